//! The initiator side's event loops: a fixed pool of threads (`MC_TE_CLIENT_THREADS`) drives
//! every lane's connection, however many peers there are. Each lane lives on one loop: a te
//! peer's lanes are dealt round-robin, a Mooncake peer's share one loop ([`Placement`]). The
//! loop drives a lane when its socket is ready, when a submitting thread handed it slices (a
//! wake-up naming it), when a timer it asked for is due (a retry's backoff), and on a sweep
//! every 100 ms while it has work (connect and stall timeouts).
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

/// How one peer's lanes are laid over the loops.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Placement {
    /// Round-robin: a te target serves its connections on several threads, and the lanes'
    /// copies run on as many cores as there are loops.
    Spread,
    /// On one loop: a Mooncake target answers every connection from one asio thread, one
    /// reply at a time, so one loop here keeps up with it; more would only add wake-ups and,
    /// where both ends share a host's cores, take cores from it. Measured on 2 cores against
    /// the wheel's target: one loop moved 1 MiB WRITEs 1.9× and 64 KiB READs 1.15× faster
    /// than four (medians of 43 and 14 runs: one loop's 64 KiB READs range from 1.4 to 6 GB/s,
    /// slow when the kernel puts the loop and Mooncake's thread on one CPU; four loops' from
    /// 2.1 to 3.8), 64 KiB WRITEs as fast, and 1 MiB READs 0.8× as fast, still 1.4×
    /// Mooncake's own initiator.
    Together,
}

impl Placement {
    /// The placement for a peer speaking `framing`.
    pub(crate) fn for_framing(framing: crate::lane::Framing) -> Self {
        match framing {
            crate::lane::Framing::Te => Placement::Spread,
            crate::lane::Framing::Mooncake { .. } => Placement::Together,
        }
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

    /// Loops for one peer's `lanes` new lanes, and each lane's token on its loop: dealt
    /// round-robin over the loops, or all on the next loop in turn ([`Placement`]).
    pub(crate) fn place(
        &self,
        lanes: usize,
        placement: Placement,
    ) -> Vec<(Arc<LoopShared>, usize)> {
        // Loops taken from the round-robin, and the step from one lane's loop to the next's.
        let (deals, step) = match placement {
            Placement::Spread => (lanes, 1),
            Placement::Together => (1, 0),
        };
        let first = self.next.fetch_add(deals, Ordering::Relaxed);
        (0..lanes)
            .map(|n| {
                let i = first.wrapping_add(n * step);
                let home = self.loops[i % self.loops.len()].clone();
                let token = home.next_token.fetch_add(1, Ordering::Relaxed);
                (home, token)
            })
            .collect()
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lane::Framing;

    /// Which of `dialer`'s loops each placement landed on, and whether the tokens on each loop
    /// are distinct.
    fn loops_of(dialer: &Dialer, placed: &[(Arc<LoopShared>, usize)]) -> Vec<usize> {
        let mut seen = HashSet::new();
        placed
            .iter()
            .map(|(home, token)| {
                let i = dialer.loops.iter().position(|l| Arc::ptr_eq(l, home));
                let i = i.expect("placed on one of the dialer's loops");
                assert!(
                    seen.insert((i, *token)),
                    "token {token} given twice on loop {i}"
                );
                i
            })
            .collect()
    }

    #[test]
    fn a_te_peer_spreads_its_lanes_and_a_mooncake_peer_keeps_them_on_one_loop() {
        let dialer = Dialer::start(4).unwrap();
        let te = Placement::for_framing(Framing::Te);
        let mooncake = Placement::for_framing(Framing::Mooncake { acked: true });
        assert_eq!(te, Placement::Spread);
        assert_eq!(mooncake, Placement::Together);

        let spread = loops_of(&dialer, &dialer.place(4, te));
        assert_eq!(spread, vec![0, 1, 2, 3]);
        // The next peer's lanes go on one loop, the one after the last dealt; the peer after
        // that starts on the next loop, so Mooncake peers spread over the loops in turn.
        let first = loops_of(&dialer, &dialer.place(4, mooncake));
        assert_eq!(first, vec![0; 4]);
        let second = loops_of(&dialer, &dialer.place(4, mooncake));
        assert_eq!(second, vec![1; 4]);
        // More lanes than loops wrap around; tokens stay distinct on each loop (checked above).
        let wrapped = loops_of(&dialer, &dialer.place(6, te));
        assert_eq!(wrapped, vec![2, 3, 0, 1, 2, 3]);
        dialer.shutdown();
    }
}
