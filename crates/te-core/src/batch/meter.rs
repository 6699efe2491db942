//! Counting tasks' ends, with metrics on. A metered task carries its submit's moment
//! ([`Meter`], one clock read per submit); its batch keeps when each submit's first slices
//! were handed to their transports ([`BatchShared::stamp_posted`]). Its end is counted
//! when it is first seen ended, as Mooncake and TENT count: a wait, a status query, or its
//! batch's free ([`BatchShared::count_ended`]). One pass counts every ended task of a batch
//! into a [`Tally`] in plain memory, reads the clock once, and adds the tally to the engine's
//! counters in a few atomic additions: the finishing path itself counts nothing.
//!
//! A task a runtime held (see `held.rs`) is one request however many attempts it took: each
//! failed attempt is counted as an attempt when it is held again; the request, from the
//! moment it was held, when it ends. Its time held before its first attempt is its queue wait.

use std::sync::OnceLock;
use std::sync::atomic::Ordering;
use std::time::Instant;

use te_metrics::counters::{FailureKind, Stages, TransportLabel};
use te_metrics::tally::{Ended, Tally};

use super::{BatchShared, TaskShared, TransferState, lock};

/// A task's submit moment, with metrics on. (The counters are its batch's.)
pub(crate) struct Meter {
    submitted: Instant,
    /// The task is one attempt of a request its submitter counts (te-tent's staging hops):
    /// the engine counts the attempt only.
    attempt_only: bool,
    /// A held task's place before any attempt (its moment is when it was held).
    placeholder: bool,
    /// For an attempt in a held task's place: when the request was held and when its first
    /// attempt was submitted.
    origin: OnceLock<(Instant, Instant)>,
}

impl Meter {
    /// A task submitted at `submitted`.
    pub(crate) fn new(submitted: Instant, attempt_only: bool) -> Self {
        Meter {
            submitted,
            attempt_only,
            placeholder: false,
            origin: OnceLock::new(),
        }
    }

    /// A held task's place, held at `held`.
    pub(crate) fn placeholder(held: Instant) -> Self {
        Meter {
            placeholder: true,
            ..Meter::new(held, false)
        }
    }

    /// Makes this attempt, in the place of `before` (a placeholder or a failed attempt),
    /// count the request from where `before` started it.
    pub(super) fn follow(&self, before: &Meter) {
        let origin = match (before.origin.get(), before.placeholder) {
            (Some(origin), _) => *origin,
            (None, true) => (before.submitted, self.submitted),
            (None, false) => (before.submitted, before.submitted),
        };
        let _ = self.origin.set(origin);
    }
}

/// Microseconds from `from` to `to`.
fn micros(from: Instant, to: Instant) -> u64 {
    u64::try_from(to.saturating_duration_since(from).as_micros()).unwrap_or(u64::MAX - 1)
}

/// What one pass over many tasks worked out for the task before: a submit's tasks share their
/// submission, and most a transport (the division and the name match are done once).
#[derive(Default)]
struct Recent {
    since: Option<(Instant, u64)>,
    label: Option<(*const u8, TransportLabel)>,
    posted: Option<(Instant, Option<u64>)>,
}

impl Recent {
    /// µs from the submit at `submitted` to its first post, found in `stamps`.
    fn posted(&mut self, submitted: Instant, stamps: &[(Instant, u64)]) -> Option<u64> {
        match self.posted {
            Some((at, us)) if at == submitted => us,
            _ => {
                let us = (stamps.iter()).find_map(|(at, us)| (*at == submitted).then_some(*us));
                self.posted = Some((submitted, us));
                us
            }
        }
    }

    /// µs from `from` to the pass's moment `to`.
    fn micros(&mut self, from: Instant, to: Instant) -> u64 {
        match self.since {
            Some((f, us)) if f == from => us,
            _ => {
                let us = micros(from, to);
                self.since = Some((from, us));
                us
            }
        }
    }

    fn label(&mut self, transport: Option<&'static str>) -> TransportLabel {
        let Some(name) = transport else {
            return TransportLabel::Unspec;
        };
        let at = name.as_ptr();
        match self.label {
            Some((p, label)) if p == at => label,
            _ => {
                let label = TransportLabel::of(name);
                self.label = Some((at, label));
                label
            }
        }
    }
}

