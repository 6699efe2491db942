//! A tally: the ends of many requests counted in plain memory, then added to an engine's
//! counters at once ([`Metrics::record`]). A pass over a batch's ended tasks costs a few atomic
//! additions per batch instead of a dozen per task, and a value equal to the last one observed
//! finds its bucket without a search (a batch's tasks mostly share their latencies and sizes).

use te_sys::small_list::SmallList;

use crate::counters::{
    FailureKind, LATENCY_BUCKETS_US, Metrics, Operation, SIZE_BUCKETS, STAGE_BUCKETS_US, Stages,
    TASK_LATENCY_BUCKETS_US, TransportLabel,
};

/// One histogram's counts in plain memory: `N` buckets (its bounds and +Inf).
#[derive(Clone)]
pub(crate) struct Buckets<const N: usize> {
    pub(crate) bounds: &'static [u64],
    pub(crate) counts: [u64; N],
    pub(crate) sum: u64,
    /// Which buckets were counted in (bit per bucket): only those are added.
    pub(crate) touched: u32,
    /// The last value observed and its bucket.
    last: Option<(u64, usize)>,
}

impl<const N: usize> Buckets<N> {
    fn new(bounds: &'static [u64]) -> Self {
        debug_assert!(bounds.len() + 1 == N && N <= 32);
        Buckets {
            bounds,
            counts: [0; N],
            sum: 0,
            touched: 0,
            last: None,
        }
    }

    fn observe(&mut self, value: u64, n: u64) {
        let at = match self.last {
            Some((v, at)) if v == value => at,
            _ => {
                let at = self.bounds.partition_point(|b| *b < value);
                self.last = Some((value, at));
                at
            }
        };
        self.counts[at] += n;
        self.touched |= 1 << at;
        self.sum = self.sum.wrapping_add(value.wrapping_mul(n));
    }
}

/// One transport and operation's counts.
pub(crate) struct CellTally {
    pub(crate) transport: TransportLabel,
    pub(crate) op: Operation,
    pub(crate) requests: u64,
    pub(crate) bytes: u64,
    pub(crate) failures: [u64; FailureKind::ALL.len()],
    pub(crate) attempts: u64,
    pub(crate) attempt_failures: u64,
    pub(crate) latency_us: Buckets<{ LATENCY_BUCKETS_US.len() + 1 }>,
    pub(crate) size: Buckets<{ SIZE_BUCKETS.len() + 1 }>,
    pub(crate) attempt_latency_us: Buckets<{ LATENCY_BUCKETS_US.len() + 1 }>,
    pub(crate) stages: [Buckets<{ STAGE_BUCKETS_US.len() + 1 }>; 3],
}

impl CellTally {
    fn new(transport: TransportLabel, op: Operation) -> Self {
        CellTally {
            transport,
            op,
            requests: 0,
            bytes: 0,
            failures: [0; FailureKind::ALL.len()],
            attempts: 0,
            attempt_failures: 0,
            latency_us: Buckets::new(&LATENCY_BUCKETS_US),
            size: Buckets::new(&SIZE_BUCKETS),
            attempt_latency_us: Buckets::new(&LATENCY_BUCKETS_US),
            stages: [0; 3].map(|_| Buckets::new(&STAGE_BUCKETS_US)),
        }
    }
}

/// A request's end, as its engine saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ended {
    /// Its final transport.
    pub transport: TransportLabel,
    /// Its operation.
    pub op: Operation,
    /// Its bytes.
    pub len: u64,
    /// Completed, or why not.
    pub outcome: Result<(), FailureKind>,
    /// Submission to its end, µs.
    pub latency_us: u64,
    /// How that time was spent.
    pub stages: Stages,
}

/// Counts gathered in plain memory, for [`Metrics::record`].
pub struct Tally {
    pub(crate) cells: SmallList<CellTally>,
    pub(crate) task_latency_us: Buckets<{ TASK_LATENCY_BUCKETS_US.len() + 1 }>,
    /// The last request's end, not counted into `cells` yet, and how many times it repeated
    /// (a batch's tasks mostly end alike: one count for them all).
    run: Option<(Ended, Option<bool>, u64)>,
}

impl Default for Tally {
    fn default() -> Self {
        Tally {
            cells: SmallList::Empty,
            task_latency_us: Buckets::new(&TASK_LATENCY_BUCKETS_US),
            run: None,
        }
    }
}

impl Tally {
    fn cell(&mut self, transport: TransportLabel, op: Operation) -> &mut CellTally {
        let at = match (self.cells.iter()).position(|c| c.transport == transport && c.op == op) {
            Some(at) => at,
            None => {
                self.cells.push(CellTally::new(transport, op));
                self.cells.len() - 1
            }
        };
        &mut self.cells[at]
    }

