//! A TENT request's life as its metrics count it (only with metrics on): when it was
//! submitted, left the queue and was posted, and why it failed. te-core counts each attempt
//! (each te-core task the runtime posts); the runtime counts the request once, at its end, on
//! its final transport, with its stages (TENT's causal chain), and each failover.

use std::sync::Arc;
use std::time::Instant;

use te_core::{TransferState, TransferStatus};
use te_metrics::counters::{FailureKind, Metrics, Operation, Stages, TransportLabel};

/// Microseconds from `from` to `to` (0 when `to` is earlier).
fn micros(from: Instant, to: Instant) -> u64 {
    u64::try_from(to.saturating_duration_since(from).as_micros()).unwrap_or(u64::MAX)
}

/// One request's moments.
pub(crate) struct RequestMeter {
    metrics: Arc<Metrics>,
    submitted: Instant,
    dispatched: Option<Instant>,
    posted: Option<Instant>,
    failure: Option<FailureKind>,
}

impl RequestMeter {
    /// A request submitted now, counted in `metrics`.
    pub(crate) fn new(metrics: Arc<Metrics>) -> Self {
        RequestMeter {
            metrics,
            submitted: Instant::now(),
            dispatched: None,
            posted: None,
            failure: None,
        }
    }

    /// The counters.
    pub(crate) fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// It left the queue now (the first time counts: a failed-over request's queue wait is
    /// its first).
    pub(crate) fn dispatched(&mut self, now: Instant) {
        self.dispatched.get_or_insert(now);
    }

    /// Its first attempt was handed to te-core now.
    pub(crate) fn posted(&mut self, now: Instant) {
        self.posted.get_or_insert(now);
    }

    /// Why its last attempt failed.
    pub(crate) fn failed_with(&mut self, kind: FailureKind) {
        self.failure = Some(kind);
    }

    /// It ended with `status` on `transport`.
    pub(crate) fn ended(
        &self,
        transport: TransportLabel,
        op: Operation,
        len: u64,
        status: &TransferStatus,
    ) {
        let end = Instant::now();
        let dispatched = self.dispatched.unwrap_or(end);
        let posted = self.posted.unwrap_or(end).max(dispatched);
        let stages = Stages {
            queue_wait_us: micros(self.submitted, dispatched),
            dispatch_us: micros(dispatched, posted),
            transport_us: micros(posted, end),
        };
        let outcome = match status.state {
            TransferState::Completed => Ok(()),
            TransferState::Timeout => Err(FailureKind::Timeout),
            TransferState::Canceled => Err(FailureKind::Canceled),
            _ => Err(self.failure.unwrap_or(FailureKind::Other)),
        };
        let latency = micros(self.submitted, end);
        self.metrics
            .request_ended(transport, op, len, outcome, latency, stages);
    }
}
