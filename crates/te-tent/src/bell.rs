//! The runtime's bell: how the progress thread and waiters learn that something happened (a
//! task ended on its transport, a staged job ended, work was submitted) without asking on a
//! timer.
//!
//! A thread takes a [`Ticket`] *before* it looks at the runtime's state, then sleeps on it: a
//! ring after the ticket was taken ends the sleep at once, so no event falls between the look
//! and the sleep. Rings are counted, not consumed, so every sleeper sees each. A ring costs one
//! atomic add and one load unless a sleeper listens: task ends, the common ring, wake only
//! threads that asked for them.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::Instant;

use te_core::{BatchId, TaskWatcher};

/// Rings and their sleepers.
#[derive(Debug, Default)]
pub(crate) struct Bell {
    /// Task ends so far.
    rings: AtomicU64,
    /// Kicks so far.
    kicks: AtomicU64,
    /// Tickets that want task ends.
    listeners: AtomicUsize,
    lock: Mutex<()>,
    woken: Condvar,
}

/// A sleeper's place: the rings it has seen.
#[must_use]
pub(crate) struct Ticket<'a> {
    bell: &'a Bell,
    /// (rings, kicks) when it was taken.
    seen: (u64, u64),
    listening: bool,
}

impl Bell {
    /// A ticket; `listen`: task ends wake it (else only [`kick`](Self::kick)s do).
    pub(crate) fn ticket(&self, listen: bool) -> Ticket<'_> {
        if listen {
            self.listeners.fetch_add(1, Ordering::SeqCst);
        }
        Ticket {
            bell: self,
            // Read after the listener is counted: a ring that missed the count is seen here.
            seen: self.seen(),
            listening: listen,
        }
    }

    /// Something listeners want happened (a task ended): wakes them, if any.
    pub(crate) fn ring(&self) {
        self.rings.fetch_add(1, Ordering::SeqCst);
        if self.listeners.load(Ordering::SeqCst) > 0 {
            self.wake();
        }
    }

    /// Something every sleeper wants happened (work submitted, the engine stopping).
    pub(crate) fn kick(&self) {
        self.kicks.fetch_add(1, Ordering::SeqCst);
        self.wake();
    }

    fn wake(&self) {
        // Taken so that a sleeper between its last look at `rings` and its wait is waited for.
        drop(self.lock.lock().unwrap_or_else(|e| e.into_inner()));
        self.woken.notify_all();
    }

    /// (rings, kicks) so far.
    fn seen(&self) -> (u64, u64) {
        (
            self.rings.load(Ordering::SeqCst),
            self.kicks.load(Ordering::SeqCst),
        )
    }
}

impl Ticket<'_> {
    /// Stops listening to task ends (kicks still wake it).
    pub(crate) fn deafen(&mut self) {
        if std::mem::take(&mut self.listening) {
            self.bell.listeners.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// Sleeps until a kick (or, listening, a ring) after the ticket was taken, or `until`
    /// (forever without one). Whether one came.
    pub(crate) fn sleep(self, until: Option<Instant>) -> bool {
        let bell = self.bell;
        let mut guard = bell.lock.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            let (rings, kicks) = bell.seen();
            if kicks != self.seen.1 || (self.listening && rings != self.seen.0) {
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
        self.deafen();
    }
}

/// te-core tells the bell of each end of a SubBatch's task.
impl TaskWatcher for Bell {
    fn task_ended(&self, _batch: BatchId) {
        self.ring();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn a_ring_after_the_ticket_ends_the_sleep_and_one_before_does_not() {
        let bell = Bell::default();
        bell.ring();
        let t = bell.ticket(true);
        let soon = Instant::now() + Duration::from_millis(20);
        assert!(!t.sleep(Some(soon)), "a ring before the ticket is not news");
        let t = bell.ticket(true);
        bell.ring();
        assert!(
            t.sleep(None),
            "a ring between the look and the sleep is not lost"
        );
    }

    #[test]
    fn task_ends_wake_listeners_and_kicks_wake_everyone() {
        let bell = Arc::new(Bell::default());
        for listen in [true, false] {
            let (tx, rx) = std::sync::mpsc::channel();
            let b = bell.clone();
            let sleeper = std::thread::spawn(move || {
                let t = b.ticket(listen);
                tx.send(()).unwrap();
                t.sleep(Some(Instant::now() + Duration::from_secs(30)))
            });
            rx.recv().unwrap();
            // A task end: a listener wakes; a deaf sleeper is not woken (only a kick wakes it).
            bell.task_ended(BatchId::from_raw(1));
            if !listen {
                std::thread::sleep(Duration::from_millis(50));
                assert!(!sleeper.is_finished(), "a deaf sleeper slept on");
                bell.kick();
            }
            assert!(sleeper.join().unwrap(), "listen={listen}: woken by a ring");
        }
        assert_eq!(bell.listeners.load(Ordering::SeqCst), 0);
    }
}
