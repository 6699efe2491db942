//! The target side's connections in te's framing, on te-core's event loops
//! ([`te_reactor`]): a fixed pool of threads (`MC_TE_SERVER_THREADS`) serves every data
//! connection, however many peers there are.
//!
//! Each connection is a state machine driven whenever its socket is ready. It sends its
//! greeting, then reads a request header; checks the connection's proof of the segment secret,
//! the bounds of one registered region and its permission
//! (pinning the region) before any byte of memory is touched; then moves the body straight
//! between the socket and that region, no copy of te's own. A WRITE is acknowledged only once
//! its last byte is in memory; replies go out in request order, gathered while further
//! requests are ready and sent when none is (or when `MC_TE_CONN_REPLY_BYTES` wait), which also
//! bounds what a peer that does not read its replies can make the target hold. A refused WRITE's
//! body is read and dropped so the connection stays usable (up to [`MAX_DRAIN`]; a larger one
//! closes it). A malformed header is answered and closes the connection; a Mooncake header is
//! answered in Mooncake's framing and closes it (see [`crate::gpu_path`]'s module doc). A
//! connection never waits: every socket call is non-blocking and one that has had its turn
//! ([`TURN`] bytes) yields to the others.
//!
//! Small requests are taken in bulk: after a request of at most [`SMALL_REQUEST`] bytes, one
//! receive call reads up to [`BULK_BYTES`] into the loop's scratch buffer, and the headers and
//! WRITE bodies in it are taken from there (a body's bytes copied into its pinned region, the
//! rest of a body that did not come along received straight into memory, with the next bulk
//! receive in the same call: one `recvmsg` into the region and then the scratch buffer, where
//! two receives would do). READs are answered
//! in bulk too: each READ's reply and a reference to its pinned data are queued, and the
//! queued replies and data go out in one send call when no further request is ready (or
//! [`GATHER_READS`] READs or [`GATHER_READ_BYTES`] wait). Large requests keep the header-sized
//! reads, so their bodies are never copied: a WRITE's body (its last piece) is received into its
//! region and the next request's header into a header-sized buffer in one call. A receive that
//! returns less than it asked for found the socket empty, and the connection waits for more
//! without asking again. Where GPU memory is registered a connection reads whole headers only
//! and sends each READ at once: such a request leaves the loop. A connection that caught up
//! has its loop poll briefly for the next request before sleeping while it is the server's only
//! connection ([`Step::BlockedHotAlone`]): a single peer's next batch is then the only work
//! coming, and a sleeping core starts the loop tens of microseconds late (`docs/tuning.md`).
//!
//! A request on GPU memory sends its connection to a thread of its own ([`crate::gpu_path`]),
//! where staging may wait without holding anybody up.

use std::io::Read;
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Instant;

use te_core::Opcode;
use te_core::memory::RegionPin;
use te_core::segment::SegmentSecret;
use te_core::transport::Rejection;
use te_reactor::{Deal, Protocol, Refusal, Server, Slot, Step};
use te_sys::PinnedRange;
use tracing::{debug, warn};

use crate::gpu_path::{IDLE_MAX, MAX_DRAIN, SMALL_REQUEST, TargetState, foreign_refusal};
use crate::sys;
use crate::wire::{REQUEST_LEN, Reply, Request, Status};

mod outbox;

use outbox::{Flush, Outbox};

/// Bytes one connection may move per turn before the others get theirs.
const TURN: usize = 8 << 20;
/// Bytes one receive call takes at most: the socket is locked while the kernel copies, and
/// segments arriving meanwhile wait in its backlog, which overflows under megabyte copies.
const RECV_PIECE: usize = 256 << 10;
/// The most `SO_RCVLOWAT` is raised to while a body arrives.
const LOWAT_MAX: usize = 64 << 10;
/// Bytes one bulk receive takes at most (after a small request).
pub(crate) const BULK_BYTES: usize = 64 << 10;
/// READs whose replies and data may wait to go out together.
pub(crate) const GATHER_READS: usize = 32;
/// Bytes of READ data that may wait to go out together.
pub(crate) const GATHER_READ_BYTES: usize = 256 << 10;

