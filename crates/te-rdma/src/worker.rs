//! A device lane's worker thread: takes queued slices, posts each as signalled READ/WRITE work
//! requests (one per memory-region piece it spans), polls the lane's CQs in batches, and
//! reports a slice when its last work request completes. It spins briefly while work is in
//! flight, then arms the CQs and sleeps on the lane's completion channel; it never busy-waits
//! for long. Work-completion errors pause the device or the remote device they blame.
//!
//! Not here: which device a slice goes to (`post`, with [`crate::route`] and
//! [`crate::failover`]), and connecting endpoints ([`crate::State::endpoint`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use te_core::segment::RemoteSegment;
use te_core::transport::{Rejection, SliceError, SliceOp};
use tracing::warn;

use crate::route;
use crate::verbs::{Endpoint, WcError};
use crate::{State, failover};

/// How long a worker keeps polling after the last progress before it sleeps.
const SPIN: Duration = Duration::from_micros(100);
/// Longest sleep with work in flight (the stall watchdog runs between sleeps).
const SLEEP_BUSY: Duration = Duration::from_millis(100);
/// Longest sleep with nothing to do (to notice shutdown).
const SLEEP_IDLE: Duration = Duration::from_millis(500);
/// How long a worker waits at shutdown for what it has in flight, its queue pairs moved to
/// ERROR: they flush at once on a working device, so past this the device is not answering.
const SHUTDOWN_FLUSH: Duration = Duration::from_secs(5);

/// A slice on the wire: its work requests share its `wr_id`.
struct Flight {
    op: SliceOp,
    ep: Arc<Endpoint>,
    rdev: usize,
    /// Work requests not yet completed.
    left: usize,
    /// The first error among them.
    error: Option<SliceError>,
    since: Instant,
}

/// A slice nothing of which was posted, and why (boxed: the error path is the rare one, and
/// keeps `start`'s result small).
type Refused = Box<(SliceOp, SliceError)>;

/// Posts `op` from device `nic` on `lane`. `Ok` has the flight (some work requests may have
/// been posted before an error, which then waits for them); `Err` gives the error when
/// nothing was posted.
fn start(
    state: &State,
    nic: usize,
    lane: usize,
    op: SliceOp,
    wr_id: u64,
) -> Result<Flight, Refused> {
    let desc = op.target.desc();
    if desc.devices.is_empty() {
        let e = SliceError::Path(format!("segment {} publishes no RDMA device", desc.name));
        return Err(Box::new((op, e)));
    }
    let rdev = {
        let m = desc.devices.len();
        // Per slice: so the devices are walked in place, not collected.
        let names = desc
            .devices
            .iter()
            .map(|d| (d.name.as_str(), d.te_netdev.as_deref()));
        let mapped = op
            .target
            .rail_names()
            .get(op.remote_rail as usize)
            .and_then(|rail| route::device_for_rail(rail, names));
        let preferred = route::device_index(mapped, op.remote_rail, m);
        let pauses = state.pauses.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        failover::pick(preferred, m, |j| {
            pauses.remote_paused(op.target.id(), j, now)
        })
    };
    let Ok(buffer) = op.target.check_access(op.remote_addr, op.len, op.opcode) else {
        return Err(Box::new((op, SliceError::Rejected(Rejection::OutOfBounds))));
    };
    let ndev = desc.devices.len();
    let remote_chunk = buffer.te_mr_chunk.unwrap_or(u64::MAX);
    let remote_off = op.remote_addr - buffer.addr;
    let Some(local) = state.local_keys(nic, op.local_addr, op.len) else {
        let e = SliceError::LocalPath(format!(
            "{:#x}+{} is not registered with RDMA",
            op.local_addr, op.len
        ));
        return Err(Box::new((op, e)));
    };
    if op.len > u64::from(u32::MAX) {
        return Err(Box::new((op, SliceError::Rejected(Rejection::Malformed))));
    }
    let pieces = route::pieces(local.offset, local.chunk, remote_off, remote_chunk, op.len);
    // Every key first: a descriptor short of keys is refused before anything is posted.
    let mut keys = Vec::with_capacity(pieces.len());
    for p in &pieces {
        let rkey = buffer.rkey.get(p.remote * ndev + rdev);
        let lkey = p
            .local
            .checked_sub(local.first)
            .and_then(|i| local.keys.get(i));
        match (lkey, rkey) {
            (Some(&l), Some(&r)) => keys.push((l, r)),
            _ => return Err(Box::new((op, SliceError::Rejected(Rejection::Malformed)))),
        }
    }
    // A failed set-up pauses what it blames itself (once, not per slice behind it).
    let group = match state.endpoint(nic, rdev, lane, &op.target, op.token.attempt()) {
        Ok(g) => g,
        Err(e) => return Err(Box::new((op, e))),
    };
    // Queue pairs in turn: each keeps its own order, together they fill the device. The
    // pieces of one slice share a queue pair.
    let ep = group[(wr_id % group.len() as u64) as usize].clone();
    let mut posted = 0;
    let mut error = None;
    for (p, (lkey, rkey)) in pieces.iter().zip(keys) {
        if let Err(e) = ep.post_piece(&op, p.offset, p.len, wr_id, lkey, rkey) {
            state.forget(&op.target, nic, rdev, lane);
            error = Some(SliceError::Path(e));
            break;
        }
        posted += 1;
    }
    match (posted, error) {
        (0, Some(e)) => Err(Box::new((op, e))),
        (left, error) => Ok(Flight {
            op,
            ep,
            rdev,
            left,
            error,
            since: Instant::now(),
        }),
    }
}

