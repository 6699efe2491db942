//! The deterministic simulation: a seeded driver runs the real engine through `SimTransport`,
//! choosing which slice completes when and how (success, path failure, a whole rail failing,
//! delay, reorder, withheld "never completes" slices), while it submits, cancels and frees
//! batches, tries to unregister memory in flight, and moves a simulated clock (so task deadlines
//! and rail pauses come and go). Slices are moved out of the transport to be completed, so a
//! duplicate completion cannot even be expressed; the driver still checks each byte range of a
//! task succeeds at most once.
//!
//! Safety phase (faults on): no slice completes twice; a slice is never posted past the retry
//! limit; nothing in flight is freed or unregistered; a terminal task has no slice in flight;
//! every completed task's bytes are right. Liveness phase (faults off, withheld slices
//! released): every task ends. A failure prints `TE_SEED=<seed>`; `TE_SEED=<seed>` replays one
//! seed, `TE_SIM_SEEDS=<n>` runs n seeds (default 40). `cargo xtask sim --seeds N` runs it.
//!
//! A third of the batches are a runtime's (te-tent's): their tasks are added held, posted
//! now or later, and an attempt posted to fail over is held again when it fails; the driver
//! then posts it again or gives it up. Each attempt's slices count afresh.
//!
//! At scale: the same driver and invariants with one engine against 1,000 peers whose
//! descriptors live in a real Redis, through a transport that keeps only 64 endpoints, so
//! endpoints are evicted with slices queued on them (each then finishes or fails).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use te_core::transport::{SliceError, SliceOp};
use te_core::{
    BatchId, Config, Error, HeldTask, HostBuffer, Opcode, Permission, SubmitOptions, TaskWatcher,
    TransferEngine, TransferRequest, TransferState, TransferStatus,
};
use te_testkit::SimTransport;
use te_testkit::clock::SimClock;

const SLOT: usize = 64 << 10;
const SLOTS: usize = 16;
/// Slots at scale: enough tasks in flight at once to reach many peers.
const SCALE_SLOTS: usize = 256;
const RETRIES: u32 = 3;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut r = Rng(seed);
    (0..len).map(|_| r.next() as u8).collect()
}

struct Task {
    op: Opcode,
    /// The slot the task holds (freed with its batch).
    slot: usize,
    /// Where its bytes start in both buffers: its slot's start, or (in a run of merged
    /// requests) right after the run's previous task, within the run's slots.
    start: usize,
    len: usize,
    seed: u64,
    done_offsets: HashSet<u64>,
}

struct Batch {
    id: BatchId,
    tasks: Vec<usize>,
    requests: Vec<TransferRequest>,
}

/// The tasks of the runtime's batches held again after a failed attempt, as the engine tells.
#[derive(Default)]
struct HeldLog(std::sync::Mutex<Vec<(BatchId, usize)>>);

impl TaskWatcher for HeldLog {
    fn task_ended(&self, _batch: BatchId, _ran: bool) {}

    fn task_held(&self, batch: BatchId, task: usize) {
        self.0.lock().unwrap().push((batch, task));
    }
}

struct Sim {
    rng: Rng,
    engine: TransferEngine,
    transport: Arc<SimTransport>,
    clock: Arc<SimClock>,
    local: Arc<HostBuffer>,
    remote: Arc<HostBuffer>,
    /// The segments tasks go to: the engine's own, or (at scale) a thousand peers'.
    segments: Vec<u64>,
    tasks: Vec<Task>,
    live: Vec<Batch>,
    free_slots: Vec<usize>,
    withheld: Vec<SliceOp>,
    held_log: Arc<HeldLog>,
    /// Held tasks waiting for an attempt: (batch, task of the batch).
    waiting: Vec<(BatchId, usize)>,
    stats: Stats,
}