    /// Whether nothing was counted.
    pub fn is_empty(&self) -> bool {
        self.cells.is_empty() && self.run.is_none()
    }

    /// A request that ended, as [`Metrics::request_ended`] counts it; with `one_attempt` (a
    /// classic engine's task: one transport, tried once) also as its attempt, ended FAILED
    /// when it says so.
    pub fn request(&mut self, e: &Ended, one_attempt: Option<bool>) {
        match &mut self.run {
            Some((last, attempt, n)) if last == e && *attempt == one_attempt => *n += 1,
            run => {
                if let Some((last, attempt, n)) = run.replace((*e, one_attempt, 1)) {
                    self.count(&last, attempt, n);
                }
            }
        }
    }

    /// Counts `n` requests that ended as `e`.
    fn count(&mut self, e: &Ended, one_attempt: Option<bool>, n: u64) {
        let cell = self.cell(e.transport, e.op);
        cell.requests += n;
        match e.outcome {
            Ok(()) => {
                cell.bytes += e.len * n;
                cell.latency_us.observe(e.latency_us, n);
                cell.size.observe(e.len, n);
                let [queue, dispatch, carried] = &mut cell.stages;
                queue.observe(e.stages.queue_wait_us, n);
                dispatch.observe(e.stages.dispatch_us, n);
                carried.observe(e.stages.transport_us, n);
            }
            Err(kind) => cell.failures[kind as usize] += n,
        }
        if let Some(failed) = one_attempt {
            cell.attempts += n;
            cell.attempt_failures += u64::from(failed) * n;
            cell.attempt_latency_us.observe(e.latency_us, n);
        }
        if e.outcome.is_ok() {
            self.task_latency_us.observe(e.latency_us, n);
        }
    }

    /// Counts the requests held back.
    fn settle(&mut self) {
        if let Some((last, attempt, n)) = self.run.take() {
            self.count(&last, attempt, n);
        }
    }

    /// One attempt that ended, as [`Metrics::attempt_ended`] counts it.
    pub fn attempt(&mut self, transport: TransportLabel, op: Operation, ok: bool, latency_us: u64) {
        let cell = self.cell(transport, op);
        cell.attempts += 1;
        cell.attempt_failures += u64::from(!ok);
        cell.attempt_latency_us.observe(latency_us, 1);
    }
}

impl Metrics {
    /// Adds `tally`'s counts (one atomic addition per count that is not zero).
    pub fn record(&self, mut tally: Tally) {
        tally.settle();
        for c in tally.cells.iter() {
            self.add_cell(c);
        }
        self.add_task_latency(&tally.task_latency_us);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tally_counts_what_the_direct_calls_count() {
        let ends = [
            (TransportLabel::Tcp, Operation::Write, 4096, Ok(()), 120, 7),
            (TransportLabel::Tcp, Operation::Write, 4096, Ok(()), 120, 7),
            (TransportLabel::Tcp, Operation::Write, 4096, Ok(()), 120, 7),
            (
                TransportLabel::Tcp,
                Operation::Write,
                1 << 20,
                Ok(()),
                900,
                40,
            ),
            (TransportLabel::Tcp, Operation::Write, 4096, Ok(()), 120, 7),
            (
                TransportLabel::Tcp,
                Operation::Write,
                4096,
                Err(FailureKind::Path),
                3000,
                7,
            ),
            (
                TransportLabel::Shm,
                Operation::Read,
                64,
                Err(FailureKind::Canceled),
                5,
                5,
            ),
            (TransportLabel::Shm, Operation::Read, 64, Ok(()), 15, 5),
        ];
        let direct = Metrics::default();
        let tallied = Metrics::default();
        let mut tally = Tally::default();
        for (transport, op, len, outcome, latency_us, dispatch_us) in ends {
            let stages = Stages {
                queue_wait_us: 0,
                dispatch_us,
                transport_us: latency_us - dispatch_us,
            };
            let failed = matches!(outcome, Err(FailureKind::Path));
            direct.request_ended(transport, op, len, outcome, latency_us, stages);
            direct.attempt_ended(transport, op, !failed, latency_us);
            let e = Ended {
                transport,
                op,
                len,
                outcome,
                latency_us,
                stages,
            };
            tally.request(&e, Some(failed));
        }
        tally.attempt(TransportLabel::Rdma, Operation::Write, false, 70);
        direct.attempt_ended(TransportLabel::Rdma, Operation::Write, false, 70);
        assert!(!tally.is_empty());
        tallied.record(tally);
        assert_eq!(tallied.snapshot(), direct.snapshot());
        assert_eq!(tallied.snapshot().series[0].requests, 6);
    }
}