/// The slice error for a failed work completion, pausing what it blames.
fn blame(state: &State, nic: usize, lane: usize, f: &Flight, e: WcError) -> SliceError {
    // A QP with an error completion flushes everything after it: reconnect.
    state.forget(&f.op.target, nic, f.rdev, lane);
    match e {
        WcError::RemoteAccess => SliceError::Rejected(Rejection::PermissionDenied),
        WcError::RemoteInvalid => SliceError::Rejected(Rejection::Malformed),
        // Flushed behind another error: retried quietly, nothing to blame.
        WcError::Flushed => SliceError::Path("work request flushed".into()),
        // The local device failed: the retry leaves it.
        WcError::Local(m) => {
            state.pause_local(nic);
            SliceError::LocalPath(m)
        }
        // No answer (retries exhausted, timeouts): either end may be gone, so the retry
        // leaves this device and this remote device.
        WcError::Path(m) => {
            state.pause_local(nic);
            state.pause_remote(f.op.target.id(), f.rdev);
            SliceError::Path(m)
        }
    }
}

/// The worker of lane `lane` of device `nic`; returns after shutdown once nothing is in flight.
pub(crate) fn run(state: Arc<State>, nic: usize, lane: usize) {
    let device = state.nics[nic].clone();
    let queue = state.queues[nic][lane].clone();
    let max = device.max_wr as usize;
    let mut inflight: HashMap<u64, Flight> = HashMap::new();
    let mut wrs = 0usize;
    let mut done = Vec::new();
    let mut next_wr: u64 = 0;
    let mut last_progress = Instant::now();
    // When this worker first saw the shutdown with requests still in flight.
    let mut stopped: Option<Instant> = None;
    let complete = |inflight: &mut HashMap<u64, Flight>,
                    wrs: &mut usize,
                    done: &mut Vec<(u64, Result<(), WcError>)>| {
        for (wr_id, outcome) in done.drain(..) {
            let Some(f) = inflight.get_mut(&wr_id) else {
                continue;
            };
            f.left -= 1;
            *wrs -= 1;
            if let Err(e) = outcome {
                let err = blame(&state, nic, lane, f, e);
                f.error.get_or_insert(err);
            }
            if f.left == 0 {
                let f = inflight.remove(&wr_id).expect("present");
                state.settle(nic, f.op, f.error.map_or(Ok(()), Err));
            }
        }
    };
    loop {
        let batch: Vec<SliceOp> = {
            let mut ops = queue.lock().unwrap_or_else(|e| e.into_inner());
            // Room is counted in slices; a slice over several pieces may overshoot by its
            // pieces, which the CQ (16 × max_wr entries) absorbs.
            let n = max.saturating_sub(wrs).min(ops.len());
            ops.drain(..n).collect()
        };
        let mut progressed = !batch.is_empty();
        let stopping = state.stop.load(Ordering::SeqCst);
        for op in batch {
            if op.is_canceled() {
                state.settle(nic, op, Err(SliceError::Canceled));
                continue;
            }
            if stopping {
                // Shutting down: nothing new goes on the wire (nor dials a peer).
                state.settle(nic, op, Err(crate::shut_down()));
                continue;
            }
            next_wr = next_wr.wrapping_add(1);
            match start(&state, nic, lane, op, next_wr) {
                Ok(f) if f.left == 0 => state.settle(nic, f.op, Ok(())),
                Ok(f) => {
                    wrs += f.left;
                    inflight.insert(next_wr, f);
                }
                Err(refused) => {
                    let (op, e) = *refused;
                    state.settle(nic, op, Err(e));
                }
            }
        }
        device.poll_lane(lane, &mut done);
        progressed |= !done.is_empty();
        complete(&mut inflight, &mut wrs, &mut done);
        if progressed {
            last_progress = Instant::now();
            continue;
        }
        if !inflight.is_empty() && last_progress.elapsed() < SPIN {
            std::thread::yield_now();
            continue;
        }
        if inflight.is_empty() && state.stop.load(Ordering::SeqCst) {
            let empty = queue.lock().unwrap_or_else(|e| e.into_inner()).is_empty();
            if empty {
                return;
            }
        }
        if !inflight.is_empty() && state.stop.load(Ordering::SeqCst) {
            let since = *stopped.get_or_insert_with(Instant::now);
            if since.elapsed() > SHUTDOWN_FLUSH {
                abandon(&state, nic, &mut inflight);
                wrs = 0;
                continue;
            }
        }
        watch_stalls(&state, nic, lane, &mut inflight);
        // Arm, look once more (a completion before arming raises no event), then sleep.
        device.prepare_sleep(lane);
        device.poll_lane(lane, &mut done);
        let queued = !queue.lock().unwrap_or_else(|e| e.into_inner()).is_empty();
        // Read after the sleeping mark (both SeqCst): a shutdown that raced past the check
        // above either sees the mark and wakes this lane, or is seen here.
        let stopping = state.stop.load(Ordering::SeqCst) && inflight.is_empty();
        if done.is_empty() && !queued && !stopping {
            let limit = match inflight.is_empty() {
                true => SLEEP_IDLE,
                false => SLEEP_BUSY,
            };
            device.sleep(lane, limit);
        } else {
            device.sleep(lane, Duration::ZERO);
        }
        complete(&mut inflight, &mut wrs, &mut done);
        last_progress = Instant::now();
    }
}

