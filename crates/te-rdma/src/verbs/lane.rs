//! Completion lanes and device events: each worker's completion channel, CQs and wake-up
//! eventfd (arming, sleeping, waking), and the device's async events. Part of the verbs module:
//! the `unsafe` calls here are its raw calls around verbs (`poll(2)`, eventfd, the provider's
//! `req_notify_cq`, `ibv_get_cq_event`, `ibv_get_async_event`).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sideway::ibverbs::completion::{BasicCompletionQueue, CompletionChannel, CompletionQueue};
use sideway::ibverbs::device_context::DeviceContext;

use super::Nic;

/// One worker's completion side of a device: a completion channel, the CQs attached to it,
/// and an eventfd that wakes the worker when new work arrives while it sleeps.
pub struct Lane {
    pub(super) channel: Arc<CompletionChannel>,
    pub(super) cqs: Vec<Arc<BasicCompletionQueue>>,
    /// The CQ the next queue pair uses (round robin).
    pub(super) next_cq: AtomicUsize,
    /// Serialises polls (one worker polls a lane; tests may poll too).
    pub(super) poll: Mutex<()>,
    pub(super) wake: Signal,
    /// The worker is about to sleep or sleeping: posting must wake it.
    pub(super) sleeping: AtomicBool,
}

/// What the device reported asynchronously.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeviceEvent {
    /// The port went down (`IBV_EVENT_PORT_ERR`).
    PortDown,
    /// The port is active again (`IBV_EVENT_PORT_ACTIVE`).
    PortActive,
    /// The device failed or was removed (`IBV_EVENT_DEVICE_FATAL`).
    Fatal,
    /// Another event (QP, CQ or GID events), by name.
    Other(String),
}

impl Nic {
    /// Completion lanes of this device.
    pub fn lanes(&self) -> usize {
        self.lanes.len()
    }

    /// Whether the port is up and the device has not failed (async events keep this current).
    pub fn is_active(&self) -> bool {
        self.active.load(Ordering::Acquire)
    }

    /// Marks the device active or inactive (from its async events).
    pub fn set_active(&self, active: bool) {
        self.active.store(active, Ordering::Release);
    }

    /// Declares lane `lane`'s worker about to sleep: arms its CQs so the next completion
    /// signals the channel. The caller polls once more after this (a completion that arrived
    /// before arming raises no event), then calls [`sleep`](Self::sleep).
    pub fn prepare_sleep(&self, lane: usize) {
        let lane = &self.lanes[lane % self.lanes.len()];
        lane.sleeping.store(true, Ordering::SeqCst);
        for cq in &lane.cqs {
            // SAFETY: the CQ is alive (held by the lane); `req_notify_cq` is the provider's
            // entry point that `ibv_req_notify_cq` (a C inline) calls.
            unsafe {
                let raw = cq.cq().as_ptr();
                if let Some(notify) = (*(*raw).context).ops.req_notify_cq {
                    notify(raw, 0);
                }
            }
        }
    }