thread_local! {
    /// The loop thread's scratch buffer for bulk receives: shared by its connections, so an
    /// idle connection holds none.
    static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

enum Phase {
    /// Reading a request header.
    Header { buf: [u8; REQUEST_LEN], got: usize },
    /// Receiving a WRITE's body into pinned memory.
    Body {
        pin: RegionPin,
        addr: u64,
        left: usize,
        request_id: u64,
    },
    /// Reading and dropping a refused WRITE's body.
    Drain {
        left: u64,
        request_id: u64,
        rejection: Rejection,
    },
    /// Sending what is queued, then closing.
    Closing,
}

fn fresh() -> Phase {
    Phase::Header {
        buf: [0; REQUEST_LEN],
        got: 0,
    }
}

/// One data connection.
pub(crate) struct TargetConn {
    peer: SocketAddr,
    phase: Phase,
    /// Replies and READ data waiting to go out.
    out: Outbox,
    /// The last time bytes moved.
    progress: Instant,
    /// The last request was small: the next headers are taken in bulk.
    last_small: bool,
    /// The request that sends this connection to a thread of its own (GPU memory).
    promoted: Option<Request>,
    /// `SO_RCVLOWAT` is raised (while a body arrives in pieces).
    lowat: bool,
    /// The peer closed its sending side (or the socket failed): every drive reads on until a
    /// receive says so, since no event comes after the one that told.
    peer_closed: bool,
    /// When it was accepted.
    opened: Instant,
    /// A request proved the segment secret: until then the connection has
    /// [`FIRST_REQUEST_DEADLINE`] from `opened`, however much it sends.
    trusted: bool,
    /// The proof every request on this connection must carry: the segment secret's, for the
    /// greeting's nonce (`wire::connection_proof`).
    expected: [u8; 16],
}

/// How long an accepted connection may take to send a request with a valid proof of the
/// segment's secret.
/// An initiator's lane sends its first request as soon as it connects; a socket that sends
/// nothing (or only refused requests) holds a place under the connection cap for this long.
pub(crate) const FIRST_REQUEST_DEADLINE: std::time::Duration = std::time::Duration::from_secs(10);

/// te's data listener: the state every connection checks against, and its reply bound.
pub(crate) struct TargetProtocol {
    pub(crate) state: TargetState,
    pub(crate) reply_bytes: usize,
}

impl TargetConn {
    /// Sends what waits; progress is marked whenever bytes move.
    fn flush(&mut self, stream: &mio::net::TcpStream) -> Flush {
        let progress = &mut self.progress;
        self.out.flush(stream, || *progress = Instant::now())
    }

    /// Whether what waits to go out must go before anything more is read: replies past the
    /// bound, or as many READs as are gathered.
    fn backlogged(&self, p: &TargetProtocol) -> bool {
        let limit = match p.state.staging.any() {
            // Where a request may leave the loop, each READ goes out before the next request.
            true => 1,
            false => GATHER_READS,
        };
        self.out.waiting() >= p.reply_bytes
            || self.out.reads() >= limit
            || self.out.read_bytes() >= GATHER_READ_BYTES
    }

    /// Acts on a complete header: the next phase, or a step that ends this drive.
    fn start(&mut self, p: &TargetProtocol, raw: &[u8; REQUEST_LEN]) -> Option<Step> {
        let r = match Request::decode(raw) {
            Ok(r) => r,
            Err(e) => {
                warn!(peer = %self.peer, error = %e, "malformed data request; closing the connection");
                self.out.reply(0, Status::Rejected(Rejection::Malformed));
                self.phase = Phase::Closing;
                return None;
            }
        };
        self.last_small = r.len <= SMALL_REQUEST;
        let state = &p.state;
        let checked = state.check(&r, &self.expected);
        self.trusted |= !matches!(checked, Err(Rejection::BadSecret));
        let Ok(len) = usize::try_from(r.len) else {
            self.phase = Phase::Closing;
            return None;
        };
        self.phase = match (checked, r.opcode) {
            (Ok(_), _) if state.staging.device_of(r.addr, r.len).is_some() => {
                if self.out.reads() > 0 {
                    // READs answered on the loop would go out behind the GPU thread's replies:
                    // close instead (the initiator retries what it has in flight).
                    warn!(peer = %self.peer, "GPU request behind gathered READs; closing the connection");
                    self.phase = Phase::Closing;
                    return Some(Step::Close);
                }
                self.promoted = Some(r);
                return Some(Step::Promote);
            }
            (Ok(pin), Opcode::Write) => Phase::Body {
                pin,
                addr: r.addr,
                left: len,
                request_id: r.request_id,
            },
            (Ok(pin), _) => {
                self.out.read(r.request_id, pin, r.addr, len);
                fresh()
            }
            (Err(rejection), opcode) => {
                debug!(addr = r.addr, len = r.len, ?rejection, "request refused");
                if opcode != Opcode::Write {
                    self.out.reply(r.request_id, Status::Rejected(rejection));
                    fresh()
                } else if r.len > MAX_DRAIN {
                    self.out.reply(r.request_id, Status::Rejected(rejection));
                    Phase::Closing
                } else {
                    Phase::Drain {
                        left: r.len,
                        request_id: r.request_id,
                        rejection,
                    }
                }
            }
        };
        None
    }

    /// No further request is ready: now the gathered replies (and READ data) go out. `idle`:
    /// no header is half read.
    fn caught_up(&mut self, stream: &mio::net::TcpStream, idle: bool) -> Step {
        match self.flush(stream) {
            Flush::Blocked => Step::BlockedSending,
            Flush::Failed => Step::Close,
            Flush::Done if idle => Step::BlockedHotAlone,
            Flush::Done => Step::Blocked,
        }
    }

    /// One receive of up to [`BULK_BYTES`] into the loop's scratch buffer, taken through the
    /// phases ([`absorb`](Self::absorb)): the bytes received, and the step the drive ends with
    /// if one of them calls for it. While a WRITE's body is being received, the same call first
    /// puts the rest of the body straight into its region (one call where the body's rest and
    /// the next bulk receive would take two).
    fn receive_bulk(
        &mut self,
        p: &TargetProtocol,
        stream: &mio::net::TcpStream,
    ) -> std::io::Result<(Received, Option<Step>)> {
        SCRATCH.with(|cell| {
            let mut scratch = cell.borrow_mut();
            if scratch.len() < BULK_BYTES {
                scratch.resize(BULK_BYTES, 0);
            }
            let (n, body, asked) = match self.body_range() {
                Some(range) => {
                    let range = range?;
                    let want = range.len();
                    let n = sys::recv_then(stream, range, &mut scratch[..])?;
                    let body = n.min(want);
                    self.body_received(stream, body);
                    (n, body, want + scratch.len())
                }
                None => (sys::recv_now(stream, &mut scratch[..])?, 0, scratch.len()),
            };
            // The scratch buffer holds what came after the body.
            let step = self.absorb(p, &scratch[..n - body]);
            Ok((Received::of(n, asked), step))
        })
    }

    /// The rest of the WRITE body being received, in its pinned region: `None` outside a body;
    /// an error if the range left its region (checked when the request started, so never).
    fn body_range(&self) -> Option<std::io::Result<PinnedRange<'_>>> {
        let Phase::Body {
            pin, addr, left, ..
        } = &self.phase
        else {
            return None;
        };
        Some(
            pin.range(*addr, *left)
                .ok_or_else(|| std::io::Error::other("a WRITE's body left its region")),
        )
    }

    /// `n` more bytes of a WRITE's body are in its region; the whole body acknowledged.
    fn body_received(&mut self, stream: &mio::net::TcpStream, n: usize) {
        let Phase::Body {
            addr,
            left,
            request_id,
            ..
        } = &mut self.phase
        else {
            return;
        };
        *addr += n as u64;
        *left -= n;
        if *left == 0 {
            // The bytes are in memory: now the acknowledgement.
            let id = *request_id;
            self.out.reply(id, Status::Ok);
            self.phase = fresh();
            if self.lowat {
                self.lowat = false;
                let _ = sys::set_recv_lowat(stream, 1);
            }
        }
    }

    /// Part of a body is still on its way: the socket reads as readable once the rest (up to a
    /// piece) is there, not at every segment.
    fn await_rest(&mut self, stream: &mio::net::TcpStream) {
        if let Phase::Body { left, .. } = self.phase {
            let want = left.min(LOWAT_MAX);
            if want > 1 && sys::set_recv_lowat(stream, want).is_ok() {
                self.lowat = true;
            }
        }
    }

    /// Takes bytes received in bulk through the phases: headers (each request started as it
    /// completes), WRITE bodies (copied into their pinned regions, acknowledged when whole),
    /// refused bodies (dropped). Returns a step that ends the drive, if one is called for.
    fn absorb(&mut self, p: &TargetProtocol, mut bytes: &[u8]) -> Option<Step> {
        while !bytes.is_empty() {
            match &mut self.phase {
                Phase::Header { buf, got } => {
                    let k = (REQUEST_LEN - *got).min(bytes.len());
                    buf[*got..*got + k].copy_from_slice(&bytes[..k]);
                    *got += k;
                    bytes = &bytes[k..];
                    if let Some(refusal) = foreign_refusal(self.peer, buf, *got) {
                        self.out.framed(&refusal);
                        self.phase = Phase::Closing;
                    } else if *got == REQUEST_LEN {
                        let raw = *buf;
                        match self.start(p, &raw) {
                            // The GPU thread would not see the bytes read past the header.
                            Some(Step::Promote) if !bytes.is_empty() => {
                                warn!(peer = %self.peer, "GPU request read with requests behind it; closing the connection");
                                return Some(Step::Close);
                            }
                            Some(step) => return Some(step),
                            None => {}
                        }
                    }
                }
                Phase::Body {
                    pin,
                    addr,
                    left,
                    request_id,
                } => {
                    let k = (*left).min(bytes.len());
                    let Some(range) = pin.range(*addr, k) else {
                        warn!(peer = %self.peer, "a WRITE's body left its region; closing the connection");
                        return Some(Step::Close);
                    };
                    range.put(&bytes[..k]);
                    *addr += k as u64;
                    *left -= k;
                    bytes = &bytes[k..];
                    if *left == 0 {
                        // The bytes are in memory: now the acknowledgement.
                        let id = *request_id;
                        self.out.reply(id, Status::Ok);
                        self.phase = fresh();
                    }
                }
                Phase::Drain {
                    left,
                    request_id,
                    rejection,
                } => {
                    let k = (*left).min(bytes.len() as u64);
                    *left -= k;
                    bytes = &bytes[k as usize..];
                    if *left == 0 {
                        let (id, why) = (*request_id, *rejection);
                        self.out.reply(id, Status::Rejected(why));
                        self.phase = fresh();
                    }
                }
                // The connection closes; what came after the refused request is dropped.
                Phase::Closing => return None,
            }
        }
        None
    }

    /// A header's bytes so far were taken: a foreign one is answered in its own framing (the
    /// connection then closes), a whole one is started.
    fn took_header(&mut self, p: &TargetProtocol) -> Option<Step> {
        let Phase::Header { buf, got } = &self.phase else {
            return None;
        };
        let (raw, got) = (*buf, *got);
        if let Some(refusal) = foreign_refusal(self.peer, &raw, got) {
            self.out.framed(&refusal);
            self.phase = Phase::Closing;
            return None;
        }
        match got == REQUEST_LEN {
            true => self.start(p, &raw),
            false => None,
        }
    }

    /// The socket had nothing more when last read: the step that waits for more.
    fn drained(&mut self, stream: &mio::net::TcpStream) -> Option<Step> {
        match self.phase {
            Phase::Header { got, .. } => Some(self.caught_up(stream, got == 0)),
            Phase::Body { .. } => {
                self.await_rest(stream);
                Some(Step::Blocked)
            }
            Phase::Drain { .. } => Some(Step::Blocked),
            // Sends what is queued, then closes.
            Phase::Closing => None,
        }
    }

    /// Moves the connection on as far as its socket allows.
    ///
    /// A receive that returns fewer bytes than it asked for found the socket empty: the drive
    /// ends there instead of asking again to be told so. Nothing is missed: data arriving
    /// during or after that receive makes the socket ready again (readiness is edge-triggered,
    /// and every arrival is an edge). Except the end of the stream, which a short receive can
    /// stop just before: once an event said the peer closed its side
    /// ([`Protocol::peer_closing`]), every receive is followed by another until one says so.
    fn drive(&mut self, p: &TargetProtocol, stream: &mio::net::TcpStream) -> Step {
        let mut turn = 0usize;
        let mut drained = false;
        loop {
            if drained
                && !self.peer_closed
                && let Some(step) = self.drained(stream)
            {
                return step;
            }
            if turn >= TURN {
                return Step::Yield;
            }
            let backlog = self.backlogged(p);
            if let Phase::Header { got, .. } = self.phase
                && !backlog
                && self.last_small
                && !p.state.staging.any()
            {
                let moved = match self.receive_bulk(p, stream) {
                    Ok((Received { n: 0, .. }, _)) => {
                        // The peer finished sending; it may still read what it is owed.
                        let _ = self.flush(stream);
                        return Step::Close;
                    }
                    Ok((_, Some(step))) => return step,
                    Ok((got, None)) => {
                        drained = got.short;
                        got.n
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        return self.caught_up(stream, got == 0);
                    }
                    Err(_) => return Step::Close,
                };
                turn += moved;
                self.progress = Instant::now();
                continue;
            }
            if let Phase::Body { .. } = self.phase
                && !backlog
                && self.last_small
                && !p.state.staging.any()
            {
                let moved = match self.receive_bulk(p, stream) {
                    Ok((Received { n: 0, .. }, _)) => return Step::Close,
                    Ok((_, Some(step))) => return step,
                    Ok((got, None)) => {
                        drained = got.short;
                        got.n
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        self.await_rest(stream);
                        return Step::Blocked;
                    }
                    Err(_) => return Step::Close,
                };
                turn += moved;
                self.progress = Instant::now();
                continue;
            }
            let moved = match &mut self.phase {
                Phase::Closing => {
                    return match self.flush(stream) {
                        Flush::Blocked => Step::BlockedSending,
                        _ => Step::Close,
                    };
                }
                Phase::Header { .. } if backlog => {
                    // The peer is not reading its replies: read no further until it does.
                    match self.flush(stream) {
                        Flush::Done => 0,
                        Flush::Blocked => return Step::BlockedSending,
                        Flush::Failed => return Step::Close,
                    }
                }
                Phase::Header { buf, got } => {
                    let at = *got;
                    let n = sys::recv_now(stream, &mut buf[at..]);
                    match n {
                        Ok(0) => {
                            // The peer finished sending; it may still read what it is owed.
                            let _ = self.flush(stream);
                            return Step::Close;
                        }
                        Ok(n) => {
                            *got += n;
                            drained = *got < REQUEST_LEN;
                            if let Some(step) = self.took_header(p) {
                                return step;
                            }
                            n
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                            return self.caught_up(stream, at == 0);
                        }
                        Err(_) => return Step::Close,
                    }
                }
                Phase::Body {
                    pin, addr, left, ..
                } => {
                    let piece = (*left).min(RECV_PIECE);
                    let Some(range) = pin.range(*addr, piece) else {
                        warn!(peer = %self.peer, "a WRITE's body left its region; closing the connection");
                        return Step::Close;
                    };
                    // The next request's header comes along with the body's last piece, in the
                    // same call, when the peer sent it (unless replies are piling up, or a GPU
                    // request could follow: then headers are read on their own).
                    let along = piece == *left && !backlog && !p.state.staging.any();
                    let mut next = [0u8; REQUEST_LEN];
                    let header: &mut [u8] = match along {
                        true => &mut next,
                        false => &mut [],
                    };
                    match sys::recv_then(stream, range, header) {
                        Ok(0) => return Step::Close,
                        Ok(n) => {
                            let body = n.min(piece);
                            self.body_received(stream, body);
                            drained = n < piece + header.len();
                            if n > body {
                                // The body is whole (the phase is a fresh header's): the next
                                // header's first bytes came with it.
                                self.phase = Phase::Header {
                                    buf: next,
                                    got: n - body,
                                };
                                if let Some(step) = self.took_header(p) {
                                    return step;
                                }
                            }
                            n
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                            self.await_rest(stream);
                            return Step::Blocked;
                        }
                        Err(_) => return Step::Close,
                    }
                }
                Phase::Drain {
                    left,
                    request_id,
                    rejection,
                } => {
                    let mut scratch = [0u8; 16 << 10];
                    let want = scratch
                        .len()
                        .min(usize::try_from(*left).unwrap_or(usize::MAX));
                    match (&mut &*stream).read(&mut scratch[..want]) {
                        Ok(0) => return Step::Close,
                        Ok(n) => {
                            *left -= n as u64;
                            if *left == 0 {
                                let (id, why) = (*request_id, *rejection);
                                self.out.reply(id, Status::Rejected(why));
                                self.phase = fresh();
                            }
                            n
                        }
                        Err(e) => return blocked_or_closed(&e),
                    }
                }
            };
            turn += moved;
            self.progress = Instant::now();
        }
    }
}

