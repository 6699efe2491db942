//! [`TentEngine`]: TENT's API over te-core's engine. A TENT batch is a te-core batch whose
//! tasks are added held: each waits in the runtime queue by priority, is posted on the
//! transport its plan puts first, is held again and posted on the next capable transport when
//! an attempt fails, and ends TIMEOUT past its deadline. Status, waits, cancels and the batch's
//! notification (sent once all its data is in place) are te-core's.
//!
//! Progress (posting queued tasks, failover, deadlines) is [`crate::progress`]'s.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use te_core::transport::{Capabilities, Transport};
use te_core::{
    BatchId, HeldTask, HostBuffer, Notification, Policy, SegmentId, TransferEngine, TransferStatus,
};
use tracing::info;

use crate::bell::{Bell, Hearing};
use crate::capability::{MemoryKind, Move, Scope};
use crate::config::TentConfig;
use crate::memo::{PlanMemo, TargetMemo};
use crate::policy::{Plan, RequestFacts, select};
use crate::progress::needs_progress;
use crate::queue::Dispatcher;
use crate::request::{MemoryOptions, Request, TentBatchId};
use crate::state::{PLAN_CACHE, Stage, State, Task};
use crate::{Result, TentError};

pub(crate) struct Inner {
    pub(crate) core: Arc<TransferEngine>,
    pub(crate) config: TentConfig,
    pub(crate) own: SegmentId,
    pub(crate) state: Mutex<State>,
    /// Told of task ends and failed attempts by te-core, kicked by submits and the drop.
    pub(crate) bell: Arc<Bell>,
    pub(crate) stop: AtomicBool,
}

/// TENT's engine: say what to move; the runtime picks transports, orders, retries and stages.
pub struct TentEngine {
    inner: Arc<Inner>,
    /// The progress thread, joined on drop.
    progress: te_workers::Threads,
    owned: Mutex<HashMap<u64, Arc<HostBuffer>>>,
    /// Where `allocate_memory` takes host memory from: shared memory where shm is installed.
    shm: Option<te_catalog::Allocator>,
}

impl std::fmt::Debug for TentEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TentEngine")
            .field("segment", &self.inner.core.segment_name())
            .finish()
    }
}

impl TentEngine {
    /// An engine from `config`, with the transports it enables that this build has (tcp, shm,
    /// uring; rdma with the `rdma` feature when `transports.rdma.enable` is true).
    ///
    /// # Errors
    /// The classic engine's init, or a transport that cannot install.
    pub fn new(config: TentConfig) -> Result<Self> {
        Self::with_transports(config, true)
    }

    /// An engine from `config` with no transport yet (install them with
    /// [`install_transport`](Self::install_transport)); `defaults` installs the enabled ones.
    ///
    /// # Errors
    /// As [`new`](Self::new).
    pub fn with_transports(config: TentConfig, defaults: bool) -> Result<Self> {
        let core = Arc::new(TransferEngine::init(
            config.core.clone(),
            &config.metadata_conn,
            &config.segment_name(),
        )?);
        // The metrics the file and the variables ask for: this engine counts into them.
        if te_metrics::start(&config.metrics).map_err(TentError::Metrics)? {
            core.set_metrics_enabled(true);
            te_metrics::watch(core.metrics());
        }
        let own = core.open_segment(core.segment_name())?;
        let inner = Arc::new(Inner {
            state: Mutex::new(State {
                runs: HashMap::default(),
                dispatcher: Dispatcher::new(config.max_inflight_tasks),
                installed: Vec::new(),
                memory: BTreeMap::new(),
                plans: Vec::new(),
                scratch: Default::default(),
                spare: Vec::new(),
            }),
            core,
            config,
            own,
            bell: Arc::new(Bell::default()),
            stop: AtomicBool::new(false),
        });
        let policy: std::sync::Weak<dyn Policy> = Arc::downgrade(&inner) as _;
        inner.core.install_policy(policy)?;
        let progress = inner.clone();
        let threads = te_workers::Threads::default();
        threads.push(
            std::thread::Builder::new()
                .name("te-tent-progress".into())
                .spawn(move || progress.run_progress())
                .map_err(|e| TentError::InvalidArgument(format!("progress thread: {e}")))?,
        );
        let mut engine = TentEngine {
            inner,
            progress: threads,
            owned: Mutex::new(HashMap::new()),
            shm: None,
        };
        if defaults {
            engine.install_defaults()?;
        }
        Ok(engine)
    }

