//! One event loop of a [`Server`](crate::Server): the connections it serves, the accepts
//! (loop 0), hand-offs between loops, drives, sweeps and room made at the caps.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, Sender};
use std::time::{Duration, Instant};

use mio::{Events, Interest, Poll, Token, Waker};
use tracing::{debug, error, warn};

use crate::admission::{Admission, Candidate, Pressure, victim};
use crate::{Deal, HOT_SPIN, Handoff, LISTENER, Protocol, Slot, Step, WAKER};

pub(crate) struct Entry<C> {
    stream: mio::net::TcpStream,
    peer: SocketAddr,
    conn: C,
    /// Whether the loop watches this socket for room to send (only while a reply waits).
    watching_writes: bool,
    /// Whether it is counted among its loop's bulk connections.
    bulk: bool,
    /// Whether it is in its loop's `parked`.
    parked: bool,
    slot: Slot,
}

/// A loop as the others see it: where to hand it a connection, and how many bulk connections
/// it serves.
pub(crate) struct Sibling<C> {
    pub(crate) inbox: Sender<Handoff<C>>,
    pub(crate) waker: Arc<Waker>,
    pub(crate) bulk: AtomicUsize,
    /// Room the accepting loop asks this one to make ([`EventLoop::make_room`]).
    pub(crate) make_room: std::sync::Mutex<Vec<Pressure>>,
}

/// How long a loop polls before it sleeps after a connection's `step`, with `live` connections
/// on the server: the decision, apart from the loop so it can be tested.
pub(crate) fn poll_window(step: Step, live: usize) -> Option<Duration> {
    match step {
        Step::BlockedHotAlone if live <= 1 => Some(HOT_SPIN),
        _ => None,
    }
}

pub(crate) struct EventLoop<P: Protocol> {
    pub(crate) poll: Poll,
    /// This loop's place in `siblings`.
    pub(crate) index: usize,
    pub(crate) inbox: Receiver<Handoff<P::Conn>>,
    /// Loop 0 accepts, and deals connections out as `deal` says.
    pub(crate) listener: Option<mio::net::TcpListener>,
    pub(crate) protocol: Arc<P>,
    pub(crate) stop: Arc<AtomicBool>,
    pub(crate) live: Arc<AtomicUsize>,
    pub(crate) admission: Arc<Admission>,
    pub(crate) deal: Deal,
    pub(crate) congestion: crate::congestion::Congestion,
    /// Every loop, this one included.
    pub(crate) siblings: Arc<Vec<Sibling<P::Conn>>>,
    pub(crate) conns: HashMap<usize, Entry<P::Conn>>,
    pub(crate) next_token: usize,
    pub(crate) next_sibling: usize,
    /// Connections that used up their turn with work left, driven again before waiting.
    pub(crate) pending: VecDeque<usize>,
    /// Connections waiting for the end of the turn ([`Step::Parked`]).
    pub(crate) parked: Vec<usize>,
    /// Poll without sleeping until then: a connection's next request is due.
    pub(crate) hot_until: Option<Instant>,
}

impl<P: Protocol> EventLoop<P> {
    pub(crate) fn run(mut self) {
        let mut events = Events::with_capacity(256);
        let mut swept = Instant::now();
        while !self.stop.load(Ordering::Acquire) {
            let hot = self.hot_until.is_some_and(|t| Instant::now() < t);
            let wait = match self.pending.is_empty() && self.parked.is_empty() && !hot {
                true => Some(Duration::from_secs(1)),
                false => Some(Duration::ZERO),
            };
            if !hot {
                self.hot_until = None;
            } else if events.is_empty() {
                // The last poll found nothing: a thread with work on this core goes first.
                std::thread::yield_now();
            }
            if let Err(e) = self.poll.poll(&mut events, wait) {
                if e.kind() != io::ErrorKind::Interrupted {
                    let name = self.protocol.name();
                    return error!(server = name, error = %e, "poll failed; event loop stopped");
                }
            }
            for event in events.iter() {
                match event.token() {
                    LISTENER => self.accept(),
                    WAKER => {
                        while let Ok((stream, peer, slot, conn)) = self.inbox.try_recv() {
                            self.adopt(stream, peer, slot, conn);
                        }
                        let asked = std::mem::take(
                            &mut *self.siblings[self.index]
                                .make_room
                                .lock()
                                .unwrap_or_else(|e| e.into_inner()),
                        );
                        for pressure in asked {
                            self.make_room(pressure);
                        }
                    }
                    Token(t) => {
                        if (event.is_read_closed() || event.is_error())
                            && let Some(e) = self.conns.get_mut(&t)
                        {
                            self.protocol.peer_closing(&mut e.conn);
                        }
                        self.drive(t)
                    }
                }
            }
            for _ in 0..self.pending.len() {
                if let Some(t) = self.pending.pop_front() {
                    self.drive(t);
                }
            }
            if !self.parked.is_empty() {
                self.protocol.turn_end();
                for t in std::mem::take(&mut self.parked) {
                    if let Some(e) = self.conns.get_mut(&t) {
                        e.parked = false;
                    }
                    self.drive(t);
                }
            }
            if swept.elapsed() >= Duration::from_secs(1) {
                swept = Instant::now();
                self.sweep(swept);
            }
        }
    }