/// What a run exercised, so a passing simulation shows it did something.
#[derive(Default, Debug, Clone, Copy)]
struct Stats {
    submitted: u64,
    succeeded: u64,
    failed: u64,
    refused_frees: u64,
    refused_unregisters: u64,
    ended: [u64; 3],
    evictions: u64,
    /// Slices carrying parts of more than one task (merged requests).
    merged_slices: u64,
    /// Tasks held again after a failed attempt, and attempts posted in a held task's place.
    held_again: u64,
    held_posts: u64,
}

type Check = Result<(), String>;

impl Sim {
    fn new(seed: u64) -> Self {
        Self::build(seed, None)
    }

    /// One engine, its descriptors in a real Redis at `metadata`, against `peers` simulated
    /// peers (each a segment whose buffer is the simulation's remote buffer), through a
    /// transport keeping at most `endpoints` endpoints.
    fn at_scale(seed: u64, metadata: &str, peers: usize, endpoints: usize) -> Self {
        let mut sim = Self::build(seed, Some((metadata, endpoints)));
        let mut config = Config::default();
        config.handshake_connect_timeout = Duration::from_secs(5);
        let store = te_core::metadata::open(metadata, &config).unwrap();
        let len = SLOT * SCALE_SLOTS;
        sim.segments = (0..peers)
            .map(|i| {
                let name = format!("sim-peer-{seed}-{i}");
                let desc = serde_json::json!({
                    "name": name, "protocol": "sim", "te_wire_version": 2,
                    "te_rails": [{"name": "lo", "ip": "127.0.0.1", "port": 9}],
                    "te_secret": format!("{:032x}", seed.wrapping_mul(1000).wrapping_add(i as u64)),
                    "buffers": [{"name": "cpu:0", "addr": sim.remote.addr(), "length": len,
                                 "permission": "remote_read_write"}],
                });
                let desc =
                    te_core::segment::SegmentDesc::from_json(desc.to_string().as_bytes()).unwrap();
                store.publish_segment(&desc).unwrap();
                store.publish_rpc(&name, "127.0.0.1", 9).unwrap();
                sim.engine.open_segment(&name).unwrap()
            })
            .collect();
        sim
    }

    fn build(seed: u64, scale: Option<(&str, usize)>) -> Self {
        let mut config = Config::default();
        config.tcp_bind_address = Some("127.0.0.1".parse().unwrap());
        config.slice_size = 4096;
        config.fragment_limit = 1024;
        config.retry_cnt = RETRIES;
        config.slice_timeout = Some(Duration::from_secs(20));
        config.rail_pause = Duration::from_secs(2);
        let clock = Arc::new(SimClock::new());
        let (metadata, name) = match scale {
            Some((url, _)) => (url.to_string(), format!("sim-engine-{seed}")),
            None => ("P2PHANDSHAKE".to_string(), "127.0.0.1".to_string()),
        };
        let engine =
            TransferEngine::init_with_clock(config, &metadata, &name, clock.clone()).unwrap();
        let transport = Arc::new(match scale {
            Some((_, endpoints)) => SimTransport::new().with_endpoints(endpoints),
            None => SimTransport::new(),
        });
        engine.install_transport(transport.clone()).unwrap();
        let slots = match scale {
            Some(_) => SCALE_SLOTS,
            None => SLOTS,
        };
        let (local, remote, segment) = te_testkit::own_buffers(&engine, SLOT * slots);
        Sim {
            rng: Rng(seed),
            engine,
            transport,
            clock,
            local,
            remote,
            segments: vec![segment],
            tasks: Vec::new(),
            live: Vec::new(),
            free_slots: (0..slots).collect(),
            withheld: Vec::new(),
            held_log: Arc::default(),
            waiting: Vec::new(),
            stats: Stats::default(),
        }
    }

