//! File segments: a file on this host opened as a segment, so READ and WRITE move bytes between
//! registered memory and file ranges (`target_offset` is the file offset). The engine only
//! checks the file and describes it; a transport with
//! [`Capabilities::DRAM_FILE`](crate::transport::Capabilities::DRAM_FILE) (te-uring, or its
//! buffered-I/O fallback) does the I/O. File segments are never published or received.

use std::path::Path;

use super::TransferEngine;
use crate::error::{Error, Result};
use crate::memory::Permission;
use crate::segment::{SegmentDesc, SegmentId};
use crate::transport::Capabilities;

/// How a file segment may be used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum FileAccess {
    /// READ only (file → memory); a WRITE is refused with `PermissionDenied` at submit.
    ReadOnly,
    /// READ and WRITE.
    ReadWrite,
}

impl TransferEngine {
    /// Opens the regular file at `path` as a segment of its current length. Transfers to it use
    /// the file offset as `target_offset`. Opening the same path again refreshes its length and
    /// access under the same id.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the path is missing, not a regular file, empty, or cannot
    /// be opened with `access` (the OS error is named); [`Error::NotSupportedTransport`] when no
    /// installed transport serves files.
    pub fn open_file_segment(&self, path: &Path, access: FileAccess) -> Result<SegmentId> {
        let has_file_transport = self
            .core
            .transports()
            .iter()
            .any(|t| t.capabilities().contains(Capabilities::DRAM_FILE));
        if !has_file_transport {
            return Err(Error::NotSupportedTransport(
                "none installed moves file segments (install te-uring's)".into(),
            ));
        }
        let bad = |why: String| Error::InvalidArgument(format!("file segment {path:?}: {why}"));
        let canonical = path.canonicalize().map_err(|e| bad(e.to_string()))?;
        // Opening now tells the caller at once if the access is not allowed (a read-only file
        // or mount); the transport opens its own descriptors on first use.
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(access == FileAccess::ReadWrite)
            .open(&canonical)
            .map_err(|e| bad(e.to_string()))?;
        let meta = file.metadata().map_err(|e| bad(e.to_string()))?;
        if !meta.is_file() {
            return Err(bad("not a regular file".into()));
        }
        if meta.len() == 0 {
            return Err(bad("empty file (size it before opening it)".into()));
        }
        let permission = match access {
            FileAccess::ReadOnly => Permission::RemoteRead,
            FileAccess::ReadWrite => Permission::RemoteReadWrite,
        };
        let path_str = canonical
            .to_str()
            .ok_or_else(|| bad("path is not UTF-8".into()))?;
        let name = format!("{}{path_str}", super::segments::FILE_PREFIX);
        let previous = self.segments.by_name(&name);
        let desc = SegmentDesc::file(&name, path_str, meta.len(), permission);
        if let Some(old) = previous {
            for t in self.core.transports() {
                t.close_segment(&old);
            }
        }
        let seg = self.segments.insert("local".into(), 0, desc);
        tracing::debug!(
            path = path_str,
            len = meta.len(),
            ?access,
            id = seg.id(),
            "file segment opened"
        );
        Ok(seg.id())
    }

    /// The installed transports, by name, with what each can move.
    pub fn transport_capabilities(&self) -> Vec<(&'static str, Capabilities)> {
        self.core
            .transports()
            .iter()
            .map(|t| (t.name(), t.capabilities()))
            .collect()
    }
}
