//! One lane's connection as its loop drives it: a non-blocking connect from the local rail's
//! address, te's greeting read (its nonce makes the connection's proof of the segment secret, which
//! every request carries instead of the secret), then requests pipelined out (header, and a WRITE's
//! body straight from registered memory; up to [`GATHER_REQUESTS`] requests or [`GATHER_BYTES`] per
//! send call) while replies are read in order and in bulk (statuses of many requests, and small
//! READs' data, per receive call, through the [`Inbox`]; a larger READ's data straight into
//! registered memory), every socket call non-blocking. A reply is matched to the oldest
//! request in flight; a slice is reported only once its request is wholly sent (its memory is the
//! application's again after that). Whatever breaks the connection (a send or receive error, a
//! reply out of order, the peer closing, no progress for the status timeout, a Mooncake refusal)
//! fails what is in flight as path errors; queued slices wait for the next connection, except after
//! no progress for the status timeout, which fails them too (a hung peer would have each new
//! connection fill its buffers and wait the timeout out again).

use std::collections::VecDeque;
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use mio::unix::SourceFd;
use mio::{Interest, Token};
use te_core::Opcode;
use te_core::transport::{SliceError, SliceOp};

use super::inbox::Inbox;
use super::{Driven, Framing, LaneCore, LaneState, busy, connect_fault, decode_status, header};
use crate::error::Error;
use crate::initiator::dialer::LoopShared;
use crate::sys::{self, SendPart};
use crate::wire::{GREETING_LEN, Status, connection_proof, greeting_of};

/// Bytes one receive call takes at most.
const RECV_PIECE: usize = 256 << 10;
/// A READ with at least this much data still to come receives it straight into registered
/// memory; less comes through the inbox with the replies after it (a copy of a few KiB costs
/// less than a receive call).
const DIRECT_READ: usize = 16 << 10;
/// Requests one send call carries at most (two parts each: header and body).
pub(crate) const GATHER_REQUESTS: usize = 32;
/// Bytes one send call carries at most: requests are gathered until this much is out.
pub(crate) const GATHER_BYTES: usize = 256 << 10;
/// Connects one drive may start after the connection broke, before it waits a little.
const RECONNECTS_PER_DRIVE: usize = 2;
/// A reply's data ran past its slice's memory: the arithmetic of a lane went wrong.
const OVERRUN: &str = "lane failed: a reply's data overran its slice";

type Done = Vec<(SliceOp, Result<(), SliceError>)>;

/// A request being sent.
struct Outgoing {
    head: [u8; 48],
    head_len: usize,
    head_sent: usize,
    /// A WRITE's body: its slice's local memory (0 for a READ).
    body: usize,
    body_sent: usize,
    request_id: u64,
}

impl Outgoing {
    /// Bytes of it not yet sent.
    fn left(&self) -> usize {
        self.head_len - self.head_sent + self.body - self.body_sent
    }
}

struct InFlight {
    op: SliceOp,
    request_id: u64,
}

/// Where a connection is with te's greeting.
enum Greeting {
    /// Not spoken: a Mooncake target.
    None,
    /// Being read: `got` bytes of it in `buf`.
    Reading { buf: [u8; GREETING_LEN], got: usize },
    /// Read: the connection's nonce.
    Read([u8; 16]),
}

/// A lane's connection.
pub(crate) struct Conn {
    stream: Arc<TcpStream>,
    fd: RawFd,
    connected: bool,
    /// The connect's start, then the last time bytes moved.
    since: Instant,
    next_id: u64,
    /// Requests being sent, oldest first (they are also in `in_flight`).
    out: VecDeque<Outgoing>,
    in_flight: VecDeque<InFlight>,
    /// Replies received and not yet matched.
    inbox: Inbox,
    /// The oldest request's reply status, once read.
    status: Option<Status>,
    /// Bytes of the oldest READ's data received.
    data_at: usize,
    /// Whether the loop watches the socket: while it connects or has requests out. An idle
    /// connection is not watched, so a submitting thread's exchange on it wakes no loop.
    watched: bool,
    greeting: Greeting,
    /// The proof last made, and the secret it was made with (a lane serves one segment; a
    /// descriptor fetched again may bring another secret).
    proof: Option<([u8; 16], [u8; 16])>,
}

