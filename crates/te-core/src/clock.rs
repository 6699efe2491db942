//! Where the engine's decisions get the time: the system clock, or a simulated one the
//! deterministic simulation advances by hand (te-testkit's `SimClock`). Task deadlines and rail
//! health read this clock; blocking waits still sleep in real time.

use std::fmt::Debug;
use std::time::Instant;

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