/// Shutting down, requests whose queue pairs did not flush: they are reported failed so the
/// close does not hang on a device that stopped answering, loudly, since the device may still
/// touch their memory.
fn abandon(state: &State, nic: usize, inflight: &mut HashMap<u64, Flight>) {
    tracing::error!(
        device = %state.nics[nic].name,
        requests = inflight.len(),
        "RDMA requests did not complete within {SHUTDOWN_FLUSH:?} of shutdown (their queue pairs \
         did not flush); failing them, though the device may still write their memory"
    );
    for (_, f) in inflight.drain() {
        let why = SliceError::Path("rdma transport shut down; the request never completed".into());
        state.settle(nic, f.op, Err(why));
    }
}

/// A path that stopped answering (a device whose port went down may never complete what it
/// holds): past the QP's own retry budget, fail the QP so its requests flush and retry.
fn watch_stalls(state: &State, nic: usize, lane: usize, inflight: &mut HashMap<u64, Flight>) {
    let now = Instant::now();
    let mut stalled: Vec<(Arc<Endpoint>, Arc<RemoteSegment>, usize)> = Vec::new();
    for f in inflight.values() {
        let seen = stalled.iter().any(|(e, _, _)| Arc::ptr_eq(e, &f.ep));
        if !seen && now.duration_since(f.since) > f.ep.stall_limit() {
            stalled.push((f.ep.clone(), f.op.target.clone(), f.rdev));
        }
    }
    for (ep, segment, rdev) in stalled {
        warn!(device = %state.nics[nic].name, "RDMA requests stalled; failing the queue pair");
        state.pause_local(nic);
        state.pause_remote(segment.id(), rdev);
        state.forget(&segment, nic, rdev, lane);
        ep.fail();
        for f in inflight.values_mut().filter(|f| Arc::ptr_eq(&f.ep, &ep)) {
            f.since = now;
        }
    }
}