/// Sets the socket blocking (for a whole exchange on one thread) or back to non-blocking.
pub(crate) fn blocking(stream: &TcpStream, on: bool) -> std::io::Result<()> {
    stream.set_nonblocking(!on)
}

/// Runs `io` (`what` it does, for the error) with the socket blocking, then sets it back. Any
/// failure, of `io` or of either switch, is the reason the connection closes.
fn while_blocking<T>(
    stream: &TcpStream,
    what: &str,
    io: impl FnOnce() -> std::io::Result<T>,
) -> Result<T, String> {
    blocking(stream, true).map_err(|e| format!("lane failed: {e}"))?;
    let done = io();
    blocking(stream, false).map_err(|e| format!("lane failed: {e}"))?;
    done.map_err(|e| format!("lane failed: {what}: {e}"))
}

impl Conn {
    /// Whether it connects (greeting included), or has requests out.
    pub(crate) fn busy(&self) -> bool {
        !self.ready() || !self.out.is_empty() || !self.in_flight.is_empty()
    }

    /// Connected, and greeted where te's listener greets.
    fn ready(&self) -> bool {
        self.connected && !matches!(self.greeting, Greeting::Reading { .. })
    }

    /// Ready with nothing out or in flight.
    pub(crate) fn idle(&self) -> bool {
        self.ready() && self.out.is_empty() && self.in_flight.is_empty() && self.inbox.is_empty()
    }

    /// The proof `op`'s request carries on this connection: none towards a Mooncake target.
    pub(crate) fn proof_for(&mut self, op: &SliceOp) -> [u8; 16] {
        let Greeting::Read(nonce) = &self.greeting else {
            return [0; 16];
        };
        let secret = op.target.secret();
        let bytes = secret.to_bytes();
        match self.proof {
            Some((made_with, proof)) if made_with == bytes => proof,
            _ => {
                let proof = connection_proof(&secret, nonce);
                self.proof = Some((bytes, proof));
                proof
            }
        }
    }

    /// Reads what it can of the greeting: `Ok(true)` once it is in (or none is spoken),
    /// `Ok(false)` while more is to come, `Err` with why the connection is no good (the
    /// target at its cap: [`SliceError::Busy`], its slices retried after a backoff).
    fn read_greeting(&mut self) -> Result<bool, SliceError> {
        let Greeting::Reading { buf, got } = &mut self.greeting else {
            return Ok(true);
        };
        while *got < GREETING_LEN {
            let at = *got;
            let n = sys::recv_now(&*self.stream, &mut buf[at..GREETING_LEN]);
            match n {
                Ok(0) => break,
                Ok(n) => *got += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) => return Err(SliceError::Path(format!("reading the greeting: {e}"))),
            }
        }
        let nonce = greeting_of(&buf[..*got]).map_err(|e| match e {
            Error::Busy => SliceError::Busy(format!("lane refused: {}", busy())),
            Error::BadMagic(_) => SliceError::Path(format!(
                "the target's greeting is not te's (an older te, or not te): {e}"
            )),
            e => SliceError::Path(e.to_string()),
        })?;
        self.greeting = Greeting::Read(nonce);
        Ok(true)
    }

    pub(crate) fn stream(&self) -> Arc<TcpStream> {
        self.stream.clone()
    }

    pub(crate) fn next_request_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// Has the loop watch the socket (`on`) or not.
    fn watch(&mut self, home: &LoopShared, token: usize, on: bool) -> std::io::Result<()> {
        if self.watched == on {
            return Ok(());
        }
        match on {
            true => home.registry().register(
                &mut SourceFd(&self.fd),
                Token(token),
                Interest::READABLE | Interest::WRITABLE,
            )?,
            false => home.registry().deregister(&mut SourceFd(&self.fd))?,
        }
        self.watched = on;
        Ok(())
    }

    /// Closes the connection: its loop stops watching it, and what is in flight fails.
    pub(crate) fn fail_all(self, home: &LoopShared, why: &str, done: &mut Done) {
        if self.watched {
            let _ = home.registry().deregister(&mut SourceFd(&self.fd));
        }
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
        for f in self.in_flight {
            done.push((f.op, Err(SliceError::Path(why.to_string()))));
        }
    }

    /// Whether the connect finished; an error when it failed.
    fn check_connected(&self) -> std::io::Result<bool> {
        if let Some(e) = self.stream.take_error()? {
            return Err(e);
        }
        match self.stream.peer_addr() {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::NotConnected => Ok(false),
            Err(e) => Err(e),
        }
    }
}

