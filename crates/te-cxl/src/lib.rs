//! te-cxl: segment memory on a CXL memory device shared by the processes (and hosts) that map
//! it. The device (`MC_CXL_DEV_PATH`, a DAX device such as `/dev/dax0.0`; `MC_CXL_DEV_SIZE`) is
//! mapped once per process ([`CxlDevice`]). The owner allocates segment memory on it
//! ([`CxlTransport::allocate`]) or registers any range of the mapping; its descriptor publishes
//! the device identity and each buffer's device offset. A peer that maps the same device
//! ([`Transport::serves`]) copies straight between its memory and the device at that offset
//! (through `CopyWorkers`: up to 1 MiB on the submitting thread, more on worker threads), with
//! a store fence after every write, every address checked against the mapping.
//!
//! Not done here: cache flushes for devices shared by hosts without hardware coherence (the
//! device is taken as coherent: CXL 3 shared memory, or one host), and reclaiming device memory.
#![deny(unsafe_code)]

mod device;

use std::sync::Arc;

pub use device::{ALIGN, CxlDevice, HEADER_LEN};
use te_core::segment::{BufferDesc, Origin, RemoteSegment, SegmentDesc};
use te_core::transport::{Capabilities, InstallContext, Rejection, SliceError, SliceOp, Transport};
use te_core::{Config, Error, HostBuffer, Opcode};
use te_workers::CopyWorkers;
use tracing::info;

/// Worker threads copying slices.
const WORKERS: usize = 2;

/// The CXL transport over one mapped device.
pub struct CxlTransport {
    device: Arc<CxlDevice>,
    workers: CopyWorkers,
}

impl std::fmt::Debug for CxlTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CxlTransport")
            .field("device", &self.device)
            .finish()
    }
}

impl CxlTransport {
    /// Maps the device named by `MC_CXL_DEV_PATH` (and `MC_CXL_DEV_SIZE`) in `config`.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] when `MC_CXL_DEV_PATH` is unset; the device's errors otherwise
    /// (see [`CxlDevice::open`]).
    pub fn open(config: &Config) -> te_core::Result<Self> {
        let path = config
            .cxl_dev_path
            .as_deref()
            .ok_or_else(|| Error::InvalidConfig {
                name: "MC_CXL_DEV_PATH".into(),
                value: String::new(),
                reason: "the CXL transport needs the DAX device's path".into(),
            })?;
        let device = CxlDevice::open(path, config.cxl_dev_size)?;
        info!(path = %path.display(), len = device.len(), id = device.id(), "CXL device mapped");
        Ok(CxlTransport {
            device: Arc::new(device),
            workers: CopyWorkers::new("cxl"),
        })
    }

    /// The mapped device.
    pub fn device(&self) -> &Arc<CxlDevice> {
        &self.device
    }

    /// Allocates `len` bytes of segment memory on the device (TENT's `allocateLocalMemory`);
    /// register the buffer with the engine to publish it.
    ///
    /// # Errors
    /// Zero length, or the device is full.
    pub fn allocate(&self, len: usize) -> te_core::Result<Arc<HostBuffer>> {
        let offset = self.device.allocate(len as u64)?;
        let owner: Arc<dyn std::any::Any + Send + Sync> = self.device.clone();
        #[allow(unsafe_code)]
        // SAFETY: `[offset, offset+len)` was just carved out of the mapping for this buffer
        // alone; the device (and its mapping) lives as long as the buffer holds `owner`.
        let buffer = unsafe {
            HostBuffer::from_parts((self.device.base() + offset) as *mut u8, len, owner)?
        };
        Ok(Arc::new(buffer))
    }
}

