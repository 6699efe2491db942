//! Which device a slice uses, kept apart from the verbs calls: a device (local) or a remote
//! device of a segment that just failed is paused for `MC_RDMA_RAIL_PAUSE_SECONDS`, and slices
//! go to the next device that is not paused, wrapping around (all paused: the preferred one,
//! so an error says what is wrong). Time is passed in, so the decisions test without waiting.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// The first of `n` indices, from `start` on and wrapping, for which `paused` is false; `start`
/// when all are paused.
pub fn pick(start: usize, n: usize, paused: impl Fn(usize) -> bool) -> usize {
    (0..n)
        .map(|k| (start + k) % n)
        .find(|&i| !paused(i))
        .unwrap_or(start % n.max(1))
}

/// Pauses of local devices and of (segment, remote device) pairs.
#[derive(Debug)]
pub struct Pauses {
    pause: Duration,
    local: Vec<Option<Instant>>,
    remote: HashMap<(u64, usize), Instant>,
}

impl Pauses {
    /// No pauses yet for `devices` local devices; each pause lasts `pause`.
    pub fn new(devices: usize, pause: Duration) -> Self {
        Pauses {
            pause,
            local: vec![None; devices],
            remote: HashMap::new(),
        }
    }

    /// Pauses local device `i` from `now`.
    pub fn pause_local(&mut self, i: usize, now: Instant) {
        if let Some(p) = self.local.get_mut(i) {
            *p = Some(now + self.pause);
        }
    }

    /// Lifts local device `i`'s pause (its port came back).
    pub fn resume_local(&mut self, i: usize) {
        if let Some(p) = self.local.get_mut(i) {
            *p = None;
        }
    }

    /// Pauses remote device `dev` of segment `segment` from `now`.
    pub fn pause_remote(&mut self, segment: u64, dev: usize, now: Instant) {
        self.remote.insert((segment, dev), now + self.pause);
    }

    /// Whether local device `i` is paused at `now`.
    pub fn local_paused(&self, i: usize, now: Instant) -> bool {
        self.local
            .get(i)
            .copied()
            .flatten()
            .is_some_and(|until| now < until)
    }

    /// Whether remote device `dev` of `segment` is paused at `now`.
    pub fn remote_paused(&self, segment: u64, dev: usize, now: Instant) -> bool {
        self.remote
            .get(&(segment, dev))
            .is_some_and(|until| now < *until)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paused_devices_are_skipped_until_the_pause_ends() {
        let t0 = Instant::now();
        let mut p = Pauses::new(3, Duration::from_secs(30));
        assert_eq!(pick(1, 3, |i| p.local_paused(i, t0)), 1);
        p.pause_local(1, t0);
        assert_eq!(pick(1, 3, |i| p.local_paused(i, t0)), 2);
        p.pause_local(2, t0);
        assert_eq!(pick(1, 3, |i| p.local_paused(i, t0)), 0, "wraps around");
        p.pause_local(0, t0);
        assert_eq!(
            pick(1, 3, |i| p.local_paused(i, t0)),
            1,
            "all paused: the preferred one"
        );
        p.resume_local(2);
        assert_eq!(pick(1, 3, |i| p.local_paused(i, t0)), 2, "resumed");
        p.pause_local(2, t0);
        let later = t0 + Duration::from_secs(31);
        assert_eq!(pick(1, 3, |i| p.local_paused(i, later)), 1, "pauses end");
        p.pause_remote(7, 0, t0);
        assert!(
            p.remote_paused(7, 0, t0) && !p.remote_paused(8, 0, t0) && !p.remote_paused(7, 1, t0)
        );
        assert_eq!(pick(0, 2, |j| p.remote_paused(7, j, t0)), 1);
        assert_eq!(
            pick(5, 0, |_| false),
            0,
            "no device: index 0, the caller reports it"
        );
    }
}