/// Starts connecting to the peer from the local rail's address, and has the loop watch it.
fn connect(core: &LaneCore, home: &LoopShared, now: Instant) -> std::io::Result<Conn> {
    use socket2::{Domain, Socket, Type};
    let peer = &core.peer;
    // Resolved by a posting thread: a loop never waits on a name service.
    let to: SocketAddr = *core.to.lock().unwrap_or_else(|e| e.into_inner());
    let socket = Socket::new(Domain::for_address(to), Type::STREAM, None)?;
    if peer.local_ip.is_ipv4() == to.is_ipv4() && !peer.local_ip.is_unspecified() {
        socket.bind(&SocketAddr::new(peer.local_ip, 0).into())?;
    }
    socket.set_nonblocking(true)?;
    match socket.connect(&to.into()) {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {}
        Err(e) => return Err(e),
    }
    socket.set_tcp_nodelay(true)?;
    // The connect has chosen the local address (a same-host peer gets reno by default).
    core.settings.congestion.apply(&socket, to.ip(), || {
        let chosen = socket.local_addr().ok().and_then(|a| a.as_socket());
        Some(chosen.map_or(peer.local_ip, |a| a.ip()))
    });
    // For the exchanges a submitting thread makes with the socket blocking.
    socket.set_read_timeout(Some(core.settings.status_timeout))?;
    socket.set_write_timeout(Some(core.settings.status_timeout))?;
    let stream: TcpStream = socket.into();
    let fd = stream.as_raw_fd();
    home.registry().register(
        &mut SourceFd(&fd),
        Token(core.token),
        Interest::READABLE | Interest::WRITABLE,
    )?;
    let greeting = match peer.framing {
        Framing::Te => Greeting::Reading {
            buf: [0; GREETING_LEN],
            got: 0,
        },
        Framing::Mooncake { .. } => Greeting::None,
    };
    Ok(Conn {
        greeting,
        proof: None,
        stream: Arc::new(stream),
        fd,
        connected: false,
        since: now,
        next_id: 0,
        out: VecDeque::new(),
        in_flight: VecDeque::new(),
        inbox: Inbox::new(),
        status: None,
        data_at: 0,
        watched: true,
    })
}

impl LaneCore {
    /// Moves the lane on as far as its socket allows (called by its loop).
    pub(crate) fn drive(&self, home: &LoopShared, now: Instant) -> Driven {
        let mut done = Vec::new();
        let driven = {
            let mut st = self.lock();
            let mut driven = self.step(&mut st, home, now, &mut done);
            driven.active =
                st.inline || !st.queue.is_empty() || st.conn.as_ref().is_some_and(Conn::busy);
            driven
        };
        self.report(done);
        driven
    }

