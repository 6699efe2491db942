//! Staging through host memory: a request no transport can make directly (GPU memory with no
//! GPU-capable transport to the target) runs as two hops per chunk through a host buffer of
//! this process: the local hop between the request's memory and the buffer (a transport with
//! `GPU_LOCAL`, through the local segment), and the remote hop between the buffer and the
//! target. Each job runs on its own thread, its task claimed in te-core, and ends the task
//! itself; hops are sequential, so the target sees a chunk only after its local hop completed.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use te_core::transport::SliceError;
use te_core::{
    BatchId, HostBuffer, Opcode, Permission, SegmentId, SubmitOptions, TransferEngine,
    TransferRequest, TransferState, TransferStatus,
};
use tracing::{debug, warn};

/// One staged request in progress.
#[derive(Debug, Default)]
pub(crate) struct Job {
    outcome: Mutex<Option<(TransferState, Option<String>)>>,
    moved: AtomicU64,
}

impl Job {
    /// The final state and error, once the job ended.
    pub(crate) fn outcome(&self) -> Option<(TransferState, Option<String>)> {
        self.outcome
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn end(&self, outcome: (TransferState, Option<String>)) {
        *self.outcome.lock().unwrap_or_else(|e| e.into_inner()) = Some(outcome);
    }
}

/// What a staged request needs.
pub(crate) struct StagedMove {
    pub request: TransferRequest,
    /// Its task, claimed: ended by the job.
    pub task: (BatchId, usize),
    /// Transport of the local hop (request memory ↔ staging buffer).
    pub local: &'static str,
    /// Transport of the remote hop (staging buffer ↔ target).
    pub remote: &'static str,
    /// This engine's own segment (the local hop's target).
    pub own: SegmentId,
    pub chunk: u64,
    pub deadline: Option<Instant>,
}

/// Starts `m` on a thread; the job ends its task in te-core with its outcome.
pub(crate) fn start(core: Arc<TransferEngine>, m: StagedMove) -> Arc<Job> {
    let job = Arc::new(Job::default());
    let j = job.clone();
    let c = core.clone();
    let task = m.task;
    let spawned = std::thread::Builder::new()
        .name("te-tent-stage".into())
        .spawn(move || {
            let outcome = run(&c, &m, &j);
            end_task(&c, m.task, &j, outcome);
        });
    if let Err(e) = spawned {
        let outcome = (TransferState::Failed, Some(format!("staging thread: {e}")));
        end_task(&core, task, &job, outcome);
    }
    job
}

/// Ends the staged task with `outcome` (the job's record first, for the runtime's errors).
fn end_task(
    core: &TransferEngine,
    (batch, task): (BatchId, usize),
    job: &Job,
    outcome: (TransferState, Option<String>),
) {
    let status = TransferStatus {
        state: outcome.0,
        transferred_bytes: job.moved.load(Ordering::Acquire),
    };
    let error = outcome.1.clone().map(SliceError::Path);
    job.end(outcome);
    if let Err(e) = core.end_held(batch, task, status, error) {
        warn!(error = %e, "a staged task could not be ended");
    }
}

/// Why the job stops early: its task was canceled, or its deadline passed.
fn stop_asked(core: &TransferEngine, m: &StagedMove) -> Option<TransferState> {
    if !core.stop_asked(m.task.0, m.task.1).unwrap_or(true) {
        return None;
    }
    match m.deadline.is_some_and(|d| d <= Instant::now()) {
        true => Some(TransferState::Timeout),
        false => Some(TransferState::Canceled),
    }
}

/// One hop: a one-task batch through `transport`, waited for.
fn hop(
    core: &TransferEngine,
    r: TransferRequest,
    transport: &'static str,
    deadline: Option<Instant>,
) -> Result<(), (TransferState, String)> {
    let fail = |e: te_core::Error| (TransferState::Failed, e.to_string());
    let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
    if left == Some(Duration::ZERO) {
        return Err((
            TransferState::Timeout,
            "deadline passed while staging".into(),
        ));
    }
    let mut options = (SubmitOptions::default().via(transport))
        .as_attempts()
        .as_planned();
    if let Some(left) = left {
        options = options.within(left);
    }
    let b = core.allocate_watched_batch(1, None).map_err(fail)?;
    let result = core
        .submit_with(b, &[r], &options)
        .map_err(fail)
        .and_then(|()| {
            let s = core
                .wait(b, left.unwrap_or(Duration::from_secs(3600)))
                .map_err(fail)?;
            match s.state {
                TransferState::Completed => Ok(()),
                state => {
                    let err = core.task_error(b, 0).ok().flatten();
                    Err((state, format!("{transport} hop: {err:?}")))
                }
            }
        });
    // A batch whose task is still in flight (a wait that timed out) stays: freeing it would
    // fail; the engine reclaims it with the engine.
    let _ = core.free_batch(b);
    result
}

fn run(core: &TransferEngine, m: &StagedMove, job: &Job) -> (TransferState, Option<String>) {
    let r = &m.request;
    let size = m.chunk.min(r.length) as usize;
    let staging = match HostBuffer::new(size) {
        Ok(b) => Arc::new(b),
        Err(e) => return (TransferState::Failed, Some(e.to_string())),
    };
    if let Err(e) = core.register_buffer(&staging, "*", Permission::LocalOnly) {
        return (TransferState::Failed, Some(e.to_string()));
    }
    let mut at = 0;
    let mut outcome = (TransferState::Completed, None);
    while at < r.length {
        if let Some(state) = stop_asked(core, m) {
            outcome = (state, None);
            break;
        }
        let n = (r.length - at).min(size as u64);
        // The local hop moves between the request's memory (through the own segment) and the
        // staging buffer; the remote hop between the staging buffer and the target.
        let via_staging = |opcode, (target_id, target_offset): (u64, u64)| TransferRequest {
            opcode,
            source: staging.addr(),
            target_id,
            target_offset: target_offset + at,
            length: n,
        };
        let (local, remote) = ((m.own, r.source), (r.target_id, r.target_offset));
        let hops = match r.opcode {
            Opcode::Write => [
                (via_staging(Opcode::Read, local), m.local),
                (via_staging(Opcode::Write, remote), m.remote),
            ],
            Opcode::Read => [
                (via_staging(Opcode::Read, remote), m.remote),
                (via_staging(Opcode::Write, local), m.local),
            ],
            other => {
                outcome = (
                    TransferState::Failed,
                    Some(format!("{other:?} cannot be staged")),
                );
                break;
            }
        };
        if let Some((state, e)) = hops
            .into_iter()
            .find_map(|(req, t)| hop(core, req, t, m.deadline).err())
        {
            outcome = (state, Some(e));
            break;
        }
        at += n;
        job.moved.store(at, Ordering::Release);
    }
    debug!(bytes = at, state = ?outcome.0, "staged request ended");
    let _ = core.unregister_memory(staging.addr());
    outcome
}
