//! Event-driven servers: a listening socket served by a fixed pool of threads, each an event
//! loop (readiness through `mio`, that is epoll) over any number of non-blocking connections.
//! The thread count does not grow with peers; a connection costs a file descriptor and its
//! protocol's state.
//!
//! The reactor owns the sockets and their lifecycle: loop 0 accepts and deals connections out
//! (round-robin, or all to itself, as [`Deal`] says), a connection whose protocol says it moves
//! bulk ([`Protocol::bulk`]) is handed to a loop with fewer such connections, the connection
//! caps (server-wide and per source address, `admission.rs`) refuse more with the protocol's
//! own refusal once the accepting loop has closed its connection idle longest to make room
//! ([`Protocol::idle_since`]), each accepted
//! connection gets its socket settings (`TCP_NODELAY`, the congestion control), a connection
//! whose turn ran out is driven again before the loop sleeps, one waiting to send is watched
//! for room only while it waits, expired connections are swept every second, and shutdown
//! closes everything. An event saying the peer closed its side (or the socket failed) is passed
//! on before the drive it brings ([`Protocol::peer_closing`]). What is spoken on a connection,
//! and when it counts as idle or stalled, is the [`Protocol`]'s: the reactor calls it whenever
//! a socket may have moved.
//!
//! Not here: blocking work. A protocol whose connection must wait on something other than its
//! socket (a GPU copy) [promotes](Step::Promote) it to a thread of its own.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mio::{Events, Interest, Poll, Token, Waker};
use tracing::{debug, error, warn};

mod admission;
pub use tally::{ConnectionCount, connection_counts};
pub mod allow;
pub mod congestion;
pub mod deadline;
mod error;
pub mod http;
pub mod limits;
pub mod secret;
pub mod settings;
mod tally;

pub use admission::{AddressCap, EVICT_MIN_IDLE, Slot};
use admission::{Admission, oldest_idle};
pub use error::{Error, Result, waited};

const LISTENER: Token = Token(usize::MAX - 1);
const WAKER: Token = Token(usize::MAX);
/// How long a loop polls without sleeping after a connection said its peer's next request is
/// due within microseconds ([`Step::BlockedHotAlone`]). A polling loop
/// yields its CPU after every poll that found nothing, so a thread with work on that core runs
/// first. In a VM a core woken from sleep starts the woken thread tens of microseconds late
/// (about 25 µs on the 2-core VM te is measured on, more under load): the poll keeps the core
/// awake through the gap between a peer's batches.
const HOT_SPIN: Duration = Duration::from_micros(100);

/// What a loop does next with a connection, as its protocol says after driving it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Waiting for bytes to read: the loop hears when they come.
    Blocked,
    /// As `Blocked`, but while this connection is the server's only one the loop polls briefly
    /// before it sleeps: its peer's next request is then the only work the server can get. With
    /// other connections the loop sleeps: their peers may need the core (on one host), and a
    /// busy server rarely waits long anyway.
    BlockedHotAlone,
    /// Waiting for room to send: the loop watches for it (and only then).
    BlockedSending,
    /// Had its turn with work left: driven again before the loop waits.
    Yield,
    /// Done: the socket is closed.
    Close,
    /// Leaves the loop for a thread of its own ([`Protocol::promote`]).
    Promote,
    /// Waiting on work its protocol finishes at the end of the loop's turn
    /// ([`Protocol::turn_end`]): driven again right after that, before the loop waits.
    Parked,
}

/// A connection's replies waiting to be sent, for protocols that queue whole replies and send
/// them as the socket takes them.
#[derive(Debug, Default)]
pub struct Outbox {
    bytes: Vec<u8>,
    sent: usize,
}

impl Outbox {
    /// Buffers larger than this are released once sent, so an idle connection holds none.
    const KEEP_CAPACITY: usize = 4 << 10;

    /// Queues `bytes` after what waits.
    pub fn push(&mut self, bytes: &[u8]) {
        self.bytes.extend_from_slice(bytes);
    }

    /// Whether nothing waits.
    pub fn is_empty(&self) -> bool {
        self.sent == self.bytes.len()
    }

