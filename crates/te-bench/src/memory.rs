//! The memory a run moves: host memory (the heap, shared memory or a CXL device), or GPU
//! memory for `--use_vram` (`--gpu_id`; a fabric allocation under `MC_USE_FABRIC` /
//! `MC_FORCE_MNNVL`, as te-nvlink allocates). Both fill and compare the same way, so
//! `--verify` checks GPU runs byte by byte too. Not here: which transports move it.

use std::sync::Arc;

use te_core::{HostBuffer, Permission, TransferEngine};
use te_cuda::DeviceBuffer;

use crate::BenchResult;

/// A run's buffer.
#[derive(Clone, Debug)]
pub(crate) enum BenchMemory {
    Host(Arc<HostBuffer>),
    Gpu(Arc<DeviceBuffer>),
}

impl BenchMemory {
    /// `len` bytes on GPU `device`, exportable by te-nvlink.
    pub(crate) fn gpu(device: u32, len: usize) -> BenchResult<Self> {
        let d = te_nvlink::NvlinkTransport::new()
            .allocate(device, len)
            .map_err(|e| format!("--use_vram: GPU {device}: {e}"))?;
        Ok(BenchMemory::Gpu(Arc::new(d)))
    }

    /// `len` bytes of GPU memory when `gpu` names a device, else of the heap.
    pub(crate) fn new(gpu: Option<u32>, len: usize) -> BenchResult<Self> {
        match gpu {
            Some(device) => Self::gpu(device, len),
            None => Ok(BenchMemory::Host(Arc::new(
                HostBuffer::new(len).map_err(|e| e.to_string())?,
            ))),
        }
    }

    pub(crate) fn addr(&self) -> u64 {
        match self {
            BenchMemory::Host(h) => h.addr(),
            BenchMemory::Gpu(d) => d.addr(),
        }
    }

    /// Registers it with `engine` (`*`: its NUMA node or its GPU), which keeps it alive.
    pub(crate) fn register(&self, engine: &TransferEngine, p: Permission) -> BenchResult<()> {
        let registered = match self {
            BenchMemory::Host(h) => engine.register_buffer(h, "*", p),
            BenchMemory::Gpu(d) => engine.register_device_buffer(d, "*", p),
        };
        registered.map_err(|e| e.to_string())
    }

    pub(crate) fn write_at(&self, offset: usize, data: &[u8]) -> BenchResult<()> {
        match self {
            BenchMemory::Host(h) => h.write_at(offset, data).map_err(|e| e.to_string()),
            BenchMemory::Gpu(d) => d.write_at(offset, data).map_err(|e| e.to_string()),
        }
    }

    pub(crate) fn read_at(&self, offset: usize, out: &mut [u8]) -> BenchResult<()> {
        match self {
            BenchMemory::Host(h) => h.read_at(offset, out).map_err(|e| e.to_string()),
            BenchMemory::Gpu(d) => {
                let got = d.to_vec(offset, out.len()).map_err(|e| e.to_string())?;
                out.copy_from_slice(&got);
                Ok(())
            }
        }
    }
}