/// What one receive call took, and whether it found the socket empty before it had all it
/// asked for (a short read).
#[derive(Clone, Copy)]
struct Received {
    n: usize,
    short: bool,
}

impl Received {
    fn of(n: usize, asked: usize) -> Self {
        Received {
            n,
            short: n < asked,
        }
    }
}

fn blocked_or_closed(e: &std::io::Error) -> Step {
    match e.kind() {
        std::io::ErrorKind::WouldBlock => Step::Blocked,
        _ => Step::Close,
    }
}

impl Protocol for TargetProtocol {
    type Conn = TargetConn;

    fn name(&self) -> &'static str {
        "te-tcp-data"
    }

    fn open(&self, peer: SocketAddr, _stream: &mio::net::TcpStream) -> TargetConn {
        // The greeting goes first: a fresh nonce, which the connection's proof covers. Without
        // randomness, the connection closes before it is served.
        let mut out = Outbox::default();
        let (phase, expected) = match SegmentSecret::random() {
            Ok(nonce) => {
                let nonce = nonce.to_bytes();
                out.framed(&crate::wire::encode_greeting(&nonce));
                (fresh(), self.state.expected_proof(&nonce))
            }
            Err(_) => {
                warn!(%peer, "no nonce for a data connection's greeting; closed");
                (Phase::Closing, [0; 16])
            }
        };
        TargetConn {
            peer,
            phase,
            out,
            progress: Instant::now(),
            last_small: false,
            promoted: None,
            lowat: false,
            peer_closed: false,
            opened: Instant::now(),
            trusted: false,
            expected,
        }
    }

    fn peer_closing(&self, c: &mut TargetConn) {
        c.peer_closed = true;
    }

    fn drive(&self, c: &mut TargetConn, stream: &mio::net::TcpStream) -> Step {
        c.drive(self, stream)
    }

    fn expired(&self, c: &TargetConn, now: Instant) -> bool {
        if !c.trusted && now.duration_since(c.opened) > FIRST_REQUEST_DEADLINE {
            return true;
        }
        let limit = match &c.phase {
            Phase::Header { got: 0, .. } if c.out.waiting() == 0 => IDLE_MAX,
            _ => self.state.stall_timeout,
        };
        now.duration_since(c.progress) > limit
    }

    fn proves(&self) -> bool {
        true
    }

    /// Until a request proves the segment secret: such connections make room first.
    fn unproven_since(&self, c: &TargetConn) -> Option<Instant> {
        (!c.trusted).then_some(c.opened)
    }

    fn idle_since(&self, c: &TargetConn) -> Option<Instant> {
        match &c.phase {
            Phase::Header { got: 0, .. } if c.out.waiting() == 0 => Some(c.progress),
            _ => None,
        }
    }

    fn refuse(&self, stream: &mio::net::TcpStream, peer: SocketAddr, why: Refusal) {
        debug!(%peer, ?why, "data connection refused (MC_TE_MAX_DATA_CONNECTIONS)");
        let busy = Reply {
            status: Status::Busy,
            request_id: 0,
        }
        .encode();
        let _ = sys::send_some(stream, &[busy[..].into()]);
    }

    fn promote(self: &Arc<Self>, c: TargetConn, stream: TcpStream, peer: SocketAddr, slot: Slot) {
        let Some(first) = c.promoted else {
            return;
        };
        let replies = c.out.unsent_replies();
        let expected = c.expected;
        let me = self.clone();
        let spawned = std::thread::Builder::new()
            .name("te-tcp-data-gpu".into())
            .spawn(move || {
                crate::gpu_path::serve_from(&me.state, stream, first, replies, expected);
                drop(slot);
            });
        if let Err(e) = spawned {
            warn!(%peer, error = %e, "no thread for a GPU data connection; closed");
        }
    }
}

/// Starts a data listener's event loops.
///
/// # Errors
/// The listener or a loop could not be set up.
pub(crate) fn start(
    listener: std::net::TcpListener,
    protocol: Arc<TargetProtocol>,
    limits: &te_reactor::limits::ServerLimits,
    congestion: &te_reactor::congestion::Congestion,
) -> std::io::Result<Server> {
    let settings = limits.data_server(limits.server_threads, Deal::RoundRobin, congestion);
    Server::start(listener, protocol, settings)
}
