//! The files behind file segments, opened on first use and kept per segment: one buffered
//! descriptor, and one `O_DIRECT` descriptor where the file system takes it. Every slice is
//! checked here again (a file segment, a WRITE only where the segment permits it, the range
//! inside the file as opened) before any I/O. Does no I/O itself.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::{Arc, Mutex};

use te_core::segment::{RemoteSegment, SegmentId};
use te_core::transport::{Rejection, SliceError};
use te_core::{Opcode, Permission};
use tracing::debug;

/// Alignment of memory address, file offset and length that `O_DIRECT` needs here. 4096 covers
/// every logical block size in use; a smaller one would only let more requests go direct.
pub const DIRECT_ALIGN: u64 = 4096;

/// A file segment's open descriptors.
#[derive(Debug)]
pub struct OpenFile {
    /// Buffered descriptor (always there).
    pub buffered: File,
    /// `O_DIRECT` descriptor, when the file system supports it and direct I/O is wanted.
    pub direct: Option<File>,
    /// Length of the segment (the file's length when opened).
    pub len: u64,
    /// Whether WRITE is allowed.
    pub writable: bool,
}

impl OpenFile {
    /// Whether a transfer of `len` bytes between `local` and file offset `offset` can go direct.
    pub fn direct_fits(&self, local: u64, offset: u64, len: u64) -> bool {
        crate::plan::goes_direct(self.direct.is_some(), local, offset, len, DIRECT_ALIGN)
    }
}

/// Opened files by segment id.
#[derive(Debug, Default)]
pub struct FileTable {
    files: Mutex<HashMap<SegmentId, Arc<OpenFile>>>,
    /// Open an `O_DIRECT` descriptor too.
    direct: bool,
}

impl FileTable {
    /// A table whose files also get an `O_DIRECT` descriptor when `direct`.
    pub fn new(direct: bool) -> Self {
        FileTable {
            files: Mutex::new(HashMap::new()),
            direct,
        }
    }

    /// Checks that `len` bytes at `offset` of `target` may be moved by `opcode`, and returns the
    /// file to do it with, opening it on first use.
    ///
    /// # Errors
    /// `Rejected` for a segment that is no file segment, a WRITE to a read-only one, or a range
    /// outside the file; `Path` when the file cannot be opened.
    pub fn check(
        &self,
        target: &RemoteSegment,
        opcode: Opcode,
        offset: u64,
        len: u64,
    ) -> Result<Arc<OpenFile>, SliceError> {
        let desc = target.desc();
        let (Some(path), Some(buffer)) = (desc.te_file.as_deref(), desc.buffers.first()) else {
            return Err(SliceError::Rejected(Rejection::Malformed));
        };
        if !desc.is_file() {
            return Err(SliceError::Rejected(Rejection::Malformed));
        }
        let writable = buffer.permission.as_deref().and_then(Permission::parse)
            == Some(Permission::RemoteReadWrite);
        if opcode == Opcode::Write && !writable {
            return Err(SliceError::Rejected(Rejection::PermissionDenied));
        }
        let file = self.open(target.id(), Path::new(path), buffer.length, writable)?;
        if opcode == Opcode::Write && !file.writable {
            return Err(SliceError::Rejected(Rejection::PermissionDenied));
        }
        match offset.checked_add(len) {
            Some(end) if len > 0 && end <= file.len && end <= buffer.length => Ok(file),
            _ => Err(SliceError::Rejected(Rejection::OutOfBounds)),
        }
    }

    fn open(
        &self,
        id: SegmentId,
        path: &Path,
        len: u64,
        writable: bool,
    ) -> Result<Arc<OpenFile>, SliceError> {
        let mut files = self.files.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(f) = files.get(&id) {
            return Ok(f.clone());
        }
        let open = |flags: i32| {
            OpenOptions::new()
                .read(true)
                .write(writable)
                .custom_flags(flags | libc::O_CLOEXEC)
                .open(path)
        };
        let buffered = open(0).map_err(|e| SliceError::Path(format!("opening {path:?}: {e}")))?;
        let on_disk = buffered
            .metadata()
            .map_err(|e| SliceError::Path(format!("{path:?}: {e}")))?
            .len();
        // tmpfs and some FUSE mounts refuse O_DIRECT: those files are served buffered.
        let direct = match self.direct {
            true => open(libc::O_DIRECT)
                .inspect_err(|e| debug!(?path, error = %e, "no O_DIRECT; buffered I/O only"))
                .ok(),
            false => None,
        };
        let file = Arc::new(OpenFile {
            buffered,
            direct,
            // The file may have shrunk since the segment was opened: never address past its end.
            len: len.min(on_disk),
            writable,
        });
        debug!(
            ?path,
            len = file.len,
            direct = file.direct.is_some(),
            writable,
            "file opened"
        );
        files.insert(id, file.clone());
        Ok(file)
    }

    /// Forgets the descriptors of a closed segment (in-flight I/O keeps its own reference).
    pub fn close(&self, id: SegmentId) {
        self.files
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id);
    }
}