    /// Sends what waits as far as `stream` takes it, stamping `last` whenever bytes go:
    /// `None` once all of it is sent, else the step the drive ends with (waiting for room, or
    /// closing a connection that failed).
    pub fn send(&mut self, mut stream: &mio::net::TcpStream, last: &mut Instant) -> Option<Step> {
        use std::io::Write;
        while self.sent < self.bytes.len() {
            match stream.write(&self.bytes[self.sent..]) {
                Ok(0) => return Some(Step::Close),
                Ok(n) => {
                    self.sent += n;
                    *last = Instant::now();
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    return Some(Step::BlockedSending);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return Some(Step::Close),
            }
        }
        self.bytes.clear();
        self.sent = 0;
        if self.bytes.capacity() > Self::KEEP_CAPACITY {
            self.bytes = Vec::new();
        }
        None
    }
}

/// Why a connection was refused before it was served.
/// Exhaustive: every protocol says each refusal its own way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The server holds its cap of connections, none of them idle.
    AtCapacity {
        /// The cap.
        max: usize,
    },
    /// The peer's address holds its cap of connections.
    AddressCap {
        /// The cap per address.
        max: usize,
    },
}

/// What a server speaks: called by the loops, never from two threads at once for one
/// connection.
pub trait Protocol: Send + Sync + 'static {
    /// One connection's state.
    type Conn: Send + 'static;

    /// A short name for threads and logs.
    fn name(&self) -> &'static str;

    /// Whether `peer` may connect at all (checked at accept).
    fn admits(&self, _peer: SocketAddr) -> bool {
        true
    }

    /// The state of a newly accepted connection from `peer` over `stream` (for what its
    /// local end tells, such as whether the peer is on this host).
    fn open(&self, peer: SocketAddr, stream: &mio::net::TcpStream) -> Self::Conn;

    /// Moves the connection on as far as its socket allows, without blocking.
    fn drive(&self, conn: &mut Self::Conn, stream: &mio::net::TcpStream) -> Step;

    /// A readiness event said the peer closed its sending side, or that the socket has an
    /// error: what is left to read ends at the end of the stream (or the error), which only a
    /// receive that returns 0 (or fails) tells. Called before the drive that event brings. A
    /// protocol that stops reading once a receive returns less than it asked for (the socket
    /// held no more) must read on from now, or it would miss the end: no further event comes
    /// for it. Nothing by default.
    fn peer_closing(&self, _conn: &mut Self::Conn) {}

    /// Whether the connection is moving bulk (large requests), where its loop's copying is the
    /// cost and several loops copying side by side pay; asked after every drive. The reactor
    /// keeps bulk connections spread evenly over the loops, moving one (state and all) when it
    /// turns bulk on a loop that has more of them than another. None by default.
    fn bulk(&self, _conn: &Self::Conn) -> bool {
        false
    }

    /// Called once per loop turn in which a connection returned [`Step::Parked`], after every
    /// connection with work had its drive and before the parked ones are driven again: where
    /// work the parked connections wait on is done once for all of them (one disk sync for
    /// the changes of every connection served). Nothing by default.
    fn turn_end(&self) {}

    /// Whether the connection idled or stalled too long; it is then closed.
    fn expired(&self, conn: &Self::Conn, now: Instant) -> bool;

    /// Since when the connection has been idle (between requests, nothing owed either way),
    /// or `None` while it is busy. At the connection cap the accepting loop closes the one of
    /// its connections idle longest (at least [`EVICT_MIN_IDLE`]) to serve a new peer. None
    /// by default: never closed to make room.
    fn idle_since(&self, _conn: &Self::Conn) -> Option<Instant> {
        None
    }

    /// Tells a peer it is refused (the stream is non-blocking and closed afterwards).
    fn refuse(&self, _stream: &mio::net::TcpStream, _peer: SocketAddr, _why: Refusal) {}

    /// Serves a connection that returned [`Step::Promote`] on a thread of its own (the stream
    /// is non-blocking; the protocol sets it as it needs). `slot` holds its place under the
    /// connection cap until dropped.
    fn promote(
        self: &Arc<Self>,
        _conn: Self::Conn,
        _stream: TcpStream,
        _peer: SocketAddr,
        _slot: Slot,
    ) {
    }
}

