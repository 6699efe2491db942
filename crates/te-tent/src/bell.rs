//! The runtime's bell: how the progress thread learns that something happened (a task ended,
//! an attempt failed and its task waits for its next transport, work was submitted) without
//! asking on a timer. te-core tells it as the batches' [`TaskWatcher`].
//!
//! A thread takes a [`Ticket`] *before* it looks at the runtime's state, then sleeps on it: an
//! event after the ticket was taken ends the sleep at once, so none falls between the look and
//! the sleep. Events are counted, not consumed, so every sleeper sees each. A ticket hears what
//! its holder needs ([`Hearing`]): every end (tasks wait for room in the queue), or kicks only
//! (submits, failovers, the engine stopping). A ring costs an atomic add and a load or two
//! unless a sleeper hears it.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::Instant;

use te_core::{BatchId, TaskWatcher};

/// What a sleeper wants to be woken by, besides kicks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Hearing {
    /// Kicks only.
    Kicks,
    /// Every end.
    Every,
}

/// Events and their sleepers.
#[derive(Debug, Default)]
pub(crate) struct Bell {
    /// Ends so far, kicks so far.
    ends: AtomicU64,
    kicks: AtomicU64,
    /// Tickets that hear every end.
    every: AtomicUsize,
    lock: Mutex<()>,
    woken: Condvar,
    /// Ends of tasks that ran (posted or staged), not yet taken off the queue's count.
    ran: AtomicUsize,
    /// Tasks held again after a failed attempt, (batch, task), for their next transport;
    /// `any_held` set after each is added (a round with none takes no lock).
    held: Mutex<Vec<(u64, usize)>>,
    any_held: AtomicBool,
}

/// A sleeper's place: the events it has seen, and what it hears.
#[must_use]
pub(crate) struct Ticket<'a> {
    bell: &'a Bell,
    /// (ends, kicks) when it was taken.
    seen: [u64; 2],
    hearing: Hearing,
}

impl Bell {
    /// A ticket hearing `hearing`.
    pub(crate) fn ticket(&self, hearing: Hearing) -> Ticket<'_> {
        if hearing == Hearing::Every {
            self.every.fetch_add(1, Ordering::SeqCst);
        }
        Ticket {
            bell: self,
            // Read after the listener is counted: an event that missed the count is seen here.
            seen: self.seen(),
            hearing,
        }
    }

    /// A task ended: wakes those who hear it, if any.
    pub(crate) fn ring(&self) {
        self.ends.fetch_add(1, Ordering::SeqCst);
        if self.every.load(Ordering::SeqCst) > 0 {
            self.wake();
        }
    }

    /// Something every sleeper wants happened (work submitted, a failover due, the engine
    /// stopping).
    pub(crate) fn kick(&self) {
        self.kicks.fetch_add(1, Ordering::SeqCst);
        self.wake();
    }

    fn wake(&self) {
        // Taken so that a sleeper between its last look at the counts and its wait is waited for.
        drop(self.lock.lock().unwrap_or_else(|e| e.into_inner()));
        self.woken.notify_all();
    }

    /// Ends of tasks that ran, since the last call.
    pub(crate) fn take_ran(&self) -> usize {
        self.ran.swap(0, Ordering::AcqRel)
    }

    /// Tasks held again since the last call.
    pub(crate) fn take_held(&self) -> Vec<(u64, usize)> {
        if !self.any_held.swap(false, Ordering::AcqRel) {
            return Vec::new();
        }
        std::mem::take(&mut *self.held.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// (ends, kicks) so far.
    fn seen(&self) -> [u64; 2] {
        [&self.ends, &self.kicks].map(|n| n.load(Ordering::SeqCst))
    }
}

impl Ticket<'_> {
    /// Hears `hearing` from now on instead (ends since the ticket was taken count once it
    /// hears them).
    pub(crate) fn hear(&mut self, hearing: Hearing) {
        match (self.hearing, hearing) {
            (Hearing::Kicks, Hearing::Every) => {
                self.bell.every.fetch_add(1, Ordering::SeqCst);
            }
            (Hearing::Every, Hearing::Kicks) => {
                self.bell.every.fetch_sub(1, Ordering::SeqCst);
            }
            _ => {}
        }
        self.hearing = hearing;
    }

    /// Whether an event it hears came since it was taken.
    fn heard(&self) -> bool {
        let [ends, kicks] = self.bell.seen();
        kicks != self.seen[1] || (self.hearing == Hearing::Every && ends != self.seen[0])
    }

    /// Sleeps until an event it hears since the ticket was taken, or `until` (forever without
    /// one). Whether one came.
    pub(crate) fn sleep(self, until: Option<Instant>) -> bool {
        let bell = self.bell;
        let mut guard = bell.lock.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if self.heard() {
                return true;
            }
            guard = match until {
                None => bell.woken.wait(guard).unwrap_or_else(|e| e.into_inner()),
                Some(until) => {
                    let Some(left) = until.checked_duration_since(Instant::now()) else {
                        return false;
                    };
                    (bell.woken.wait_timeout(guard, left))
                        .unwrap_or_else(|e| e.into_inner())
                        .0
                }
            };
        }
    }
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        self.hear(Hearing::Kicks);
    }
}

