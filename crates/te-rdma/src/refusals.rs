//! Failed endpoint set-ups, remembered so that a peer that is gone costs one handshake per
//! attempt, not one per slice.
//!
//! A batch of 1 GiB in 64 KiB slices is 16,384 slices. When its target dies, every slice
//! fails its queue pair, is retried, and each retry would otherwise make queue pairs and
//! dial the dead peer's control port on its own. Here a failed set-up from a local device to
//! a remote device of one descriptor is kept with the attempt number of the slice that made
//! it: later slices of the same or an earlier attempt get the same error at once, while the
//! first slice of the next attempt tries again (so each retry round still asks the peer once,
//! and a peer back within the round is found). A refusal belongs to the descriptor it was
//! made with (a fetched descriptor, after a restart, starts clean) and lapses after
//! [`HOLD`].
//!
//! Not here: the handshake itself, pausing devices, or which device a slice uses. Time is
//! passed in, so the decisions test without waiting.

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use te_core::transport::SliceError;

/// How long a refusal stands at most.
pub const HOLD: Duration = Duration::from_secs(1);

/// (segment id, local device, remote device).
type Key = (u64, usize, usize);

/// One failed set-up.
#[derive(Debug)]
struct Refusal<T> {
    /// The descriptor the set-up was made with.
    segment: Weak<T>,
    attempt: u32,
    at: Instant,
    error: SliceError,
}

/// Failed endpoint set-ups by (segment, local device, remote device); `T` is the descriptor.
#[derive(Debug)]
pub struct Refusals<T> {
    map: HashMap<Key, Refusal<T>>,
}

impl<T> Default for Refusals<T> {
    fn default() -> Self {
        Refusals {
            map: HashMap::new(),
        }
    }
}

impl<T> Refusals<T> {
    /// The error a slice on attempt `attempt` gets without asking the peer again: the refusal
    /// of a set-up to `key` with this very descriptor, on this attempt or a later one, less
    /// than [`HOLD`] ago.
    pub fn refused(
        &self,
        key: Key,
        segment: &Arc<T>,
        attempt: u32,
        now: Instant,
    ) -> Option<SliceError> {
        let r = self.map.get(&key)?;
        let same = std::ptr::eq(r.segment.as_ptr(), Arc::as_ptr(segment));
        (same && attempt <= r.attempt && now.saturating_duration_since(r.at) < HOLD)
            .then(|| r.error.clone())
    }

    /// Records that a set-up to `key` with `segment` failed with `error` for a slice on
    /// attempt `attempt`; drops refusals that lapsed or whose descriptor is gone.
    pub fn record(
        &mut self,
        key: Key,
        segment: &Arc<T>,
        attempt: u32,
        error: SliceError,
        now: Instant,
    ) {
        self.map.retain(|_, r| {
            r.segment.strong_count() > 0 && now.saturating_duration_since(r.at) < HOLD
        });
        self.map.insert(
            key,
            Refusal {
                segment: Arc::downgrade(segment),
                attempt,
                at: now,
                error,
            },
        );
    }

    /// Forgets the refusal of `key` (a set-up to it just worked).
    pub fn clear(&mut self, key: Key) {
        self.map.remove(&key);
    }

    /// Refusals held.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.map.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused() -> SliceError {
        SliceError::Path("connection refused".into())
    }

    #[test]
    fn one_set_up_per_attempt_and_descriptor() {
        let t0 = Instant::now();
        let seg = Arc::new("desc");
        let mut r = Refusals::default();
        assert_eq!(
            r.refused((1, 0, 0), &seg, 0, t0),
            None,
            "nothing refused yet"
        );
        r.record((1, 0, 0), &seg, 0, refused(), t0);
        assert_eq!(
            r.refused((1, 0, 0), &seg, 0, t0),
            Some(refused()),
            "the rest of the round fails at once"
        );
        assert_eq!(
            r.refused((1, 0, 0), &seg, 1, t0),
            None,
            "the next attempt asks again"
        );
        assert_eq!(
            r.refused((1, 0, 1), &seg, 0, t0),
            None,
            "another remote device"
        );
        assert_eq!(
            r.refused((1, 1, 0), &seg, 0, t0),
            None,
            "another local device"
        );
        assert_eq!(r.refused((2, 0, 0), &seg, 0, t0), None, "another segment");
        // The next attempt failed too: it holds for that attempt and the ones before.
        r.record((1, 0, 0), &seg, 1, refused(), t0);
        assert!(r.refused((1, 0, 0), &seg, 0, t0).is_some());
        assert!(r.refused((1, 0, 0), &seg, 1, t0).is_some());
        assert!(r.refused((1, 0, 0), &seg, 2, t0).is_none());
        // A descriptor fetched again (the peer restarted) starts clean.
        let fetched = Arc::new("desc");
        assert_eq!(r.refused((1, 0, 0), &fetched, 0, t0), None);
        // It lapses.
        assert!(r.refused((1, 0, 0), &seg, 0, t0 + HOLD / 2).is_some());
        assert_eq!(r.refused((1, 0, 0), &seg, 0, t0 + HOLD), None);
        // A set-up that worked clears it.
        r.clear((1, 0, 0));
        assert_eq!(r.refused((1, 0, 0), &seg, 0, t0), None);
    }

    #[test]
    fn lapsed_refusals_and_dropped_descriptors_are_not_kept() {
        let t0 = Instant::now();
        let mut r = Refusals::default();
        let gone = Arc::new(1u8);
        r.record((1, 0, 0), &gone, 0, refused(), t0);
        drop(gone);
        let old = Arc::new(2u8);
        r.record((2, 0, 0), &old, 0, refused(), t0);
        let live = Arc::new(3u8);
        r.record((3, 0, 0), &live, 0, refused(), t0 + HOLD);
        assert_eq!(r.len(), 1, "only the live, fresh refusal stays");
        assert!(r.refused((3, 0, 0), &live, 0, t0 + HOLD).is_some());
    }
}