/// Where loop 0 puts the connections it accepts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Deal {
    /// Over every loop in turn: each loop's share of the peers.
    #[default]
    RoundRobin,
    /// All on loop 0; the other loops serve only the bulk connections moved to them. Where each
    /// request costs more in wake-ups than in copying, one loop serving everybody wakes least
    /// (and leaves the cores to the rest of the machine); large requests still copy side by
    /// side on several loops.
    Gather,
}

/// How a server runs.
#[derive(Clone, Debug)]
pub struct ServerSettings {
    /// Event-loop threads.
    pub threads: usize,
    /// Connections held at once (in loops and promoted); more are refused.
    pub max_connections: usize,
    /// Connections one source address may hold at once.
    pub per_address: AddressCap,
    /// Where accepted connections go.
    pub deal: Deal,
    /// Connections the kernel holds before they are accepted (the listener's `listen` backlog).
    pub backlog: usize,
    /// The congestion control each accepted connection gets.
    pub congestion: crate::congestion::Congestion,
}

/// Reads how many connections a [`Server`] holds, for pages served apart from it.
#[derive(Clone, Debug, Default)]
pub struct Held(std::sync::Weak<AtomicUsize>);

impl Held {
    /// Connections held now; 0 when the server is gone.
    pub fn now(&self) -> usize {
        self.0
            .upgrade()
            .map_or(0, |live| live.load(Ordering::Acquire))
    }
}

/// A connection on its way to a loop: its state too when it moves from another loop.
type Handoff<C> = (mio::net::TcpStream, SocketAddr, Slot, Option<C>);

/// A running server. Dropping it stops the loops and closes their connections.
pub struct Server {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    live: Arc<AtomicUsize>,
    wakers: Vec<Arc<Waker>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("addr", &self.addr)
            .field("loops", &self.wakers.len())
            .field("connections", &self.connections())
            .finish()
    }
}

impl Server {
    /// Serves `listener` with `settings.threads` event loops speaking `protocol`.
    ///
    /// # Errors
    /// The listener or a loop could not be set up.
    pub fn start<P: Protocol>(
        listener: TcpListener,
        protocol: Arc<P>,
        settings: ServerSettings,
    ) -> io::Result<Self> {
        let addr = listener.local_addr()?;
        te_sys::set_listen_backlog(&listener, settings.backlog)?;
        listener.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let live = Arc::new(AtomicUsize::new(0));
        let refused = tally::register(protocol.name(), &live);
        let admission = Arc::new(Admission::new(
            live.clone(),
            settings.max_connections,
            settings.per_address,
            refused,
        ));
        let mut polls = Vec::new();
        let mut siblings = Vec::new();
        for _ in 0..settings.threads.max(1) {
            let poll = Poll::new()?;
            let waker = Arc::new(Waker::new(poll.registry(), WAKER)?);
            let (tx, rx) = mpsc::channel();
            siblings.push(Sibling {
                inbox: tx,
                waker,
                bulk: AtomicUsize::new(0),
            });
            polls.push((poll, rx));
        }
        let wakers: Vec<Arc<Waker>> = siblings.iter().map(|s| s.waker.clone()).collect();
        let mut listener = Some(mio::net::TcpListener::from_std(listener));
        let siblings = Arc::new(siblings);
        let mut threads = Vec::new();
        for (i, (poll, inbox)) in polls.into_iter().enumerate() {
            let mut ev = EventLoop {
                poll,
                index: i,
                inbox,
                listener: listener.take(),
                protocol: protocol.clone(),
                stop: stop.clone(),
                live: live.clone(),
                admission: admission.clone(),
                deal: settings.deal,
                congestion: settings.congestion.clone(),
                siblings: siblings.clone(),
                conns: HashMap::new(),
                next_token: 0,
                next_sibling: 0,
                pending: VecDeque::new(),
                parked: Vec::new(),
                hot_until: None,
            };
            if let Some(l) = ev.listener.as_mut() {
                ev.poll
                    .registry()
                    .register(l, LISTENER, Interest::READABLE)?;
            }
            let spawned = std::thread::Builder::new()
                .name(format!("{}{i}", protocol.name()))
                .spawn(move || ev.run());
            match spawned {
                Ok(t) => threads.push(t),
                Err(e) => {
                    stop_and_join(&stop, &wakers, threads);
                    return Err(e);
                }
            }
        }
        Ok(Server {
            addr,
            stop,
            live,
            wakers,
            threads: Mutex::new(threads),
        })
    }

