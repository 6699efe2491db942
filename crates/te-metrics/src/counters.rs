//! What the engine did, counted where it happens: per transport and operation, requests,
//! bytes, failures by kind, and histograms of request latency and size (the series and
//! buckets of Mooncake's TENT, `tent_*`), plus te's own (slice retries, rail pauses).
//!
//! Recording is atomics only (no lock, no allocation): a histogram is a fixed array of
//! counters. Labels come from closed sets ([`TransportLabel`], [`Operation`],
//! [`FailureKind`]), so the number of series is bounded whatever the peers send. Nothing is
//! counted unless the engine's metrics are switched on (a task then carries the counters and
//! its start time). [`Metrics::snapshot`] gives plain figures to whoever exposes them
//! (Prometheus text, JSON, the periodic log).
//!
//! te-core records into these (a task's end, a retried slice, a paused rail); this module
//! knows nothing of te-core.

use std::sync::atomic::{AtomicU64, Ordering};

/// Latency buckets, µs: TENT's (`tent_*_latency_us`).
pub const LATENCY_BUCKETS_US: [u64; 9] = [
    100, 500, 1_000, 5_000, 10_000, 50_000, 100_000, 500_000, 1_000_000,
];
/// Stage latency buckets, µs: TENT's (`tent_stage_*_us`).
pub const STAGE_BUCKETS_US: [u64; 10] = [
    10, 50, 100, 500, 1_000, 5_000, 10_000, 50_000, 100_000, 500_000,
];
/// Task latency buckets, µs: the classic engine's (`MC_TE_METRIC`'s distribution).
pub const TASK_LATENCY_BUCKETS_US: [u64; 19] = [
    10, 20, 50, 100, 200, 500, 1_000, 2_000, 5_000, 10_000, 20_000, 50_000, 100_000, 200_000,
    500_000, 1_000_000, 2_000_000, 5_000_000, 10_000_000,
];
/// Request size buckets, bytes: TENT's (`tent_*_size_bytes`).
pub const SIZE_BUCKETS: [u64; 11] = [
    1 << 10,
    4 << 10,
    16 << 10,
    64 << 10,
    256 << 10,
    1 << 20,
    4 << 20,
    16 << 20,
    64 << 20,
    256 << 20,
    1 << 30,
];

/// The `transport` label: TENT's names for the transports it has, te's own names for the
/// rest; `unspec` for a request that ended before a transport was chosen, `other` for a
/// transport outside the set (a test's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TransportLabel {
    /// No transport chosen.
    Unspec,
    /// TCP.
    Tcp,
    /// RDMA (verbs).
    Rdma,
    /// Shared memory on one host.
    Shm,
    /// Cross-memory attach on one host (te's).
    Cma,
    /// A CXL memory device (te's).
    Cxl,
    /// File segments through io_uring.
    IoUring,
    /// File segments through buffered I/O (te's).
    Bufio,
    /// GPU memory over NVLink or CUDA IPC.
    Nvlink,
    /// Multi-node NVLink.
    Mnnvl,
    /// GPUDirect Storage.
    Gds,
    /// A transport outside this set.
    Other,
}

impl TransportLabel {
    /// Every label, in index order.
    pub const ALL: [TransportLabel; 12] = [
        TransportLabel::Unspec,
        TransportLabel::Tcp,
        TransportLabel::Rdma,
        TransportLabel::Shm,
        TransportLabel::Cma,
        TransportLabel::Cxl,
        TransportLabel::IoUring,
        TransportLabel::Bufio,
        TransportLabel::Nvlink,
        TransportLabel::Mnnvl,
        TransportLabel::Gds,
        TransportLabel::Other,
    ];

