//! te-gds: GPU memory to and from file segments through GPUDirect Storage (cuFile, loaded at
//! run time).
//!
//! - Install loads the CUDA driver and opens the cuFile driver; without either, install fails
//!   with a sentence saying what is missing (cuFile's compatibility mode, set in `cufile.json`,
//!   runs the same calls through the POSIX path where GDS is not available).
//! - A file segment is opened `O_DIRECT` and registered with cuFile on first use; every slice is
//!   checked against it (a file segment, not read-only for a WRITE, inside the file).
//! - Slices run on copy workers as `cuFileRead`/`cuFileWrite` between the slice's memory (GPU
//!   or host) and the file offset; short transfers are continued.
//!
//! Not here: host memory to files by default (te-uring does that faster), cuFile batch and
//! stream APIs.

#![deny(unsafe_code)]

mod cufile;

use std::collections::HashMap;
use std::fs::OpenOptions;
use std::os::unix::fs::OpenOptionsExt;
use std::sync::{Arc, Mutex};

use te_core::segment::{RemoteSegment, SegmentId};
use te_core::transport::{Capabilities, InstallContext, Rejection, SliceError, SliceOp, Transport};
use te_core::{Opcode, Permission};
use te_workers::CopyWorkers;
use tracing::{debug, info};

pub use cufile::open_driver;

const WORKERS: usize = 2;

/// One registered file segment.
struct GdsFile {
    handle: cufile::Handle,
    len: u64,
    writable: bool,
}

type Files = Mutex<HashMap<SegmentId, Arc<GdsFile>>>;

/// The GPUDirect Storage transport.
pub struct GdsTransport {
    workers: CopyWorkers,
    files: Arc<Files>,
}

impl std::fmt::Debug for GdsTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GdsTransport").finish_non_exhaustive()
    }
}

impl Default for GdsTransport {
    fn default() -> Self {
        GdsTransport {
            workers: CopyWorkers::new("gds"),
            files: Arc::new(Mutex::new(HashMap::new())),
        }
    }
}

impl GdsTransport {
    /// A transport not yet installed.
    pub fn new() -> Self {
        Self::default()
    }
}

/// The registered file for `op`, after checking the slice against it.
fn file_for(files: &Files, op: &SliceOp) -> Result<Arc<GdsFile>, SliceError> {
    let target = &op.target;
    let desc = target.desc();
    let (Some(path), Some(buffer)) = (desc.te_file.as_deref(), desc.buffers.first()) else {
        return Err(SliceError::Rejected(Rejection::Malformed));
    };
    let writable = buffer.permission.as_deref().and_then(Permission::parse)
        == Some(Permission::RemoteReadWrite);
    if op.opcode == Opcode::Write && !writable {
        return Err(SliceError::Rejected(Rejection::PermissionDenied));
    }
    let file = {
        let mut map = files.lock().unwrap_or_else(|e| e.into_inner());
        match map.get(&target.id()) {
            Some(f) => f.clone(),
            None => {
                let f = OpenOptions::new()
                    .read(true)
                    .write(writable)
                    .custom_flags(libc::O_DIRECT | libc::O_CLOEXEC)
                    .open(path)
                    .map_err(|e| SliceError::Path(format!("opening {path:?} O_DIRECT: {e}")))?;
                let on_disk = f
                    .metadata()
                    .map_err(|e| SliceError::Path(format!("{path:?}: {e}")))?
                    .len();
                let handle = cufile::Handle::register(f).map_err(SliceError::Path)?;
                debug!(path, "file registered with cuFile");
                let f = Arc::new(GdsFile {
                    handle,
                    len: on_disk.min(buffer.length),
                    writable,
                });
                map.insert(target.id(), f.clone());
                f
            }
        }
    };
    if op.opcode == Opcode::Write && !file.writable {
        return Err(SliceError::Rejected(Rejection::PermissionDenied));
    }
    match op.remote_addr.checked_add(op.len) {
        Some(end) if op.len > 0 && end <= file.len => Ok(file),
        _ => Err(SliceError::Rejected(Rejection::OutOfBounds)),
    }
}

fn execute(files: &Files, op: &SliceOp) -> Result<(), SliceError> {
    let file = file_for(files, op)?;
    // cuFile moves device memory in the current context: the buffer's device's, on this worker.
    let cuda = te_cuda::driver().map_err(|e| SliceError::LocalPath(e.to_string()))?;
    if let Some(device) = cuda.device_of(op.local_addr) {
        cuda.make_current(device)
            .map_err(|e| SliceError::LocalPath(e.to_string()))?;
    }
    let write = op.opcode == Opcode::Write;
    let mut done = 0u64;
    while done < op.len {
        // The local range lies in a region the engine pinned for this slice's task; the file
        // range was checked above.
        let n = run_io(
            &file,
            write,
            op.local_addr + done,
            (op.len - done) as usize,
            op.remote_addr + done,
        )?;
        if n == 0 {
            return Err(SliceError::Path(format!(
                "cuFile moved nothing at offset {}",
                op.remote_addr + done
            )));
        }
        done += n as u64;
    }
    Ok(())
}

#[allow(unsafe_code)]
fn run_io(
    file: &GdsFile,
    write: bool,
    buf: u64,
    len: usize,
    offset: u64,
) -> Result<usize, SliceError> {
    // SAFETY: `buf..buf+len` is inside the slice's local range, which lies in a region the
    // engine pinned for the task until the slice is reported.
    unsafe { file.handle.io(write, buf, len, offset) }.map_err(SliceError::Path)
}

impl Transport for GdsTransport {
    fn name(&self) -> &'static str {
        "gds"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::GPU_FILE
    }

    fn install(&self, ctx: InstallContext) -> te_core::Result<()> {
        let fail = |reason: String| te_core::Error::Transport {
            transport: "gds",
            reason,
        };
        let cuda = te_cuda::driver().map_err(|e| fail(e.to_string()))?;
        cufile::open_driver().map_err(fail)?;
        let files = self.files.clone();
        self.workers.start(
            WORKERS,
            ctx.sink,
            Arc::new(move |op: &SliceOp| execute(&files, op)),
        )?;
        info!(devices = cuda.devices, "gds transport installed");
        Ok(())
    }

    fn slice_size(&self, _target: &te_core::segment::RemoteSegment) -> Option<u64> {
        Some(te_workers::COPY_SLICE)
    }

    fn post(&self, slices: Vec<SliceOp>) {
        self.workers.post(slices);
    }

    fn close_segment(&self, segment: &RemoteSegment) {
        self.files
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&segment.id());
    }

    fn shutdown(&self) {
        self.workers.shutdown();
    }
}