    /// Where it listens.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Connections held now (in the loops and promoted).
    pub fn connections(&self) -> usize {
        self.live.load(Ordering::Acquire)
    }

    /// A reader of [`Server::connections`] that outlives no one: it reads 0 once the server
    /// is gone. The count is the one the caps compare against, taken when a connection is
    /// admitted, before a loop opens it.
    pub fn held(&self) -> Held {
        Held(Arc::downgrade(&self.live))
    }

    /// Stops the loops and closes every connection they serve (promoted connections end with
    /// their peer or their protocol's timeouts).
    pub fn shutdown(&self) {
        let threads = std::mem::take(&mut *self.threads.lock().unwrap_or_else(|e| e.into_inner()));
        stop_and_join(&self.stop, &self.wakers, threads);
    }
}

fn stop_and_join(stop: &AtomicBool, wakers: &[Arc<Waker>], threads: Vec<JoinHandle<()>>) {
    stop.store(true, Ordering::Release);
    for w in wakers {
        let _ = w.wake();
    }
    for t in threads {
        let _ = t.join();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shutdown();
    }
}

struct Entry<C> {
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
struct Sibling<C> {
    inbox: Sender<Handoff<C>>,
    waker: Arc<Waker>,
    bulk: AtomicUsize,
}

/// How long a loop polls before it sleeps after a connection's `step`, with `live` connections
/// on the server: the decision, apart from the loop so it can be tested.
fn poll_window(step: Step, live: usize) -> Option<Duration> {
    match step {
        Step::BlockedHotAlone if live <= 1 => Some(HOT_SPIN),
        _ => None,
    }
}

struct EventLoop<P: Protocol> {
    poll: Poll,
    /// This loop's place in `siblings`.
    index: usize,
    inbox: Receiver<Handoff<P::Conn>>,
    /// Loop 0 accepts, and deals connections out as `deal` says.
    listener: Option<mio::net::TcpListener>,
    protocol: Arc<P>,
    stop: Arc<AtomicBool>,
    live: Arc<AtomicUsize>,
    admission: Arc<Admission>,
    deal: Deal,
    congestion: crate::congestion::Congestion,
    /// Every loop, this one included.
    siblings: Arc<Vec<Sibling<P::Conn>>>,
    conns: HashMap<usize, Entry<P::Conn>>,
    next_token: usize,
    next_sibling: usize,
    /// Connections that used up their turn with work left, driven again before waiting.
    pending: VecDeque<usize>,
    /// Connections waiting for the end of the turn ([`Step::Parked`]).
    parked: Vec<usize>,
    /// Poll without sleeping until then: a connection's next request is due.
    hot_until: Option<Instant>,
}

impl<P: Protocol> EventLoop<P> {
    fn run(mut self) {
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
            if self.admission.full() {
                self.make_room();
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
            let i = match self.deal {
                Deal::RoundRobin => self.next_sibling % self.siblings.len(),
                Deal::Gather => self.index,
            };
            self.next_sibling = self.next_sibling.wrapping_add(1);
            match i == self.index {
                true => self.adopt(stream, peer, slot, None),
                false => self.hand_over(i, (stream, peer, slot, None)),
            }
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

    /// At the connection cap: closes this loop's connection idle longest, if one has idled
    /// long enough, so that a new peer is served rather than refused.
    fn make_room(&mut self) {
        let idle = self
            .conns
            .iter()
            .map(|(t, e)| (*t, self.protocol.idle_since(&e.conn)));
        if let Some(t) = oldest_idle(idle, Instant::now()) {
            if let Some(e) = self.conns.get(&t) {
                debug!(server = self.protocol.name(), peer = %e.peer,
                    "at the connection cap: closed the connection idle longest to make room");
            }
            self.close(t);
        }
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

#[cfg(test)]
mod tests;