    /// The label of the transport named `name` (as transports name themselves).
    pub fn of(name: &str) -> TransportLabel {
        match name {
            "tcp" => TransportLabel::Tcp,
            "rdma" => TransportLabel::Rdma,
            "shm" => TransportLabel::Shm,
            "cma" => TransportLabel::Cma,
            "cxl" => TransportLabel::Cxl,
            "uring" | "io_uring" => TransportLabel::IoUring,
            "bufio" => TransportLabel::Bufio,
            "nvlink" | "nvlink_intra" => TransportLabel::Nvlink,
            "mnnvl" => TransportLabel::Mnnvl,
            "gds" => TransportLabel::Gds,
            _ => TransportLabel::Other,
        }
    }

    /// The label's value.
    pub fn name(self) -> &'static str {
        match self {
            TransportLabel::Unspec => "unspec",
            TransportLabel::Tcp => "tcp",
            TransportLabel::Rdma => "rdma",
            TransportLabel::Shm => "shm",
            TransportLabel::Cma => "cma",
            TransportLabel::Cxl => "cxl",
            TransportLabel::IoUring => "io_uring",
            TransportLabel::Bufio => "bufio",
            TransportLabel::Nvlink => "nvlink",
            TransportLabel::Mnnvl => "mnnvl",
            TransportLabel::Gds => "gds",
            TransportLabel::Other => "other",
        }
    }
}

/// The `operation` label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operation {
    /// READ: bytes from the peer into local memory.
    Read,
    /// WRITE: local bytes into the peer.
    Write,
}

impl Operation {
    /// Both, in index order.
    pub const ALL: [Operation; 2] = [Operation::Read, Operation::Write];

    /// The label's value.
    pub fn name(self) -> &'static str {
        match self {
            Operation::Read => "read",
            Operation::Write => "write",
        }
    }
}

/// Why a request failed (te's `kind` label).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailureKind {
    /// The peer or the engine refused it (permission, bounds, a bad secret, a cap).
    Refused,
    /// The path failed (connection lost, no answer, a device error).
    Path,
    /// Its deadline passed.
    Timeout,
    /// The caller canceled it.
    Canceled,
    /// Anything else (the peer's own failure, a shutdown).
    Other,
}

impl FailureKind {
    /// Every kind, in index order.
    pub const ALL: [FailureKind; 5] = [
        FailureKind::Refused,
        FailureKind::Path,
        FailureKind::Timeout,
        FailureKind::Canceled,
        FailureKind::Other,
    ];

    /// The label's value.
    pub fn name(self) -> &'static str {
        match self {
            FailureKind::Refused => "refused",
            FailureKind::Path => "path",
            FailureKind::Timeout => "timeout",
            FailureKind::Canceled => "canceled",
            FailureKind::Other => "other",
        }
    }
}

/// The stages of a completed request (TENT's causal chain), µs: waiting in the runtime's
/// queue, being posted to its transport, and in the transport until its end was seen.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stages {
    /// Submission to leaving the queue (0 where there is no queue: the classic engine).
    pub queue_wait_us: u64,
    /// Leaving the queue to every slice handed to the transport.
    pub dispatch_us: u64,
    /// Handed to the transport to its end.
    pub transport_us: u64,
}

/// A histogram over fixed buckets: one counter per bucket (the last is +Inf), a count and a
/// sum, all atomics.
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [u64],
    counts: Box<[AtomicU64]>,
    sum: AtomicU64,
}

impl Histogram {
    /// A histogram over `bounds` (ascending), nothing observed.
    pub fn new(bounds: &'static [u64]) -> Self {
        Histogram {
            bounds,
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum: AtomicU64::new(0),
        }
    }

    /// Counts `value` in its bucket.
    pub fn observe(&self, value: u64) {
        let at = self.bounds.partition_point(|b| *b < value);
        self.counts[at].fetch_add(1, Ordering::Relaxed);
        self.sum.fetch_add(value, Ordering::Relaxed);
    }

    /// Adds counts gathered in plain memory (bucket by bucket, over the same bounds).
    pub(crate) fn add<const N: usize>(&self, counts: &crate::tally::Buckets<N>) {
        debug_assert_eq!(counts.bounds, self.bounds);
        let mut touched = counts.touched;
        while touched != 0 {
            let at = touched.trailing_zeros() as usize;
            touched &= touched - 1;
            self.counts[at].fetch_add(counts.counts[at], Ordering::Relaxed);
        }
        if counts.sum > 0 {
            self.sum.fetch_add(counts.sum, Ordering::Relaxed);
        }
    }

