//! The runtime's progress: reaping posted and staged tasks that ended, failing a task over to
//! its next transport, ending queued tasks past their deadline, posting what the queue lets
//! through (grouped per batch and transport into one SubBatch submit), and sending
//! notifications once their batch completed. Called from every status call, `wait`, and the progress thread, which
//! sleeps until the bell tells of an end or a submit, or the next deadline is due.

use std::sync::atomic::Ordering;
use std::sync::{Arc, MutexGuard};
use std::time::{Duration, Instant};

use te_core::{SubmitOptions, TransferRequest, TransferState, TransferStatus};
use tracing::{debug, warn};

use crate::bell::Hearing;
use crate::engine::Inner;
use crate::policy::Plan;
use crate::queue::Dispatcher;
use crate::staging::{self, StagedMove};
use crate::state::{Batch, State, Task, TaskState};

/// A notification due for a batch: (batch, (target segment, notification)).
pub(crate) type Notice = (u64, (te_core::SegmentId, te_core::Notification));

/// Tasks posted together: (batch, transport, deadline).
type GroupKey = (u64, &'static str, Option<Instant>);

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
    /// One group's requests to the classic engine.
    requests: Vec<TransferRequest>,
    /// SubBatches `reap` asked about, and those of them complete.
    asked: Vec<te_core::BatchId>,
    complete: Vec<te_core::BatchId>,
}

impl Scratch {
    fn clear(&mut self) {
        self.taken.clear();
        self.keys.clear();
        self.members.clear();
        self.tasks.clear();
        self.requests.clear();
        self.asked.clear();
        self.complete.clear();
    }
}

/// What the progress thread must hear to make progress without the application polling:
/// every end while tasks wait in the queue (an end makes room) or are staged; decisive ends
/// while a notification is owed (its batch's end, or a failure to fail over); else nothing.
pub(crate) fn needs_progress(s: &State) -> Hearing {
    let staged = || {
        s.live.iter().any(|(b, t)| {
            s.batches
                .get(b)
                .and_then(|b| b.tasks.get(*t))
                .is_some_and(|t| matches!(t.state, TaskState::Staged(_)))
        })
    };
    if s.dispatcher.waiting() > 0 || staged() {
        Hearing::Every
    } else if s.batches.values().any(|b| b.notify.is_some()) {
        Hearing::Decisive
    } else {
        Hearing::Kicks
    }
}

/// The next deadline still ahead among unfinished tasks (a queued one is ended then, a posted
/// one asked about so that te-core ends it); `None` when no task has one.
pub(crate) fn next_due(s: &State) -> Option<Instant> {
    let mut due: Option<Instant> = None;
    let mut now = None;
    let tasks = s.batches.values().flat_map(|b: &Batch| b.tasks.iter());
    for t in tasks.filter(|t| !matches!(t.state, TaskState::Done(_))) {
        if let Some(d) = t.deadline
            && d > *now.get_or_insert_with(Instant::now)
        {
            due = Some(due.map_or(d, |e| e.min(d)));
        }
    }
    due
}

/// The aggregate of task statuses, in one pass (no list needed).
pub(crate) fn overall(statuses: impl IntoIterator<Item = TransferStatus>) -> TransferStatus {
    let rank = |s: TransferState| match s {
        TransferState::Failed => 3,
        TransferState::Timeout => 2,
        TransferState::Canceled => 1,
        _ => 0,
    };
    let mut transferred_bytes = 0;
    let (mut all_ended, mut any_started) = (true, false);
    let mut worst = TransferState::Completed;
    for s in statuses {
        transferred_bytes += s.transferred_bytes;
        all_ended &= s.state.is_terminal();
        any_started |= s.state != TransferState::Waiting;
        if rank(s.state) > rank(worst) {
            worst = s.state;
        }
    }
    let state = match (all_ended, any_started) {
        (true, _) => worst,
        (false, true) => TransferState::Pending,
        (false, false) => TransferState::Waiting,
    };
    TransferStatus {
        state,
        transferred_bytes,
    }
}

