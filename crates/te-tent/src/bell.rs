//! The runtime's bell: how the progress thread and waiters learn that something happened (a
//! task ended on its transport, a staged job ended, work was submitted) without asking on a
//! timer.
//!
//! A thread takes a [`Ticket`] *before* it looks at the runtime's state, then sleeps on it: an
//! event after the ticket was taken ends the sleep at once, so none falls between the look and
//! the sleep. Events are counted, not consumed, so every sleeper sees each. A ticket hears what
//! its holder needs ([`Hearing`]): every end (tasks wait for room in the queue), decisive ends
//! only (a failure to fail over, a batch's end to announce), or kicks only. A ring costs an
//! atomic add and a load or two unless a sleeper hears it.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::Instant;

use te_core::{BatchId, TaskWatcher};

/// What a sleeper wants to be woken by, besides kicks (submits, the engine stopping).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Hearing {
    /// Kicks only.
    Kicks,
    /// Decisive ends: a task failed, a SubBatch's last task ended, a staged job ended.
    Decisive,
    /// Every end.
    Every,
}

/// Events and their sleepers.
#[derive(Debug, Default)]
pub(crate) struct Bell {
    /// Ends so far, decisive ends so far, kicks so far.
    ends: AtomicU64,
    decisive: AtomicU64,
    kicks: AtomicU64,
    /// Tickets that hear every end, and those that hear decisive ones only.
    every: AtomicUsize,
    decisive_only: AtomicUsize,
    lock: Mutex<()>,
    woken: Condvar,
}

/// A sleeper's place: the events it has seen, and what it hears.
#[must_use]
pub(crate) struct Ticket<'a> {
    bell: &'a Bell,
    /// (ends, decisive ends, kicks) when it was taken.
    seen: [u64; 3],
    hearing: Hearing,
}

impl Bell {
    /// A ticket hearing `hearing`.
    pub(crate) fn ticket(&self, hearing: Hearing) -> Ticket<'_> {
        self.listeners(hearing)
            .map(|n| n.fetch_add(1, Ordering::SeqCst));
        Ticket {
            bell: self,
            // Read after the listener is counted: an event that missed the count is seen here.
            seen: self.seen(),
            hearing,
        }
    }

    fn listeners(&self, hearing: Hearing) -> Option<&AtomicUsize> {
        match hearing {
            Hearing::Kicks => None,
            Hearing::Decisive => Some(&self.decisive_only),
            Hearing::Every => Some(&self.every),
        }
    }

    /// A task ended (`decisive`: see [`Hearing::Decisive`]): wakes those who hear it, if any.
    pub(crate) fn ring(&self, decisive: bool) {
        self.ends.fetch_add(1, Ordering::SeqCst);
        if decisive {
            self.decisive.fetch_add(1, Ordering::SeqCst);
        }
        let heard = self.every.load(Ordering::SeqCst) > 0
            || (decisive && self.decisive_only.load(Ordering::SeqCst) > 0);
        if heard {
            self.wake();
        }
    }

    /// Something every sleeper wants happened (work submitted, the engine stopping).
    pub(crate) fn kick(&self) {
        self.kicks.fetch_add(1, Ordering::SeqCst);
        self.wake();
    }

    fn wake(&self) {
        // Taken so that a sleeper between its last look at the counts and its wait is waited for.
        drop(self.lock.lock().unwrap_or_else(|e| e.into_inner()));
        self.woken.notify_all();
    }

    /// (ends, decisive ends, kicks) so far.
    fn seen(&self) -> [u64; 3] {
        [&self.ends, &self.decisive, &self.kicks].map(|n| n.load(Ordering::SeqCst))
    }
}

impl Ticket<'_> {
    /// Hears `hearing` from now on instead (events it no longer hears stop counting, events
    /// since the ticket was taken that it now hears count).
    pub(crate) fn hear(&mut self, hearing: Hearing) {
        if hearing != self.hearing {
            self.bell
                .listeners(hearing)
                .map(|n| n.fetch_add(1, Ordering::SeqCst));
            self.bell
                .listeners(self.hearing)
                .map(|n| n.fetch_sub(1, Ordering::SeqCst));
            self.hearing = hearing;
        }
    }

    /// Whether an event it hears came since it was taken.
    fn heard(&self) -> bool {
        let [ends, decisive, kicks] = self.bell.seen();
        kicks != self.seen[2]
            || match self.hearing {
                Hearing::Kicks => false,
                Hearing::Decisive => decisive != self.seen[1],
                Hearing::Every => ends != self.seen[0],
            }
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

/// te-core tells the bell of each end of a SubBatch's task.
impl TaskWatcher for Bell {
    fn task_ended(&self, _batch: BatchId, decisive: bool) {
        self.ring(decisive);
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
        bell.ring(true);
        let t = bell.ticket(Hearing::Every);
        let soon = Instant::now() + Duration::from_millis(20);
        assert!(!t.sleep(Some(soon)), "an end before the ticket is not news");
        let t = bell.ticket(Hearing::Every);
        bell.ring(false);
        assert!(
            t.sleep(None),
            "an end between the look and the sleep is not lost"
        );
    }

    #[test]
    fn each_ticket_is_woken_by_what_it_hears_and_by_kicks() {
        let bell = Arc::new(Bell::default());
        // (hearing, the ends that must not wake it, the end that must)
        let cases = [
            (Hearing::Every, vec![], Some(false)),
            (Hearing::Decisive, vec![false], Some(true)),
            (Hearing::Kicks, vec![false, true], None),
        ];
        for (hearing, unheard, heard) in cases {
            let (tx, rx) = std::sync::mpsc::channel();
            let b = bell.clone();
            let sleeper = std::thread::spawn(move || {
                let t = b.ticket(hearing);
                tx.send(()).unwrap();
                t.sleep(Some(Instant::now() + Duration::from_secs(30)))
            });
            rx.recv().unwrap();
            for decisive in unheard {
                bell.task_ended(BatchId::from_raw(1), decisive);
            }
            std::thread::sleep(Duration::from_millis(50));
            assert!(
                !sleeper.is_finished(),
                "{hearing:?}: slept through what it does not hear"
            );
            match heard {
                Some(decisive) => bell.task_ended(BatchId::from_raw(1), decisive),
                None => bell.kick(),
            }
            assert!(sleeper.join().unwrap(), "{hearing:?}: woken");
        }
        assert_eq!(bell.every.load(Ordering::SeqCst), 0);
        assert_eq!(bell.decisive_only.load(Ordering::SeqCst), 0);
    }
}