    /// The tasks whose bytes `slice` carries (several for merged requests), with the offset
    /// in each task and the bytes that are its.
    fn tasks_of(&self, slice: &SliceOp) -> Vec<(usize, usize, usize)> {
        let start = (slice.local_addr - self.local.addr()) as usize;
        let end = start + slice.len as usize;
        let mut out = Vec::new();
        let mut at = start;
        while at < end {
            // The newest task covering this byte: older ones there belong to freed batches.
            let t = self
                .tasks
                .iter()
                .rposition(|t| t.start <= at && at < t.start + t.len)
                .expect("slice belongs to a task");
            let task = &self.tasks[t];
            let stop = end.min(task.start + task.len);
            out.push((t, at - task.start, stop - at));
            at = stop;
        }
        out
    }

    fn touches(&self, slice: &SliceOp, tasks: &[usize]) -> bool {
        self.tasks_of(slice)
            .iter()
            .any(|(t, _, _)| tasks.contains(t))
    }

    /// Free slots `s..s + n` for a run of merged requests, if there are.
    fn free_run(&self, n: usize) -> Option<usize> {
        let mut starts: Vec<usize> = self
            .free_slots
            .iter()
            .copied()
            .filter(|&s| (s..s + n).all(|k| self.free_slots.contains(&k)))
            .collect();
        starts.sort_unstable();
        (!starts.is_empty()).then(|| starts[self.rng_pick(starts.len())])
    }

    fn rng_pick(&self, n: usize) -> usize {
        // A pick that does not advance the generator (`free_run` borrows self immutably).
        (self.rng.0.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 33) as usize % n
    }

    fn submit(&mut self) -> Check {
        let n = 1 + self.rng.below(3) as usize;
        if self.free_slots.len() < n {
            return Ok(());
        }
        // One submit in three is a run: requests back to back in both buffers, in consecutive
        // slots, to one segment with one opcode, so the engine merges them (lengths are not
        // multiples of the slice size, so merged slices straddle tasks).
        let run = match self.rng.below(3) {
            0 => self.free_run(n),
            _ => None,
        };
        self.rng.next();
        let run_op = if self.rng.below(2) == 0 {
            Opcode::Write
        } else {
            Opcode::Read
        };
        let run_target = self.segments[self.rng.below(self.segments.len() as u64) as usize];
        let held = self.rng.below(3) == 0;
        let id = match held {
            true => (self.engine).allocate_watched_batch(n, Some(self.held_log.clone())),
            false => self.engine.allocate_batch(n),
        }
        .map_err(|e| e.to_string())?;
        let mut requests = Vec::new();
        let mut tasks = Vec::new();
        let mut next_start = run.map(|s| s * SLOT);
        for k in 0..n {
            let slot = match run {
                Some(s) => s + k,
                None => self.free_slots[self.rng.below(self.free_slots.len() as u64) as usize],
            };
            self.free_slots.retain(|&f| f != slot);
            let len = 1 + self.rng.below(SLOT as u64 - 1) as usize;
            let (op, target_id, start) = match next_start.as_mut() {
                Some(at) => {
                    let start = *at;
                    *at += len;
                    (run_op, run_target, start)
                }
                None => {
                    let op = if self.rng.below(2) == 0 {
                        Opcode::Write
                    } else {
                        Opcode::Read
                    };
                    let target = self.segments[self.rng.below(self.segments.len() as u64) as usize];
                    (op, target, slot * SLOT)
                }
            };
            let seed = self.rng.next();
            let (src, dst) = match op {
                Opcode::Write => (&self.local, &self.remote),
                _ => (&self.remote, &self.local),
            };
            src.write_at(start, &pattern(seed, len)).unwrap();
            dst.write_at(start, &vec![0u8; len]).unwrap();
            requests.push(TransferRequest {
                opcode: op,
                source: (self.local.addr() as usize + start) as u64,
                target_id,
                target_offset: (self.remote.addr() as usize + start) as u64,
                length: len as u64,
            });
            tasks.push(self.tasks.len());
            self.tasks.push(Task {
                op,
                slot,
                start,
                len,
                seed,
                done_offsets: HashSet::new(),
            });
        }
        match held {
            true => self.hold(id, &requests)?,
            false => self
                .engine
                .submit(id, &requests)
                .map_err(|e| format!("submit: {e}"))?,
        }
        self.stats.submitted += n as u64;
        self.live.push(Batch {
            id,
            tasks,
            requests,
        });
        self.evict()
    }