    /// Installs the transports TENT's configuration enables, made by te-catalog: tcp, shm (in
    /// `transports/shm`'s `cxl_mount_path`, else `/dev/shm`), io_uring with buffered I/O where
    /// it is refused, rdma when enabled (on its `devices`), nvlink where a CUDA driver is
    /// (`transports/mnnvl` enabled lets fabric handles serve other hosts, as `MC_FORCE_MNNVL`).
    fn install_defaults(&mut self) -> Result<()> {
        let inner = self.inner.clone();
        let config = &inner.config;
        let transport = |name: &str| config.transports.get(name);
        let mut wanted = Vec::new();
        let built = [
            ("tcp", "tcp", cfg!(feature = "tcp")),
            ("shm", "shm", cfg!(feature = "shm")),
            ("uring", "file", cfg!(feature = "uring")),
        ];
        for (name, entry, _) in built.into_iter().filter(|b| b.2) {
            if config.enabled(name) {
                wanted.push(entry);
            }
        }
        if cfg!(feature = "rdma") && transport("rdma").and_then(|t| t.enable) == Some(true) {
            wanted.push("rdma");
        }
        // A machine without a GPU runs without nvlink.
        #[cfg(feature = "nvlink")]
        if config.enabled("nvlink") {
            match te_cuda::driver() {
                Ok(_) if transport("mnnvl").and_then(|t| t.enable) == Some(true) => {
                    wanted.push("mnnvl");
                }
                Ok(_) => wanted.push("nvlink"),
                Err(reason) => info!(%reason, "nvlink not installed"),
            }
        }
        let shm_dir = transport("shm")
            .and_then(|t| t.cxl_mount_path.as_deref())
            .filter(|d| !d.trim().is_empty())
            .map(std::path::Path::new);
        let options = te_catalog::Options {
            config: self.inner.core.config(),
            lookup: &|name| config.lookup(name),
            devices: transport("rdma").and_then(|t| t.devices.clone()),
            shm_dir,
        };
        for entry in wanted {
            let made = te_catalog::make(entry, &options)?;
            if entry == "shm" {
                self.shm = made.allocator;
            }
            self.install_transport(made.transport)?;
        }
        Ok(())
    }

    /// Installs `transport` (its capabilities join the matrix).
    ///
    /// # Errors
    /// The classic engine's refusal.
    pub fn install_transport(&self, transport: Arc<dyn Transport>) -> Result<()> {
        info!(transport = transport.name(), capabilities = %transport.capabilities(), "installing");
        self.inner.core.install_transport(transport)?;
        let mut s = self.inner.lock();
        s.installed = self.inner.core.transport_capabilities();
        s.plans.clear();
        Ok(())
    }

    /// The engine this runtime is installed in (segments, rails, statistics).
    pub fn core(&self) -> &TransferEngine {
        &self.inner.core
    }

    /// The engine this runtime is installed in, shared: its batches, submits and
    /// registrations reach this runtime, whoever calls them, while this runtime lives.
    pub fn engine(&self) -> Arc<TransferEngine> {
        self.inner.core.clone()
    }

    /// This engine's segment name (`host:port`).
    pub fn segment_name(&self) -> &str {
        self.inner.core.segment_name()
    }

    /// The capability matrix: each installed transport and the moves it makes.
    pub fn capability_matrix(&self) -> Vec<(&'static str, Vec<Move>)> {
        crate::capability::matrix(&self.inner.core.transport_capabilities())
    }

    /// Registers `buffer` with `options` (location, permission).
    ///
    /// # Errors
    /// The classic engine's refusal (overlap, bad location).
    pub fn register_memory(&self, buffer: &Arc<HostBuffer>, options: &MemoryOptions) -> Result<()> {
        // The engine tells this runtime of it ([`Policy::registered`]).
        let core = &self.inner.core;
        Ok(core.register_buffer(buffer, &options.location, options.permission)?)
    }

    /// Unregisters the memory at `addr`.
    ///
    /// # Errors
    /// The classic engine's refusal (unknown, or in use).
    pub fn unregister_memory(&self, addr: u64) -> Result<()> {
        self.unregister_memory_batch(&[addr])
    }

    /// Unregisters the memory at each of `addrs`, all or none.
    ///
    /// # Errors
    /// As [`unregister_memory`](Self::unregister_memory), for the first that cannot be.
    pub fn unregister_memory_batch(&self, addrs: &[u64]) -> Result<()> {
        Ok(self.inner.core.unregister_memory_batch(addrs)?)
    }

