//! te-nvlink: GPU memory between processes of one host over NVLink/PCIe through CUDA IPC
//! handles, and device copies within one process (the staging hop of te-tent).
//!
//! - At install the CUDA driver is loaded (`te_core::cuda`); without it, or without a device,
//!   install fails with a clear error.
//! - A registered region on a GPU (`cuda:N`) is exported as a CUDA IPC handle; the descriptor
//!   publishes it in the buffer's `shm_name` (as Mooncake's nvlink transport does) as
//!   `cuda-ipc:<device>:<offset>:<handle hex>`.
//! - A peer on the same host opens the handle once per segment and copies with `cuMemcpy`:
//!   below `MC_TE_NVLINK_ASYNC_THRESHOLD` (default 1 MiB) directly, above it queued on the
//!   worker's stream and completed when the stream's work is done. Slices run on copy workers,
//!   never the submitting thread.
//! - Within one process (the own segment) no handle is opened: addresses are used as they are,
//!   host or device (unified addressing).
//!
//! Not here: fabric handles (MNNVL) — the driver call needs memory allocated with
//! `cuMemCreate` and a fabric-capable system; this transport exports legacy IPC handles only.

#![deny(unsafe_code)]

mod handle;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use te_core::Opcode;
use te_core::memory::{Location, Region};
use te_core::segment::{BufferDesc, RemoteSegment, SegmentDesc};
use te_core::transport::{Capabilities, InstallContext, Rejection, SliceError, SliceOp, Transport};
use te_core::workers::CopyWorkers;
use tracing::{debug, info};

pub use handle::IpcName;

/// Copy workers.
const WORKERS: usize = 2;

/// Opened peer allocations: IPC name → address in this process.
type Opened = Mutex<HashMap<String, u64>>;

/// The NVLink transport.
pub struct NvlinkTransport {
    workers: CopyWorkers,
    /// Exported regions: start → published name.
    exported: Mutex<HashMap<u64, IpcName>>,
    opened: Arc<Opened>,
    local_name: OnceLock<String>,
    async_threshold: usize,
}

impl std::fmt::Debug for NvlinkTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvlinkTransport").finish_non_exhaustive()
    }
}

impl Default for NvlinkTransport {
    fn default() -> Self {
        let async_threshold = std::env::var("MC_TE_NVLINK_ASYNC_THRESHOLD")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(1 << 20);
        NvlinkTransport {
            workers: CopyWorkers::new("nvlink"),
            exported: Mutex::new(HashMap::new()),
            opened: Arc::new(Mutex::new(HashMap::new())),
            local_name: OnceLock::new(),
            async_threshold,
        }
    }
}

impl NvlinkTransport {
    /// A transport not yet installed.
    pub fn new() -> Self {
        Self::default()
    }
}

/// The device address for `op`'s remote range: the own segment's addresses as they are, a
/// peer's through its opened IPC handle.
fn remote_address(opened: &Opened, own: bool, op: &SliceOp) -> Result<(u64, u32), SliceError> {
    let buffer = op
        .target
        .check_access(op.remote_addr, op.len, op.opcode)
        .map_err(|_| SliceError::Rejected(Rejection::OutOfBounds))?;
    let name = buffer
        .shm_name
        .as_deref()
        .and_then(IpcName::parse)
        .ok_or(SliceError::Rejected(Rejection::Malformed))?;
    let into = op.remote_addr - buffer.addr;
    if own {
        return Ok((op.remote_addr, name.device));
    }
    let cuda = te_core::cuda::driver().map_err(|e| SliceError::LocalPath(e.to_string()))?;
    let key = buffer.shm_name.clone().unwrap_or_default();
    let mut map = opened.lock().unwrap_or_else(|e| e.into_inner());
    let base = match map.get(&key) {
        Some(b) => *b,
        None => {
            let b = cuda
                .ipc_open(&name.handle, name.device)
                .map_err(|e| SliceError::Path(format!("{}: {e}", op.target.name())))?;
            debug!(
                segment = op.target.name(),
                device = name.device,
                "opened a peer's GPU memory"
            );
            map.insert(key, b);
            b
        }
    };
    Ok((base + name.offset + into, name.device))
}

fn execute(
    opened: &Opened,
    own_name: &str,
    threshold: usize,
    op: &SliceOp,
) -> Result<(), SliceError> {
    let own = op.target.name() == own_name;
    let (remote, device) = remote_address(opened, own, op)?;
    let (dst, src) = match op.opcode {
        Opcode::Read => (op.local_addr, remote),
        _ => (remote, op.local_addr),
    };
    let cuda = te_core::cuda::driver().map_err(|e| SliceError::LocalPath(e.to_string()))?;
    let len = op.len as usize;
    // The local range was checked against the engine's pinned region, the remote one against
    // the peer's published buffer (and lies in its opened allocation).
    let copied = handle::copy(cuda, len >= threshold, (device, dst, src, len));
    copied.map_err(|e| SliceError::Path(e.to_string()))
}

impl Transport for NvlinkTransport {
    fn name(&self) -> &'static str {
        "nvlink"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::GPU_SAME_HOST | Capabilities::GPU_LOCAL
    }

    fn install(&self, ctx: InstallContext) -> te_core::Result<()> {
        let cuda = te_core::cuda::driver().map_err(|e| te_core::Error::Transport {
            transport: "nvlink",
            reason: e.to_string(),
        })?;
        let _ = self.local_name.set(ctx.local_name.clone());
        let (opened, own, threshold) = (
            self.opened.clone(),
            ctx.local_name.clone(),
            self.async_threshold,
        );
        self.workers.start(
            WORKERS,
            ctx.sink,
            Arc::new(move |op: &SliceOp| execute(&opened, &own, threshold, op)),
        )?;
        info!(
            devices = cuda.devices,
            driver = cuda.version,
            "nvlink transport installed"
        );
        Ok(())
    }

    fn register(&self, region: &Arc<Region>) -> te_core::Result<()> {
        let Location::Cuda(_) = region.location() else {
            return Ok(());
        };
        let cuda = te_core::cuda::driver()?;
        let (handle, offset) = cuda.ipc_handle(region.addr())?;
        let device = cuda.device_of(region.addr()).unwrap_or(0);
        self.exported
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(
                region.addr(),
                IpcName {
                    device,
                    offset,
                    handle,
                },
            );
        Ok(())
    }

    fn unregister(&self, region: &Region) {
        self.exported
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&region.addr());
    }

    fn describe(&self, desc: &mut SegmentDesc) {
        let exported = self.exported.lock().unwrap_or_else(|e| e.into_inner());
        for b in &mut desc.buffers {
            if let Some(name) = exported.get(&b.addr) {
                b.shm_name = Some(name.to_string());
            }
        }
    }

    fn serves(&self, target: &RemoteSegment, buffer: &BufferDesc) -> bool {
        buffer
            .shm_name
            .as_deref()
            .is_some_and(|n| IpcName::parse(n).is_some())
            && target.same_host()
    }

    fn post(&self, slices: Vec<SliceOp>) {
        self.workers.post(slices);
    }

    fn close_segment(&self, segment: &RemoteSegment) {
        let Ok(cuda) = te_core::cuda::driver() else {
            return;
        };
        let mut map = self.opened.lock().unwrap_or_else(|e| e.into_inner());
        for b in &segment.desc().buffers {
            if let Some(ptr) = b.shm_name.as_ref().and_then(|n| map.remove(n)) {
                cuda.ipc_close(ptr);
            }
        }
    }

    fn shutdown(&self) {
        self.workers.shutdown();
    }
}
