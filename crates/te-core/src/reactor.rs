//! Event-driven servers: a listening socket served by a fixed pool of threads, each an event
//! loop (readiness through `mio`, that is epoll) over any number of non-blocking connections.
//! The thread count does not grow with peers; a connection costs a file descriptor and its
//! protocol's state.
//!
//! The reactor owns the sockets and their lifecycle: loop 0 accepts and deals connections out
//! round-robin, the connection cap (shared by all loops) refuses more with the protocol's own
//! refusal, a connection whose turn ran out is driven again before the loop sleeps, one waiting
//! to send is watched for room only while it waits, expired connections are swept every second,
//! and shutdown closes everything. What is spoken on a connection, and when it counts as idle or
//! stalled, is the [`Protocol`]'s: the reactor calls it whenever a socket may have moved.
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

const LISTENER: Token = Token(usize::MAX - 1);
const WAKER: Token = Token(usize::MAX);
/// How long a loop polls without sleeping after a connection said its peer's next request is
/// due within microseconds ([`Step::BlockedHot`]).
const HOT_SPIN: Duration = Duration::from_micros(50);

/// What a loop does next with a connection, as its protocol says after driving it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Waiting for bytes to read: the loop hears when they come.
    Blocked,
    /// As `Blocked`, but the peer's next request is expected within microseconds (it follows
    /// a small one): the loop polls briefly before it sleeps.
    BlockedHot,
    /// Waiting for room to send: the loop watches for it (and only then).
    BlockedSending,
    /// Had its turn with work left: driven again before the loop waits.
    Yield,
    /// Done: the socket is closed.
    Close,
    /// Leaves the loop for a thread of its own ([`Protocol::promote`]).
    Promote,
}

