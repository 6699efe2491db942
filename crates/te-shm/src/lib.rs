//! te-shm: moving bytes between processes on one host through shared memory (TENT's SHM
//! transport), not through the network stack.
//!
//! - The owner allocates segment memory with [`ShmTransport::allocate`]: a file in `/dev/shm`
//!   (or a tmpfs or CXL mount given at construction), owner-only (0600), under a random name not
//!   derivable from the segment name. Registered like any buffer, it is published with its
//!   `shm_name`.
//! - A peer whose descriptor's owner is proven to run on this host (`Origin`: the process that
//!   served it over the connection te used) maps that file on first use, only if the published
//!   name is te's own form in this transport's directory, the
//!   file, opened without following links, is a regular file of this user with one link and no
//!   access for others (a descriptor comes from the wire: it never names a file to open), and
//!   the proven owner maps that very file (so a peer cannot name another engine's memory); it
//!   relocates remote addresses into its mapping; the engine prefers this
//!   transport over the segment's protocol for such buffers ([`Transport::serves`]). The
//!   mapping is kept with the peer's descriptor ([`RemoteSegment::attached`]): found with no
//!   lock by every later slice, unmapped when the descriptor is dropped (the segment closed or
//!   fetched again) and its last slice is done.
//! - Copies run through [`CopyWorkers`]: a post of up to 1 MiB on the submitting thread, a
//!   larger one on worker threads; either way each slice completes through the engine's sink
//!   like every transport's. Bounds and permissions are checked by the engine
//!   against the descriptor before posting, and again here against the mapping.
//!
//! - A process that dies without dropping its buffers leaves their files; the next te-shm
//!   install on the host removes those nobody holds ([`HostBuffer::reap_orphans`]).
//!
//! Not done here: the remote side cannot tell who maps its memory (file permissions are the
//! gate), and memory not allocated by this transport is not shareable.
#![deny(unsafe_code)]

mod cma;
pub use cma::CmaTransport;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use te_core::HostBuffer;
use te_core::segment::{BufferDesc, RemoteSegment, SegmentDesc};
use te_core::transport::{InstallContext, SliceError, SliceOp, Transport};
use te_workers::CopyWorkers;
use tracing::{debug, info};

/// How old a file with no live creator must be before install removes it.
const ORPHAN_AGE: std::time::Duration = std::time::Duration::from_secs(10);

/// Worker threads copying slices.
const WORKERS: usize = 2;

/// The shared-memory transport. Create it, install it (with TCP for other hosts), and allocate
/// the segment's memory through it.
pub struct ShmTransport {
    dir: PathBuf,
    /// Buffers this process allocated: start address → file.
    allocated: Mutex<HashMap<u64, String>>,
    workers: CopyWorkers,
}

impl std::fmt::Debug for ShmTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShmTransport")
            .field("dir", &self.dir)
            .finish()
    }
}

impl Default for ShmTransport {
    fn default() -> Self {
        Self::new(Path::new("/dev/shm"))
    }
}

impl ShmTransport {
    /// A transport keeping its files in `dir` (`/dev/shm`, or a tmpfs or CXL mount).
    pub fn new(dir: &Path) -> Self {
        ShmTransport {
            dir: dir.to_path_buf(),
            allocated: Mutex::new(HashMap::new()),
            workers: CopyWorkers::new("shm"),
        }
    }

    /// Allocates `len` zeroed bytes of shared memory for the local segment (TENT's
    /// `allocateLocalMemory`). Register the buffer with the engine to publish it.
    ///
    /// # Errors
    /// The file cannot be created or mapped.
    pub fn allocate(&self, len: usize) -> te_core::Result<Arc<HostBuffer>> {
        let buffer = Arc::new(HostBuffer::new_shared(len, &self.dir)?);
        let path = buffer
            .shared_path()
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        self.allocated
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(buffer.addr(), path);
        Ok(buffer)
    }
}

/// Finds the published buffer holding `addr`, with its index.
fn buffer_of(desc: &SegmentDesc, addr: u64, len: u64) -> Option<(usize, &BufferDesc)> {
    desc.buffers.iter().enumerate().find(|(_, b)| {
        addr >= b.addr
            && addr
                .checked_add(len)
                .is_some_and(|end| end <= b.addr + b.length)
    })
}