    /// The figures now: cumulative counts at each bound (then +Inf), and the sum.
    pub fn snapshot(&self) -> HistogramSnapshot {
        let mut total = 0;
        let cumulative = self
            .counts
            .iter()
            .map(|c| {
                total += c.load(Ordering::Relaxed);
                total
            })
            .collect();
        HistogramSnapshot {
            bounds: self.bounds,
            cumulative,
            sum: self.sum.load(Ordering::Relaxed),
        }
    }
}

/// A histogram's figures at one moment.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HistogramSnapshot {
    /// The upper bounds (the last bucket, +Inf, has none).
    pub bounds: &'static [u64],
    /// Observations at or below each bound, then all of them.
    pub cumulative: Vec<u64>,
    /// The sum of the observed values.
    pub sum: u64,
}

impl HistogramSnapshot {
    /// How many values were observed.
    pub fn count(&self) -> u64 {
        self.cumulative.last().copied().unwrap_or(0)
    }
}

/// The counters of one transport and operation.
#[derive(Debug)]
struct Cell {
    requests: AtomicU64,
    bytes: AtomicU64,
    failures: [AtomicU64; FailureKind::ALL.len()],
    retries: AtomicU64,
    latency_us: Histogram,
    size: Histogram,
    attempts: AtomicU64,
    attempt_failures: AtomicU64,
    attempt_latency_us: Histogram,
    /// Queue wait, dispatch, transport.
    stages: [Histogram; 3],
}

impl Cell {
    fn new() -> Self {
        Cell {
            requests: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            failures: Default::default(),
            retries: AtomicU64::new(0),
            latency_us: Histogram::new(&LATENCY_BUCKETS_US),
            size: Histogram::new(&SIZE_BUCKETS),
            attempts: AtomicU64::new(0),
            attempt_failures: AtomicU64::new(0),
            attempt_latency_us: Histogram::new(&LATENCY_BUCKETS_US),
            stages: [0; 3].map(|_| Histogram::new(&STAGE_BUCKETS_US)),
        }
    }
}

/// One engine's counters.
#[derive(Debug)]
pub struct Metrics {
    cells: Vec<[Cell; 2]>,
    failovers: Vec<[AtomicU64; TransportLabel::ALL.len()]>,
    deadline_infeasible: [AtomicU64; TransportLabel::ALL.len()],
    rail_pauses: AtomicU64,
    /// Batches allocated and not freed (counted whether or not metrics are on).
    batches: AtomicU64,
    task_latency_us: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            cells: TransportLabel::ALL
                .iter()
                .map(|_| [Cell::new(), Cell::new()])
                .collect(),
            failovers: TransportLabel::ALL
                .iter()
                .map(|_| Default::default())
                .collect(),
            deadline_infeasible: Default::default(),
            rail_pauses: AtomicU64::new(0),
            batches: AtomicU64::new(0),
            task_latency_us: Histogram::new(&TASK_LATENCY_BUCKETS_US),
        }
    }
}

impl Metrics {
    fn cell(&self, transport: TransportLabel, op: Operation) -> &Cell {
        &self.cells[transport as usize][op as usize]
    }

    /// A request that ended on its final `transport`: its `len` bytes when it completed,
    /// else the kind of its failure; `latency_us` from submission to its end, and how that
    /// time was spent (counted for completed requests, as TENT counts them). One request's
    /// [`Tally`](crate::tally::Tally), recorded at once.
    pub fn request_ended(
        &self,
        transport: TransportLabel,
        op: Operation,
        len: u64,
        outcome: Result<(), FailureKind>,
        latency_us: u64,
        stages: Stages,
    ) {
        let mut tally = crate::tally::Tally::default();
        let ended = crate::tally::Ended {
            transport,
            op,
            len,
            outcome,
            latency_us,
            stages,
        };
        tally.request(&ended, None);
        self.record(tally);
    }