    /// Memory a transport allocates (shared memory when te-shm is installed, so peers on this
    /// host reach it directly), registered with `options`; freed by
    /// [`free_memory`](Self::free_memory).
    ///
    /// # Errors
    /// Allocation or registration failed.
    pub fn allocate_memory(&self, len: usize, options: &MemoryOptions) -> Result<Arc<HostBuffer>> {
        let buffer = match (&self.shm, MemoryKind::of_location(&options.location)) {
            (Some(shm), MemoryKind::Dram) => shm(len)?,
            _ => Arc::new(HostBuffer::new(len).map_err(te_core::Error::from)?),
        };
        self.register_memory(&buffer, options)?;
        self.owned
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(buffer.addr(), buffer.clone());
        Ok(buffer)
    }

    /// Unregisters and releases memory from [`allocate_memory`](Self::allocate_memory).
    ///
    /// # Errors
    /// [`TentError::InvalidArgument`] for memory this engine did not allocate; as
    /// [`unregister_memory`](Self::unregister_memory).
    pub fn free_memory(&self, addr: u64) -> Result<()> {
        let owned = self.owned.lock().unwrap_or_else(|e| e.into_inner());
        if !owned.contains_key(&addr) {
            return Err(TentError::InvalidArgument(format!(
                "{addr:#x} was not allocated by this engine"
            )));
        }
        drop(owned);
        self.unregister_memory(addr)?;
        self.owned
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&addr);
        Ok(())
    }

    /// Opens segment `name` (`host:port`).
    ///
    /// # Errors
    /// The classic engine's refusal.
    pub fn open_segment(&self, name: &str) -> Result<SegmentId> {
        Ok(self.inner.core.open_segment(name)?)
    }

    /// Closes a segment.
    ///
    /// # Errors
    /// The classic engine's refusal.
    pub fn close_segment(&self, id: SegmentId) -> Result<()> {
        Ok(self.inner.core.close_segment(id)?)
    }

    /// A batch of up to `capacity` tasks (a te-core batch, under its id).
    ///
    /// # Errors
    /// [`TentError::InvalidArgument`] for 0 or more than the classic engine's batch limit.
    pub fn allocate_batch(&self, capacity: usize) -> Result<TentBatchId> {
        if capacity == 0 || capacity > self.inner.config.core.max_batch_size {
            return Err(TentError::InvalidArgument(format!(
                "batch capacity {capacity} outside 1..={}",
                self.inner.config.core.max_batch_size
            )));
        }
        // What the engine's `allocate_batch` does with this runtime installed, without its
        // look-up of the policy.
        Ok(TentBatchId(Policy::allocate(&*self.inner, capacity)?.raw()))
    }

    /// Frees a batch whose tasks all ended.
    ///
    /// # Errors
    /// [`TentError::InvalidBatch`], [`TentError::BatchBusy`].
    pub fn free_batch(&self, batch: TentBatchId) -> Result<()> {
        // The engine tells this runtime ([`Policy::freed`]), which forgets the batch's run.
        match self.inner.core.free_batch(BatchId::from_raw(batch.0)) {
            Ok(()) => Ok(()),
            Err(te_core::Error::BatchBusy(_)) => Err(TentError::BatchBusy(batch.0)),
            Err(te_core::Error::InvalidBatch { .. }) => Err(TentError::InvalidBatch(batch.0)),
            Err(e) => Err(e.into()),
        }
    }

    /// Submits `requests` as new tasks of `batch`. Each is planned (policy, capabilities)
    /// before any is queued: nothing is queued unless all can be.
    ///
    /// # Errors
    /// [`TentError::InvalidBatch`], [`TentError::TooManyRequests`], [`TentError::NoTransport`],
    /// and the classic engine's checks of the target range ([`TentError::Engine`]).
    pub fn submit(&self, batch: TentBatchId, requests: &[Request]) -> Result<()> {
        self.inner.submit_requests(batch, requests, None)
    }

    /// As [`submit`](Self::submit); once every task of the batch has completed, `notification`
    /// goes to the target of `requests[0]` (so it arrives after the data).
    ///
    /// # Errors
    /// As [`submit`](Self::submit); an empty request list.
    pub fn submit_with_notification(
        &self,
        batch: TentBatchId,
        requests: &[Request],
        notification: Notification,
    ) -> Result<()> {
        let first = requests.first().ok_or_else(|| {
            TentError::InvalidArgument("a notification needs at least one request".into())
        })?;
        (self.inner).submit_requests(batch, requests, Some((first.target_id, notification)))
    }
}

