//! The listener for Mooncake initiators (opt-in, `MC_TE_MOONCAKE_COMPAT=1`): Mooncake's framing
//! ([`crate::mooncake_wire`]) on a port of its own, published as Mooncake's `tcp_data_port`
//! with `tcp_data_host` and `tcp_proto_version` 2, so te's own listeners and their secret check
//! are untouched.
//!
//! Mooncake's requests carry no credential, so what guards memory here is everything else te
//! checks: the peer's address against `MC_TE_MOONCAKE_ALLOW` (at accept), then for every
//! request the bounds of one registered region, that region's permission, and a pin that
//! keeps it registered until the bytes have moved. A refused request gets Mooncake's refusal
//! status and the connection closes (as Mooncake's own target does). Requests in Mooncake's
//! unacknowledged framing (v1) are refused by resetting the connection, unless
//! `MC_TE_MOONCAKE_ALLOW_V1=1`: a v1 initiator reads no status, so it could take a refused
//! WRITE for a done one.
//!
//! Threads: a fixed set of event loops (`MC_TE_MOONCAKE_THREADS`) serve every connection, readiness
//! driven (mio), moving bytes between sockets and registered memory without copies
//! ([`conn`]). Mooncake's initiator keeps one request in flight per connection over several
//! connections, so on few cores a thread per connection costs more in wake-ups than the copies
//! themselves. A connection whose request touches GPU memory leaves the loops for a thread of
//! its own ([`blocking`]), where staging may wait without holding anybody up.
//!
//! Not here: the descriptor served to Mooncake peers (te-core's control listener), and any
//! notion of which regions Mooncake may see (every remotely accessible region is, with its
//! permission).

mod blocking;
mod conn;

use std::collections::{HashMap, VecDeque};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mio::{Events, Interest, Poll, Token, Waker};
use te_core::memory::{AccessDenied, RegionPin, RegionTable};
use te_core::mooncake::MooncakeCompat;
use tracing::{debug, error, warn};

use crate::mooncake_wire::{self, HEADER_LEN, Header, STATUS_REJECTED};

/// Connections served at once; more are refused.
const MAX_CONNECTIONS: usize = 4096;
/// An idle connection (no request started) is closed after this long.
pub(super) const IDLE_MAX: Duration = Duration::from_secs(600);
const LISTENER: Token = Token(usize::MAX - 1);
const WAKER: Token = Token(usize::MAX);

/// What every Mooncake connection is checked against.
pub(crate) struct CompatState {
    pub(crate) regions: Arc<RegionTable>,
    pub(crate) compat: MooncakeCompat,
    /// How long a started request may stall.
    pub(crate) stall_timeout: Duration,
    pub(crate) staging: Arc<crate::staging::GpuStaging>,
}

/// What to do with a header.
pub(super) enum Verdict {
    Serve(Header),
    /// Refuse: send this status and close, or (`None`) reset the connection.
    Refuse(Option<[u8; mooncake_wire::STATUS_LEN]>),
}

impl CompatState {
    /// Decodes a header and applies the framing policy: a malformed one is refused with
    /// Mooncake's status, one in the unacknowledged framing is refused by a reset (its
    /// initiator reads no status) unless v1 is allowed.
    pub(super) fn admit(&self, peer: Option<SocketAddr>, raw: &[u8; HEADER_LEN]) -> Verdict {
        let refused = Some(mooncake_wire::encode_status(STATUS_REJECTED));
        let header = match Header::decode(raw) {
            Ok(h) => h,
            Err(e) => {
                warn!(?peer, error = %e, "malformed Mooncake request; closing the connection");
                return Verdict::Refuse(refused);
            }
        };
        if !header.acked && !self.compat.allow_v1 {
            // Loud: a v1 initiator reads no status, so it may report this WRITE done.
            error!(
                ?peer,
                op = ?header.opcode,
                size = header.size,
                "Mooncake request in the unacknowledged framing (v1, MC_TCP_PROTO=1 on that \
                 engine) REFUSED and NOT APPLIED; a v1 initiator may still report a WRITE done. \
                 Unset MC_TCP_PROTO there, or set MC_TE_MOONCAKE_ALLOW_V1=1 here to apply v1"
            );
            return Verdict::Refuse(None);
        }
        Verdict::Serve(header)
    }