impl Inner {
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn status_of(&self, t: &Task) -> TransferStatus {
        match &t.state {
            TaskState::Done(s) => *s,
            TaskState::Queued => TransferStatus {
                state: TransferState::Waiting,
                transferred_bytes: 0,
            },
            TaskState::Posted { sub, index } => {
                let mut s = self
                    .core
                    .task_status(*sub, *index)
                    .unwrap_or(TransferStatus {
                        state: TransferState::Pending,
                        transferred_bytes: 0,
                    });
                // A failure the next pump fails over is not the end yet.
                if s.state.is_terminal() {
                    s.state = TransferState::Pending;
                }
                s
            }
            TaskState::Staged(job) => TransferStatus {
                state: TransferState::Pending,
                transferred_bytes: job.moved(),
            },
        }
    }

    /// The progress thread: pumps at each end it needs to hear ([`needs_progress`]) and at
    /// each deadline; with nothing to do, sleeps until a submit needs it.
    pub(crate) fn run_progress(self: Arc<Self>) {
        while !self.stop.load(Ordering::Acquire) {
            // Taken before the look: an end or a kick after it ends the sleep below.
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
        let (busy, notices) = {
            let mut s = self.lock();
            let notices = self.progress(&mut s);
            (needs_progress(&s), notices)
        };
        self.send_notices(notices);
        busy
    }

    /// One round of progress under the lock the caller holds; the notifications now due,
    /// for [`send_notices`](Self::send_notices) once the lock is released.
    pub(crate) fn progress(&self, s: &mut State) -> Vec<Notice> {
        self.reap(s);
        self.expire(s);
        self.post(s);
        let mut notices = Vec::new();
        for (id, b) in s.batches.iter_mut() {
            // Most batches owe no notification: their tasks are not looked at.
            if b.notify.is_none() || !b.ended() {
                continue;
            }
            let all_ok = b.tasks.iter().all(
                |t| matches!(&t.state, TaskState::Done(st) if st.state == TransferState::Completed),
            );
            if let Some(n) = b.notify.take().filter(|_| all_ok) {
                notices.push((*id, n));
            }
        }
        notices
    }

    /// Sends `notices` (outside the lock: the data they announce is complete).
    pub(crate) fn send_notices(&self, notices: Vec<Notice>) {
        for (batch, (target, n)) in notices {
            let sent = self
                .core
                .segment(target)
                .and_then(|seg| self.core.send_notify(seg.name(), &n));
            if let Err(e) = sent {
                warn!(batch, error = %e, "notification not delivered");
            }
        }
    }

    /// Polls live tasks: ended ones finish or fail over.
    fn reap(&self, s: &mut State) {
        let State {
            batches,
            dispatcher,
            live,
            scratch,
            ..
        } = s;
        // SubBatches whose every task completed (one question instead of one per task).
        let (complete, asked) = (&mut scratch.complete, &mut scratch.asked);
        complete.clear();
        asked.clear();
        for &(bid, ti) in live.iter() {
            if let Some(TaskState::Posted { sub, .. }) = batches
                .get(&bid)
                .and_then(|b| b.tasks.get(ti))
                .map(|t| &t.state)
            {
                if !asked.contains(sub) {
                    asked.push(*sub);
                    let done = self.core.batch_status(*sub);
                    if done.is_ok_and(|st| st.state == TransferState::Completed) {
                        complete.push(*sub);
                    }
                }
            }
        }
        live.retain(|&(bid, ti)| {
            let Some(t) = batches.get_mut(&bid).and_then(|b| b.tasks.get_mut(ti)) else {
                return false;
            };
            let (state, status, error) = match &t.state {
                TaskState::Posted { sub, .. } if complete.contains(sub) => {
                    let st = TransferStatus {
                        state: TransferState::Completed,
                        transferred_bytes: t.request.length,
                    };
                    (st.state, st, None)
                }
                TaskState::Posted { sub, index } => match self.core.task_status(*sub, *index) {
                    Ok(st) if st.state == TransferState::Completed => (st.state, st, None),
                    Ok(st) if st.state.is_terminal() => {
                        let err = self.core.task_error(*sub, *index).ok().flatten();
                        if let (Some(m), Some(e)) = (&mut t.meter, &err) {
                            m.failed_with(te_core::transport::failure_kind(e));
                        }
                        (st.state, st, err.map(|e| e.to_string()))
                    }
                    _ => return true,
                },
                TaskState::Staged(job) => match job.outcome() {
                    Some((state, err)) => (
                        state,
                        TransferStatus {
                            state,
                            transferred_bytes: job.moved(),
                        },
                        err,
                    ),
                    None => return true,
                },
                _ => return false,
            };
            dispatcher.finished();
            if let Some(e) = error {
                t.errors
                    .push(format!("{}: {e}", t.transport().unwrap_or("staged")));
            }
            let alternatives = match &*t.plan {
                Plan::Direct(order) => order.len(),
                Plan::Staged { .. } => 1,
            };
            let failover = state == TransferState::Failed
                && !t.canceled
                && self.config.auto_failover
                && (t.choice as u32) < self.config.max_failover_attempts
                && t.choice + 1 < alternatives;
            if failover {
                t.fail_over();
                debug!(
                    batch = bid,
                    task = ti,
                    to = t.transport(),
                    "failing over to the next transport"
                );
                t.state = TaskState::Queued;
                dispatcher.push_front(t.request.priority, (bid, ti));
            } else {
                t.end(status);
            }
            false
        });
    }

    /// Queued tasks past their deadline end TIMEOUT without being posted.
    fn expire(&self, s: &mut State) {
        if s.dispatcher.waiting() == 0 {
            return;
        }
        let now = Instant::now();
        let State {
            batches,
            dispatcher,
            ..
        } = s;
        let late = dispatcher.remove_where(|(b, t)| {
            batches
                .get(b)
                .and_then(|b| b.tasks.get(*t))
                .and_then(|t| t.deadline)
                .is_some_and(|d| d <= now)
        });
        for (b, t) in late {
            if let Some(task) = batches.get_mut(&b).and_then(|b| b.tasks.get_mut(t)) {
                task.end(TransferStatus {
                    state: TransferState::Timeout,
                    transferred_bytes: 0,
                });
            }
        }
    }

    /// Posts what the queue lets through: direct tasks grouped per batch and transport into
    /// one SubBatch submit, staged tasks onto their own threads.
    pub(crate) fn post(&self, s: &mut State) {
        if s.dispatcher.waiting() == 0 {
            return;
        }
        let mut scratch = std::mem::take(&mut s.scratch);
        while let Some(k) = s.dispatcher.take_next() {
            scratch.taken.push(k);
        }
        dispatched(s, &scratch.taken);
        // Groups keep submission order: (batch, transport, deadline) → tasks.
        for &(bid, ti) in &scratch.taken {
            let Some(t) = s.batches.get_mut(&bid).and_then(|b| b.tasks.get_mut(ti)) else {
                s.dispatcher.finished();
                continue;
            };
            if let Plan::Staged { local, remote } = &*t.plan {
                let job = staging::start(
                    self.core.clone(),
                    self.bell.clone(),
                    StagedMove {
                        request: t.request.core(),
                        local: local[0],
                        remote: remote[0],
                        own: self.own,
                        chunk: self.config.staging.chunk_size,
                        deadline: t.deadline,
                    },
                );
                if let Some(m) = &mut t.meter {
                    m.posted(Instant::now());
                }
                t.state = TaskState::Staged(job);
                s.live.push((bid, ti));
                continue;
            }
            let transport = t.transport().expect("a direct plan has its transport");
            let key = (bid, transport, t.deadline);
            let group = match scratch.keys.iter().position(|k| *k == key) {
                Some(g) => g,
                None => {
                    scratch.keys.push(key);
                    scratch.keys.len() - 1
                }
            };
            scratch.members.push((group, ti));
        }
        for (g, &(bid, transport, deadline)) in scratch.keys.iter().enumerate() {
            scratch.tasks.clear();
            let members = scratch.members.iter().filter(|m| m.0 == g).map(|m| m.1);
            scratch.tasks.extend(members);
            self.submit_group(
                s,
                bid,
                transport,
                deadline,
                &scratch.tasks,
                &mut scratch.requests,
            );
        }
        scratch.clear();
        s.scratch = scratch;
    }

    fn submit_group(
        &self,
        s: &mut State,
        bid: u64,
        transport: &'static str,
        deadline: Option<Instant>,
        tasks: &[usize],
        requests: &mut Vec<TransferRequest>,
    ) {
        let State {
            batches,
            dispatcher,
            live,
            ..
        } = s;
        let Some(b) = batches.get_mut(&bid) else {
            return;
        };
        let sub = match b.subs.iter().position(|(t, _, _)| *t == transport) {
            Some(i) => i,
            None => {
                let cap = b.capacity * (self.config.max_failover_attempts as usize + 1);
                let cap = cap.min(self.config.core.max_batch_size);
                match self.core.allocate_watched_batch(cap, self.bell.clone()) {
                    Ok(id) => {
                        b.subs.push((transport, id, 0));
                        b.subs.len() - 1
                    }
                    Err(e) => {
                        for &ti in tasks {
                            fail_now(&mut b.tasks[ti], dispatcher, format!("{transport}: {e}"));
                        }
                        return;
                    }
                }
            }
        };
        let mut options = SubmitOptions::default().via(transport).as_attempts();
        if let Some(d) = deadline {
            options = options.within(
                d.saturating_duration_since(Instant::now())
                    .max(Duration::from_micros(1)),
            );
        }
        let (_, sub_id, used) = b.subs[sub];
        requests.clear();
        requests.extend(tasks.iter().map(|&ti| b.tasks[ti].request.core()));
        let room = self
            .config
            .core
            .max_batch_size
            .min(b.capacity * (self.config.max_failover_attempts as usize + 1));
        let outcome = match used + requests.len() <= room {
            true => self.core.submit_with(sub_id, requests, &options),
            false => Err(te_core::Error::TooManyRequests {
                capacity: room,
                requested: used + requests.len(),
            }),
        };
        match outcome {
            Ok(()) => {
                let mut now = None;
                for (k, &ti) in tasks.iter().enumerate() {
                    let t = &mut b.tasks[ti];
                    if let Some(m) = &mut t.meter {
                        m.posted(*now.get_or_insert_with(Instant::now));
                    }
                    t.state = TaskState::Posted {
                        sub: sub_id,
                        index: used + k,
                    };
                    live.push((bid, ti));
                }
                b.subs[sub].2 += requests.len();
            }
            // Submit-stage refusals (the transport cannot reach a buffer): the task moves on to
            // its next transport at once, or fails with the reason.
            Err(e) => {
                for &ti in tasks {
                    let t = &mut b.tasks[ti];
                    t.errors.push(format!("{transport}: {e}"));
                    // A refusal at submit is a failed attempt that te-core never started.
                    let (label, op) = (t.label(), t.request.opcode.operation());
                    if let Some(m) = &mut t.meter {
                        m.metrics().attempt_ended(label, op, false, 0);
                        m.failed_with(te_metrics::counters::FailureKind::Refused);
                    }
                    let more = match &*t.plan {
                        Plan::Direct(order) => t.choice + 1 < order.len(),
                        Plan::Staged { .. } => false,
                    };
                    dispatcher.finished();
                    if more {
                        t.fail_over();
                        dispatcher.push_front(t.request.priority, (bid, ti));
                    } else {
                        t.end(TransferStatus {
                            state: TransferState::Failed,
                            transferred_bytes: 0,
                        });
                    }
                }
            }
        }
    }
}

fn fail_now(t: &mut Task, dispatcher: &mut Dispatcher<(u64, usize)>, why: String) {
    dispatcher.finished();
    t.errors.push(why);
    t.end(TransferStatus {
        state: TransferState::Failed,
        transferred_bytes: 0,
    });
}

/// With metrics on, marks the moment `taken` tasks left the queue (one clock read for them all).
fn dispatched(s: &mut State, taken: &[(u64, usize)]) {
    let mut now = None;
    for &(bid, ti) in taken {
        if let Some(m) = (s.batches.get_mut(&bid))
            .and_then(|b| b.tasks.get_mut(ti))
            .and_then(|t| t.meter.as_mut())
        {
            m.dispatched(*now.get_or_insert_with(Instant::now));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn st(state: TransferState, n: u64) -> TransferStatus {
        TransferStatus {
            state,
            transferred_bytes: n,
        }
    }

    #[test]
    fn the_overall_status_is_the_worst_ending_once_all_ended() {
        use TransferState::*;
        assert_eq!(
            overall([st(Completed, 1), st(Completed, 2)]),
            st(Completed, 3)
        );
        assert_eq!(overall([st(Completed, 1), st(Waiting, 0)]).state, Pending);
        assert_eq!(overall([st(Waiting, 0), st(Waiting, 0)]).state, Waiting);
        assert_eq!(overall([st(Canceled, 0), st(Timeout, 0)]).state, Timeout);
        assert_eq!(
            overall([st(Failed, 0), st(Timeout, 0), st(Completed, 1)]).state,
            Failed
        );
    }
}