    /// Adds `requests` to batch `id` held, and posts some of them now (failing over or not).
    fn hold(&mut self, id: BatchId, requests: &[TransferRequest]) -> Check {
        let spec: Vec<HeldTask> = (requests.iter())
            .map(|r| HeldTask {
                opcode: r.opcode,
                length: r.length,
                deadline: None,
                transport: None,
            })
            .collect();
        self.engine
            .hold(id, &spec, None)
            .map_err(|e| format!("hold: {e}"))?;
        let (mut now, mut later) = (Vec::new(), Vec::new());
        for k in 0..requests.len() {
            match self.rng.below(2) {
                0 => now.push(k),
                _ => later.push((id, k)),
            }
        }
        self.waiting.extend(later);
        let chosen: Vec<TransferRequest> = now.iter().map(|&k| requests[k]).collect();
        let options = SubmitOptions::default().failing_over(self.rng.below(2) == 0);
        match now.is_empty() {
            true => Ok(()),
            false => (self.engine)
                .post_held(id, &now, &chosen, &options)
                .map_err(|e| format!("post_held: {e}")),
        }
    }

    /// The tasks the engine told of as held again since the last call join those waiting.
    fn take_told(&mut self) {
        let told = std::mem::take(&mut *self.held_log.0.lock().unwrap());
        self.stats.held_again += told.len() as u64;
        self.waiting.extend(told);
    }

    /// The runtime's turn: one held task gets its next attempt (failing over again or not), or
    /// is given up; a held task of a freed batch is a defect.
    fn move_on(&mut self, fail_over: bool) -> Check {
        self.take_told();
        if self.waiting.is_empty() {
            return Ok(());
        }
        let (id, k) = self
            .waiting
            .swap_remove(self.rng.below(self.waiting.len() as u64) as usize);
        let Some(b) = self.live.iter().find(|b| b.id == id) else {
            return Err(format!("batch {id:?} freed with task {k} held"));
        };
        let (t, r) = (b.tasks[k], b.requests[k]);
        let outcome = match (fail_over, self.rng.below(4)) {
            (true, 0) => {
                let failed = TransferStatus {
                    state: TransferState::Failed,
                    transferred_bytes: 0,
                };
                let why = SliceError::Path("given up".into());
                self.engine.end_held(id, k, failed, Some(why))
            }
            _ => {
                // A new attempt: its slices are counted afresh.
                self.tasks[t].done_offsets.clear();
                let options =
                    SubmitOptions::default().failing_over(fail_over && self.rng.below(2) == 0);
                let posted = self.engine.post_held(id, &[k], &[r], &options);
                self.stats.held_posts += u64::from(posted.is_ok());
                posted
            }
        };
        match outcome {
            // Ended while it waited (canceled, or past its deadline).
            Ok(()) | Err(Error::InvalidArgument(_)) => Ok(()),
            Err(e) => Err(format!("moving on held task {k} of {id:?}: {e}")),
        }
    }

    /// Endpoints the transport evicted to make room: what was queued on them either finishes
    /// (a lane finishing what it holds) or fails as the connection closes, slice by slice.
    fn evict(&mut self) -> Check {
        for peer in self.transport.take_evicted() {
            self.stats.evictions += 1;
            for slice in self.transport.take_where(|op| op.target.name() == peer) {
                match self.rng.below(2) {
                    0 => self.succeed(slice)?,
                    _ => {
                        self.stats.failed += 1;
                        let closed = SliceError::Path("endpoint evicted; connection closed".into());
                        self.transport.complete(slice, Err(closed));
                    }
                }
            }
        }
        Ok(())
    }

