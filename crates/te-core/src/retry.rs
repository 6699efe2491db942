//! The retry decision for a failed slice: a pure function of the attempt count and the error.
//!
//! This is the seam the failover policy (rail health, re-routing) grows from; today it retries
//! path failures on the same transport up to `MC_RETRY_CNT` times and never retries a
//! target's rejection or a cancellation.

use crate::transport::SliceError;

/// How many times a slice may be tried again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    retries_max: u32,
}

impl RetryPolicy {
    /// A policy allowing `retries_max` attempts after the first.
    pub fn new(retries_max: u32) -> Self {
        RetryPolicy { retries_max }
    }

    /// Whether a slice that failed with `error` on its attempt number `attempt` (0 = first)
    /// should be posted again.
    pub fn should_retry(&self, attempt: u32, error: &SliceError) -> bool {
        error.is_retryable() && attempt < self.retries_max
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::Rejection;

    #[test]
    fn retries_path_failures_up_to_the_limit_only() {
        let p = RetryPolicy::new(2);
        let path = SliceError::Path("reset".into());
        assert!(p.should_retry(0, &path));
        assert!(p.should_retry(1, &path));
        assert!(!p.should_retry(2, &path));
        assert!(!p.should_retry(0, &SliceError::Rejected(Rejection::OutOfBounds)));
        assert!(!p.should_retry(0, &SliceError::Canceled));
    }
}