/// Whether a segment's owner may name ranges of `device`: its descriptor is signed with the
/// cluster key, or its proven process on this host maps the device.
fn owner_reaches(device: &CxlDevice, target: &RemoteSegment) -> bool {
    let reaches = match target.origin() {
        Origin::Signed { .. } => true,
        Origin::Served { pid } => te_sys::holder::maps_file(pid, device.file_id()).unwrap_or(false),
        _ => false,
    };
    if !reaches {
        tracing::warn!(
            peer = target.name(),
            "the segment names this CXL device, but its owner is not proven to map it; \
             its buffers go over the segment's protocol"
        );
    }
    reaches
}

/// A decision of [`owner_reaches`], kept with a descriptor's buffer.
struct Reach(bool);

/// Copies one slice between local memory and the device range behind the remote address.
fn execute(device: &CxlDevice, op: &SliceOp) -> Result<(), SliceError> {
    let buffer = op
        .target
        .check_access(op.remote_addr, op.len, op.opcode)
        .map_err(|e| match e {
            Error::PermissionDenied { .. } => SliceError::Rejected(Rejection::PermissionDenied),
            _ => SliceError::Rejected(Rejection::OutOfBounds),
        })?;
    let Some(base) = buffer.cxl_offset else {
        return Err(SliceError::Rejected(Rejection::Malformed));
    };
    // The descriptor's offsets are the peer's word: the device checks the final range.
    let offset = base
        .checked_add(op.remote_addr - buffer.addr)
        .ok_or(SliceError::Rejected(Rejection::OutOfBounds))?;
    #[allow(unsafe_code)]
    // SAFETY: the local range lies in a region the engine pinned for this slice's task until it
    // is reported; the device range is checked by the copy.
    let copied = unsafe {
        match op.opcode {
            Opcode::Write => device.write(offset, op.local_addr, op.len),
            _ => device.read(offset, op.local_addr, op.len),
        }
    };
    copied.map_err(|_| SliceError::Rejected(Rejection::OutOfBounds))
}

impl Transport for CxlTransport {
    fn name(&self) -> &'static str {
        "cxl"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::DRAM_CXL
    }

    fn install(&self, ctx: InstallContext) -> te_core::Result<()> {
        let device = self.device.clone();
        self.workers.start(
            WORKERS,
            ctx.sink,
            Arc::new(move |op: &SliceOp| execute(&device, op)),
        )
    }

    fn describe(&self, desc: &mut SegmentDesc) {
        let mut any = false;
        for b in &mut desc.buffers {
            if let Some(offset) = self.device.offset_of(b.addr, b.length) {
                b.cxl_offset = Some(offset);
                any = true;
            }
        }
        if any {
            desc.te_cxl_device = Some(self.device.id().to_string());
        }
    }

    /// A buffer on this device, of a segment whose owner reaches the device itself: a proven
    /// process of this host that maps it, or a descriptor signed with the cluster key (another
    /// host sharing the device). Anyone else's offsets could name another engine's memory on
    /// the device. Decided once per buffer of a descriptor.
    fn serves(&self, target: &RemoteSegment, buffer: &BufferDesc) -> bool {
        if buffer.cxl_offset.is_none()
            || target.desc().te_cxl_device.as_deref() != Some(self.device.id())
        {
            return false;
        }
        let Ok(index) = target.buffer_for(buffer.addr, buffer.length, Opcode::Read) else {
            return false;
        };
        let decided = target.attached(index, || {
            Ok::<_, std::convert::Infallible>(Reach(owner_reaches(&self.device, target)))
        });
        match decided {
            Ok(Some(reach)) => reach.0,
            _ => owner_reaches(&self.device, target),
        }
    }

    fn slice_size(&self, _target: &te_core::segment::RemoteSegment) -> Option<u64> {
        Some(te_workers::COPY_SLICE)
    }

    fn post(&self, slices: Vec<SliceOp>) {
        self.workers.post_live(slices);
    }

    fn post_one(&self, slice: SliceOp) {
        self.workers.post_live_one(slice);
    }

    fn shutdown(&self) {
        self.workers.shutdown();
    }
}