    /// Executes a slice for real (copies its bytes) and reports success.
    fn succeed(&mut self, slice: SliceOp) -> Check {
        let parts = self.tasks_of(&slice);
        if parts.len() > 1 {
            self.stats.merged_slices += 1;
        }
        let local_off = (slice.local_addr - self.local.addr()) as usize;
        let remote_off = (slice.remote_addr - self.remote.addr()) as usize;
        let len = slice.len as usize;
        match slice.opcode {
            Opcode::Write => {
                let bytes = self.local.to_vec(local_off, len).unwrap();
                self.remote.write_at(remote_off, &bytes).unwrap();
            }
            _ => {
                let bytes = self.remote.to_vec(remote_off, len).unwrap();
                self.local.write_at(local_off, &bytes).unwrap();
            }
        }
        for (t, offset, _) in parts {
            if !self.tasks[t].done_offsets.insert(offset as u64) {
                return Err(format!("task {t}: slice at {offset} completed twice"));
            }
        }
        self.transport.complete(slice, Ok(()));
        self.stats.succeeded += 1;
        Ok(())
    }

    fn take(&mut self) -> Result<Option<SliceOp>, String> {
        let r = self.rng.next() as usize;
        let Some(slice) = self.transport.take(|n| r % n) else {
            return Ok(None);
        };
        // As a real transport does: a slice of a canceled (or expired) task is dropped unsent.
        if slice.is_canceled() && self.rng.below(2) == 0 {
            self.transport.complete(slice, Err(SliceError::Canceled));
            return Ok(None);
        }
        if slice.token.attempt() > RETRIES {
            return Err(format!(
                "slice posted on attempt {} past the limit {RETRIES}",
                slice.token.attempt()
            ));
        }
        Ok(Some(slice))
    }

    fn fail(&mut self, slice: SliceOp) {
        self.stats.failed += 1;
        let error = if self.rng.below(4) == 0 {
            SliceError::LocalPath("simulated local NIC failure".into())
        } else {
            SliceError::Path("simulated path failure".into())
        };
        self.transport.complete(slice, Err(error));
    }

    /// Tries to free a batch: refused while any of its slices is queued or withheld.
    fn try_free(&mut self, i: usize) -> Check {
        let tasks = self.live[i].tasks.clone();
        let in_flight = self
            .transport
            .inspect(|q| q.iter().any(|s| self.touches(s, &tasks)))
            || self.withheld.iter().any(|s| self.touches(s, &tasks));
        match self.engine.free_batch(self.live[i].id) {
            Ok(()) if in_flight => Err(format!(
                "batch {:?} freed with slices in flight",
                self.live[i].id
            )),
            Ok(()) => {
                let b = self.live.swap_remove(i);
                // Entries of tasks that ended while they waited (canceled while held).
                self.take_told();
                self.waiting.retain(|w| w.0 != b.id);
                self.free_slots
                    .extend(b.tasks.iter().map(|t| self.tasks[*t].slot));
                Ok(())
            }
            Err(Error::BatchBusy(_)) => {
                self.stats.refused_frees += 1;
                Ok(())
            }
            Err(e) => Err(format!("free_batch: {e}")),
        }
    }

    fn try_unregister(&mut self) -> Check {
        let in_flight = self.transport.queued() + self.withheld.len() > 0;
        match self.engine.unregister_memory(self.local.addr()) {
            Ok(()) if in_flight => Err("local region unregistered with slices in flight".into()),
            Ok(()) => self
                .engine
                .register_buffer(&self.local, "*", Permission::LocalOnly)
                .map_err(|e| e.to_string()),
            Err(Error::RegionBusy { .. }) => {
                self.stats.refused_unregisters += 1;
                Ok(())
            }
            Err(e) => Err(format!("unregister: {e}")),
        }
    }