impl TaskShared {
    /// Counts the task, ended `state`, seen ended at `seen`: a request (unless its submitter
    /// counts requests itself), and the attempt it ended as, if it ended posted.
    fn tally(
        &self,
        meter: &Meter,
        (state, seen, posted): (TransferState, Instant, &[(Instant, u64)]),
        recent: &mut Recent,
        tally: &mut Tally,
    ) {
        let transport = recent.label(self.transport);
        let op = self.opcode.operation();
        let failed = state == TransferState::Failed;
        if meter.attempt_only {
            tally.attempt(transport, op, !failed, recent.micros(meter.submitted, seen));
            return;
        }
        let (start, first) =
            (meter.origin.get().copied()).unwrap_or((meter.submitted, meter.submitted));
        let latency = recent.micros(start, seen);
        let outcome = match state {
            TransferState::Completed => Ok(()),
            TransferState::Timeout => Err(FailureKind::Timeout),
            TransferState::Canceled => Err(FailureKind::Canceled),
            _ => Err(lock(&self.error)
                .as_ref()
                .map_or(FailureKind::Other, crate::outcome::failure_kind)),
        };
        let queue = micros(start, first).min(latency);
        // Never handed to a transport (refused at submit): all of it was dispatch.
        let dispatch = recent
            .posted(first, posted)
            .map_or(latency - queue, |at| at.min(latency - queue));
        let ended = Ended {
            transport,
            op,
            len: self.len,
            outcome,
            latency_us: latency,
            stages: Stages {
                queue_wait_us: queue,
                dispatch_us: dispatch,
                transport_us: latency - queue - dispatch,
            },
        };
        // Ended held (its failed attempts counted as they failed), as the one attempt of a
        // classic task, or as the last attempt of a held one.
        match (self.ran_last(), meter.origin.get().is_some()) {
            (false, _) => tally.request(&ended, None),
            (true, false) => tally.request(&ended, Some(failed)),
            (true, true) => {
                tally.request(&ended, None);
                let own = micros(meter.submitted, seen);
                tally.attempt(transport, op, !failed, own);
            }
        }
    }
}

impl TaskShared {
    /// Counts this failed attempt now: its task is held again, and its place goes to the next
    /// (its request is counted when it ends).
    pub(super) fn count_failed_attempt(&self, metrics: &te_metrics::counters::Metrics) {
        let Some(meter) = &self.metered else {
            return;
        };
        let transport = self
            .transport
            .map_or(TransportLabel::Unspec, TransportLabel::of);
        let latency = micros(meter.submitted, Instant::now());
        metrics.attempt_ended(transport, self.opcode.operation(), false, latency);
    }
}

impl BatchShared {
    /// Notes that the submit made at `submitted` started handing its slices to their
    /// transports at `now` (before any of them is handed over).
    pub(crate) fn stamp_posted(&self, submitted: Instant, now: Instant) {
        lock(&self.posted).push((submitted, micros(submitted, now)));
    }

    /// Counts its metered tasks in `metrics` (an engine's counters: one for all its batches).
    pub(crate) fn count_into(&self, metrics: &std::sync::Arc<te_metrics::counters::Metrics>) {
        self.metrics.get_or_init(|| metrics.clone());
    }

    /// Counts the ends of its metered tasks not counted yet: all of them, or task `only`.
    /// Costs two loads when there is nothing to count (metrics off, or all counted).
    pub(crate) fn count_ended(&self, only: Option<usize>) {
        let Some(metrics) = self.metrics.get() else {
            return;
        };
        if self.all_counted.load(Ordering::Acquire) {
            return;
        }
        let mut tally = Tally::default();
        {
            let tasks = lock(&self.tasks);
            let posted = lock(&self.posted);
            let seen = Instant::now();
            let some = match only {
                Some(i) => tasks.get(i..=i).unwrap_or_default(),
                None => &tasks[..],
            };
            let mut left = false;
            let mut recent = Recent::default();
            for t in some {
                let Some(meter) = &t.metered else { continue };
                // Under the task lock: no other pass counts it meanwhile.
                if t.counted.load(Ordering::Relaxed) {
                    continue;
                }
                let state = t.state();
                if !state.is_terminal() {
                    left = true;
                    continue;
                }
                t.tally(meter, (state, seen, &posted), &mut recent, &mut tally);
                t.counted.store(true, Ordering::Relaxed);
            }
            if only.is_none() && !left {
                self.all_counted.store(true, Ordering::Release);
            }
        }
        if !tally.is_empty() {
            metrics.record(tally);
        }
    }
}