    /// Sleeps until a completion on lane `lane`, a [`wake`](Self::wake), or `timeout`; then
    /// drains and acknowledges the channel's events.
    pub fn sleep(&self, lane: usize, timeout: Duration) {
        let lane = &self.lanes[lane % self.lanes.len()];
        let mut fds = [
            libc::pollfd {
                fd: lane.channel.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: lane.wake.0.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: `fds` is a valid array of two pollfds for the duration of the call.
        unsafe { libc::poll(fds.as_mut_ptr(), 2, ms) };
        lane.sleeping.store(false, Ordering::SeqCst);
        if fds[1].revents != 0 {
            let mut count = 0u64;
            // SAFETY: reads 8 bytes into a u64 from the lane's eventfd (nonblocking).
            unsafe {
                libc::read(
                    lane.wake.0.as_raw_fd(),
                    (&mut count as *mut u64).cast(),
                    std::mem::size_of::<u64>(),
                )
            };
        }
        loop {
            let mut cq: *mut rdma_mummy_sys::ibv_cq = std::ptr::null_mut();
            let mut context: *mut std::ffi::c_void = std::ptr::null_mut();
            // SAFETY: the channel is alive and nonblocking; on success the event names one of
            // this lane's CQs, acknowledged at once so destroying it never waits.
            unsafe {
                let channel = lane.channel.comp_channel().as_ptr();
                if rdma_mummy_sys::ibv_get_cq_event(channel, &mut cq, &mut context) != 0 {
                    break;
                }
                rdma_mummy_sys::ibv_ack_cq_events(cq, 1);
            }
        }
    }

    /// Wakes lane `lane`'s worker if it sleeps (new work was queued).
    pub fn wake(&self, lane: usize) {
        let lane = &self.lanes[lane % self.lanes.len()];
        if lane.sleeping.load(Ordering::SeqCst) {
            lane.wake.raise();
        }
    }

    /// The device's next async event, waiting up to `timeout` or until `stop` is raised
    /// (`None`: nothing came).
    pub fn next_event(&self, timeout: Duration, stop: &Signal) -> Option<DeviceEvent> {
        use rdma_mummy_sys::ibv_event_type as T;
        // SAFETY: the context is open while `self.ctx` lives.
        let raw = unsafe { self.ctx.context().as_ptr() };
        // SAFETY: as above; only the fd is read.
        let fd = unsafe { (*raw).async_fd };
        let mut fds = [fd, stop.0.as_raw_fd()].map(|fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        });
        let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: two valid pollfds for the call.
        let ready = unsafe { libc::poll(fds.as_mut_ptr(), 2, ms) };
        if ready <= 0 || fds[0].revents & libc::POLLIN == 0 {
            return None;
        }
        // SAFETY: an all-zero `ibv_async_event` is a valid out-parameter (pointers and ints).
        let mut event: rdma_mummy_sys::ibv_async_event = unsafe { std::mem::zeroed() };
        // SAFETY: the fd is nonblocking, so this returns at once; the event is acknowledged
        // right after its type is read.
        let kind = unsafe {
            if rdma_mummy_sys::ibv_get_async_event(raw, &mut event) != 0 {
                return None;
            }
            let kind = event.event_type;
            rdma_mummy_sys::ibv_ack_async_event(&mut event);
            kind
        };
        Some(match kind {
            T::IBV_EVENT_PORT_ERR => DeviceEvent::PortDown,
            T::IBV_EVENT_PORT_ACTIVE => DeviceEvent::PortActive,
            T::IBV_EVENT_DEVICE_FATAL => DeviceEvent::Fatal,
            other => DeviceEvent::Other(format!("event {}", other as u32)),
        })
    }
}

impl Lane {
    pub(super) fn new(ctx: &Arc<DeviceContext>, cqs: usize, cqe: u32) -> Result<Lane, String> {
        let channel = CompletionChannel::new(ctx)
            .map_err(|e| format!("creating a completion channel: {e}"))?;
        channel
            .set_nonblocking(true)
            .map_err(|e| format!("completion channel: {e}"))?;
        let cqs = (0..cqs.max(1))
            .map(|_| {
                let mut builder = ctx.create_cq_builder();
                builder.setup_cqe(cqe).setup_comp_channel(&channel, 0);
                builder.build().map_err(|e| format!("creating a CQ: {e}"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Lane {
            channel,
            cqs,
            next_cq: AtomicUsize::new(0),
            poll: Mutex::new(()),
            wake: Signal::new()?,
            sleeping: AtomicBool::new(false),
        })
    }
}

/// An eventfd that a thread raises to wake another out of `poll(2)`. Reading it (as a lane's
/// sleep does) lowers it again; one never read stays raised.
pub struct Signal(OwnedFd);

impl Signal {
    /// A new, lowered signal.
    ///
    /// # Errors
    /// The eventfd could not be made.
    pub fn new() -> Result<Signal, String> {
        // SAFETY: eventfd has no memory arguments; a non-negative result is a new fd we own.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(format!("eventfd: {}", std::io::Error::last_os_error()));
        }
        // SAFETY: `fd` was just created and is owned by nothing else.
        Ok(Signal(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Raises it: whoever polls it wakes.
    pub fn raise(&self) {
        let one = 1u64;
        // SAFETY: writes 8 bytes from a u64 to the eventfd.
        unsafe {
            libc::write(
                self.0.as_raw_fd(),
                (&one as *const u64).cast(),
                std::mem::size_of::<u64>(),
            )
        };
    }
}

pub(super) fn set_nonblocking(fd: i32) -> std::io::Result<()> {
    // SAFETY: fcntl on an fd the device context owns; only its status flags change.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        if flags < 0 || libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}
