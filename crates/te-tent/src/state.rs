//! What te-tent's runtime holds under its lock ([`State`]): its batches and their tasks, the
//! runtime queue, the tasks to poll, the registered memory, the plans made so far, and freed
//! batches kept for reuse. Plain data with look-ups; the decisions are `engine.rs`'s and
//! `progress.rs`'s.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Instant;

use te_core::transport::Capabilities;
use te_core::{Notification, SegmentId, TransferStatus};

use te_metrics::counters::TransportLabel;

use crate::capability::MemoryKind;
use crate::meter::RequestMeter;
use crate::policy::{Plan, RequestFacts};
use crate::queue::Dispatcher;
use crate::request::{Request, TentBatchId};
use crate::staging::Job;
use crate::{Result, TentError};

pub(crate) enum TaskState {
    Queued,
    Posted { sub: te_core::BatchId, index: usize },
    Staged(Arc<Job>),
    Done(TransferStatus),
}

pub(crate) struct Task {
    pub(crate) request: Request,
    /// Shared with the plan cache and the batch's other tasks of the same kind.
    pub(crate) plan: Arc<Plan>,
    /// Index of the transport in the plan now (or next) in use.
    pub(crate) choice: usize,
    pub(crate) state: TaskState,
    pub(crate) deadline: Option<Instant>,
    pub(crate) errors: Vec<String>,
    pub(crate) canceled: bool,
    /// Its moments, with metrics on.
    pub(crate) meter: Option<Box<RequestMeter>>,
}

impl Task {
    pub(crate) fn transport(&self) -> Option<&'static str> {
        match &*self.plan {
            Plan::Direct(order) => order.get(self.choice).copied(),
            Plan::Staged { .. } => None,
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

    /// Ends the task with `status`, counted where it is metered.
    pub(crate) fn end(&mut self, status: TransferStatus) {
        if let Some(m) = &self.meter {
            let op = self.request.opcode.operation();
            m.ended(self.label(), op, self.request.length, &status);
        }
        self.state = TaskState::Done(status);
    }

    /// Counts a move to its next transport (TENT's failover) where it is metered.
    pub(crate) fn fail_over(&mut self) {
        let from = self.label();
        self.choice += 1;
        if let Some(m) = &self.meter {
            m.metrics().failover(from, self.label());
        }
    }
}

pub(crate) struct Batch {
    pub(crate) capacity: usize,
    pub(crate) tasks: Vec<Task>,
    /// SubBatches: (transport, te-core batch, tasks used).
    pub(crate) subs: Vec<(&'static str, te_core::BatchId, usize)>,
    pub(crate) notify: Option<(SegmentId, Notification)>,
}

impl Batch {
    /// Whether every task has ended and been reaped (`TaskState::Done`, whatever its outcome).
    pub(crate) fn ended(&self) -> bool {
        self.tasks
            .iter()
            .all(|t| matches!(t.state, TaskState::Done(_)))
    }
}

pub(crate) struct State {
    pub(crate) batches: HashMap<u64, Batch, te_core::hashing::IdHashing>,
    /// This engine's tag in its batch ids (te-core's engine tags: never zero).
    pub(crate) batch_tag: u16,
    /// The sequence number of the last batch id handed out.
    pub(crate) last_batch: u32,
    pub(crate) dispatcher: Dispatcher<(u64, usize)>,
    /// Posted and staged tasks, to poll.
    pub(crate) live: Vec<(u64, usize)>,
    /// The installed transports and their capabilities (refreshed at each install).
    pub(crate) installed: Vec<(&'static str, Capabilities)>,
    /// Registered memory: start → (length, kind).
    pub(crate) memory: BTreeMap<u64, (u64, MemoryKind)>,
    /// Plans already made, by the facts they were made for (at most [`PLAN_CACHE`]; emptied
    /// when a transport is installed). A policy's choice depends on nothing else.
    /// Plans by their facts and the installed transports that cannot reach the target.
    pub(crate) plans: Vec<((RequestFacts, u32), Arc<Plan>)>,
    /// Buffers `post` reuses from round to round (empty between rounds).
    pub(crate) scratch: crate::progress::Scratch,
    /// Freed batches, emptied, whose task and SubBatch lists the next batches reuse (at most
    /// [`SPARE_BATCHES`]): a batch of one task then allocates nothing of its own.
    pub(crate) spare: Vec<Batch>,
}

/// Freed batches kept for reuse.
const SPARE_BATCHES: usize = 16;
/// A freed batch whose task list grew past this many entries is not kept.
const SPARE_TASKS: usize = 1024;

/// Plans kept for reuse: requests mostly fall into a few kinds, and a lookup among this many
/// costs less than a policy run.
pub(crate) const PLAN_CACHE: usize = 32;

impl State {
    /// A batch id no live batch has: the engine's tag above a 32-bit sequence number, so ids
    /// are non-zero, below 2^47 (Mooncake's ids are below 2^48), and another engine's ids
    /// are not this one's.
    pub(crate) fn next_batch_id(&mut self) -> u64 {
        loop {
            self.last_batch = self.last_batch.wrapping_add(1);
            let id = (u64::from(self.batch_tag) << 32) | u64::from(self.last_batch);
            if self.last_batch != 0 && !self.batches.contains_key(&id) {
                return id;
            }
        }
    }

    /// Batch `batch`.
    pub(crate) fn batch(&self, batch: TentBatchId) -> Result<&Batch> {
        self.batches
            .get(&batch.0)
            .ok_or(TentError::InvalidBatch(batch.0))
    }

    /// Batch `batch`, writable, and the runtime queue beside it.
    pub(crate) fn batch_and_queue(
        &mut self,
        batch: TentBatchId,
    ) -> Result<(&mut Batch, &mut Dispatcher<(u64, usize)>)> {
        let b = self
            .batches
            .get_mut(&batch.0)
            .ok_or(TentError::InvalidBatch(batch.0))?;
        Ok((b, &mut self.dispatcher))
    }

    /// A batch of `capacity` tasks, made from a freed one's lists when one is kept.
    pub(crate) fn fresh_batch(&mut self, capacity: usize) -> Batch {
        match self.spare.pop() {
            Some(spare) => Batch { capacity, ..spare },
            None => Batch {
                capacity,
                tasks: Vec::new(),
                subs: Vec::new(),
                notify: None,
            },
        }
    }

    /// Keeps freed batch `b`'s lists for a later [`fresh_batch`](Self::fresh_batch), emptied
    /// (its SubBatches already freed), unless enough are kept or its task list grew large.
    pub(crate) fn keep_spare(&mut self, mut b: Batch) {
        if self.spare.len() < SPARE_BATCHES && b.tasks.capacity() <= SPARE_TASKS {
            b.tasks.clear();
            b.subs.clear();
            b.notify = None;
            self.spare.push(b);
        }
    }

    /// Task `task` of batch `batch`.
    pub(crate) fn task(&self, batch: TentBatchId, task: usize) -> Result<&Task> {
        self.batch(batch)?
            .tasks
            .get(task)
            .ok_or(TentError::InvalidTask {
                batch: batch.0,
                task,
            })
    }
}