    /// Terminal tasks have nothing in flight; completed ones have the right bytes.
    fn check_tasks(&self) -> Check {
        for b in &self.live {
            for (k, &t) in b.tasks.iter().enumerate() {
                let st = self
                    .engine
                    .task_status(b.id, k)
                    .map_err(|e| e.to_string())?;
                if !st.state.is_terminal() {
                    continue;
                }
                let queued = self
                    .transport
                    .inspect(|q| q.iter().any(|s| self.touches(s, &[t])))
                    || self.withheld.iter().any(|s| self.touches(s, &[t]));
                if queued {
                    return Err(format!("task {t} is {:?} with a slice in flight", st.state));
                }
                if st.state == TransferState::Completed {
                    let task = &self.tasks[t];
                    let dst = if task.op == Opcode::Write {
                        &self.remote
                    } else {
                        &self.local
                    };
                    if dst.to_vec(task.start, task.len).unwrap() != pattern(task.seed, task.len) {
                        return Err(format!("task {t} completed with wrong bytes"));
                    }
                    if st.transferred_bytes != task.len as u64 {
                        return Err(format!(
                            "task {t}: {} of {} bytes",
                            st.transferred_bytes, task.len
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    fn safety_step(&mut self) -> Check {
        match self.rng.below(100) {
            0..15 => self.submit(),
            15..55 => match self.take()? {
                Some(s) => self.succeed(s),
                None => Ok(()),
            },
            55..70 => {
                if let Some(s) = self.take()? {
                    self.fail(s);
                }
                Ok(())
            }
            70..73 => {
                // A rail goes down: every slice queued now fails at once (their retries come back
                // to the queue and take their chances later).
                for _ in 0..self.transport.queued() {
                    if let Some(s) = self.take()? {
                        self.fail(s);
                    }
                }
                Ok(())
            }
            73..76 => {
                // A slice that never completes (until the liveness phase).
                if let Some(s) = self.take()? {
                    self.withheld.push(s);
                }
                Ok(())
            }
            76..80 if !self.live.is_empty() => {
                let i = self.rng.below(self.live.len() as u64) as usize;
                self.engine
                    .cancel(self.live[i].id)
                    .map_err(|e| e.to_string())
            }
            80..88 if !self.live.is_empty() => {
                let i = self.rng.below(self.live.len() as u64) as usize;
                self.try_free(i)
            }
            88..92 => self.try_unregister(),
            92..95 => {
                self.clock
                    .advance(Duration::from_millis(self.rng.below(8000)));
                Ok(())
            }
            95..98 => self.move_on(true),
            _ => self.check_tasks(),
        }
    }

    fn liveness(&mut self) -> Check {
        for s in std::mem::take(&mut self.withheld) {
            self.transport
                .complete(s, Err(SliceError::Path("released".into())));
        }
        let mut steps = 0;
        loop {
            // Every held task gets an attempt that does not fail over.
            while !self.waiting.is_empty() || !self.held_log.0.lock().unwrap().is_empty() {
                self.move_on(false)?;
            }
            if self.transport.queued() == 0 {
                break;
            }
            if let Some(s) = self.take()? {
                self.succeed(s)?;
            }
            steps += 1;
            if steps > 1_000_000 {
                return Err("liveness: slices keep coming back".into());
            }
        }
        self.check_tasks()?;
        for b in std::mem::take(&mut self.live) {
            let st = self
                .engine
                .wait(b.id, Duration::ZERO)
                .map_err(|e| format!("liveness: batch not done: {e}"))?;
            if !st.state.is_terminal() {
                return Err(format!("liveness: batch {:?} still {:?}", b.id, st.state));
            }
            for k in 0..b.tasks.len() {
                match self
                    .engine
                    .task_status(b.id, k)
                    .map_err(|e| e.to_string())?
                    .state
                {
                    TransferState::Completed => self.stats.ended[0] += 1,
                    TransferState::Failed | TransferState::Timeout => self.stats.ended[1] += 1,
                    _ => self.stats.ended[2] += 1,
                }
            }
            self.engine
                .free_batch(b.id)
                .map_err(|e| format!("liveness: free: {e}"))?;
        }
        Ok(())
    }
}

fn run_seed(seed: u64) -> Result<Stats, String> {
    run(Sim::new(seed), 600)
}

fn run(mut sim: Sim, steps: usize) -> Result<Stats, String> {
    for _ in 0..steps {
        sim.safety_step()?;
    }
    sim.check_tasks()?;
    sim.liveness()?;
    Ok(sim.stats)
}

/// The same invariants with one engine against 1,000 peers, its descriptors in a real Redis
/// (Debian's redis-server, started here), through a transport that keeps 64 endpoints, so
/// endpoints are evicted all along with slices queued on them. `TE_SIM_SCALE_SEEDS` seeds
/// (default 3), 4,000 steps each.
#[test]
fn one_engine_against_a_thousand_peers_with_endpoint_eviction() {
    let dir = std::env::temp_dir().join(format!("te-sim-redis-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let port = te_testkit::services::free_port();
    let redis = te_testkit::services::redis_server(port, None, &dir);
    let n: u64 = std::env::var("TE_SIM_SCALE_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let mut total = Stats::default();
    for seed in 1..=n {
        let sim = Sim::at_scale(seed, &redis.url, 1000, 64);
        assert_eq!(sim.segments.len(), 1000);
        match run(sim, 4000) {
            Ok(s) => {
                total.submitted += s.submitted;
                total.failed += s.failed;
                total.evictions += s.evictions;
                (0..3).for_each(|i| total.ended[i] += s.ended[i]);
            }
            Err(e) => panic!("simulation at scale failed: {e}\nseed {seed}"),
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    eprintln!(
        "simulation at scale: {n} seeds, 1,000 peers, 64 endpoints: tasks {}, endpoints evicted {}, \
         slice failures {}; at the end completed {}, failed or timed out {}, canceled {}",
        total.submitted,
        total.evictions,
        total.failed,
        total.ended[0],
        total.ended[1],
        total.ended[2]
    );
    assert!(total.evictions > 0, "no endpoint was ever evicted");
    assert!(total.submitted > 1000, "too few tasks to reach many peers");
}

#[test]
fn seeded_simulation_keeps_every_invariant() {
    let seeds: Vec<u64> = match std::env::var("TE_SEED") {
        Ok(s) => vec![s.parse().expect("TE_SEED is a number")],
        Err(_) => {
            let n: u64 = std::env::var("TE_SIM_SEEDS")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(40);
            let base: u64 = std::env::var("TE_SIM_BASE")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(1);
            (base..base + n).collect()
        }
    };
    let mut total = Stats::default();
    for seed in &seeds {
        match run_seed(*seed) {
            Ok(s) => {
                total.submitted += s.submitted;
                total.succeeded += s.succeeded;
                total.failed += s.failed;
                total.refused_frees += s.refused_frees;
                total.refused_unregisters += s.refused_unregisters;
                total.merged_slices += s.merged_slices;
                total.held_again += s.held_again;
                total.held_posts += s.held_posts;
                (0..3).for_each(|i| total.ended[i] += s.ended[i]);
            }
            Err(e) => panic!("simulation failed: {e}\nreplay with TE_SEED={seed}"),
        }
    }
    eprintln!(
        "simulation: {} seeds passed; tasks submitted {}, slices succeeded {}, slice failures injected {}, \
         frees refused {}, unregisters refused {}, merged slices {}, tasks held again {}, attempts \
         posted in held places {}; tasks at the end of liveness: completed {}, failed or timed out {}, canceled {}",
        seeds.len(),
        total.submitted,
        total.succeeded,
        total.failed,
        total.refused_frees,
        total.refused_unregisters,
        total.merged_slices,
        total.held_again,
        total.held_posts,
        total.ended[0],
        total.ended[1],
        total.ended[2]
    );
    assert!(
        total.submitted > 0
            && total.failed > 0
            && total.refused_frees > 0
            && total.merged_slices > 0
            && total.held_again > 0
            && total.held_posts > 0,
        "the simulation exercised nothing (or merged or held nothing): {total:?}"
    );
}