    fn step(&self, st: &mut LaneState, home: &LoopShared, now: Instant, done: &mut Done) -> Driven {
        if st.inline {
            return Driven::default();
        }
        let mut reconnects = 0;
        loop {
            if st.conn.is_none() {
                if st.queue.is_empty() {
                    return Driven {
                        finished: st.closed,
                        ..Driven::default()
                    };
                }
                if reconnects >= RECONNECTS_PER_DRIVE {
                    return Driven {
                        timer: Some(now + Duration::from_millis(10)),
                        ..Driven::default()
                    };
                }
                // A retried slice after a failed connect: give the peer a moment.
                if let (Some(at), Some(front)) = (st.last_failure, st.queue.front()) {
                    let attempt = front.token.attempt();
                    if attempt > 0 {
                        let until = at + Duration::from_millis(5u64 << attempt.min(7));
                        if now < until {
                            return Driven {
                                timer: Some(until),
                                ..Driven::default()
                            };
                        }
                    }
                }
                reconnects += 1;
                match connect(self, home, now) {
                    Ok(c) => st.conn = Some(c),
                    Err(e) => {
                        self.fail_unreachable(st, &e, now, done);
                        continue;
                    }
                }
            }
            let Some(conn) = st.conn.as_mut() else {
                continue;
            };
            if !conn.connected {
                let failed = match conn.check_connected() {
                    Ok(true) => {
                        conn.connected = true;
                        conn.since = now;
                        st.last_failure = None;
                        None
                    }
                    Ok(false) if now.duration_since(conn.since) > self.settings.connect_timeout => {
                        Some(std::io::Error::from(std::io::ErrorKind::TimedOut))
                    }
                    Ok(false) => return Driven::default(),
                    Err(e) => Some(e),
                };
                if let Some(e) = failed {
                    if let Some(c) = st.conn.take() {
                        c.fail_all(home, "connect failed", done);
                    }
                    self.fail_unreachable(st, &e, now, done);
                    continue;
                }
            }
            if let Some(c) = st.conn.as_mut() {
                let greeted = match c.read_greeting() {
                    Ok(false) if now.duration_since(c.since) > self.settings.connect_timeout => {
                        Err(SliceError::Path(
                            "no greeting from the target within the connect timeout".into(),
                        ))
                    }
                    other => other,
                };
                match greeted {
                    Ok(true) => {}
                    Ok(false) => return Driven::default(),
                    Err(why) => {
                        tracing::debug!(peer = %self.peer.host, port = self.peer.port, reason = %why, "lane connection refused");
                        if let Some(c) = st.conn.take() {
                            c.fail_all(home, &why.to_string(), done);
                        }
                        // Retried slices wait a backoff from here before the next connect.
                        st.last_failure = Some(now);
                        self.fail_queued(st, || why.clone(), done);
                        continue;
                    }
                }
            }
            if !st.queue.is_empty() {
                if let Some(c) = st.conn.as_mut() {
                    if let Err(e) = c.watch(home, self.token, true) {
                        let why = format!("lane failed: watching its socket: {e}");
                        if let Some(c) = st.conn.take() {
                            c.fail_all(home, &why, done);
                        }
                        continue;
                    }
                }
            }
            let broken = self
                .pump(st, now, done)
                .err()
                .map(|why| (why, false))
                .or_else(|| {
                    let c = st.conn.as_ref()?;
                    let stalled =
                        c.busy() && now.duration_since(c.since) > self.settings.status_timeout;
                    stalled.then(|| {
                        let why = format!(
                            "lane failed: no progress for {} s (MC_TCP_STATUS_TIMEOUT_SEC)",
                            self.settings.status_timeout.as_secs()
                        );
                        (why, true)
                    })
                });
            if let Some((why, stalled)) = broken {
                tracing::debug!(peer = %self.peer.host, port = self.peer.port, reason = %why, "lane connection ended");
                if let Some(c) = st.conn.take() {
                    c.fail_all(home, &why, done);
                }
                if stalled {
                    // The peer took nothing and answered nothing for the whole timeout: on a
                    // new connection the slices queued behind would fill its socket buffers and
                    // wait the timeout out again, one buffer-ful at a time. They fail now, and
                    // each retry costs one timeout however large the batch.
                    let not_sent = format!("{why}; not sent");
                    self.fail_queued(st, || SliceError::Path(not_sent.clone()), done);
                }
                continue;
            }
            let drained = st.queue.is_empty() && st.conn.as_ref().is_none_or(Conn::idle);
            if drained {
                if let Some(c) = st.conn.as_mut() {
                    // Idle: unwatched until it has requests out again (a peer closing it
                    // meanwhile shows on the next send).
                    let _ = c.watch(home, self.token, false);
                }
            }
            if st.closed && drained {
                if let Some(c) = st.conn.take() {
                    c.fail_all(home, "lane closed", done);
                }
                return Driven {
                    finished: true,
                    ..Driven::default()
                };
            }
            return Driven::default();
        }
    }