    /// One attempt of a request on `transport` ended (a task of the classic engine is one
    /// attempt of one request; TENT tries a request on its next transport after a failure).
    pub fn attempt_ended(
        &self,
        transport: TransportLabel,
        op: Operation,
        ok: bool,
        latency_us: u64,
    ) {
        let mut tally = crate::tally::Tally::default();
        tally.attempt(transport, op, ok, latency_us);
        self.record(tally);
    }

    /// A request submitted with its deadline already past.
    pub fn deadline_infeasible(&self, transport: TransportLabel) {
        self.deadline_infeasible[transport as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Adds one cell's tally.
    pub(crate) fn add_cell(&self, t: &crate::tally::CellTally) {
        let cell = self.cell(t.transport, t.op);
        let add = |a: &AtomicU64, n: u64| {
            if n > 0 {
                a.fetch_add(n, Ordering::Relaxed);
            }
        };
        add(&cell.requests, t.requests);
        add(&cell.bytes, t.bytes);
        for (mine, n) in cell.failures.iter().zip(t.failures) {
            add(mine, n);
        }
        add(&cell.attempts, t.attempts);
        add(&cell.attempt_failures, t.attempt_failures);
        cell.latency_us.add(&t.latency_us);
        cell.size.add(&t.size);
        cell.attempt_latency_us.add(&t.attempt_latency_us);
        for (mine, theirs) in cell.stages.iter().zip(&t.stages) {
            mine.add(theirs);
        }
    }

    /// Adds the classic latency distribution's tally.
    pub(crate) fn add_task_latency<const N: usize>(&self, t: &crate::tally::Buckets<N>) {
        self.task_latency_us.add(t);
    }

    /// A slice posted again after a failure (te's retry on the next rail).
    pub fn slice_retried(&self, transport: TransportLabel, op: Operation) {
        self.cell(transport, op)
            .retries
            .fetch_add(1, Ordering::Relaxed);
    }

    /// A request moved from one transport to another (TENT's failover).
    pub fn failover(&self, from: TransportLabel, to: TransportLabel) {
        self.failovers[from as usize][to as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// A batch allocated.
    pub fn batch_allocated(&self) {
        self.batches.fetch_add(1, Ordering::Relaxed);
    }

    /// A batch freed.
    pub fn batch_freed(&self) {
        self.batches.fetch_sub(1, Ordering::Relaxed);
    }

    /// A rail paused after repeated errors.
    pub fn rail_paused(&self) {
        self.rail_pauses.fetch_add(1, Ordering::Relaxed);
    }

    /// Every figure now; series never touched are left out (as TENT leaves them out).
    pub fn snapshot(&self) -> Snapshot {
        let mut series = Vec::new();
        for transport in TransportLabel::ALL {
            for op in Operation::ALL {
                let c = self.cell(transport, op);
                let requests = c.requests.load(Ordering::Relaxed);
                let retries = c.retries.load(Ordering::Relaxed);
                let attempts = c.attempts.load(Ordering::Relaxed);
                if requests == 0 && retries == 0 && attempts == 0 {
                    continue;
                }
                series.push(Series {
                    transport,
                    op,
                    requests,
                    bytes: c.bytes.load(Ordering::Relaxed),
                    failures: FailureKind::ALL
                        .iter()
                        .map(|k| (*k, c.failures[*k as usize].load(Ordering::Relaxed)))
                        .filter(|(_, n)| *n > 0)
                        .collect(),
                    retries,
                    latency_us: c.latency_us.snapshot(),
                    size: c.size.snapshot(),
                    attempts,
                    attempt_failures: c.attempt_failures.load(Ordering::Relaxed),
                    attempt_latency_us: c.attempt_latency_us.snapshot(),
                    stages: c.stages.each_ref().map(Histogram::snapshot),
                });
            }
        }
        let mut failovers = Vec::new();
        for from in TransportLabel::ALL {
            for to in TransportLabel::ALL {
                let n = self.failovers[from as usize][to as usize].load(Ordering::Relaxed);
                if n > 0 {
                    failovers.push((from, to, n));
                }
            }
        }
        let deadline_infeasible = TransportLabel::ALL
            .into_iter()
            .map(|t| {
                (
                    t,
                    self.deadline_infeasible[t as usize].load(Ordering::Relaxed),
                )
            })
            .filter(|(_, n)| *n > 0)
            .collect();
        Snapshot {
            series,
            failovers,
            deadline_infeasible,
            batches: self.batches.load(Ordering::Relaxed),
            connections: Vec::new(),
            rail_pauses: self.rail_pauses.load(Ordering::Relaxed),
            task_latency_us: self.task_latency_us.snapshot(),
        }
    }
}

/// The figures of one transport and operation.
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    /// Which transport.
    pub transport: TransportLabel,
    /// Which operation.
    pub op: Operation,
    /// Requests ended, completed or not.
    pub requests: u64,
    /// Bytes of completed requests.
    pub bytes: u64,
    /// Failed requests by kind (kinds with none left out).
    pub failures: Vec<(FailureKind, u64)>,
    /// Slices posted again after a failure.
    pub retries: u64,
    /// Latency of completed requests, µs.
    pub latency_us: HistogramSnapshot,
    /// Size of completed requests, bytes.
    pub size: HistogramSnapshot,
    /// Attempts ended on this transport, and those that failed.
    pub attempts: u64,
    /// Attempts that failed.
    pub attempt_failures: u64,
    /// Latency of each attempt, µs.
    pub attempt_latency_us: HistogramSnapshot,
    /// Completed requests' stages, µs: queue wait, dispatch, transport.
    pub stages: [HistogramSnapshot; 3],
}

impl Series {
    /// Failed requests of every kind.
    pub fn failed(&self) -> u64 {
        self.failures.iter().map(|(_, n)| n).sum()
    }
}

impl HistogramSnapshot {
    /// What was observed since `earlier` (a snapshot of the same histogram).
    pub fn since(&self, earlier: &HistogramSnapshot) -> HistogramSnapshot {
        let mut out = self.clone();
        for (now, then) in out.cumulative.iter_mut().zip(&earlier.cumulative) {
            *now = now.saturating_sub(*then);
        }
        out.sum = out.sum.saturating_sub(earlier.sum);
        out
    }

    pub(crate) fn add(&mut self, other: &HistogramSnapshot) {
        for (mine, theirs) in self.cumulative.iter_mut().zip(&other.cumulative) {
            *mine += theirs;
        }
        self.sum += other.sum;
    }
}

/// Every figure of one engine at one moment.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Snapshot {
    /// Per transport and operation, those that saw a request.
    pub series: Vec<Series>,
    /// Failovers: (from, to, how many).
    pub failovers: Vec<(TransportLabel, TransportLabel, u64)>,
    /// Requests submitted with their deadline past, by transport.
    pub deadline_infeasible: Vec<(TransportLabel, u64)>,
    /// Batches allocated and not freed.
    pub batches: u64,
    /// The process's servers, by protocol (filled in for the process, not per engine).
    pub connections: Vec<te_reactor::ConnectionCount>,
    /// Rails paused after repeated errors.
    pub rail_pauses: u64,
    /// Latency of every completed request, µs, over the classic engine's finer buckets.
    pub task_latency_us: HistogramSnapshot,
}

impl Snapshot {
    /// Adds `other`'s figures to these (several engines of one process, shown as one).
    pub fn add(&mut self, other: &Snapshot) {
        for theirs in &other.series {
            match (self.series.iter_mut())
                .find(|s| (s.transport, s.op) == (theirs.transport, theirs.op))
            {
                Some(mine) => {
                    mine.requests += theirs.requests;
                    mine.bytes += theirs.bytes;
                    mine.retries += theirs.retries;
                    for (kind, n) in &theirs.failures {
                        match mine.failures.iter_mut().find(|(k, _)| k == kind) {
                            Some((_, m)) => *m += n,
                            None => mine.failures.push((*kind, *n)),
                        }
                    }
                    mine.latency_us.add(&theirs.latency_us);
                    mine.size.add(&theirs.size);
                    mine.attempts += theirs.attempts;
                    mine.attempt_failures += theirs.attempt_failures;
                    mine.attempt_latency_us.add(&theirs.attempt_latency_us);
                    for (m, t) in mine.stages.iter_mut().zip(&theirs.stages) {
                        m.add(t);
                    }
                }
                None => self.series.push(theirs.clone()),
            }
        }
        for (from, to, n) in &other.failovers {
            match (self.failovers.iter_mut()).find(|(f, t, _)| (f, t) == (from, to)) {
                Some((_, _, m)) => *m += n,
                None => self.failovers.push((*from, *to, *n)),
            }
        }
        for (transport, n) in &other.deadline_infeasible {
            match (self.deadline_infeasible.iter_mut()).find(|(t, _)| t == transport) {
                Some((_, m)) => *m += n,
                None => self.deadline_infeasible.push((*transport, *n)),
            }
        }
        self.rail_pauses += other.rail_pauses;
        self.batches += other.batches;
        match self.task_latency_us.cumulative.is_empty() {
            true => self.task_latency_us = other.task_latency_us.clone(),
            false => self.task_latency_us.add(&other.task_latency_us),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histograms_count_each_value_in_the_first_bucket_that_holds_it() {
        let h = Histogram::new(&LATENCY_BUCKETS_US);
        for v in [0, 100, 101, 999_999, 1_000_000, 1_000_001, u64::MAX / 4] {
            h.observe(v);
        }
        let s = h.snapshot();
        // <=100: 0 and 100; <=500: +101; ...; <=1e6: +999999 and 1e6; +Inf: 2 more.
        assert_eq!(s.cumulative, vec![2, 3, 3, 3, 3, 3, 3, 3, 5, 7]);
        assert_eq!(s.count(), 7);
    }

    #[test]
    fn requests_bytes_and_failures_land_in_their_own_series_only() {
        let m = Metrics::default();
        let tcp = TransportLabel::of("tcp");
        m.request_ended(tcp, Operation::Write, 4096, Ok(()), 250, Stages::default());
        m.request_ended(
            tcp,
            Operation::Write,
            1 << 20,
            Ok(()),
            2_000,
            Stages::default(),
        );
        m.request_ended(
            tcp,
            Operation::Write,
            4096,
            Err(FailureKind::Timeout),
            9,
            Stages::default(),
        );
        m.request_ended(
            TransportLabel::of("uring"),
            Operation::Read,
            512,
            Ok(()),
            50,
            Stages::default(),
        );
        m.failover(TransportLabel::Rdma, TransportLabel::Tcp);
        let s = m.snapshot();
        assert_eq!(s.series.len(), 2, "{s:?}");
        let w = &s.series[0];
        assert_eq!((w.transport, w.op), (TransportLabel::Tcp, Operation::Write));
        assert_eq!((w.requests, w.bytes, w.failed()), (3, 4096 + (1 << 20), 1));
        assert_eq!(w.failures, vec![(FailureKind::Timeout, 1)]);
        assert_eq!(w.latency_us.count(), 2, "failures have no latency");
        assert_eq!(w.size.sum, 4096 + (1 << 20));
        let r = &s.series[1];
        assert_eq!(r.transport.name(), "io_uring");
        assert_eq!(
            s.failovers,
            vec![(TransportLabel::Rdma, TransportLabel::Tcp, 1)]
        );
        assert_eq!(
            TransportLabel::of("a peer's made-up name"),
            TransportLabel::Other
        );
        // Two engines' figures add up.
        let mut both = s.clone();
        both.add(&s);
        assert_eq!(both.series[0].requests, 6);
        assert_eq!(both.series[0].latency_us.count(), 4);
        assert_eq!(both.series[0].failures, vec![(FailureKind::Timeout, 2)]);
        assert_eq!(both.failovers[0].2, 2);
    }
}