impl Inner {
    /// Reads the own segment's descriptor again (it lists the memory just (un)registered).
    pub(crate) fn refresh_own(&self) -> Result<()> {
        self.core.refresh_segment(self.core.segment_name())?;
        Ok(())
    }

    fn plan(
        &self,
        r: &Request,
        memory: &BTreeMap<u64, (u64, MemoryKind)>,
        installed: &[(&'static str, Capabilities)],
        cache: &mut Vec<((RequestFacts, u32), Arc<Plan>)>,
        memo: &mut PlanMemo,
    ) -> Result<Arc<Plan>> {
        let core = &self.core;
        if r.length == 0 {
            return Err(TentError::InvalidArgument("zero-length request".into()));
        }
        let from = match memo.source_for(r) {
            Some(kind) => kind,
            None => {
                let end = r.source.checked_add(r.length);
                let (start, (len, kind)) = memory
                    .range(..=r.source)
                    .next_back()
                    .filter(|(start, (len, _))| end.is_some_and(|e| e <= *start + len))
                    .ok_or(TentError::Engine(te_core::Error::AddressNotRegistered {
                        addr: r.source,
                        len: r.length,
                    }))?;
                memo.source = Some((*start, start + len, *kind));
                *kind
            }
        };
        let (to, scope, unreachable) = match memo.target_for(r) {
            Some(known) => known,
            None => {
                let seg =
                    core.segment_for_range(r.target_id, r.target_offset, r.length, r.opcode)?;
                let buffer = seg.check_access(r.target_offset, r.length, r.opcode)?;
                let (to, scope) = match seg.desc().is_file() {
                    true => (MemoryKind::File, Scope::SameProcess),
                    false => (
                        MemoryKind::of_location(&buffer.name),
                        match (seg.name() == core.segment_name(), seg.same_host()) {
                            (true, _) => Scope::SameProcess,
                            (false, true) => Scope::SameHost,
                            (false, false) => Scope::CrossHost,
                        },
                    ),
                };
                // A same-host transport reaches only the buffers it serves (shared memory,
                // a CXL device): one that cannot is left out of the plan, not tried and failed.
                let mut unreachable = 0u32;
                if scope == Scope::SameHost && to == MemoryKind::Dram {
                    for (i, (name, caps)) in installed.iter().enumerate().take(32) {
                        let remote = caps.contains(Capabilities::DRAM_REMOTE_HOST);
                        let serves =
                            || core.transport(name).is_some_and(|t| t.serves(&seg, buffer));
                        if !remote && !serves() {
                            unreachable |= 1 << i;
                        }
                    }
                }
                memo.target = Some(TargetMemo {
                    id: r.target_id,
                    opcode: r.opcode,
                    start: buffer.addr,
                    end: buffer.addr.saturating_add(buffer.length),
                    to,
                    scope,
                    unreachable,
                });
                (to, scope, unreachable)
            }
        };
        let facts = RequestFacts {
            movement: Move::new(from, to, scope),
            priority: r.priority,
            intent: r.intent,
            length: r.length,
            policy_name: r.policy_name.clone(),
            hint: r.transport_hint.clone(),
        };
        // Requests mostly share their facts: each kind is planned once, not once per request.
        let key = (facts, unreachable);
        if let Some((_, plan)) = cache.iter().find(|(k, _)| *k == key) {
            return Ok(plan.clone());
        }
        let mut plan = select(
            &key.0,
            &self.config.policy,
            installed,
            self.config.staging.enable,
        )
        .map_err(TentError::NoTransport)?;
        if let (Plan::Direct(order), Some(first)) = (&mut plan, &self.config.plan_first) {
            // The protocol named goes first, after a hint; the rest stay as failover and for
            // memory it cannot reach (dropped just below).
            let hint = key.0.hint.as_deref();
            let rank = |t: &&'static str| match (Some(*t) == hint, first.iter().any(|f| f == t)) {
                (true, _) => 0,
                (false, true) => 1,
                (false, false) => 2,
            };
            order.sort_by_key(rank);
        }
        if let Plan::Direct(order) = &mut plan {
            let reaches = |t: &&'static str| {
                (installed.iter().position(|(name, _)| name == t))
                    .is_none_or(|i| i >= 32 || unreachable & (1 << i) == 0)
            };
            // With none left, the plan stays whole: its submits say why each cannot.
            if order.iter().any(reaches) {
                order.retain(reaches);
            }
        }
        let plan = Arc::new(plan);
        if cache.len() >= PLAN_CACHE {
            cache.clear();
        }
        cache.push((key, plan.clone()));
        Ok(plan)
    }

