//! Rail health: a pure record of errors per rail, deciding which rails are paused.
//!
//! `threshold` errors within `window` pause a rail for a cooldown that doubles with each pause
//! in a row (`cooldown`, `2 × cooldown`, … up to `cooldown_max`). The end of the cooldown makes
//! the rail usable again; a success on it forgets its history (the next pause is short again).
//! Time comes in as an argument; nothing here reads a clock.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Identifies a rail: (local rail, remote segment, remote rail).
pub type RailKey = (u16, u64, u16);

#[derive(Clone, Debug, Default)]
struct State {
    errors: Vec<Instant>,
    paused_until: Option<Instant>,
    /// Pauses since the last success.
    strikes: u32,
}

/// Error history and pauses of every rail that has failed.
#[derive(Clone, Debug)]
pub struct RailHealth {
    threshold: usize,
    window: Duration,
    cooldown: Duration,
    cooldown_max: Duration,
    rails: HashMap<RailKey, State>,
}

impl RailHealth {
    /// `threshold` errors within `window` pause a rail for `cooldown`, doubling per repeat up
    /// to `cooldown_max`.
    pub fn new(
        threshold: usize,
        window: Duration,
        cooldown: Duration,
        cooldown_max: Duration,
    ) -> Self {
        RailHealth {
            threshold: threshold.max(1),
            window,
            cooldown,
            cooldown_max: cooldown_max.max(cooldown),
            rails: HashMap::new(),
        }
    }

    /// How long the `strikes`-th pause in a row lasts.
    pub fn cooldown_for(&self, strikes: u32) -> Duration {
        let factor = 1u32 << strikes.saturating_sub(1).min(20);
        self.cooldown.saturating_mul(factor).min(self.cooldown_max)
    }

    /// Records a failure on `rail` at `now`; returns true if that paused it.
    pub fn record_error(&mut self, rail: RailKey, now: Instant) -> bool {
        let s = self.rails.entry(rail).or_default();
        s.errors
            .retain(|t| now.saturating_duration_since(*t) <= self.window);
        s.errors.push(now);
        // Only the newest `threshold` errors decide; older ones are dropped, so a rail that
        // keeps failing while paused (every slice of a dead peer's queue) costs O(threshold)
        // per error, not O(errors so far).
        if s.errors.len() > self.threshold {
            let excess = s.errors.len() - self.threshold;
            s.errors.drain(..excess);
        }
        if s.errors.len() >= self.threshold && s.paused_until.is_none_or(|u| u <= now) {
            s.strikes += 1;
            let strikes = s.strikes;
            s.errors.clear();
            let until = now + self.cooldown_for(strikes);
            if let Some(s) = self.rails.get_mut(&rail) {
                s.paused_until = Some(until);
            }
            return true;
        }
        false
    }

    /// Records a success: the rail is healthy again.
    pub fn record_success(&mut self, rail: RailKey) {
        self.rails.remove(&rail);
    }

    /// Whether `rail` may carry slices at `now`.
    pub fn usable(&self, rail: RailKey, now: Instant) -> bool {
        self.rails
            .get(&rail)
            .and_then(|s| s.paused_until)
            .is_none_or(|u| u <= now)
    }

    /// Whether any rail has a recorded error or pause (cheap check before a success update).
    pub fn is_clean(&self) -> bool {
        self.rails.is_empty()
    }

    /// Errors remembered for `rail` (for tests of the bound).
    #[cfg(test)]
    fn remembered(&self, rail: RailKey) -> usize {
        self.rails.get(&rail).map_or(0, |s| s.errors.len())
    }

    /// Whether a local rail is paused towards any peer at `now`.
    pub fn local_paused(&self, local: u16, now: Instant) -> bool {
        self.rails
            .iter()
            .any(|((l, _, _), s)| *l == local && s.paused_until.is_some_and(|u| u > now))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_pause_and_time_or_success_restore() {
        let t0 = Instant::now();
        let mut h = RailHealth::new(
            3,
            Duration::from_secs(10),
            Duration::from_secs(30),
            Duration::from_secs(300),
        );
        let r = (0, 1, 0);
        assert!(!h.record_error(r, t0));
        assert!(!h.record_error(r, t0 + Duration::from_secs(1)));
        assert!(h.usable(r, t0 + Duration::from_secs(1)));
        assert!(
            h.record_error(r, t0 + Duration::from_secs(2)),
            "third error in the window pauses"
        );
        assert!(!h.usable(r, t0 + Duration::from_secs(3)));
        assert!(h.local_paused(0, t0 + Duration::from_secs(3)));
        assert!(
            h.usable((1, 1, 0), t0 + Duration::from_secs(3)),
            "other rails unaffected"
        );
        assert!(h.usable(r, t0 + Duration::from_secs(33)), "cooldown over");
        h.record_error(r, t0 + Duration::from_secs(40));
        h.record_success(r);
        assert!(h.is_clean());
    }

    #[test]
    fn repeated_pauses_double_up_to_the_maximum_and_success_resets() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut h = RailHealth::new(1, s(10), s(30), s(100));
        assert_eq!(
            (
                h.cooldown_for(1),
                h.cooldown_for(2),
                h.cooldown_for(3),
                h.cooldown_for(9)
            ),
            (s(30), s(60), s(100), s(100))
        );
        let r = (0, 1, 0);
        assert!(h.record_error(r, t0));
        assert!(!h.usable(r, t0 + s(29)) && h.usable(r, t0 + s(30)));
        assert!(
            h.record_error(r, t0 + s(31)),
            "fails again after expiry: second pause"
        );
        assert!(
            !h.usable(r, t0 + s(90)) && h.usable(r, t0 + s(91)),
            "60 s this time"
        );
        assert!(!h.record_error(r, t0 + s(50)), "no new pause while paused");
        h.record_success(r);
        assert!(h.record_error(r, t0 + s(200)));
        assert!(h.usable(r, t0 + s(230)), "back to 30 s after a success");
    }

    #[test]
    fn errors_outside_the_window_do_not_add_up() {
        let t0 = Instant::now();
        let mut h = RailHealth::new(
            2,
            Duration::from_secs(1),
            Duration::from_secs(30),
            Duration::from_secs(300),
        );
        let r = (0, 1, 0);
        assert!(!h.record_error(r, t0));
        assert!(!h.record_error(r, t0 + Duration::from_secs(5)));
        assert!(h.usable(r, t0 + Duration::from_secs(5)));
    }

    #[test]
    fn errors_while_paused_are_remembered_up_to_the_threshold_only() {
        let mut h = RailHealth::new(
            3,
            Duration::from_secs(10),
            Duration::from_secs(60),
            Duration::from_secs(60),
        );
        let t0 = Instant::now();
        let rail = (0, 7, 0);
        for i in 0..3 {
            h.record_error(rail, t0 + Duration::from_millis(i));
        }
        assert!(!h.usable(rail, t0 + Duration::from_secs(1)), "paused");
        for i in 0..100_000u64 {
            assert!(!h.record_error(rail, t0 + Duration::from_micros(3000 + i)));
        }
        assert_eq!(h.remembered(rail), 3);
        // After the pause, the old errors are out of the window: one new error is not enough.
        assert!(h.usable(rail, t0 + Duration::from_secs(61)));
        assert!(!h.record_error(rail, t0 + Duration::from_secs(61)));
        assert_eq!(h.remembered(rail), 1);
    }
}
