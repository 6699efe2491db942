//! [`UringTransport`]: file segments through io_uring. Each worker thread owns one ring, made at
//! install and reused for every batch; it keeps up to `depth` requests in flight, continues
//! short transfers, and falls back to the buffered descriptor when the device refuses an
//! `O_DIRECT` request. Registered memory is registered with each ring as fixed buffers while the
//! worker is idle, and used only while that table matches the engine's regions.

#![allow(unsafe_code)] // te-uring's boundary: the ring's submissions and registered buffers

use std::collections::VecDeque;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use io_uring::{IoUring, Probe, opcode, squeue, types};
use te_core::Opcode;
use te_core::memory::Region;
use te_core::segment::RemoteSegment;
use te_core::transport::{Capabilities, InstallContext, SliceError, SliceOp, Transport};
use tracing::{debug, info, warn};

use crate::files::OpenFile;
use crate::plan::Group;
use crate::queue::Taken;
use crate::{FileOptions, Shared};

/// Largest fixed buffer the kernel accepts.
const MAX_FIXED: u64 = 1 << 30;
/// Fixed buffers per ring.
const MAX_FIXED_BUFFERS: usize = 1024;

/// What the kernel's io_uring offers, from [`probe`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UringSupport {
    /// `IORING_OP_READ_FIXED` and `IORING_OP_WRITE_FIXED` are there.
    pub fixed_buffers: bool,
}

/// Checks that io_uring can be set up here and has the opcodes te needs.
///
/// # Errors
/// Why not: `io_uring_setup` failed (missing, `kernel.io_uring_disabled`, a seccomp profile), or
/// the kernel lacks `IORING_OP_READ` / `IORING_OP_WRITE`.
pub fn probe() -> Result<UringSupport, String> {
    let ring: IoUring = IoUring::new(4).map_err(|e| format!("io_uring_setup: {e}"))?;
    let mut p = Probe::new();
    ring.submitter()
        .register_probe(&mut p)
        .map_err(|e| format!("IORING_REGISTER_PROBE: {e}"))?;
    if !p.is_supported(opcode::Read::CODE) || !p.is_supported(opcode::Write::CODE) {
        return Err("the kernel's io_uring lacks IORING_OP_READ/WRITE".into());
    }
    Ok(UringSupport {
        fixed_buffers: p.is_supported(opcode::ReadFixed::CODE)
            && p.is_supported(opcode::WriteFixed::CODE),
    })
}

/// The engine's registered regions, with a version bumped on every change.
#[derive(Default)]
struct Regions {
    list: Mutex<Vec<(u64, u64)>>,
    version: AtomicU64,
}

impl Regions {
    fn change(&self, f: impl FnOnce(&mut Vec<(u64, u64)>)) {
        let mut list = self.list.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut list);
        self.version.fetch_add(1, Ordering::AcqRel);
    }
}

/// One request in flight.
struct Flight {
    group: Group<SliceOp>,
    file: Arc<OpenFile>,
    done: u64,
    direct: bool,
}

/// A worker's ring and what it has registered with it.
struct Ring {
    ring: IoUring,
    fixed: Vec<(u64, u64)>,
    fixed_version: u64,
    use_fixed: bool,
}

impl Ring {
    /// Re-registers the engine's regions as fixed buffers when they changed.
    fn refresh(&mut self, regions: &Regions) {
        if !self.use_fixed {
            return;
        }
        let list = regions.list.lock().unwrap_or_else(|e| e.into_inner());
        let version = regions.version.load(Ordering::Acquire);
        if version == self.fixed_version {
            return;
        }
        if !self.fixed.is_empty() {
            let _ = self.ring.submitter().unregister_buffers();
            self.fixed.clear();
        }
        let wanted: Vec<(u64, u64)> = list
            .iter()
            .copied()
            .filter(|&(_, len)| len <= MAX_FIXED)
            .take(MAX_FIXED_BUFFERS)
            .collect();
        drop(list);
        if !wanted.is_empty() {
            let iovecs: Vec<libc::iovec> = wanted
                .iter()
                .map(|&(addr, len)| libc::iovec {
                    iov_base: addr as *mut libc::c_void,
                    iov_len: len as usize,
                })
                .collect();
            // SAFETY: each range is a region the engine holds registered (memory of this
            // process); the kernel pins it until these buffers are unregistered, and a fixed
            // index is used only while the table matches the engine's regions.
            match unsafe { self.ring.submitter().register_buffers(&iovecs) } {
                Ok(()) => self.fixed = wanted,
                Err(e) => debug!(error = %e, "fixed buffers refused; plain reads and writes"),
            }
        }
        self.fixed_version = version;
    }