    /// Plans `requests` and adds them to `batch` (posted at once, or held and queued).
    pub(crate) fn submit_requests(
        &self,
        batch: TentBatchId,
        requests: &[Request],
        notify: Option<(SegmentId, Notification)>,
    ) -> Result<()> {
        // The clock is read only when a request has a deadline (a read costs on a VM).
        let now = requests
            .iter()
            .any(|r| r.deadline.is_some())
            .then(Instant::now);
        let busy = {
            let mut guard = self.lock();
            let State {
                runs,
                dispatcher,
                memory,
                installed,
                plans,
                ..
            } = &mut *guard;
            let run = runs
                .get_mut(&batch.0)
                .ok_or(TentError::InvalidBatch(batch.0))?;
            if run.tasks.len() + requests.len() > run.capacity {
                return Err(TentError::TooManyRequests {
                    batch: batch.0,
                    capacity: run.capacity,
                    requested: run.tasks.len() + requests.len(),
                });
            }
            // Planned under the lock (no copy of the memory table), each task added as it
            // plans; nothing is queued unless every request plans and te-core holds them all
            // (the added ones are taken back).
            let first = run.tasks.len();
            run.tasks.reserve(requests.len());
            let mut memo = PlanMemo::default();
            let metered = self.core.metrics_enabled();
            for r in requests {
                let plan = match self.plan(r, memory, installed, plans, &mut memo) {
                    Ok(plan) => plan,
                    Err(e) => {
                        run.tasks.truncate(first);
                        return Err(e);
                    }
                };
                run.tasks.push(self.task(r, plan, now, metered));
            }
            let id = BatchId::from_raw(batch.0);
            let at_once = &mut run.tasks[first..];
            if self.post_at_once(dispatcher, id, at_once, notify.as_ref()) {
                return Ok(());
            }
            let held: Vec<HeldTask> = (run.tasks[first..].iter())
                .map(|t| HeldTask {
                    opcode: t.request.opcode,
                    length: t.request.length,
                    deadline: t.deadline,
                    transport: Some(t.label().name()),
                })
                .collect();
            match self.core.hold(id, &held, notify) {
                Ok(at) => debug_assert_eq!(at, first, "te-core's task order is the runtime's"),
                Err(e) => {
                    run.tasks.truncate(first);
                    return Err(e.into());
                }
            }
            for (index, r) in (first..).zip(requests) {
                dispatcher.push(r.priority, (batch.0, index));
            }
            self.post(&mut guard);
            needs_progress(&guard) != Hearing::Kicks
        };
        // The progress thread is needed only while tasks wait.
        if busy {
            self.bell.kick();
        }
        Ok(())
    }

    /// The runtime's facts of a task for `r`, planned `plan`, submitted at `now` (`metered`:
    /// with metrics on, a deadline already past is counted).
    fn task(&self, r: &Request, plan: Arc<Plan>, now: Option<Instant>, metered: bool) -> Task {
        let task = Task {
            request: r.core(),
            priority: r.priority,
            deadline: r.deadline.zip(now).map(|(d, now)| now + d),
            plan,
            choice: 0,
            stage: Stage::Queued,
            errors: Vec::new(),
        };
        if metered && r.deadline == Some(Duration::ZERO) {
            (self.core.metrics()).deadline_infeasible(task.label());
        }
        task
    }
}

impl TentEngine {
    /// One round of progress, and batch `batch`'s te-core id once it (and its task `only`)
    /// is known to be this engine's.
    fn progressed(&self, batch: TentBatchId, only: Option<usize>) -> Result<BatchId> {
        let mut s = self.inner.lock();
        self.inner.progress(&mut s);
        let run = s.run(batch)?;
        if let Some(task) = only
            && task >= run.tasks.len()
        {
            return Err(TentError::InvalidTask {
                batch: batch.0,
                task,
            });
        }
        Ok(BatchId::from_raw(batch.0))
    }

    /// The status of one task.
    ///
    /// # Errors
    /// [`TentError::InvalidBatch`], [`TentError::InvalidTask`].
    pub fn task_status(&self, batch: TentBatchId, task: usize) -> Result<TransferStatus> {
        let id = self.progressed(batch, Some(task))?;
        Ok(self.inner.core.task_status(id, task)?)
    }

