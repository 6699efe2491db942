//! te-uring: file segments. A file opened as a segment
//! ([`TransferEngine::open_file_segment`](te_core::TransferEngine::open_file_segment)) is read
//! and written from registered memory by one of two transports, both with
//! [`Capabilities::DRAM_FILE`](te_core::Capabilities::DRAM_FILE):
//!
//! - [`UringTransport`] (feature `uring`, on by default): io_uring rings made once at install and
//!   reused for every batch, one per worker thread; the kernel's opcodes probed at start;
//!   registered memory registered with each ring as fixed buffers where the kernel takes them;
//!   `O_DIRECT` when address, file offset and length are 4 KiB aligned, buffered otherwise.
//! - [`BufIoTransport`]: `pread`/`pwrite` on worker threads (TENT's BufIO).
//!
//! [`file_transport`] picks io_uring when the probe passes and falls back to buffered I/O when
//! io_uring is missing or forbidden (an old kernel, `kernel.io_uring_disabled`, a seccomp
//! profile), logging the reason. Both coalesce queued slices that continue each other in memory
//! and in the file into one request of up to [`FileOptions::max_io`] bytes, and check every
//! slice against the file segment (bounds, read-only) before any I/O.
//!
//! Not done here: files on other hosts (that is NVMe-oF or a memory segment), and
//! `fsync` (a completed WRITE is in the page cache or, with `O_DIRECT`, handed to the device;
//! durability is the application's call).

mod bufio;
pub mod files;
mod plan;
mod queue;
#[cfg(feature = "uring")]
mod uring;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use te_core::transport::{CompletionSink, SliceError, SliceOp, Transport};
use tracing::{error, info};

pub use bufio::BufIoTransport;
#[cfg(feature = "uring")]
pub use uring::{UringSupport, UringTransport, probe};

use files::{FileTable, OpenFile};
use plan::Group;
use queue::SliceQueue;

/// Settings of the file transports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileOptions {
    /// Worker threads (each with its own ring for io_uring).
    pub workers: usize,
    /// Requests in flight per ring (io_uring only).
    pub depth: u32,
    /// Use `O_DIRECT` for aligned requests (io_uring only).
    pub direct: bool,
    /// Largest request made by coalescing neighbouring slices, bytes.
    pub max_io: u64,
}

impl Default for FileOptions {
    fn default() -> Self {
        FileOptions {
            workers: 1,
            depth: 64,
            direct: true,
            max_io: 1 << 20,
        }
    }
}

/// The transport for file segments on this kernel: io_uring when it is there and allowed,
/// buffered I/O otherwise (the reason is logged).
pub fn file_transport(options: FileOptions) -> Arc<dyn Transport> {
    #[cfg(feature = "uring")]
    match probe() {
        Ok(support) => {
            info!(
                fixed_buffers = support.fixed_buffers,
                "file segments use io_uring"
            );
            return Arc::new(UringTransport::with_support(options, support));
        }
        Err(reason) => {
            tracing::warn!(%reason, "io_uring unavailable; file segments use buffered I/O")
        }
    }
    #[cfg(not(feature = "uring"))]
    info!("built without io_uring; file segments use buffered I/O");
    Arc::new(BufIoTransport::new(options))
}

/// Requests a file transport has made, by kind (a request is one or more coalesced slices).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IoCounts {
    /// Requests that went `O_DIRECT`.
    pub direct: u64,
    /// Requests through the page cache.
    pub buffered: u64,
    /// Requests that used a registered (fixed) buffer.
    pub fixed: u64,
    /// Slices completed successfully.
    pub slices: u64,
}

#[derive(Default)]
pub(crate) struct Counters {
    direct: AtomicU64,
    buffered: AtomicU64,
    fixed: AtomicU64,
    slices: AtomicU64,
}