    /// The fixed buffer holding `[addr, addr+len)`, while the table is current.
    fn fixed_index(&self, regions: &Regions, addr: u64, len: u64) -> Option<u16> {
        if self.fixed.is_empty() || regions.version.load(Ordering::Acquire) != self.fixed_version {
            return None;
        }
        self.fixed
            .iter()
            .position(|&(a, l)| addr >= a && addr + len <= a + l)
            .map(|i| i as u16)
    }

    /// Queues the rest of `flight` as one request tagged `slot`.
    fn push(&mut self, shared: &Shared, regions: &Regions, slot: usize, flight: &Flight) {
        let g = &flight.group;
        let (ptr, off) = (g.local + flight.done, g.offset + flight.done);
        let len = (g.len - flight.done).min(MAX_FIXED) as u32;
        let fd = match (flight.direct, &flight.file.direct) {
            (true, Some(d)) => d.as_raw_fd(),
            _ => flight.file.buffered.as_raw_fd(),
        };
        let fd = types::Fd(fd);
        let fixed = self.fixed_index(regions, ptr, len as u64);
        shared.counters.request(
            flight.direct && flight.file.direct.is_some(),
            fixed.is_some(),
        );
        let entry: squeue::Entry = match (g.opcode, fixed) {
            (Opcode::Write, Some(i)) => opcode::WriteFixed::new(fd, ptr as *const u8, len, i)
                .offset(off)
                .build(),
            (Opcode::Write, None) => opcode::Write::new(fd, ptr as *const u8, len)
                .offset(off)
                .build(),
            (_, Some(i)) => opcode::ReadFixed::new(fd, ptr as *mut u8, len, i)
                .offset(off)
                .build(),
            (_, None) => opcode::Read::new(fd, ptr as *mut u8, len)
                .offset(off)
                .build(),
        };
        let entry = entry.user_data(slot as u64);
        // SAFETY: the memory range is pinned by the engine until the slices are reported (after
        // the completion), the descriptor is kept open by `flight.file`, and the queue has room:
        // at most `depth` requests are in flight and the ring has `depth` entries.
        let pushed = unsafe { self.ring.submission().push(&entry) };
        debug_assert!(pushed.is_ok(), "submission queue full");
    }
}

fn worker(shared: Arc<Shared>, regions: Arc<Regions>, mut ring: Ring) {
    let depth = shared.options.depth as usize;
    let mut slots: Vec<Option<Flight>> = (0..depth).map(|_| None).collect();
    let mut free: Vec<usize> = (0..depth).rev().collect();
    let mut seen_poke = 0u64;
    let mut backlog: VecDeque<(Group<SliceOp>, Arc<OpenFile>)> = VecDeque::new();
    loop {
        // Fill the ring; wait for work only when nothing is in flight.
        while let Some(slot) = free.pop() {
            if let Some((group, file)) = backlog.pop_front() {
                let direct = file.direct_fits(group.local, group.offset, group.len);
                let flight = Flight {
                    group,
                    file,
                    done: 0,
                    direct,
                };
                ring.push(&shared, &regions, slot, &flight);
                slots[slot] = Some(flight);
                continue;
            }
            free.push(slot);
            let idle = free.len() == depth;
            if idle {
                ring.refresh(&regions);
            }
            match shared
                .queue
                .take(shared.options.max_io, idle, &mut seen_poke)
            {
                Taken::Group(g) => backlog.extend(shared.prepare(g)),
                Taken::Empty => break,
                Taken::Closed if idle => return,
                Taken::Closed => break,
            }
        }
        if free.len() == depth {
            continue;
        }
        if let Err(e) = ring.ring.submit_and_wait(1) {
            if e.raw_os_error() != Some(libc::EINTR) && e.raw_os_error() != Some(libc::EBUSY) {
                // Requests already in the kernel may still touch memory: never report them
                // before their completions. Wait and try again (EAGAIN, ENOMEM pass).
                warn!(error = %e, "io_uring_enter failed; retrying");
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
        let done: Vec<(u64, i32)> = ring
            .ring
            .completion()
            .map(|c| (c.user_data(), c.result()))
            .collect();
        for (slot, res) in done {
            let slot = slot as usize;
            let Some(mut flight) = slots.get_mut(slot).and_then(Option::take) else {
                continue;
            };
            let remaining = flight.group.len - flight.done;
            let next = match res {
                r if r < 0 && -r == libc::EINVAL && flight.direct => {
                    // The device wants a stricter alignment than ours: go buffered.
                    debug!("O_DIRECT refused; buffered");
                    flight.direct = false;
                    Ok(true)
                }
                r if r < 0 && (-r == libc::EINTR || -r == libc::EAGAIN) => Ok(true),
                r if r < 0 => Err(format!(
                    "{} at offset {}: {}",
                    flight.group.opcode.as_str(),
                    flight.group.offset + flight.done,
                    std::io::Error::from_raw_os_error(-r)
                )),
                0 => Err(format!(
                    "end of file at offset {}",
                    flight.group.offset + flight.done
                )),
                n if (n as u64) < remaining => {
                    flight.done += n as u64;
                    // A short direct transfer may leave an unaligned rest: finish it buffered.
                    flight.direct = flight.direct
                        && flight.file.direct_fits(
                            flight.group.local + flight.done,
                            flight.group.offset + flight.done,
                            flight.group.len - flight.done,
                        );
                    Ok(true)
                }
                _ => Ok(false),
            };
            match next {
                Ok(true) => {
                    ring.push(&shared, &regions, slot, &flight);
                    slots[slot] = Some(flight);
                }
                Ok(false) => {
                    free.push(slot);
                    shared.report(flight.group.ops, Ok(()));
                }
                Err(reason) => {
                    free.push(slot);
                    shared.report(flight.group.ops, Err(SliceError::Path(reason)));
                }
            }
        }
    }
}

/// File segments through io_uring.
pub struct UringTransport {
    shared: Arc<Shared>,
    regions: Arc<Regions>,
    support: UringSupport,
}

impl std::fmt::Debug for UringTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UringTransport")
            .field("options", &self.shared.options)
            .field("support", &self.support)
            .finish()
    }
}