    fn accept(&mut self) {
        let name = self.protocol.name();
        loop {
            let Some(listener) = self.listener.as_ref() else {
                return;
            };
            let (stream, peer) = match listener.accept() {
                Ok(s) => s,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // Out of file descriptors, most likely: say so; the next readiness retries.
                    return warn!(server = name, error = %e, "accept failed");
                }
            };
            if !self.protocol.admits(peer) {
                continue;
            }
            let pressure = self.admission.pressure(peer.ip());
            // Room made here: the newcomer stays here too, so this loop keeps connections of
            // its kind to make room with next time.
            let made_room = pressure != Pressure::None && self.make_room(pressure);
            if matches!(pressure, Pressure::Server | Pressure::Source(_)) && !made_room {
                // None here to close: the other loops close one each, for the next newcomer
                // (a refused peer asks again after a backoff). The share is soft: not asked.
                self.ask_siblings(pressure);
            }
            let slot = match self.admission.admit(peer.ip()) {
                Ok(slot) => slot,
                Err(why) => {
                    warn!(server = name, %peer, ?why, "connection refused");
                    self.protocol.refuse(&stream, peer, why);
                    continue;
                }
            };
            let _ = stream.set_nodelay(true);
            self.congestion.apply(&stream, peer.ip(), || {
                stream.local_addr().ok().map(|a| a.ip())
            });
            let i = match (self.deal, made_room) {
                (_, true) | (Deal::Gather, _) => self.index,
                (Deal::RoundRobin, false) => {
                    self.next_sibling = self.next_sibling.wrapping_add(1);
                    (self.next_sibling - 1) % self.siblings.len()
                }
            };
            match i == self.index {
                true => self.adopt(stream, peer, slot, None),
                false => self.hand_over(i, (stream, peer, slot, None)),
            }
        }
    }

    /// Asks every other loop to close one connection as `pressure` says (the accepting loop
    /// had none to close).
    fn ask_siblings(&self, pressure: Pressure) {
        for (i, sibling) in self.siblings.iter().enumerate() {
            if i == self.index {
                continue;
            }
            sibling
                .make_room
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(pressure);
            let _ = sibling.waker.wake();
        }
    }

    /// Gives a connection to loop `i`.
    fn hand_over(&self, i: usize, handoff: Handoff<P::Conn>) {
        let sibling = &self.siblings[i];
        if sibling.inbox.send(handoff).is_ok() {
            let _ = sibling.waker.wake();
        }
    }

    /// Serves a connection: a new one (`conn` is `None`) or one moved here with its state.
    fn adopt(
        &mut self,
        mut stream: mio::net::TcpStream,
        peer: SocketAddr,
        slot: Slot,
        conn: Option<P::Conn>,
    ) {
        let token = self.next_token;
        self.next_token = (self.next_token + 1) % (usize::MAX - 2);
        if let Err(e) = self
            .poll
            .registry()
            .register(&mut stream, Token(token), Interest::READABLE)
        {
            let name = self.protocol.name();
            return warn!(server = name, %peer, error = %e, "cannot watch a connection");
        }
        let conn = conn.unwrap_or_else(|| self.protocol.open(peer, &stream));
        let bulk = self.protocol.bulk(&conn);
        if bulk {
            self.siblings[self.index]
                .bulk
                .fetch_add(1, Ordering::AcqRel);
        }
        self.conns.insert(
            token,
            Entry {
                stream,
                peer,
                conn,
                watching_writes: false,
                bulk,
                parked: false,
                slot,
            },
        );
        // Bytes may have arrived before the registration: look now.
        self.drive(token);
    }

    fn drive(&mut self, token: usize) {
        let Some(e) = self.conns.get_mut(&token) else {
            return;
        };
        let step = self.protocol.drive(&mut e.conn, &e.stream);
        if e.slot.is_unproven() && self.protocol.unproven_since(&e.conn).is_none() {
            e.slot.prove();
        }
        let bulk = self.protocol.bulk(&e.conn);
        let turned_bulk = count_bulk(e, bulk, &self.siblings[self.index].bulk);
        let sending = step == Step::BlockedSending;
        if sending != e.watching_writes {
            e.watching_writes = sending;
            let interest = match sending {
                true => Interest::READABLE | Interest::WRITABLE,
                false => Interest::READABLE,
            };
            if self
                .poll
                .registry()
                .reregister(&mut e.stream, Token(token), interest)
                .is_err()
            {
                return self.close(token);
            }
        }
        match step {
            Step::Blocked | Step::BlockedSending | Step::BlockedHotAlone => {
                if let Some(spin) = poll_window(step, self.live.load(Ordering::Relaxed)) {
                    self.hot_until = Some(Instant::now() + spin);
                }
            }
            Step::Yield => self.pending.push_back(token),
            Step::Parked => {
                if !std::mem::replace(&mut e.parked, true) {
                    self.parked.push(token);
                }
            }
            Step::Close => return self.close(token),
            Step::Promote => {
                if let Some(e) = self.remove(token) {
                    let stream = TcpStream::from(e.stream);
                    self.protocol.promote(e.conn, stream, e.peer, e.slot);
                }
                return;
            }
        }
        if turned_bulk {
            self.spread(token);
        }
    }

    /// Moves a connection that just turned bulk to the loop with the fewest bulk connections,
    /// when that evens them out (this loop would still have more than that one).
    fn spread(&mut self, token: usize) {
        let here = self.siblings[self.index].bulk.load(Ordering::Acquire);
        let Some((i, there)) = self
            .siblings
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != self.index)
            .map(|(i, s)| (i, s.bulk.load(Ordering::Acquire)))
            .min_by_key(|(_, n)| *n)
        else {
            return;
        };
        if here <= there + 1 {
            return;
        }
        if let Some(e) = self.remove(token) {
            let (server, peer) = (self.protocol.name(), e.peer);
            debug!(server, %peer, to = i, "bulk connection moved to a less busy loop");
            self.hand_over(i, (e.stream, e.peer, e.slot, Some(e.conn)));
        }
    }

    /// Takes a connection out of this loop (its socket unwatched, its bulk mark uncounted).
    fn remove(&mut self, token: usize) -> Option<Entry<P::Conn>> {
        let mut e = self.conns.remove(&token)?;
        let _ = self.poll.registry().deregister(&mut e.stream);
        count_bulk(&mut e, false, &self.siblings[self.index].bulk);
        Some(e)
    }

    fn close(&mut self, token: usize) {
        if let Some(e) = self.remove(token) {
            debug!(server = self.protocol.name(), peer = %e.peer, "connection closed");
        }
    }

    /// At a cap (`pressure`): closes one of this loop's connections to serve a new peer
    /// rather than refuse it: the oldest that proved nothing, whatever its age, else (at the
    /// server's cap) the one idle longest, once idle long enough ([`victim`]). Whether one
    /// was closed.
    fn make_room(&mut self, pressure: Pressure) -> bool {
        let candidates = self.conns.iter().map(|(t, e)| Candidate {
            key: *t,
            source: e.peer.ip(),
            unproven_since: match e.slot.is_unproven() {
                true => self.protocol.unproven_since(&e.conn),
                false => None,
            },
            idle_since: self.protocol.idle_since(&e.conn),
        });
        let Some(t) = victim(candidates, pressure, Instant::now()) else {
            return false;
        };
        if let Some(e) = self.conns.get(&t) {
            debug!(server = self.protocol.name(), peer = %e.peer, ?pressure,
                "at a connection cap: closed a connection to make room");
            // Told why, as a peer turned away is.
            self.protocol
                .refuse(&e.stream, e.peer, self.admission.refusal(pressure));
        }
        self.close(t);
        true
    }

    /// Closes connections their protocol finds idle or stalled too long.
    fn sweep(&mut self, now: Instant) {
        let expired: Vec<usize> = self
            .conns
            .iter()
            .filter(|(_, e)| self.protocol.expired(&e.conn, now))
            .map(|(t, _)| *t)
            .collect();
        for t in expired {
            if let Some(e) = self.conns.get(&t) {
                debug!(server = self.protocol.name(), peer = %e.peer, "connection idle or stalled; closed");
            }
            self.close(t);
        }
    }
}

/// Brings a connection's bulk mark, and its loop's `count`, up to `bulk`; whether it just
/// turned bulk.
fn count_bulk<C>(e: &mut Entry<C>, bulk: bool, count: &AtomicUsize) -> bool {
    if bulk == e.bulk {
        return false;
    }
    e.bulk = bulk;
    match bulk {
        true => count.fetch_add(1, Ordering::AcqRel),
        false => count.fetch_sub(1, Ordering::AcqRel),
    };
    bulk
}