    /// After a connect failed at `now`: fails every queued slice (they are retried after a
    /// backoff from `now`) and marks the peer's address for resolving again.
    fn fail_unreachable(
        &self,
        st: &mut LaneState,
        e: &std::io::Error,
        now: Instant,
        done: &mut Done,
    ) {
        st.last_failure = Some(now);
        self.unreachable.store(true, Ordering::Release);
        let msg = format!(
            "connecting from {} to {}:{}: {e}",
            self.peer.local_ip, self.peer.host, self.peer.port
        );
        self.fail_queued(st, || connect_fault(e, msg.clone()), done);
    }

    /// Closes the lane's connection if it is idle (nothing queued, out or awaited, no submitting
    /// thread on it) and its peer has closed it, reset it or sent bytes nobody asked for: an
    /// idle connection is not watched, so without this one to a peer that went away (or a
    /// target that closed it after its idle timeout) would hold its descriptor until the lane
    /// is next used.
    pub(crate) fn reap_idle(&self, home: &LoopShared) {
        let mut st = self.lock();
        if st.inline || !st.queue.is_empty() {
            return;
        }
        let Some(c) = st.conn.as_ref().filter(|c| c.idle()) else {
            return;
        };
        let left = match c.stream.peek(&mut [0u8; 1]) {
            Ok(0) => "the peer closed it",
            Ok(_) => "bytes nobody asked for",
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
            Err(_) => "a socket error",
        };
        tracing::debug!(peer = %self.peer.host, port = self.peer.port, reason = left, "idle lane connection closed");
        if let Some(c) = st.conn.take() {
            // Idle: nothing in flight to fail.
            c.fail_all(home, left, &mut Vec::new());
        }
    }

    /// Fails every queued slice with `error()`, to be retried as the engine decides.
    pub(crate) fn fail_queued(
        &self,
        st: &mut LaneState,
        error: impl Fn() -> SliceError,
        done: &mut Done,
    ) {
        for op in st.queue.drain(..) {
            self.queued_bytes.fetch_sub(op.len, Ordering::Relaxed);
            done.push((op, Err(error())));
        }
    }

    /// Sends what is queued and reads what has come, until the socket would block both ways.
    /// An `Err` says why the connection must close.
    fn pump(&self, st: &mut LaneState, now: Instant, done: &mut Done) -> Result<(), String> {
        let LaneState { queue, conn, .. } = st;
        let Some(c) = conn.as_mut() else {
            return Ok(());
        };
        loop {
            let mut progress = self.send_gathered(c, queue, now, done)?;
            progress |= self.receive_replies(c, now, done)?;
            if !progress {
                return Ok(());
            }
        }
    }