    /// te's checks on an admitted request, before any memory is touched: one region's bounds,
    /// its permission, and a pin against unregistering. A refusal says what to send.
    pub(super) fn check(
        &self,
        peer: Option<SocketAddr>,
        h: &Header,
    ) -> Result<RegionPin, Option<[u8; mooncake_wire::STATUS_LEN]>> {
        self.regions
            .pin_remote(h.addr, h.size, h.opcode)
            .map_err(|denied: AccessDenied| {
                warn!(?peer, addr = h.addr, size = h.size, ?denied, op = ?h.opcode, "Mooncake request refused");
                h.acked
                    .then(|| mooncake_wire::encode_status(STATUS_REJECTED))
            })
    }

    fn admits(&self, peer: SocketAddr) -> bool {
        self.compat.admits(peer.ip())
    }
}

/// Closes with a reset, so a v1 initiator's next write fails instead of vanishing.
pub(super) fn reset(stream: &TcpStream) {
    let _ = socket2::SockRef::from(stream).set_linger(Some(Duration::ZERO));
}

/// A connection handed to a loop.
type Handoff = (mio::net::TcpStream, SocketAddr);

struct LoopHandle {
    inbox: Sender<Handoff>,
    waker: Arc<Waker>,
}

/// The running listener: its event loops and how to stop them.
pub(crate) struct CompatServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    loops: Vec<LoopHandle>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl CompatServer {
    /// Serves `listener` with `MC_TE_MOONCAKE_THREADS` event loops.
    ///
    /// # Errors
    /// The listener or a loop could not be set up.
    pub(crate) fn start(
        listener: std::net::TcpListener,
        state: Arc<CompatState>,
    ) -> std::io::Result<Self> {
        let addr = listener.local_addr()?;
        listener.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let mut polls = Vec::new();
        let mut loops = Vec::new();
        for _ in 0..state.compat.threads.max(1) {
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
                state: state.clone(),
                stop: stop.clone(),
                siblings: siblings.clone(),
                conns: HashMap::new(),
                next_token: 0,
                next_sibling: 0,
                pending: VecDeque::new(),
            };
            if let Some(l) = ev.listener.as_mut() {
                ev.poll
                    .registry()
                    .register(l, LISTENER, Interest::READABLE)?;
            }
            threads.push(
                std::thread::Builder::new()
                    .name(format!("te-tcp-mooncake{i}"))
                    .spawn(move || ev.run())?,
            );
        }
        Ok(CompatServer {
            addr,
            stop,
            loops,
            threads: Mutex::new(threads),
        })
    }

    /// Where it listens.
    pub(crate) fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops the loops and closes every connection they serve (connections promoted to a
    /// thread of their own end with their peer).
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

impl Drop for CompatServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

struct EventLoop {
    poll: Poll,
    inbox: Receiver<Handoff>,
    /// Loop 0 accepts, and deals connections out over every loop.
    listener: Option<mio::net::TcpListener>,
    state: Arc<CompatState>,
    stop: Arc<AtomicBool>,
    siblings: Arc<Vec<(Sender<Handoff>, Arc<Waker>)>>,
    conns: HashMap<usize, conn::Conn>,
    next_token: usize,
    next_sibling: usize,
    /// Connections that used up their turn with work left, driven again before waiting.
    pending: VecDeque<usize>,
}

impl EventLoop {
    fn run(mut self) {
        let mut events = Events::with_capacity(256);
        let mut swept = Instant::now();
        while !self.stop.load(Ordering::Acquire) {
            let wait = match self.pending.is_empty() {
                true => Some(Duration::from_secs(1)),
                false => Some(Duration::ZERO),
            };
            if let Err(e) = self.poll.poll(&mut events, wait) {
                if e.kind() != std::io::ErrorKind::Interrupted {
                    return error!(error = %e, "Mooncake listener: poll failed; loop stopped");
                }
            }
            for event in events.iter() {
                match event.token() {
                    LISTENER => self.accept(),
                    WAKER => {
                        while let Ok((stream, peer)) = self.inbox.try_recv() {
                            self.adopt(stream, peer);
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
        loop {
            let Some(listener) = self.listener.as_ref() else {
                return;
            };
            let (stream, peer) = match listener.accept() {
                Ok(s) => s,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return warn!(error = %e, "Mooncake listener: accept failed"),
            };
            if !self.state.admits(peer) {
                warn!(
                    %peer,
                    "Mooncake-compatible listener: peer not in MC_TE_MOONCAKE_ALLOW; refused"
                );
                let _ = socket2::SockRef::from(&stream).set_linger(Some(Duration::ZERO));
                continue;
            }
            let _ = stream.set_nodelay(true);
            let i = self.next_sibling % self.siblings.len();
            self.next_sibling = self.next_sibling.wrapping_add(1);
            match i {
                0 => self.adopt(stream, peer),
                _ => {
                    let (tx, waker) = &self.siblings[i];
                    if tx.send((stream, peer)).is_ok() {
                        let _ = waker.wake();
                    }
                }
            }
        }
    }

    fn adopt(&mut self, mut stream: mio::net::TcpStream, peer: SocketAddr) {
        if self.conns.len() >= MAX_CONNECTIONS {
            return warn!(%peer, max = MAX_CONNECTIONS, "Mooncake listener: connection cap reached; refused");
        }
        let token = self.next_token;
        self.next_token = (self.next_token + 1) % (usize::MAX - 2);
        if let Err(e) = self
            .poll
            .registry()
            .register(&mut stream, Token(token), Interest::READABLE)
        {
            return warn!(%peer, error = %e, "Mooncake listener: cannot watch a connection");
        }
        self.conns.insert(token, conn::Conn::new(stream, peer));
        // Bytes may have arrived before the registration: look now.
        self.drive(token);
    }

    fn drive(&mut self, token: usize) {
        let Some(c) = self.conns.get_mut(&token) else {
            return;
        };
        // Room to send is watched only while a reply waits for it: an ACK then wakes nobody.
        let step = c.drive(&self.state);
        let sending = matches!(step, conn::Step::BlockedSending);
        if sending != c.watching_writes {
            c.watching_writes = sending;
            let interest = match sending {
                true => Interest::READABLE | Interest::WRITABLE,
                false => Interest::READABLE,
            };
            if self
                .poll
                .registry()
                .reregister(&mut c.stream, Token(token), interest)
                .is_err()
            {
                return self.close(token);
            }
        }
        match step {
            conn::Step::Blocked | conn::Step::BlockedSending => {}
            conn::Step::Yield => self.pending.push_back(token),
            conn::Step::Close => self.close(token),
            conn::Step::Promote(header) => {
                if let Some(mut c) = self.conns.remove(&token) {
                    let _ = self.poll.registry().deregister(&mut c.stream);
                    let (stream, peer) = (TcpStream::from(c.stream), c.peer);
                    let state = self.state.clone();
                    let spawned = std::thread::Builder::new()
                        .name("te-tcp-mooncake-gpu".into())
                        .spawn(move || blocking::serve_from(&state, stream, Some(peer), header));
                    if let Err(e) = spawned {
                        warn!(%peer, error = %e, "Mooncake listener: no thread for a GPU connection");
                    }
                }
            }
        }
    }

    fn close(&mut self, token: usize) {
        if let Some(mut c) = self.conns.remove(&token) {
            let _ = self.poll.registry().deregister(&mut c.stream);
            debug!(peer = %c.peer, "Mooncake connection closed");
        }
    }

    /// Closes connections idle past `IDLE_MAX` or stalled mid-request past the stall timeout.
    fn sweep(&mut self, now: Instant) {
        let stall = self.state.stall_timeout;
        let expired: Vec<usize> = self
            .conns
            .iter()
            .filter(|(_, c)| c.expired(now, stall))
            .map(|(t, _)| *t)
            .collect();
        for t in expired {
            if let Some(c) = self.conns.get(&t) {
                debug!(peer = %c.peer, "Mooncake connection idle or stalled; closed");
            }
            self.close(t);
        }
    }
}
