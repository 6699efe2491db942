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
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mio::{Interest, Poll, Token, Waker};

mod admission;
mod event_loop;
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

use admission::Admission;
pub use admission::{AddressCap, EVICT_MIN_IDLE, Slot, source_key};
pub use error::{Error, Result, waited};
use event_loop::{EventLoop, Sibling};

pub(crate) const LISTENER: Token = Token(usize::MAX - 1);
pub(crate) const WAKER: Token = Token(usize::MAX);
/// How long a loop polls without sleeping after a connection said its peer's next request is
/// due within microseconds ([`Step::BlockedHotAlone`]). A polling loop
/// yields its CPU after every poll that found nothing, so a thread with work on that core runs
/// first. In a VM a core woken from sleep starts the woken thread tens of microseconds late
/// (about 25 µs on the 2-core VM te is measured on, more under load): the poll keeps the core
/// awake through the gap between a peer's batches.
pub(crate) const HOT_SPIN: Duration = Duration::from_micros(100);

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

    /// Whether its connections prove themselves (a request with a valid proof, the cluster's
    /// challenge): those that have not yet then hold at most three quarters of the places, and
    /// at a cap are closed first, whatever their age, to serve a new peer
    /// ([`Protocol::unproven_since`]). False by default.
    fn proves(&self) -> bool {
        false
    }

    /// Since when the connection has proved nothing, or `None` once it has; asked (after every
    /// drive, and as room is made) only where [`Protocol::proves`].
    fn unproven_since(&self, _conn: &Self::Conn) -> Option<Instant> {
        None
    }

    /// Since when the connection has been idle (between requests, nothing owed either way),
    /// or `None` while it is busy. At the connection cap the accepting loop closes the one of
    /// its connections idle longest (at least [`EVICT_MIN_IDLE`]) to serve a new peer. None
    /// by default: never closed to make room.
    fn idle_since(&self, _conn: &Self::Conn) -> Option<Instant> {
        None
    }

    /// Tells a peer it is refused, or that its connection is closed to make room at a cap
    /// (the stream is non-blocking and closed afterwards).
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
pub(crate) type Handoff<C> = (mio::net::TcpStream, SocketAddr, Slot, Option<C>);

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
            protocol.proves(),
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
                make_room: Mutex::default(),
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

#[cfg(test)]
mod tests;
