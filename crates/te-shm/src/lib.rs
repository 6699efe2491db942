//! te-shm: moving bytes between processes on one host through shared memory (TENT's SHM
//! transport), not through the network stack.
//!
//! - The owner allocates segment memory with [`ShmTransport::allocate`]: a file in `/dev/shm`
//!   (or a tmpfs or CXL mount given at construction), owner-only (0600), under a random name not
//!   derivable from the segment name. Registered like any buffer, it is published with its
//!   `shm_name`.
//! - A peer on the same host (same boot and shared-memory mount, `te_host_id`) maps that file on
//!   first use and relocates remote addresses into its mapping; the engine prefers this
//!   transport over the segment's protocol for such buffers ([`Transport::serves`]).
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

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use te_core::HostBuffer;
use te_core::segment::{BufferDesc, RemoteSegment, SegmentDesc};
use te_core::transport::{InstallContext, SliceError, SliceOp, Transport};
use te_core::workers::CopyWorkers;
use tracing::{debug, info};

/// How old a file with no live creator must be before install removes it.
const ORPHAN_AGE: std::time::Duration = std::time::Duration::from_secs(10);

/// Worker threads copying slices.
const WORKERS: usize = 2;

type Mappings = Mutex<Mapped>;

/// Peers' files mapped here, by path, and the one used last (slices in a row nearly always go
/// to one file: its path is compared, not hashed).
#[derive(Default)]
struct Mapped {
    by_path: HashMap<String, Arc<HostBuffer>>,
    last: Option<(String, Arc<HostBuffer>)>,
}

impl Mapped {
    /// The mapping of `path` covering at least `len` bytes, if one is open.
    fn get(&mut self, path: &str, len: u64) -> Option<Arc<HostBuffer>> {
        let covers = |m: &Arc<HostBuffer>| m.len() as u64 >= len;
        if let Some((p, m)) = &self.last
            && p == path
            && covers(m)
        {
            return Some(m.clone());
        }
        let m = self.by_path.get(path).filter(|m| covers(m))?.clone();
        self.last = Some((path.to_string(), m.clone()));
        Some(m)
    }

    fn insert(&mut self, path: &str, m: Arc<HostBuffer>) {
        self.by_path.insert(path.to_string(), m.clone());
        self.last = Some((path.to_string(), m));
    }

    fn remove(&mut self, path: &str) {
        self.by_path.remove(path);
        if self.last.as_ref().is_some_and(|(p, _)| p == path) {
            self.last = None;
        }
    }
}

/// The shared-memory transport. Create it, install it (with TCP for other hosts), and allocate
/// the segment's memory through it.
pub struct ShmTransport {
    dir: PathBuf,
    /// Buffers this process allocated: start address → file.
    allocated: Mutex<HashMap<u64, String>>,
    /// Peers' files mapped here, by path.
    mappings: Arc<Mappings>,
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
            mappings: Arc::new(Mutex::new(Mapped::default())),
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

/// Finds the published buffer holding `addr`.
fn buffer_of(desc: &SegmentDesc, addr: u64, len: u64) -> Option<&BufferDesc> {
    desc.buffers.iter().find(|b| {
        addr >= b.addr
            && addr
                .checked_add(len)
                .is_some_and(|end| end <= b.addr + b.length)
    })
}

/// Executes one slice: maps the peer's file if needed and copies.
fn execute(mappings: &Mappings, op: &SliceOp) -> Result<(), SliceError> {
    let desc = op.target.desc();
    let buffer = buffer_of(desc, op.remote_addr, op.len).ok_or_else(|| {
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
    let mapping = {
        let mut maps = mappings.lock().unwrap_or_else(|e| e.into_inner());
        match maps.get(path, buffer.length) {
            Some(m) => m,
            None => {
                let m = HostBuffer::open_shared(Path::new(path), buffer.length as usize)
                    .map_err(|e| SliceError::Path(format!("segment {}: {e}", desc.name)))?;
                debug!(path, len = buffer.length, "mapped a peer's shared memory");
                let m = Arc::new(m);
                maps.insert(path, m.clone());
                m
            }
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
        let mappings = self.mappings.clone();
        self.workers.start(
            WORKERS,
            ctx.sink,
            Arc::new(move |op: &SliceOp| execute(&mappings, op)),
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

    fn serves(&self, target: &RemoteSegment, buffer: &BufferDesc) -> bool {
        // A shared-memory file, not another transport's handle (te-nvlink's `cuda-ipc:`).
        buffer
            .shm_name
            .as_deref()
            .is_some_and(|p| p.starts_with('/'))
            && target.same_host()
    }

    fn slice_size(&self, _target: &te_core::segment::RemoteSegment) -> Option<u64> {
        Some(te_core::workers::COPY_SLICE)
    }

    fn post(&self, slices: Vec<SliceOp>) {
        self.workers.post_live(slices);
    }

    fn post_one(&self, slice: SliceOp) {
        self.workers.post_live_one(slice);
    }

    fn close_segment(&self, segment: &RemoteSegment) {
        let mut maps = self.mappings.lock().unwrap_or_else(|e| e.into_inner());
        for b in &segment.desc().buffers {
            if let Some(path) = &b.shm_name {
                maps.remove(path);
            }
        }
    }

    fn shutdown(&self) {
        self.workers.shutdown();
    }
}
