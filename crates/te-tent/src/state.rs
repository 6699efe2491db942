//! What te-tent's runtime holds under its lock ([`State`]): for each batch (te-core's, under
//! te-core's id) the plan of each of its tasks and where the runtime has put it, the runtime
//! queue, the registered memory, the plans made so far, and freed lists kept for reuse. The
//! tasks themselves (their status, waits, cancels, deadlines, the batch's notification) are
//! te-core's. Plain data with look-ups; the decisions are `engine.rs`'s and `progress.rs`'s.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Instant;

use te_core::TransferRequest;
use te_core::transport::Capabilities;

use te_metrics::counters::{Metrics, TransportLabel};

use crate::capability::MemoryKind;
use crate::policy::{Plan, Priority, RequestFacts};
use crate::queue::Dispatcher;
use crate::request::TentBatchId;
use crate::staging::Job;
use crate::{Result, TentError};

/// Where the runtime has put a task.
pub(crate) enum Stage {
    /// Held in te-core, waiting in the runtime queue.
    Queued,
    /// An attempt runs on its transport.
    Posted,
    /// Claimed, moving through host memory.
    Staged(Arc<Job>),
    /// Seen ended (its error and metrics taken).
    Ended,
}

/// The runtime's facts of one task: what it moves, its plan and where it is in it.
pub(crate) struct Task {
    pub(crate) request: TransferRequest,
    pub(crate) priority: Priority,
    /// Shared with the plan cache and the batch's other tasks of the same kind.
    pub(crate) plan: Arc<Plan>,
    /// Index of the transport in the plan now (or next) in use.
    pub(crate) choice: usize,
    pub(crate) stage: Stage,
    pub(crate) deadline: Option<Instant>,
    pub(crate) errors: Vec<String>,
}

impl Task {
    pub(crate) fn transport(&self) -> Option<&'static str> {
        match &*self.plan {
            Plan::Direct(order) => order.get(self.choice).copied(),
            Plan::Staged { .. } => None,
        }
    }

    /// Whether a transport follows the one in use in its plan.
    pub(crate) fn has_next(&self) -> bool {
        match &*self.plan {
            Plan::Direct(order) => self.choice + 1 < order.len(),
            Plan::Staged { .. } => false,
        }
    }

    /// Its `transport` label: the transport in use, or a staged move's hop to the target.
    pub(crate) fn label(&self) -> TransportLabel {
        match &*self.plan {
            Plan::Direct(order) => order
                .get(self.choice)
                .map_or(TransportLabel::Unspec, |t| TransportLabel::of(t)),
            Plan::Staged { remote, .. } => remote
                .first()
                .map_or(TransportLabel::Unspec, |t| TransportLabel::of(t)),
        }
    }

    /// Moves it to its next transport (TENT's failover), counted in `metrics` when given.
    pub(crate) fn fail_over(&mut self, metrics: Option<&Metrics>) {
        let from = self.label();
        self.choice += 1;
        if let Some(m) = metrics {
            m.failover(from, self.label());
        }
    }
}

/// The runtime's facts of one batch's tasks, in te-core's task order.
pub(crate) struct Run {
    pub(crate) capacity: usize,
    pub(crate) tasks: Vec<Task>,
}

pub(crate) struct State {
    /// By te-core batch id.
    pub(crate) runs: HashMap<u64, Run, te_core::hashing::IdHashing>,
    pub(crate) dispatcher: Dispatcher<(u64, usize)>,
    /// The installed transports and their capabilities (refreshed at each install).
    pub(crate) installed: Vec<(&'static str, Capabilities)>,
    /// Registered memory: start → (length, kind).
    pub(crate) memory: BTreeMap<u64, (u64, MemoryKind)>,
    /// Plans already made, by the facts they were made for and the installed transports that
    /// cannot reach the target (at most [`PLAN_CACHE`]; emptied when a transport is
    /// installed). A policy's choice depends on nothing else.
    pub(crate) plans: Vec<((RequestFacts, u32), Arc<Plan>)>,
    /// Buffers `post` reuses from round to round (empty between rounds).
    pub(crate) scratch: crate::progress::Scratch,
    /// Task lists of freed batches, emptied, for the next batches (at most [`SPARE_RUNS`]).
    pub(crate) spare: Vec<Vec<Task>>,
}

/// Freed task lists kept for reuse.
const SPARE_RUNS: usize = 16;
/// A freed task list that grew past this many entries is not kept.
const SPARE_TASKS: usize = 1024;

/// Plans kept for reuse: requests mostly fall into a few kinds, and a lookup among this many
/// costs less than a policy run.
pub(crate) const PLAN_CACHE: usize = 32;

impl State {
    /// Batch `batch`'s facts.
    pub(crate) fn run(&self, batch: TentBatchId) -> Result<&Run> {
        self.runs
            .get(&batch.0)
            .ok_or(TentError::InvalidBatch(batch.0))
    }

    /// Batch `batch`'s facts, writable.
    pub(crate) fn run_mut(&mut self, batch: TentBatchId) -> Result<&mut Run> {
        self.runs
            .get_mut(&batch.0)
            .ok_or(TentError::InvalidBatch(batch.0))
    }

    /// Task `task` of batch `batch`.
    pub(crate) fn task_mut(&mut self, batch: TentBatchId, task: usize) -> Result<&mut Task> {
        self.run_mut(batch)?
            .tasks
            .get_mut(task)
            .ok_or(TentError::InvalidTask {
                batch: batch.0,
                task,
            })
    }

    /// Facts for a new batch of `capacity` tasks, on a freed batch's list when one is kept.
    pub(crate) fn fresh_run(&mut self, capacity: usize) -> Run {
        Run {
            capacity,
            tasks: self.spare.pop().unwrap_or_default(),
        }
    }

    /// Keeps freed batch `run`'s task list, emptied, for a later
    /// [`fresh_run`](Self::fresh_run), unless enough are kept or it grew large.
    pub(crate) fn keep_spare(&mut self, run: Run) {
        let mut tasks = run.tasks;
        if self.spare.len() < SPARE_RUNS && tasks.capacity() <= SPARE_TASKS {
            tasks.clear();
            self.spare.push(tasks);
        }
    }
}