    /// The status of every task of the batch, in order.
    ///
    /// # Errors
    /// [`TentError::InvalidBatch`].
    pub fn task_statuses(&self, batch: TentBatchId) -> Result<Vec<TransferStatus>> {
        let id = self.progressed(batch, None)?;
        let n = self.inner.lock().run(batch)?.tasks.len();
        (0..n)
            .map(|t| Ok(self.inner.core.task_status(id, t)?))
            .collect()
    }

    /// The batch's overall status: COMPLETED when all completed; the worst ending (FAILED,
    /// TIMEOUT, CANCELED) once all ended; PENDING or WAITING before.
    ///
    /// # Errors
    /// [`TentError::InvalidBatch`].
    pub fn batch_status(&self, batch: TentBatchId) -> Result<TransferStatus> {
        let id = self.progressed(batch, None)?;
        Ok(self.inner.core.batch_status(id)?)
    }

    /// The errors a task met, one per transport tried (failover keeps them all).
    ///
    /// # Errors
    /// [`TentError::InvalidBatch`], [`TentError::InvalidTask`].
    pub fn task_errors(&self, batch: TentBatchId, task: usize) -> Result<Vec<String>> {
        let mut s = self.inner.lock();
        let run = s.run_mut(batch)?;
        self.inner.see_ends(batch.0, run, Some(task));
        Ok(s.task_mut(batch, task)?.errors.clone())
    }

    /// The transport a task is on (or ended on); `staged` for a staged task.
    ///
    /// # Errors
    /// [`TentError::InvalidBatch`], [`TentError::InvalidTask`].
    pub fn task_transport(&self, batch: TentBatchId, task: usize) -> Result<&'static str> {
        let mut s = self.inner.lock();
        Ok(s.task_mut(batch, task)?.transport().unwrap_or("staged"))
    }

    /// Waits until every task of `batch` ended or `timeout` passed; the overall status.
    ///
    /// # Errors
    /// [`TentError::InvalidBatch`].
    pub fn wait(&self, batch: TentBatchId, timeout: Duration) -> Result<TransferStatus> {
        let id = self.progressed(batch, None)?;
        // te-core wakes this at each end and deadline; the progress thread posts queued tasks
        // and moves failed attempts on meanwhile.
        match self.inner.core.wait(id, timeout) {
            Ok(status) => Ok(status),
            Err(te_core::Error::WaitTimeout(_)) => Ok(self.inner.core.batch_status(id)?),
            Err(e) => Err(e.into()),
        }
    }

    /// Cancels one task: a queued one ends CANCELED at once; a posted (or staged) one stops
    /// and ends CANCELED (or COMPLETED if all had gone); it is not failed over.
    ///
    /// # Errors
    /// [`TentError::InvalidBatch`], [`TentError::InvalidTask`].
    pub fn cancel_task(&self, batch: TentBatchId, task: usize) -> Result<()> {
        let mut s = self.inner.lock();
        if matches!(s.task_mut(batch, task)?.stage, Stage::Queued) {
            s.dispatcher.remove_where(|k| *k == (batch.0, task));
        }
        Ok(self
            .inner
            .core
            .cancel_task(BatchId::from_raw(batch.0), task)?)
    }

    /// Sends `notification` to the owner of segment `target` now (TENT's `sendNotification`).
    ///
    /// # Errors
    /// The classic engine's refusal (unknown segment, unreachable peer).
    pub fn send_notification(&self, target: SegmentId, notification: &Notification) -> Result<()> {
        let name = self.inner.core.segment(target)?.name().to_string();
        Ok(self.inner.core.send_notify(&name, notification)?)
    }

    /// Notifications received so far, oldest first (TENT's `receiveNotification`).
    pub fn receive_notifications(&self) -> Vec<Notification> {
        self.inner
            .core
            .take_notifies()
            .into_iter()
            .map(|r| r.notification)
            .collect()
    }

    /// Waits up to `timeout` for one notification.
    pub fn receive_notification(&self, timeout: Duration) -> Option<Notification> {
        self.inner.core.next_notify(timeout).map(|r| r.notification)
    }
}

impl Drop for TentEngine {
    /// Stops the progress thread and waits for it, then shuts the core engine down here (a
    /// staging job may still hold it): once the drop returns, nothing of the engine moves bytes
    /// any more, and the application may free its buffers.
    fn drop(&mut self) {
        self.inner.stop.store(true, Ordering::Release);
        self.inner.bell.kick();
        self.progress.join_all("tent engine");
        self.inner.core.shutdown();
    }
}