impl Counters {
    pub(crate) fn request(&self, direct: bool, fixed: bool) {
        let c = if direct { &self.direct } else { &self.buffered };
        c.fetch_add(1, Ordering::Relaxed);
        if fixed {
            self.fixed.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub(crate) fn snapshot(&self) -> IoCounts {
        IoCounts {
            direct: self.direct.load(Ordering::Relaxed),
            buffered: self.buffered.load(Ordering::Relaxed),
            fixed: self.fixed.load(Ordering::Relaxed),
            slices: self.slices.load(Ordering::Relaxed),
        }
    }
}

/// What a slice gets that no worker will run because the transport shuts down.
fn shut_down() -> SliceError {
    SliceError::Path("file transport is shut down".into())
}

/// What both file transports share: open files, the queue, the sink.
pub(crate) struct Shared {
    pub(crate) counters: Counters,
    pub(crate) files: FileTable,
    pub(crate) queue: SliceQueue,
    pub(crate) options: FileOptions,
    sink: OnceLock<Arc<dyn CompletionSink>>,
    /// The workers, joined at shutdown.
    pub(crate) threads: te_workers::Threads,
}

impl Shared {
    pub(crate) fn new(options: FileOptions) -> Self {
        Shared {
            counters: Counters::default(),
            files: FileTable::new(options.direct),
            queue: SliceQueue::default(),
            options: FileOptions {
                workers: options.workers.clamp(1, 64),
                depth: options.depth.clamp(1, 4096),
                max_io: options.max_io.clamp(4096, 1 << 30),
                ..options
            },
            sink: OnceLock::new(),
            threads: te_workers::Threads::default(),
        }
    }

    pub(crate) fn install(&self, sink: Arc<dyn CompletionSink>) -> te_core::Result<()> {
        self.sink.set(sink).map_err(|_| te_core::Error::Transport {
            transport: "file",
            reason: "already installed in an engine".into(),
        })
    }

    pub(crate) fn post(&self, slices: Vec<SliceOp>) {
        if let Err(refused) = self.queue.push(slices) {
            self.report(refused, Err(shut_down()));
        }
    }

    /// Refuses new slices, fails the queued ones and returns once the workers are gone: the
    /// requests they had taken finish (those already in the kernel must), and after that
    /// nothing touches the engine's memory (an application may free a buffer as soon as its
    /// engine is closed). Called from a worker, that worker is not waited for.
    pub(crate) fn shutdown(&self) {
        let left = self.queue.close();
        self.report(left, Err(shut_down()));
        self.threads.join_all("file transport");
    }

    /// Reports every slice of a finished request with the same outcome.
    pub(crate) fn report(&self, ops: Vec<SliceOp>, outcome: Result<(), SliceError>) {
        let Some(sink) = self.sink.get() else {
            error!(
                slices = ops.len(),
                "file transport not installed; slices dropped"
            );
            return;
        };
        if outcome.is_ok() {
            self.counters
                .slices
                .fetch_add(ops.len() as u64, Ordering::Relaxed);
        }
        for op in ops {
            sink.complete(op, outcome.clone());
        }
    }

    /// Reports canceled and refused slices of `group`, and returns what is left to execute with
    /// its file: the group itself, or (after a cancellation inside it) each remaining slice alone.
    pub(crate) fn prepare(&self, group: Group<SliceOp>) -> Vec<(Group<SliceOp>, Arc<OpenFile>)> {
        let (canceled, live): (Vec<SliceOp>, Vec<SliceOp>) =
            group.ops.into_iter().partition(|op| op.is_canceled());
        let whole = canceled.is_empty();
        self.report(canceled, Err(SliceError::Canceled));
        let groups: Vec<Group<SliceOp>> = match whole {
            true => vec![Group { ops: live, ..group }],
            false => live
                .into_iter()
                .map(|op| Group {
                    opcode: op.opcode,
                    local: op.local_addr,
                    offset: op.remote_addr,
                    len: op.len,
                    ops: vec![op],
                })
                .collect(),
        };
        let mut ready = Vec::with_capacity(groups.len());
        for g in groups {
            let Some(first) = g.ops.first() else { continue };
            match self.files.check(&first.target, g.opcode, g.offset, g.len) {
                Ok(file) => ready.push((g, file)),
                Err(e) => self.report(g.ops, Err(e)),
            }
        }
        ready
    }
}