/// Why a connection was refused before it was served.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Refusal {
    /// The server holds its cap of connections.
    AtCapacity {
        /// The cap.
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

    /// The state of a newly accepted connection.
    fn open(&self, peer: SocketAddr) -> Self::Conn;

    /// Moves the connection on as far as its socket allows, without blocking.
    fn drive(&self, conn: &mut Self::Conn, stream: &mio::net::TcpStream) -> Step;

    /// Whether the connection idled or stalled too long; it is then closed.
    fn expired(&self, conn: &Self::Conn, now: Instant) -> bool;

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

/// A connection's place under the cap; dropping it frees the place.
#[derive(Debug)]
pub struct Slot(Arc<AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// How a server runs.
#[derive(Clone, Copy, Debug)]
pub struct ServerSettings {
    /// Event-loop threads.
    pub threads: usize,
    /// Connections held at once (in loops and promoted); more are refused.
    pub max_connections: usize,
}

type Handoff = (mio::net::TcpStream, SocketAddr, Slot);

struct LoopHandle {
    inbox: Sender<Handoff>,
    waker: Arc<Waker>,
}

/// A running server. Dropping it stops the loops and closes their connections.
pub struct Server {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    live: Arc<AtomicUsize>,
    loops: Vec<LoopHandle>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("addr", &self.addr)
            .field("loops", &self.loops.len())
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
        listener.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let live = Arc::new(AtomicUsize::new(0));
        let mut polls = Vec::new();
        let mut loops = Vec::new();
        for _ in 0..settings.threads.max(1) {
            let poll = Poll::new()?;
            let waker = Arc::new(Waker::new(poll.registry(), WAKER)?);
            let (tx, rx) = mpsc::channel();
            loops.push(LoopHandle { inbox: tx, waker });
            polls.push((poll, rx));
        }
        let mut listener = Some(mio::net::TcpListener::from_std(listener));
        let siblings: Arc<Vec<(Sender<Handoff>, Arc<Waker>)>> = Arc::new(
            loops
                .iter()
                .map(|l| (l.inbox.clone(), l.waker.clone()))
                .collect(),
        );
        let mut threads = Vec::new();
        for (i, (poll, inbox)) in polls.into_iter().enumerate() {
            let mut ev = EventLoop {
                poll,
                inbox,
                listener: listener.take(),
                protocol: protocol.clone(),
                stop: stop.clone(),
                live: live.clone(),
                max_connections: settings.max_connections.max(1),
                siblings: siblings.clone(),
                conns: HashMap::new(),
                next_token: 0,
                next_sibling: 0,
                pending: VecDeque::new(),
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
                    stop_and_join(&stop, &loops, threads);
                    return Err(e);
                }
            }
        }
        Ok(Server {
            addr,
            stop,
            live,
            loops,
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

    /// Stops the loops and closes every connection they serve (promoted connections end with
    /// their peer or their protocol's timeouts).
    pub fn shutdown(&self) {
        let threads = std::mem::take(&mut *self.threads.lock().unwrap_or_else(|e| e.into_inner()));
        stop_and_join(&self.stop, &self.loops, threads);
    }
}

fn stop_and_join(stop: &AtomicBool, loops: &[LoopHandle], threads: Vec<JoinHandle<()>>) {
    stop.store(true, Ordering::Release);
    for l in loops {
        let _ = l.waker.wake();
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
    slot: Slot,
}

struct EventLoop<P: Protocol> {
    poll: Poll,
    inbox: Receiver<Handoff>,
    /// Loop 0 accepts, and deals connections out over every loop.
    listener: Option<mio::net::TcpListener>,
    protocol: Arc<P>,
    stop: Arc<AtomicBool>,
    live: Arc<AtomicUsize>,
    max_connections: usize,
    siblings: Arc<Vec<(Sender<Handoff>, Arc<Waker>)>>,
    conns: HashMap<usize, Entry<P::Conn>>,
    next_token: usize,
    next_sibling: usize,
    /// Connections that used up their turn with work left, driven again before waiting.
    pending: VecDeque<usize>,
    /// Poll without sleeping until then: a connection's next request is due.
    hot_until: Option<Instant>,
}

impl<P: Protocol> EventLoop<P> {
    fn run(mut self) {
        let mut events = Events::with_capacity(256);
        let mut swept = Instant::now();
        while !self.stop.load(Ordering::Acquire) {
            let hot = self.hot_until.is_some_and(|t| Instant::now() < t);
            let wait = match self.pending.is_empty() && !hot {
                true => Some(Duration::from_secs(1)),
                false => Some(Duration::ZERO),
            };
            if !hot {
                self.hot_until = None;
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
                        while let Ok((stream, peer, slot)) = self.inbox.try_recv() {
                            self.adopt(stream, peer, slot);
                        }
                    }
                    Token(t) => self.drive(t),
                }
            }
            for _ in 0..self.pending.len() {
                if let Some(t) = self.pending.pop_front() {
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
            if self.live.fetch_add(1, Ordering::AcqRel) >= self.max_connections {
                self.live.fetch_sub(1, Ordering::AcqRel);
                let max = self.max_connections;
                warn!(server = name, %peer, max, "connection cap reached; connection refused");
                self.protocol
                    .refuse(&stream, peer, Refusal::AtCapacity { max });
                continue;
            }
            let slot = Slot(self.live.clone());
            let _ = stream.set_nodelay(true);
            let i = self.next_sibling % self.siblings.len();
            self.next_sibling = self.next_sibling.wrapping_add(1);
            match i {
                0 => self.adopt(stream, peer, slot),
                _ => {
                    let (tx, waker) = &self.siblings[i];
                    if tx.send((stream, peer, slot)).is_ok() {
                        let _ = waker.wake();
                    }
                }
            }
        }
    }

    fn adopt(&mut self, mut stream: mio::net::TcpStream, peer: SocketAddr, slot: Slot) {
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
        let conn = self.protocol.open(peer);
        self.conns.insert(
            token,
            Entry {
                stream,
                peer,
                conn,
                watching_writes: false,
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
            Step::Blocked | Step::BlockedSending => {}
            Step::BlockedHot => self.hot_until = Some(Instant::now() + HOT_SPIN),
            Step::Yield => self.pending.push_back(token),
            Step::Close => self.close(token),
            Step::Promote => {
                if let Some(mut e) = self.conns.remove(&token) {
                    let _ = self.poll.registry().deregister(&mut e.stream);
                    let stream = TcpStream::from(e.stream);
                    self.protocol.promote(e.conn, stream, e.peer, e.slot);
                }
            }
        }
    }

    fn close(&mut self, token: usize) {
        if let Some(mut e) = self.conns.remove(&token) {
            let _ = self.poll.registry().deregister(&mut e.stream);
            debug!(server = self.protocol.name(), peer = %e.peer, "connection closed");
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    /// Echoes bytes back, a line protocol with no framing: enough to exercise the loops.
    struct Echo {
        promoted: AtomicUsize,
    }

    #[derive(Default)]
    struct EchoConn {
        buf: Vec<u8>,
        last: Option<Instant>,
    }

    impl Protocol for Echo {
        type Conn = EchoConn;
        fn name(&self) -> &'static str {
            "echo"
        }
        fn admits(&self, peer: SocketAddr) -> bool {
            peer.ip().is_loopback()
        }
        fn open(&self, _peer: SocketAddr) -> EchoConn {
            EchoConn {
                last: Some(Instant::now()),
                ..EchoConn::default()
            }
        }
        fn drive(&self, c: &mut EchoConn, mut s: &mio::net::TcpStream) -> Step {
            let mut chunk = [0u8; 4096];
            loop {
                if !c.buf.is_empty() {
                    match s.write(&c.buf) {
                        Ok(n) => drop(c.buf.drain(..n)),
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                            return Step::BlockedSending;
                        }
                        Err(_) => return Step::Close,
                    }
                    continue;
                }
                match s.read(&mut chunk) {
                    Ok(0) => return Step::Close,
                    Ok(n) if chunk[..n].contains(&b'!') => return Step::Promote,
                    Ok(n) => {
                        c.buf.extend_from_slice(&chunk[..n]);
                        c.last = Some(Instant::now());
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Step::Blocked,
                    Err(_) => return Step::Close,
                }
            }
        }
        fn expired(&self, c: &EchoConn, now: Instant) -> bool {
            c.last
                .is_some_and(|t| now.duration_since(t) > Duration::from_secs(2))
        }
        fn refuse(&self, mut s: &mio::net::TcpStream, _peer: SocketAddr, why: Refusal) {
            let _ = s.write_all(format!("{why:?}").as_bytes());
        }
        fn promote(self: &Arc<Self>, _c: EchoConn, mut s: TcpStream, _p: SocketAddr, slot: Slot) {
            self.promoted.fetch_add(1, Ordering::AcqRel);
            let _ = s.set_nonblocking(false);
            let _ = s.write_all(b"promoted");
            drop(slot);
        }
    }

    fn start(threads: usize, max: usize) -> (Server, Arc<Echo>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let echo = Arc::new(Echo {
            promoted: AtomicUsize::new(0),
        });
        let settings = ServerSettings {
            threads,
            max_connections: max,
        };
        (Server::start(l, echo.clone(), settings).unwrap(), echo)
    }

    fn roundtrip(s: &mut TcpStream, msg: &[u8]) -> Vec<u8> {
        s.write_all(msg).unwrap();
        let mut got = vec![0u8; msg.len()];
        s.read_exact(&mut got).unwrap();
        got
    }

    #[test]
    fn many_connections_on_few_threads_each_get_their_own_bytes() {
        let (server, _) = start(2, 1000);
        let mut conns: Vec<TcpStream> = (0..200)
            .map(|_| TcpStream::connect(server.local_addr()).unwrap())
            .collect();
        for (i, c) in conns.iter_mut().enumerate() {
            let msg = format!("connection {i} says hello");
            assert_eq!(roundtrip(c, msg.as_bytes()), msg.as_bytes());
        }
        // A large message crosses many turns and send-readiness waits.
        let big: Vec<u8> = (0..4 << 20).map(|i: u32| b'a' + (i % 26) as u8).collect();
        let mut c = conns.pop().unwrap();
        let writer = {
            let mut w = c.try_clone().unwrap();
            let big = big.clone();
            std::thread::spawn(move || w.write_all(&big).unwrap())
        };
        let mut got = vec![0u8; big.len()];
        c.read_exact(&mut got).unwrap();
        writer.join().unwrap();
        assert!(got == big);
        assert_eq!(server.connections(), 200);
        drop(conns);
        drop(c);
        let deadline = Instant::now() + Duration::from_secs(10);
        while server.connections() != 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(server.connections(), 0);
    }

    #[test]
    fn over_the_cap_a_peer_is_told_why_and_the_rest_are_served() {
        let (server, _) = start(1, 3);
        let mut held: Vec<TcpStream> = (0..3)
            .map(|_| TcpStream::connect(server.local_addr()).unwrap())
            .collect();
        for c in &mut held {
            assert_eq!(roundtrip(c, b"x"), b"x");
        }
        let mut over = TcpStream::connect(server.local_addr()).unwrap();
        let mut why = String::new();
        over.read_to_string(&mut why).unwrap();
        assert_eq!(why, "AtCapacity { max: 3 }");
        assert_eq!(roundtrip(&mut held[0], b"still"), b"still");
        // A place freed is a place taken.
        drop(held.pop());
        let deadline = Instant::now() + Duration::from_secs(10);
        while server.connections() != 2 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let mut again = TcpStream::connect(server.local_addr()).unwrap();
        assert_eq!(roundtrip(&mut again, b"in"), b"in");
    }

    #[test]
    fn a_promoted_connection_leaves_the_loop_and_shutdown_closes_the_rest() {
        let (server, echo) = start(2, 10);
        let mut p = TcpStream::connect(server.local_addr()).unwrap();
        p.write_all(b"!").unwrap();
        let mut got = String::new();
        p.read_to_string(&mut got).unwrap();
        assert_eq!(got, "promoted");
        assert_eq!(echo.promoted.load(Ordering::Acquire), 1);
        let mut idle = TcpStream::connect(server.local_addr()).unwrap();
        assert_eq!(roundtrip(&mut idle, b"a"), b"a");
        server.shutdown();
        let mut rest = Vec::new();
        assert_eq!(idle.read_to_end(&mut rest).unwrap_or(0), 0);
        // Nobody is served any more: a connection is refused, or closed unanswered.
        let addr = server.local_addr();
        if let Ok(mut late) = TcpStream::connect(addr) {
            late.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
            let _ = late.write_all(b"anyone?");
            assert_eq!(late.read(&mut [0u8; 8]).unwrap_or(0), 0);
        }
    }
}
