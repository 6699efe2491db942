//! The runtime's progress: moving a task held again after a failed attempt on to its next
//! transport, ending queued tasks past their deadline, and posting what the queue lets through
//! (grouped per batch and transport into one post of held tasks). Ends themselves are te-core's:
//! the runtime learns of them as events (its bell) and reads them from te-core when asked.
//! Called from every status call, `wait`, and the progress thread, which sleeps until the bell
//! tells of an end it needs, a failover or a submit, or the next deadline is due.

use std::sync::atomic::Ordering;
use std::sync::{Arc, MutexGuard};
use std::time::{Duration, Instant};

use te_core::transport::SliceError;
use te_core::{
    BatchId, Notification, SegmentId, SubmitOptions, TransferRequest, TransferState, TransferStatus,
};
use tracing::debug;

use crate::bell::Hearing;
use crate::engine::Inner;
use crate::policy::Plan;
use crate::queue::Dispatcher;
use crate::staging::{self, StagedMove};
use crate::state::{Run, Stage, State, Task};

/// Tasks posted together: (batch, how they are posted).
type GroupKey = (u64, Posting);

/// How a direct task is posted: (transport, deadline, failing over).
type Posting = (&'static str, Option<Instant>, bool);

/// The buffers one round of `post` fills, kept from round to round so a round allocates
/// nothing once they have grown.
#[derive(Default)]
pub(crate) struct Scratch {
    /// Tasks the queue let through: (batch, task).
    taken: Vec<(u64, usize)>,
    /// The groups, in order of their first task.
    keys: Vec<GroupKey>,
    /// (group, task) in submission order.
    members: Vec<(usize, usize)>,
    /// One group's tasks.
    tasks: Vec<usize>,
    /// One group's requests to te-core.
    requests: Vec<TransferRequest>,
}

impl Scratch {
    fn clear(&mut self) {
        self.taken.clear();
        self.keys.clear();
        self.members.clear();
        self.tasks.clear();
        self.requests.clear();
    }
}

/// What the progress thread must hear besides kicks (submits, failovers): every end while
/// tasks wait in the queue (an end makes room); else nothing.
pub(crate) fn needs_progress(s: &State) -> Hearing {
    match s.dispatcher.waiting() > 0 {
        true => Hearing::Every,
        false => Hearing::Kicks,
    }
}

/// The next deadline still ahead among queued tasks (they are ended then; te-core ends posted
/// ones); `None` when none has one.
pub(crate) fn next_due(s: &State) -> Option<Instant> {
    let mut due: Option<Instant> = None;
    let mut now = None;
    let tasks = s.runs.values().flat_map(|r: &Run| r.tasks.iter());
    for t in tasks.filter(|t| matches!(t.stage, Stage::Queued)) {
        if let Some(d) = t.deadline
            && d > *now.get_or_insert_with(Instant::now)
        {
            due = Some(due.map_or(d, |e| e.min(d)));
        }
    }
    due
}

impl Inner {
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The progress thread: a round at each event it needs to hear ([`needs_progress`]) and
    /// at each deadline; with nothing to do, sleeps until a submit or a failover kicks it.
    pub(crate) fn run_progress(self: Arc<Self>) {
        while !self.stop.load(Ordering::Acquire) {
            // Taken before the look: an event after it ends the sleep below.
            let mut ticket = self.bell.ticket(Hearing::Every);
            let hearing = self.pump();
            // Looked at after the ticket was taken: a drop sets it, then kicks.
            if self.stop.load(Ordering::Acquire) {
                break;
            }
            ticket.hear(hearing);
            let due = match hearing {
                Hearing::Kicks => None,
                _ => next_due(&self.lock()),
            };
            let _ = ticket.sleep(due);
        }
    }

    /// One round of progress; what the progress thread must hear from now on.
    pub(crate) fn pump(&self) -> Hearing {
        let mut s = self.lock();
        self.progress(&mut s);
        needs_progress(&s)
    }

    /// One round of progress under the lock the caller holds.
    pub(crate) fn progress(&self, s: &mut State) {
        s.dispatcher.ended(self.bell.take_ran());
        self.move_on(s);
        self.expire(s);
        self.post(s);
    }

    /// Tasks held again after a failed attempt go to the front of their priority, on their
    /// next transport (an attempt is posted to fail over only while one follows).
    fn move_on(&self, s: &mut State) {
        let metrics = self.core.metrics_enabled().then(|| &**self.core.metrics());
        for (bid, ti) in self.bell.take_held() {
            let Some(t) = s.runs.get_mut(&bid).and_then(|r| r.tasks.get_mut(ti)) else {
                continue;
            };
            let error = self
                .core
                .task_error(BatchId::from_raw(bid), ti)
                .ok()
                .flatten();
            note_failure(t, error.as_ref());
            t.fail_over(metrics);
            debug!(batch = bid, task = ti, to = t.transport(), "failing over");
            t.stage = Stage::Queued;
            s.dispatcher.push_front(t.priority, (bid, ti));
        }
    }

    /// Queued tasks past their deadline end TIMEOUT without being posted.
    fn expire(&self, s: &mut State) {
        if s.dispatcher.waiting() == 0 {
            return;
        }
        let now = Instant::now();
        let State {
            runs, dispatcher, ..
        } = s;
        let late = dispatcher.remove_where(|(b, t)| {
            runs.get(b)
                .and_then(|r| r.tasks.get(*t))
                .and_then(|t| t.deadline)
                .is_some_and(|d| d <= now)
        });
        let timeout = TransferStatus {
            state: TransferState::Timeout,
            transferred_bytes: 0,
        };
        for (b, t) in late {
            // te-core may have ended it already (a status query past its deadline).
            let _ = self.core.end_held(BatchId::from_raw(b), t, timeout, None);
        }
    }

    /// Posts what the queue lets through: direct tasks grouped per batch, transport, deadline
    /// and failover into one post, staged tasks onto their own threads.
    pub(crate) fn post(&self, s: &mut State) {
        if s.dispatcher.waiting() == 0 {
            return;
        }
        let mut scratch = std::mem::take(&mut s.scratch);
        while let Some(k) = s.dispatcher.take_next() {
            scratch.taken.push(k);
        }
        for &(bid, ti) in &scratch.taken {
            let Some(t) = s.runs.get_mut(&bid).and_then(|r| r.tasks.get_mut(ti)) else {
                s.dispatcher.finished();
                continue;
            };
            if let Plan::Staged { local, remote } = &*t.plan {
                let task = (BatchId::from_raw(bid), ti);
                // Not held any more: canceled or expired while it waited.
                if self.core.claim_held(task.0, task.1).is_err() {
                    s.dispatcher.finished();
                    continue;
                }
                let job = staging::start(
                    self.core.clone(),
                    StagedMove {
                        request: t.request,
                        task,
                        local: local[0],
                        remote: remote[0],
                        own: self.own,
                        chunk: self.config.staging.chunk_size,
                        deadline: t.deadline,
                    },
                );
                t.stage = Stage::Staged(job);
                continue;
            }
            let key = (bid, self.posting(t).expect("a direct plan"));
            let group = match scratch.keys.iter().position(|k| *k == key) {
                Some(g) => g,
                None => {
                    scratch.keys.push(key);
                    scratch.keys.len() - 1
                }
            };
            scratch.members.push((group, ti));
        }
        for (g, &key) in scratch.keys.iter().enumerate() {
            scratch.tasks.clear();
            let members = scratch.members.iter().filter(|m| m.0 == g).map(|m| m.1);
            scratch.tasks.extend(members);
            self.post_group(s, key, &scratch.tasks, &mut scratch.requests);
        }
        scratch.clear();
        s.scratch = scratch;
    }

    /// Posts one group's held tasks on their transport; a group te-core refuses is posted
    /// task by task, so that each refusal is its own task's.
    fn post_group(
        &self,
        s: &mut State,
        (bid, posting): GroupKey,
        tasks: &[usize],
        requests: &mut Vec<TransferRequest>,
    ) {
        let Some(run) = s.runs.get_mut(&bid) else {
            return;
        };
        let options = options(posting);
        requests.clear();
        requests.extend(tasks.iter().map(|&ti| run.tasks[ti].request));
        let id = BatchId::from_raw(bid);
        match self.core.post_held(id, tasks, requests, &options) {
            Ok(()) => {
                for &ti in tasks {
                    run.tasks[ti].stage = Stage::Posted;
                }
            }
            Err(_) if tasks.len() > 1 => {
                for &ti in tasks {
                    self.post_group(s, (bid, posting), &[ti], requests);
                }
            }
            Err(e) => self.refused(s, bid, tasks[0], posting.0, &e),
        }
    }

    /// How `t` is posted now; `None` for a staged task.
    fn posting(&self, t: &Task) -> Option<Posting> {
        let transport = t.transport()?;
        let max = self.config.max_failover_attempts as usize;
        let fail_over = self.config.auto_failover && t.has_next() && t.choice < max;
        Some((transport, t.deadline, fail_over))
    }

    /// Posts a submit's new `tasks` (the last of batch `id`) at once, appended in te-core's
    /// order, when nothing waits in the queue, it has room for them all, and they are all
    /// posted alike (as nearly every submit's are): none is held. False when they cannot be,
    /// or te-core refused them; then they are to be held and queued.
    pub(crate) fn post_at_once(
        &self,
        dispatcher: &mut Dispatcher<(u64, usize)>,
        id: BatchId,
        tasks: &mut [Task],
        notify: Option<&(SegmentId, Notification)>,
    ) -> bool {
        let Some(posting) = tasks.first().and_then(|t| self.posting(t)) else {
            return false;
        };
        if dispatcher.waiting() > 0
            || dispatcher.room() < tasks.len()
            || tasks[1..].iter().any(|t| self.posting(t) != Some(posting))
        {
            return false;
        }
        let options = options(posting);
        let many: Vec<TransferRequest>;
        let requests = match &*tasks {
            [one] => std::slice::from_ref(&one.request),
            all => {
                many = all.iter().map(|t| t.request).collect();
                &many
            }
        };
        let options = match notify {
            Some((_, n)) => options.notifying(n.clone()),
            None => options,
        };
        let posted = self.core.submit_with(id, requests, &options);
        if posted.is_err() {
            return false;
        }
        dispatcher.count_posted(tasks.len());
        tasks.iter_mut().for_each(|t| t.stage = Stage::Posted);
        true
    }

    /// Task `ti` of batch `bid` could not be posted on `transport`: it ended meanwhile, or
    /// the transport refused it (it cannot reach a buffer); then it moves on to its next
    /// transport at once, or fails with the reason.
    fn refused(&self, s: &mut State, bid: u64, ti: usize, transport: &str, e: &te_core::Error) {
        let id = BatchId::from_raw(bid);
        s.dispatcher.finished();
        let Some(t) = s.runs.get_mut(&bid).and_then(|r| r.tasks.get_mut(ti)) else {
            return;
        };
        if self
            .core
            .task_status(id, ti)
            .map_or(true, |st| st.state.is_terminal())
        {
            return;
        }
        t.errors.push(format!("{transport}: {e}"));
        // A refusal at submit is a failed attempt that te-core never started.
        let metrics = self.core.metrics_enabled().then(|| &**self.core.metrics());
        if let Some(m) = metrics {
            m.attempt_ended(t.label(), t.request.opcode.operation(), false, 0);
        }
        if t.has_next() {
            t.fail_over(metrics);
            s.dispatcher.push_front(t.priority, (bid, ti));
            return;
        }
        let failed = TransferStatus {
            state: TransferState::Failed,
            transferred_bytes: 0,
        };
        let error = SliceError::Unsupported(format!("{transport}: {e}"));
        let _ = self.core.end_held(id, ti, failed, Some(error));
    }

    /// Records the error of each ended task of `run` (te-core's batch `bid`) that ended on
    /// its final attempt or staged; only task `only` when given.
    pub(crate) fn see_ends(&self, bid: u64, run: &mut Run, only: Option<usize>) {
        let id = BatchId::from_raw(bid);
        let range = match only {
            Some(i) => i..(i + 1).min(run.tasks.len()),
            None => 0..run.tasks.len(),
        };
        for ti in range {
            let t = &mut run.tasks[ti];
            if matches!(t.stage, Stage::Ended) {
                continue;
            }
            let Ok(status) = self.core.task_status(id, ti) else {
                continue;
            };
            if !status.state.is_terminal() {
                continue;
            }
            match &t.stage {
                Stage::Posted if status.state == TransferState::Failed => {
                    let error = self.core.task_error(id, ti).ok().flatten();
                    note_failure(t, error.as_ref());
                }
                Stage::Staged(job) => {
                    if let Some((_, Some(e))) = job.outcome() {
                        t.errors.push(format!("staged: {e}"));
                    }
                }
                _ => {}
            }
            t.stage = Stage::Ended;
        }
    }
}

/// te-core's options for tasks posted as `posting` says.
fn options((transport, deadline, fail_over): Posting) -> SubmitOptions {
    let options = SubmitOptions::default()
        .via(transport)
        .failing_over(fail_over)
        .as_planned();
    match deadline {
        Some(d) => options.within(
            d.saturating_duration_since(Instant::now())
                .max(Duration::from_micros(1)),
        ),
        None => options,
    }
}

/// Records the error an attempt of `t` failed with, on its transport.
fn note_failure(t: &mut Task, error: Option<&SliceError>) {
    let why = error.map_or_else(|| "failed".to_string(), ToString::to_string);
    t.errors
        .push(format!("{}: {why}", t.transport().unwrap_or("staged")));
}
