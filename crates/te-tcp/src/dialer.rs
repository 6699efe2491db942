//! The initiator side's event loops: a fixed pool of threads (`MC_TE_CLIENT_THREADS`) drives
//! every lane's connection, however many peers there are. Each lane lives on one loop (dealt
//! round-robin); the loop drives it when its socket is ready, when a submitting thread handed
//! it slices (a wake-up naming it), when a timer it asked for is due (a retry's backoff), and
//! on a sweep every 100 ms while it has work (connect and stall timeouts).
//!
//! What a lane does when driven is the lane's ([`crate::lane`]); here are only the loops, the
//! wake-ups, the timers and the shutdown (every lane's slices fail, so each posted slice is
//! still reported once).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mio::{Events, Poll, Registry, Token, Waker};
use tracing::error;

use crate::lane::LaneCore;

const WAKER: Token = Token(usize::MAX);
/// How often a loop with work looks at every lane (timeouts).
const SWEEP: Duration = Duration::from_millis(100);

/// What submitting threads share with one loop.
pub(crate) struct LoopShared {
    waker: Waker,
    registry: Registry,
    lanes: Mutex<HashMap<usize, Arc<LaneCore>>>,
    ready: Mutex<Vec<usize>>,
    next_token: AtomicUsize,
}

impl LoopShared {
    /// Asks the loop to drive lane `token` soon.
    pub(crate) fn wake(&self, token: usize) {
        self.ready
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(token);
        let _ = self.waker.wake();
    }

    /// The loop's registry (lanes register their sockets from the loop thread).
    pub(crate) fn registry(&self) -> &Registry {
        &self.registry
    }
}

/// The loops of one transport.
pub(crate) struct Dialer {
    loops: Vec<Arc<LoopShared>>,
    next: AtomicUsize,
    stop: Arc<AtomicBool>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl Dialer {
    /// Starts `threads` loops.
    ///
    /// # Errors
    /// A loop could not be set up.
    pub(crate) fn start(threads: usize) -> std::io::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let mut loops = Vec::new();
        let mut handles = Vec::new();
        for i in 0..threads.max(1) {
            let poll = Poll::new()?;
            let shared = Arc::new(LoopShared {
                waker: Waker::new(poll.registry(), WAKER)?,
                registry: poll.registry().try_clone()?,
                lanes: Mutex::new(HashMap::new()),
                ready: Mutex::new(Vec::new()),
                next_token: AtomicUsize::new(0),
            });
            let (s, st) = (shared.clone(), stop.clone());
            let spawned = std::thread::Builder::new()
                .name(format!("te-tcp-lanes{i}"))
                .spawn(move || run(poll, &s, &st));
            match spawned {
                Ok(h) => handles.push(h),
                Err(e) => {
                    let d = Dialer {
                        loops,
                        next: AtomicUsize::new(0),
                        stop,
                        threads: Mutex::new(handles),
                    };
                    d.shutdown();
                    return Err(e);
                }
            }
            loops.push(shared);
        }
        Ok(Dialer {
            loops,
            next: AtomicUsize::new(0),
            stop,
            threads: Mutex::new(handles),
        })
    }

    /// A loop for a new lane, and the lane's token on it.
    pub(crate) fn place(&self) -> (Arc<LoopShared>, usize) {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.loops.len();
        let home = self.loops[i].clone();
        let token = home.next_token.fetch_add(1, Ordering::Relaxed);
        (home, token)
    }

    /// Stops the loops; every lane still holding slices fails them.
    pub(crate) fn shutdown(&self) {
        self.stop.store(true, Ordering::Release);
        for l in &self.loops {
            let _ = l.waker.wake();
        }
        let threads = std::mem::take(&mut *self.threads.lock().unwrap_or_else(|e| e.into_inner()));
        for t in threads {
            let _ = t.join();
        }
    }
}

impl Drop for Dialer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Adds `lane` to its loop's table (before anything can wake it).
pub(crate) fn adopt(home: &LoopShared, token: usize, lane: Arc<LaneCore>) {
    home.lanes
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(token, lane);
}

fn lane_of(shared: &LoopShared, token: usize) -> Option<Arc<LaneCore>> {
    shared
        .lanes
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&token)
        .cloned()
}

fn run(mut poll: Poll, shared: &LoopShared, stop: &AtomicBool) {
    let mut events = Events::with_capacity(1024);
    let mut timers: Vec<(Instant, usize)> = Vec::new();
    let mut swept = Instant::now();
    // Lanes holding slices or a connection to watch over: swept for timeouts.
    let mut active: HashSet<usize> = HashSet::new();
    while !stop.load(Ordering::Acquire) {
        let busy = !active.is_empty();
        let now = Instant::now();
        let next_timer = timers.iter().map(|t| t.0).min();
        let sweep_at = busy.then_some(swept + SWEEP);
        let wait = next_timer
            .into_iter()
            .chain(sweep_at)
            .min()
            .map_or(Duration::from_secs(1), |t| t.saturating_duration_since(now));
        if let Err(e) = poll.poll(&mut events, Some(wait)) {
            if e.kind() != std::io::ErrorKind::Interrupted {
                error!(error = %e, "lane loop: poll failed; loop stopped");
                break;
            }
        }
        let mut due: HashSet<usize> = events
            .iter()
            .map(|e| e.token().0)
            .filter(|t| *t != WAKER.0)
            .collect();
        due.extend(std::mem::take(
            &mut *shared.ready.lock().unwrap_or_else(|e| e.into_inner()),
        ));
        let now = Instant::now();
        timers.retain(|(at, token)| {
            let fire = *at <= now;
            if fire {
                due.insert(*token);
            }
            !fire
        });
        let sweep = busy && now >= swept + SWEEP;
        if sweep {
            swept = now;
            due.extend(active.iter().copied());
        }
        for token in due {
            let Some(lane) = lane_of(shared, token) else {
                continue;
            };
            let outcome = lane.drive(shared, now);
            if let Some(at) = outcome.timer {
                timers.push((at, token));
            }
            match outcome.active && !outcome.finished {
                true => active.insert(token),
                false => active.remove(&token),
            };
            if outcome.finished {
                shared
                    .lanes
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&token);
            }
        }
    }
    // Stopped: what the lanes still hold fails (each posted slice is reported once).
    let lanes: Vec<Arc<LaneCore>> =
        std::mem::take(&mut *shared.lanes.lock().unwrap_or_else(|e| e.into_inner()))
            .into_values()
            .collect();
    for lane in lanes {
        lane.abandon(shared);
    }
}