/// Maps a peer's file: only one of te's in `dir` that the segment's proven owner maps itself
/// ([`HostBuffer::open_shared`] checks the published name, the file and its holder), so a
/// descriptor cannot make this process open a path of the peer's choosing, nor another
/// process's memory.
fn map(dir: &Path, path: &str, len: u64, target: &RemoteSegment) -> Result<HostBuffer, SliceError> {
    let segment = target.name();
    let owner = target.owner_pid().ok_or_else(|| {
        SliceError::Path(format!(
            "segment {segment}: its owner is not proven to run on this host"
        ))
    })?;
    let m = HostBuffer::open_shared(dir, path, len as usize, owner).map_err(|e| match e {
        te_sys::Error::InvalidArgument(why) => {
            tracing::warn!(segment, "{why}");
            SliceError::Rejected(te_core::transport::Rejection::Malformed)
        }
        e => SliceError::Path(format!("segment {segment}: {e}")),
    })?;
    debug!(path, len, "mapped a peer's shared memory");
    Ok(m)
}

/// Executes one slice: maps the peer's file on first use (kept with the segment's descriptor,
/// so later slices find it with no lock) and copies.
fn execute(dir: &Path, op: &SliceOp) -> Result<(), SliceError> {
    let desc = op.target.desc();
    let (index, buffer) = buffer_of(desc, op.remote_addr, op.len).ok_or_else(|| {
        SliceError::Path(format!(
            "{:#x}+{} is in no buffer of {}",
            op.remote_addr, op.len, desc.name
        ))
    })?;
    let path = buffer
        .shm_name
        .as_deref()
        .filter(|p| p.starts_with('/'))
        .ok_or_else(|| {
            SliceError::Path(format!(
                "buffer {:#x} of {} is not shared memory",
                buffer.addr, desc.name
            ))
        })?;
    let kept = op
        .target
        .attached(index, || map(dir, path, buffer.length, &op.target))?;
    // Another transport's state on this buffer (never te-shm's own): map for this slice only.
    let once;
    let mapping = match kept {
        Some(m) => m,
        None => {
            once = map(dir, path, buffer.length, &op.target)?;
            &once
        }
    };
    let offset = (op.remote_addr - buffer.addr) as usize;
    let len = op.len as usize;
    #[allow(unsafe_code)]
    // SAFETY: the local range lies in a region the engine pinned for this slice's task until it
    // is reported; the mapping's range is checked by the copy itself.
    let copied = unsafe {
        match op.opcode {
            te_core::Opcode::Write => mapping.copy_in_raw(offset, op.local_addr, len),
            _ => mapping.copy_out_raw(offset, op.local_addr, len),
        }
    };
    copied.map_err(|e| SliceError::Path(e.to_string()))
}

impl Transport for ShmTransport {
    fn name(&self) -> &'static str {
        "shm"
    }

    fn capabilities(&self) -> te_core::transport::Capabilities {
        te_core::transport::Capabilities::DRAM_SAME_HOST
    }

    fn install(&self, ctx: InstallContext) -> te_core::Result<()> {
        let reaped = HostBuffer::reap_orphans(&self.dir, ORPHAN_AGE);
        if reaped > 0 {
            info!(reaped, dir = %self.dir.display(), "removed shared memory left by dead processes");
        }
        let dir = self.dir.clone();
        self.workers.start(
            WORKERS,
            ctx.sink,
            Arc::new(move |op: &SliceOp| execute(&dir, op)),
        )?;
        info!(dir = %self.dir.display(), segment = %ctx.local_name, "shm transport installed");
        Ok(())
    }

    fn describe(&self, desc: &mut SegmentDesc) {
        let allocated = self.allocated.lock().unwrap_or_else(|e| e.into_inner());
        for b in &mut desc.buffers {
            if let Some(path) = allocated.get(&b.addr) {
                b.shm_name = Some(path.clone());
            }
        }
    }

    fn unregister(&self, region: &te_core::memory::Region) {
        self.allocated
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&region.addr());
    }

    /// A shared-memory file in te's form (not another transport's handle, te-nvlink's
    /// `cuda-ipc:`) of an owner proven to run on this host. Whether that owner holds the file
    /// is checked when it is mapped, on the buffer's first slice (`map`).
    fn serves(&self, target: &RemoteSegment, buffer: &BufferDesc) -> bool {
        buffer
            .shm_name
            .as_deref()
            .is_some_and(|p| HostBuffer::shared_name_in(&self.dir, p).is_some())
            && target.same_host()
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
