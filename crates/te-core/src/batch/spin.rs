//! Whether a waiting thread polls before it sleeps, learnt from how its recent polls ended.
//!
//! A poll pays when the batch ends within it: a sleep and a wake-up cost more than the poll
//! (memory transports, whose small copies end in microseconds; a network with cores to spare).
//! It costs when the batch outlasts it: the polling thread takes a core from the threads that
//! would end the batch (a TCP loopback on two cores, where the poll doubled a 4 KiB
//! round trip). So each poll's ending is scored: one that saw the batch end earns a point, one
//! that ran out loses [`LOSS`]; waits poll while the score is above zero, and with none left
//! every [`PROBE_EVERY`]th wait polls anyway, so a workload that changes is noticed.
//!
//! Pure bookkeeping, shared by every waiter of one engine through atomics; no clock, no I/O.

use std::sync::atomic::{AtomicU32, Ordering};

/// The score's ceiling: how many polls that ran out in a row it takes (with [`LOSS`]) to stop.
const MAX: u32 = 8;
/// What a poll that ran out costs the score; one that paid earns 1, so polling goes on only
/// while at least three polls in four pay.
const LOSS: u32 = 3;
/// With no score left, one wait in this many polls anyway.
const PROBE_EVERY: u32 = 16;

/// The score of one engine's polls.
#[derive(Debug)]
pub(crate) struct SpinGauge {
    score: AtomicU32,
    /// Waits that found no score, for the probes.
    idle: AtomicU32,
}

impl Default for SpinGauge {
    /// Polling at first, as if the last few polls had paid.
    fn default() -> Self {
        SpinGauge {
            score: AtomicU32::new(MAX / 2),
            idle: AtomicU32::new(0),
        }
    }
}

impl SpinGauge {
    /// Whether this wait polls before it sleeps.
    pub(crate) fn should_poll(&self) -> bool {
        self.score.load(Ordering::Relaxed) > 0
            || self.idle.fetch_add(1, Ordering::Relaxed) % PROBE_EVERY == PROBE_EVERY - 1
    }

    /// How a poll ended: `paid` when the batch ended within it.
    pub(crate) fn record(&self, paid: bool) {
        let _ = self
            .score
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |s| {
                Some(match paid {
                    true => (s + 1).min(MAX),
                    false => s.saturating_sub(LOSS),
                })
            });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn polls_in(g: &SpinGauge, waits: u32) -> u32 {
        (0..waits).filter(|_| g.should_poll()).count() as u32
    }

    #[test]
    fn polls_that_pay_keep_it_polling() {
        let g = SpinGauge::default();
        for _ in 0..100 {
            assert!(g.should_poll());
            g.record(true);
        }
        // Three in four paying keeps it polling...
        for _ in 0..30 {
            g.record(true);
            g.record(true);
            g.record(true);
            g.record(false);
            assert!(g.score.load(Ordering::Relaxed) > 0);
        }
        // ...two in three does not.
        for _ in 0..30 {
            g.record(true);
            g.record(true);
            g.record(false);
        }
        assert_eq!(g.score.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn polls_that_run_out_stop_it_but_for_a_probe_now_and_then() {
        let g = SpinGauge::default();
        assert!(g.should_poll(), "a new engine polls");
        g.record(false);
        g.record(false);
        assert!(
            !g.should_poll(),
            "two polls that ran out, from the starting score"
        );
        assert_eq!(polls_in(&g, 15), 1, "one probe in every 16 waits");
        assert_eq!(polls_in(&g, 160), 10);
        // Mostly losing: paying once in three never builds a score.
        for _ in 0..30 {
            g.record(true);
            g.record(false);
            g.record(false);
        }
        assert_eq!(polls_in(&g, 16), 1);
        // A probe that pays brings polling back.
        g.record(true);
        assert!(g.should_poll());
        assert!(g.should_poll());
    }
}
