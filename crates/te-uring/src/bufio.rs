//! [`BufIoTransport`]: file segments served with plain `pread`/`pwrite` on worker threads
//! (TENT's BufIO). The fallback where io_uring is missing or forbidden, and a baseline for it.
//! Buffered only: no `O_DIRECT`, no rings.

#![allow(unsafe_code)] // te-uring's boundary: positioned reads and writes into registered memory

use std::fs::File;
use std::os::fd::AsRawFd;
use std::sync::Arc;

use te_core::Opcode;
use te_core::segment::RemoteSegment;
use te_core::transport::{Capabilities, InstallContext, SliceError, SliceOp, Transport};
use tracing::info;

use crate::queue::Taken;
use crate::{FileOptions, Shared};

/// Moves `len` bytes between memory at `local` and `file` at `offset`, to the end (short counts
/// and interrupts are continued; end of file on a READ is an error).
///
/// # Safety
/// `[local, local+len)` must be memory of this process that stays valid (and, for a READ,
/// writable) for the call, with no one relying on its contents meanwhile.
pub(crate) unsafe fn pio(
    file: &File,
    opcode: Opcode,
    local: u64,
    offset: u64,
    len: u64,
) -> Result<(), SliceError> {
    let fd = file.as_raw_fd();
    let mut done = 0u64;
    while done < len {
        let (ptr, rest, at) = (local + done, (len - done) as usize, offset + done);
        // SAFETY: the caller guarantees the memory range; `rest` stays inside it.
        let n = unsafe {
            match opcode {
                Opcode::Write => libc::pwrite(fd, ptr as *const libc::c_void, rest, at as i64),
                _ => libc::pread(fd, ptr as *mut libc::c_void, rest, at as i64),
            }
        };
        match n {
            0 => return Err(SliceError::Path(format!("end of file at offset {at}"))),
            n if n > 0 => done += n as u64,
            _ => {
                let e = std::io::Error::last_os_error();
                if e.kind() != std::io::ErrorKind::Interrupted {
                    return Err(SliceError::Path(format!(
                        "{} at offset {at}: {e}",
                        opcode.as_str()
                    )));
                }
            }
        }
    }
    Ok(())
}

fn worker(shared: Arc<Shared>) {
    let mut seen_poke = 0;
    loop {
        let group = match shared
            .queue
            .take(shared.options.max_io, true, &mut seen_poke)
        {
            Taken::Group(g) => g,
            Taken::Empty => continue,
            Taken::Closed => return,
        };
        for (group, file) in shared.prepare(group) {
            shared.counters.request(false, false);
            // SAFETY: every slice's local range lies in a region the engine pinned for its task
            // until the slice is reported, which happens after this call.
            let outcome = unsafe {
                pio(
                    &file.buffered,
                    group.opcode,
                    group.local,
                    group.offset,
                    group.len,
                )
            };
            shared.report(group.ops, outcome);
        }
    }
}

/// Buffered file I/O on worker threads.
pub struct BufIoTransport {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for BufIoTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BufIoTransport")
            .field("options", &self.shared.options)
            .finish()
    }
}

impl BufIoTransport {
    /// A buffered-I/O transport with `options` (`direct` is ignored).
    pub fn new(options: FileOptions) -> Self {
        BufIoTransport {
            shared: Arc::new(Shared::new(FileOptions {
                direct: false,
                ..options
            })),
        }
    }
}

impl BufIoTransport {
    /// Requests made so far.
    pub fn counts(&self) -> crate::IoCounts {
        self.shared.counters.snapshot()
    }
}

impl Transport for BufIoTransport {
    fn name(&self) -> &'static str {
        "bufio"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::DRAM_FILE
    }

    fn install(&self, ctx: InstallContext) -> te_core::Result<()> {
        self.shared.install(ctx.sink)?;
        for i in 0..self.shared.options.workers {
            let shared = self.shared.clone();
            let handle = std::thread::Builder::new()
                .name(format!("te-bufio-{i}"))
                .spawn(move || worker(shared))
                .map_err(|e| te_core::Error::Transport {
                    transport: "bufio",
                    reason: format!("spawning a worker: {e}"),
                })?;
            self.shared.threads.push(handle);
        }
        info!(
            workers = self.shared.options.workers,
            "buffered file I/O transport installed"
        );
        Ok(())
    }

    fn slice_size(&self, _target: &te_core::segment::RemoteSegment) -> Option<u64> {
        Some(self.shared.options.max_io)
    }

    fn post(&self, slices: Vec<SliceOp>) {
        self.shared.post(slices);
    }

    fn close_segment(&self, segment: &RemoteSegment) {
        self.shared.files.close(segment.id());
    }

    fn shutdown(&self) {
        self.shared.shutdown();
    }
}
