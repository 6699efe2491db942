//! The initiator side's event loops: a fixed pool of threads (`MC_TE_CLIENT_THREADS`) drives
//! every lane's connection, however many peers there are. Each lane lives on one loop: a te
//! peer's lanes are dealt round-robin, a Mooncake peer's share one loop ([`Placement`]). The
//! loop drives a lane when its socket is ready, when a submitting thread handed it slices (a
//! wake-up naming it), when a timer it asked for is due (a retry's backoff), and on a sweep
//! every 100 ms while it has work (connect and stall timeouts).
//!
//! A hand-off writes a loop's waker only while the loop may block ([`Doorbell`]).
//!
//! What a lane does when driven is the lane's ([`crate::initiator`]); here are only the loops, the
//! wake-ups, the timers and the shutdown (every lane's slices fail, so each posted slice is
//! still reported once). Every 5 s a loop also closes its lanes' idle connections whose peers
//! closed them (idle connections are not watched).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mio::{Events, Poll, Registry, Token, Waker};
use tracing::error;

use crate::initiator::LaneCore;

const WAKER: Token = Token(usize::MAX);
/// How often a loop with work looks at every lane (timeouts).
const SWEEP: Duration = Duration::from_millis(100);
/// How often a loop looks at its lanes' idle connections for peers that closed them
/// ([`LaneCore::reap_idle`]): one `recv` peek per idle connection.
const IDLE_SWEEP: Duration = Duration::from_secs(5);

/// What submitting threads share with one loop.
pub(crate) struct LoopShared {
    waker: Waker,
    registry: Registry,
    lanes: Mutex<HashMap<usize, Arc<LaneCore>>>,
    bell: Doorbell,
    next_token: AtomicUsize,
}

/// The lanes handed to one loop, and whether handing it one must write its waker: only while
/// the loop is in (or about to enter) a poll that may block. A loop that is awake looks at
/// the hand-offs before it blocks again, so a hand-off to it costs no system call (on a
/// virtual machine, waking a thread whose CPU is idle costs the waking thread about 10 µs).
/// Pure bookkeeping: the caller writes the waker.
#[derive(Default)]
struct Doorbell {
    ready: Mutex<Vec<usize>>,
    /// The loop may block.
    sleeping: AtomicBool,
}

impl Doorbell {
    /// Hands lane `token` to the loop; whether the caller must write the waker (of several
    /// callers while the loop sleeps, one must).
    fn ring(&self, token: usize) -> bool {
        self.ready
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(token);
        // Pairs with the fence in `may_block`: either the loop sees the token before it
        // blocks, or this sees it blocking.
        std::sync::atomic::fence(Ordering::SeqCst);
        self.sleeping.swap(false, Ordering::SeqCst)
    }

    /// The loop is about to poll: whether it may block (nothing was handed to it).
    fn may_block(&self) -> bool {
        self.sleeping.store(true, Ordering::SeqCst);
        std::sync::atomic::fence(Ordering::SeqCst);
        self.ready
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_empty()
    }

    /// The loop's poll returned: hand-offs from now on need no waker.
    fn awake(&self) {
        self.sleeping.store(false, Ordering::SeqCst);
    }

    /// The lanes handed to the loop since it last took them.
    fn take(&self) -> Vec<usize> {
        std::mem::take(&mut *self.ready.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

impl LoopShared {
    /// Asks the loop to drive lane `token` soon.
    pub(crate) fn wake(&self, token: usize) {
        if self.bell.ring(token) {
            let _ = self.waker.wake();
        }
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
    /// where both ends share a host's cores, take cores from it (`docs/tuning.md`).
    Together,
}

impl Placement {
    /// The placement for a peer speaking `framing`.
    pub(crate) fn for_framing(framing: crate::initiator::Framing) -> Self {
        match framing {
            crate::initiator::Framing::Te => Placement::Spread,
            crate::initiator::Framing::Mooncake { .. } => Placement::Together,
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
                bell: Doorbell::default(),
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
    let mut reaped = swept;
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
        let wait = if shared.bell.may_block() {
            wait
        } else {
            Duration::ZERO
        };
        let polled = poll.poll(&mut events, Some(wait));
        shared.bell.awake();
        if let Err(e) = polled {
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
        due.extend(shared.bell.take());
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
        if now >= reaped + IDLE_SWEEP {
            reaped = now;
            let lanes: Vec<Arc<LaneCore>> = shared
                .lanes
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .values()
                .cloned()
                .collect();
            for lane in lanes {
                lane.reap_idle(shared);
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
    use crate::initiator::Framing;

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
    fn a_hand_off_writes_the_waker_only_to_a_loop_that_may_block() {
        let bell = Doorbell::default();
        // Awake: the loop takes the hand-off before it next blocks; no waker.
        assert!(!bell.ring(1));
        assert!(
            !bell.may_block(),
            "a hand-off is waiting: the poll must not block"
        );
        bell.awake();
        assert_eq!(bell.take(), vec![1]);
        // About to block with nothing handed: the first hand-off writes, later ones do not.
        assert!(bell.may_block());
        assert!(bell.ring(2));
        assert!(!bell.ring(3));
        bell.awake();
        assert_eq!(bell.take(), vec![2, 3]);
        // Woken for nothing (a timer): awake again, so a hand-off writes nothing.
        assert!(bell.may_block());
        bell.awake();
        assert!(!bell.ring(4));
        assert_eq!(bell.take(), vec![4]);
    }

    #[test]
    fn no_hand_off_is_lost_between_threads() {
        // A loop that blocks (on a channel standing for its poll) only when `may_block` says
        // so, and senders that wake it only when `ring` says so: every hand-off is taken.
        let bell = Arc::new(Doorbell::default());
        let (waker, poll) = std::sync::mpsc::channel::<()>();
        const SENDERS: usize = 4;
        const EACH: usize = 20_000;
        let senders: Vec<_> = (0..SENDERS)
            .map(|s| {
                let (bell, waker) = (bell.clone(), waker.clone());
                std::thread::spawn(move || {
                    for i in 0..EACH {
                        if bell.ring(s * EACH + i) {
                            waker.send(()).unwrap();
                        }
                    }
                })
            })
            .collect();
        let mut seen = vec![false; SENDERS * EACH];
        let mut taken = 0;
        while taken < SENDERS * EACH {
            if bell.may_block() {
                poll.recv_timeout(Duration::from_secs(10))
                    .expect("a hand-off was made while the loop blocked, and no one woke it");
            }
            bell.awake();
            for t in bell.take() {
                assert!(
                    !std::mem::replace(&mut seen[t], true),
                    "token {t} taken twice"
                );
                taken += 1;
            }
        }
        for s in senders {
            s.join().unwrap();
        }
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