    /// Out: the requests being sent, topped up from the queue, as many per send call as
    /// [`GATHER_REQUESTS`] and [`GATHER_BYTES`] allow. Whether anything moved.
    fn send_gathered(
        &self,
        c: &mut Conn,
        queue: &mut VecDeque<SliceOp>,
        now: Instant,
        done: &mut Done,
    ) -> Result<bool, String> {
        let framing = self.peer.framing;
        let mut progress = false;
        loop {
            let mut pending: usize = c.out.iter().map(Outgoing::left).sum();
            while c.out.len() < GATHER_REQUESTS && pending < GATHER_BYTES {
                let Some(op) = queue.pop_front() else {
                    break;
                };
                self.queued_bytes.fetch_sub(op.len, Ordering::Relaxed);
                if op.is_canceled() {
                    done.push((op, Err(SliceError::Canceled)));
                    continue;
                }
                if op.opcode == Opcode::Write && self.on_gpu(&op) {
                    if !c.out.is_empty() {
                        // Sent whole with the socket blocking, after what is being sent.
                        self.queued_bytes.fetch_add(op.len, Ordering::Relaxed);
                        queue.push_front(op);
                        break;
                    }
                    let id = c.next_request_id();
                    self.send_staged(c, &op, id)?;
                    c.in_flight.push_back(InFlight { op, request_id: id });
                    progress = true;
                    continue;
                }
                let id = c.next_request_id();
                let proof = c.proof_for(&op);
                let (head, head_len) = header(framing, &op, id, proof);
                let body = match op.opcode {
                    Opcode::Write => op.len as usize,
                    _ => 0,
                };
                let o = Outgoing {
                    head,
                    head_len,
                    head_sent: 0,
                    body,
                    body_sent: 0,
                    request_id: id,
                };
                pending += o.left();
                c.out.push_back(o);
                c.in_flight.push_back(InFlight { op, request_id: id });
            }
            if c.out.is_empty() {
                return Ok(progress);
            }
            // The requests being sent are the last in flight, in order.
            let sending = c.in_flight.range(c.in_flight.len() - c.out.len()..);
            let mut parts = [SendPart::EMPTY; 2 * GATHER_REQUESTS];
            let mut n = 0;
            for (o, f) in c.out.iter().zip(sending) {
                parts[n] = o.head[o.head_sent..o.head_len].into();
                parts[n + 1] = match o.body {
                    0 => SendPart::EMPTY,
                    len => {
                        f.op.local_range()
                            .and_then(|r| r.part(o.body_sent, len - o.body_sent))
                            .ok_or("lane failed: a WRITE's body is not host memory")?
                            .into()
                    }
                };
                n += 2;
            }
            let sent = match sys::send_some(&*c.stream, &parts[..n]) {
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(progress),
                Err(e) => return Err(format!("lane failed: sending: {e}")),
            };
            if sent == 0 {
                return Ok(progress);
            }
            progress = true;
            c.since = now;
            let mut left = sent;
            while let Some(o) = c.out.front_mut() {
                let h = left.min(o.head_len - o.head_sent);
                o.head_sent += h;
                left -= h;
                let b = left.min(o.body - o.body_sent);
                o.body_sent += b;
                left -= b;
                if o.left() > 0 {
                    break;
                }
                c.out.pop_front();
            }
        }
    }