impl UringTransport {
    /// Probes the kernel and makes the transport.
    ///
    /// # Errors
    /// [`te_core::Error::Transport`] when io_uring is unavailable (see [`probe`]).
    pub fn new(options: FileOptions) -> te_core::Result<Self> {
        let support = probe().map_err(|reason| te_core::Error::Transport {
            transport: "uring",
            reason,
        })?;
        Ok(Self::with_support(options, support))
    }

    /// Makes the transport for a kernel already probed.
    pub fn with_support(options: FileOptions, support: UringSupport) -> Self {
        UringTransport {
            shared: Arc::new(Shared::new(options)),
            regions: Arc::new(Regions::default()),
            support,
        }
    }
}

impl UringTransport {
    /// Requests made so far.
    pub fn counts(&self) -> crate::IoCounts {
        self.shared.counters.snapshot()
    }
}

impl Transport for UringTransport {
    fn name(&self) -> &'static str {
        "uring"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::DRAM_FILE
    }

    fn install(&self, ctx: InstallContext) -> te_core::Result<()> {
        let fail = |reason: String| te_core::Error::Transport {
            transport: "uring",
            reason,
        };
        let depth = self.shared.options.depth;
        let mut rings = Vec::with_capacity(self.shared.options.workers);
        for _ in 0..self.shared.options.workers {
            let ring = IoUring::new(depth).map_err(|e| fail(format!("io_uring_setup: {e}")))?;
            rings.push(Ring {
                ring,
                fixed: Vec::new(),
                fixed_version: u64::MAX,
                use_fixed: self.support.fixed_buffers,
            });
        }
        self.shared.install(ctx.sink)?;
        for (i, ring) in rings.into_iter().enumerate() {
            let (shared, regions) = (self.shared.clone(), self.regions.clone());
            let handle = std::thread::Builder::new()
                .name(format!("te-uring-{i}"))
                .spawn(move || worker(shared, regions, ring))
                .map_err(|e| fail(format!("spawning a worker: {e}")))?;
            self.shared.threads.push(handle);
        }
        info!(
            workers = self.shared.options.workers,
            depth,
            direct = self.shared.options.direct,
            fixed_buffers = self.support.fixed_buffers,
            "io_uring file transport installed"
        );
        Ok(())
    }

    fn register(&self, region: &Arc<Region>) -> te_core::Result<()> {
        let (addr, len) = (region.addr(), region.len());
        self.regions.change(|l| l.push((addr, len)));
        Ok(())
    }

    fn unregister(&self, region: &Region) {
        let addr = region.addr();
        self.regions.change(|l| l.retain(|&(a, _)| a != addr));
        // Idle workers drop their pins on the region's pages now, not at the next transfer.
        self.shared.queue.poke();
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
