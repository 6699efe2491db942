//! The scheduling policy a Mooncake loop thread runs under while it serves a request: batch
//! (`SCHED_BATCH`) for WRITEs from an initiator on this host, the kernel's default
//! (`SCHED_OTHER`) otherwise; and the per-thread record that makes the system call only when
//! the policy a request wants differs from the thread's.
//!
//! Why: a Mooncake initiator on this host copies each WRITE's body into its socket on this
//! host's cores, and the loop wakes as the bytes arrive. Under the default policy the woken
//! loop preempts the sender, so the two take turns on one core request by request (and
//! Mooncake's initiator keeps a thread polling on another). A batch thread that wakes does not
//! preempt: the sender runs on until it sleeps, and the loop then takes what has come, more
//! requests per wake-up. READs keep the default: the loop copies their data while the
//! initiator waits for it. Where cores are free a woken thread runs at once under either
//! policy; the difference is only how a busy core is shared (`docs/tuning.md`).
//!
//! A thread is left alone if its policy was not the plain default when it first served a
//! request (the operator chose one: real-time, idle, batch, or the default with
//! `SCHED_RESET_ON_FORK`), or once a change is refused (a sandbox; logged once per thread).
//! `MC_TE_MOONCAKE_BATCH_LOCAL_WRITES=0` turns this off.
//!
//! Not here: the system calls themselves ([`crate::sys::thread_policy`],
//! [`crate::sys::set_thread_policy`]); te's own listeners, whose initiators do not poll.

use std::cell::RefCell;
use std::io;

use te_core::Opcode;
use tracing::warn;

/// A loop thread's policy while it serves a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Policy {
    /// The kernel's default (`SCHED_OTHER`): a woken thread may preempt the running one.
    Default,
    /// `SCHED_BATCH`: a woken thread waits for the running one.
    Batch,
}

/// The policy for serving `opcode` from a peer on this host (`on_host`) or not, with batch
/// for local WRITEs enabled or not.
pub(super) fn policy_for(opcode: Opcode, on_host: bool, enabled: bool) -> Policy {
    match enabled && on_host && opcode == Opcode::Write {
        true => Policy::Batch,
        false => Policy::Default,
    }
}

/// What one thread has been set to, and whether it may be set at all.
#[derive(Debug, Default)]
pub(super) struct Keeper {
    /// The policy this thread was last set to; `None` before its first request.
    current: Option<Policy>,
    /// Left alone: not the default policy at first, or a change was refused.
    hands_off: bool,
}

impl Keeper {
    /// The change to make for a request that wants `want`: `None` when the thread has it
    /// already or is left alone. `policy_now` (the thread's policy, read once, at the first
    /// request) says whether the thread is te's to set.
    pub(super) fn change(
        &mut self,
        want: Policy,
        policy_now: impl FnOnce() -> io::Result<libc::c_int>,
    ) -> Option<Policy> {
        if self.hands_off {
            return None;
        }
        let current = match self.current {
            Some(current) => current,
            None => match policy_now() {
                Ok(libc::SCHED_OTHER) => Policy::Default,
                _ => {
                    self.hands_off = true;
                    return None;
                }
            },
        };
        self.current = Some(current);
        (current != want).then_some(want)
    }

    /// The change to `to` was made.
    pub(super) fn changed(&mut self, to: Policy) {
        self.current = Some(to);
    }

    /// The change was refused: the thread is left as it is from now on.
    pub(super) fn refused(&mut self) {
        self.hands_off = true;
    }
}

thread_local! {
    static KEEPER: RefCell<Keeper> = RefCell::new(Keeper::default());
}

