//! [`SimClock`]: a clock that stands still until the test advances it, for the deterministic
//! simulation (te-core's engine reads it for deadlines and rail health).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use te_core::clock::Clock;

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