    /// In: replies in order, each once its request is wholly out, read in bulk. Whether
    /// anything moved.
    fn receive_replies(&self, c: &mut Conn, now: Instant, done: &mut Done) -> Result<bool, String> {
        let framing = self.peer.framing;
        let mut progress = false;
        let closed = || "lane failed: the target closed the connection".to_string();
        while let Some(front) = c.in_flight.front() {
            if c.out
                .front()
                .is_some_and(|o| o.request_id == front.request_id)
            {
                break;
            }
            if c.status.is_none() {
                let want = framing.status_len();
                if c.inbox.len() < want {
                    match c.inbox.fill(&*c.stream) {
                        Ok(0) => return Err(closed()),
                        Ok(_) => {
                            c.since = now;
                            progress = true;
                            continue;
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                        Err(e) => return Err(format!("lane failed: receiving: {e}")),
                    }
                }
                let status = decode_status(framing, c.inbox.take(want), front.request_id)
                    .map_err(|e| format!("lane failed: {e}"))?;
                c.status = Some(status);
            }
            let outcome = match c.status {
                Some(Status::Rejected(r)) => Err(SliceError::Rejected(r)),
                Some(Status::Busy) => return Err(format!("lane failed: {}", busy())),
                Some(Status::Ok) if front.op.opcode == Opcode::Read => {
                    if self.on_gpu(&front.op) {
                        self.receive_staged(c)?
                    } else {
                        let op = &front.op;
                        let len = op.len as usize;
                        let Some(local) = op.local_range() else {
                            return Err("lane failed: a READ's memory is not host memory".into());
                        };
                        if !c.inbox.is_empty() {
                            let bytes = c.inbox.take(len - c.data_at);
                            local
                                .part(c.data_at, bytes.len())
                                .ok_or(OVERRUN)?
                                .put(bytes);
                            c.data_at += bytes.len();
                            progress = true;
                        }
                        let left = len - c.data_at;
                        if left > 0 {
                            let direct = left >= DIRECT_READ;
                            let received = match direct {
                                true => sys::recv_some(
                                    &*c.stream,
                                    local.part(c.data_at, left.min(RECV_PIECE)).ok_or(OVERRUN)?,
                                ),
                                // Into the inbox, with the replies after it: copied out on the
                                // next round.
                                false => c.inbox.fill(&*c.stream),
                            };
                            match received {
                                Ok(0) => return Err(closed()),
                                Ok(n) => {
                                    if direct && n < left {
                                        // The target's sending may wait on this read's ACK,
                                        // which the kernel holds back on a lane that sends
                                        // requests as it reads (`sys::push_ack`).
                                        let _ = sys::push_ack(&*c.stream);
                                    }
                                    c.data_at += if direct { n } else { 0 };
                                    c.since = now;
                                    progress = true;
                                }
                                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                                Err(e) => return Err(format!("lane failed: receiving: {e}")),
                            }
                            continue;
                        }
                        Ok(())
                    }
                }
                _ => Ok(()),
            };
            let Some(InFlight { op, .. }) = c.in_flight.pop_front() else {
                break;
            };
            c.status = None;
            c.data_at = 0;
            progress = true;
            let closes = framing.closes_after(&outcome);
            done.push((op, outcome));
            if closes {
                // Mooncake's target closes after a refusal: what was pipelined behind it
                // fails as path errors, and retries.
                return Err("the Mooncake target refused a request and closed the lane".into());
            }
        }
        Ok(progress)
    }

    fn on_gpu(&self, op: &SliceOp) -> bool {
        self.settings
            .staging
            .device_of(op.local_addr, op.len)
            .is_some()
    }

    /// A WRITE from GPU memory: copied into a staging buffer and sent whole, the socket
    /// blocking for it (requests before it are wholly out).
    fn send_staged(&self, c: &mut Conn, op: &SliceOp, id: u64) -> Result<(), String> {
        let staging = &self.settings.staging;
        let len = op.len as usize;
        let device = staging
            .device_of(op.local_addr, op.len)
            .ok_or("GPU region gone")?;
        let bounce = staging.bounce(len).map_err(|e| format!("staging: {e}"))?;
        crate::staging::copy(device, bounce.addr(), op.local_addr, len)
            .map_err(|e| format!("staging: {e}"))?;
        let (head, head_len) = header(self.peer.framing, op, id, c.proof_for(op));
        let mut parts = [head[..head_len].into(), bounce.range(len).into()];
        while_blocking(&c.stream, "sending", || {
            sys::send_parts(&*c.stream, &mut parts)
        })
    }

    /// A READ's data for GPU memory: received whole into a staging buffer (the socket blocking
    /// for it), then copied onto the GPU. The outer error closes the connection.
    fn receive_staged(&self, c: &mut Conn) -> Result<Result<(), SliceError>, String> {
        let Some(front) = c.in_flight.front() else {
            return Ok(Ok(()));
        };
        let op = &front.op;
        let staging = &self.settings.staging;
        let len = op.len as usize;
        let Some(device) = staging.device_of(op.local_addr, op.len) else {
            return Err("GPU region gone".into());
        };
        let bounce = staging.bounce(len).map_err(|e| format!("staging: {e}"))?;
        // Data already read with the replies first, then the rest from the socket.
        let early = c.inbox.take(len);
        let had = early.len();
        let staged = bounce.range(len);
        staged.put(early);
        let rest = staged.part(had, len - had).ok_or(OVERRUN)?;
        while_blocking(&c.stream, "receiving", || sys::recv_exact(&*c.stream, rest))?;
        Ok(
            crate::staging::copy(device, op.local_addr, bounce.addr(), len)
                .map_err(SliceError::LocalPath),
        )
    }
}