/// Puts the calling thread under `want` unless it is there already or left alone.
pub(super) fn serve_under(want: Policy) {
    KEEPER.with_borrow_mut(|keeper| {
        let Some(to) = keeper.change(want, crate::sys::thread_policy) else {
            return;
        };
        let policy = match to {
            Policy::Batch => libc::SCHED_BATCH,
            Policy::Default => libc::SCHED_OTHER,
        };
        match crate::sys::set_thread_policy(policy) {
            Ok(()) => keeper.changed(to),
            Err(e) => {
                keeper.refused();
                warn!(error = %e, "Mooncake-compatible listener: cannot change a loop thread's \
                    scheduling policy (MC_TE_MOONCAKE_BATCH_LOCAL_WRITES); it keeps its own");
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_writes_from_this_host_are_served_in_batch_and_only_when_enabled() {
        assert_eq!(policy_for(Opcode::Write, true, true), Policy::Batch);
        assert_eq!(policy_for(Opcode::Read, true, true), Policy::Default);
        assert_eq!(policy_for(Opcode::Write, false, true), Policy::Default);
        assert_eq!(policy_for(Opcode::Write, true, false), Policy::Default);
    }

    #[test]
    fn the_policy_is_changed_only_when_a_request_wants_another() {
        let mut keeper = Keeper::default();
        let mut asked = 0;
        let mut now = || {
            asked += 1;
            Ok(libc::SCHED_OTHER)
        };
        assert_eq!(keeper.change(Policy::Default, &mut now), None);
        assert_eq!(keeper.change(Policy::Batch, &mut now), Some(Policy::Batch));
        keeper.changed(Policy::Batch);
        assert_eq!(keeper.change(Policy::Batch, &mut now), None);
        assert_eq!(
            keeper.change(Policy::Default, &mut now),
            Some(Policy::Default)
        );
        keeper.changed(Policy::Default);
        assert_eq!(keeper.change(Policy::Default, &mut now), None);
        assert_eq!(asked, 1, "the thread's policy is read once");
    }

    #[test]
    fn a_thread_whose_policy_the_operator_chose_or_that_was_refused_is_left_alone() {
        for chosen in [
            libc::SCHED_IDLE,
            libc::SCHED_BATCH,
            libc::SCHED_FIFO,
            libc::SCHED_OTHER | libc::SCHED_RESET_ON_FORK,
        ] {
            let mut keeper = Keeper::default();
            assert_eq!(keeper.change(Policy::Batch, || Ok(chosen)), None);
            assert_eq!(keeper.change(Policy::Default, || Ok(chosen)), None);
        }
        let mut unreadable = Keeper::default();
        let denied = || Err(io::Error::from(io::ErrorKind::PermissionDenied));
        assert_eq!(unreadable.change(Policy::Batch, denied), None);
        let mut refused = Keeper::default();
        assert_eq!(
            refused.change(Policy::Batch, || Ok(libc::SCHED_OTHER)),
            Some(Policy::Batch)
        );
        refused.refused();
        assert_eq!(
            refused.change(Policy::Batch, || Ok(libc::SCHED_OTHER)),
            None
        );
        assert_eq!(
            refused.change(Policy::Default, || Ok(libc::SCHED_OTHER)),
            None
        );
    }

    /// The system calls on this machine's kernel: a thread of its own is put in batch and back.
    #[test]
    fn a_thread_is_put_in_batch_and_back_for_real() {
        std::thread::spawn(|| {
            assert_eq!(crate::sys::thread_policy().unwrap(), libc::SCHED_OTHER);
            serve_under(Policy::Batch);
            assert_eq!(crate::sys::thread_policy().unwrap(), libc::SCHED_BATCH);
            serve_under(Policy::Batch);
            assert_eq!(crate::sys::thread_policy().unwrap(), libc::SCHED_BATCH);
            serve_under(Policy::Default);
            assert_eq!(crate::sys::thread_policy().unwrap(), libc::SCHED_OTHER);
        })
        .join()
        .unwrap();
    }

    /// A thread the operator put in `SCHED_IDLE` (no privilege needed) stays there.
    #[test]
    fn a_thread_in_another_policy_is_not_touched_for_real() {
        std::thread::spawn(|| {
            crate::sys::set_thread_policy(libc::SCHED_IDLE).unwrap();
            serve_under(Policy::Batch);
            assert_eq!(crate::sys::thread_policy().unwrap(), libc::SCHED_IDLE);
            serve_under(Policy::Default);
            assert_eq!(crate::sys::thread_policy().unwrap(), libc::SCHED_IDLE);
        })
        .join()
        .unwrap();
    }
}