/// te-core tells the bell of each end of a task of the runtime's batches, and of each task
/// held again (which the progress thread moves on to its next transport, whatever it hears).
impl TaskWatcher for Bell {
    fn task_ended(&self, _batch: BatchId, ran: bool) {
        if ran {
            self.ran.fetch_add(1, Ordering::AcqRel);
        }
        self.ring();
    }

    fn task_held(&self, batch: BatchId, task: usize) {
        self.held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((batch.raw(), task));
        self.any_held.store(true, Ordering::Release);
        self.ran.fetch_add(1, Ordering::AcqRel);
        self.kick();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn an_end_after_the_ticket_ends_the_sleep_and_one_before_does_not() {
        let bell = Bell::default();
        bell.ring();
        let t = bell.ticket(Hearing::Every);
        let soon = Instant::now() + Duration::from_millis(20);
        assert!(!t.sleep(Some(soon)), "an end before the ticket is not news");
        let t = bell.ticket(Hearing::Every);
        bell.ring();
        assert!(
            t.sleep(None),
            "an end between the look and the sleep is not lost"
        );
    }

    #[test]
    fn each_ticket_is_woken_by_what_it_hears_and_by_kicks() {
        let bell = Arc::new(Bell::default());
        // (hearing, whether an end wakes it)
        for (hearing, end_wakes) in [(Hearing::Every, true), (Hearing::Kicks, false)] {
            let (tx, rx) = std::sync::mpsc::channel();
            let b = bell.clone();
            let sleeper = std::thread::spawn(move || {
                let t = b.ticket(hearing);
                tx.send(()).unwrap();
                t.sleep(Some(Instant::now() + Duration::from_secs(30)))
            });
            rx.recv().unwrap();
            if !end_wakes {
                bell.task_ended(BatchId::from_raw(1), true);
                std::thread::sleep(Duration::from_millis(50));
                assert!(!sleeper.is_finished(), "{hearing:?}: slept through an end");
            }
            match end_wakes {
                true => bell.task_ended(BatchId::from_raw(1), true),
                false => bell.kick(),
            }
            assert!(sleeper.join().unwrap(), "{hearing:?}: woken");
        }
        assert_eq!(bell.every.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn a_held_task_kicks_and_is_kept_for_the_progress_thread() {
        let bell = Arc::new(Bell::default());
        let t = bell.ticket(Hearing::Kicks);
        bell.task_held(BatchId::from_raw(7), 3);
        bell.task_ended(BatchId::from_raw(7), false);
        assert!(t.sleep(None), "a held task kicks");
        assert_eq!(bell.take_held(), [(7, 3)]);
        assert!(bell.take_held().is_empty(), "taken once");
        assert_eq!(
            bell.take_ran(),
            1,
            "the failed attempt ran; the held end did not"
        );
        assert_eq!(bell.take_ran(), 0);
    }
}
