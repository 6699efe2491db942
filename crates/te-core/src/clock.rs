//! Where the engine's decisions get the time: the system clock, or a simulated one the
//! deterministic simulation advances by hand. Task deadlines and rail health read this clock;
//! blocking waits still sleep in real time.

use std::fmt::Debug;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A source of "now".
pub trait Clock: Send + Sync + Debug {
    /// The current time.
    fn now(&self) -> Instant;
}

/// The system's monotonic clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }
}

/// A clock that stands still until advanced.
#[derive(Debug)]
pub struct SimClock {
    base: Instant,
    offset_nanos: AtomicU64,
}

impl Default for SimClock {
    fn default() -> Self {
        SimClock {
            base: Instant::now(),
            offset_nanos: AtomicU64::new(0),
        }
    }
}

impl SimClock {
    /// A clock at an arbitrary start.
    pub fn new() -> Self {
        Self::default()
    }

    /// Moves the clock forward by `d`.
    pub fn advance(&self, d: Duration) {
        let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.offset_nanos.fetch_add(nanos, Ordering::AcqRel);
    }
}

impl Clock for SimClock {
    fn now(&self) -> Instant {
        self.base + Duration::from_nanos(self.offset_nanos.load(Ordering::Acquire))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sim_clock_moves_only_when_advanced() {
        let c = SimClock::new();
        let t0 = c.now();
        assert_eq!(c.now(), t0);
        c.advance(Duration::from_secs(3));
        assert_eq!(c.now() - t0, Duration::from_secs(3));
    }
}
