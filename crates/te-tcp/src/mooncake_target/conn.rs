//! One Mooncake connection on an event loop: a state machine driven whenever its socket is
//! ready, that reads a header, checks it, then moves the body straight between the socket and
//! registered memory (no copy of te's own), and answers in Mooncake's framing. It never waits:
//! every socket call is non-blocking, and a connection that has had its turn (`TURN` bytes)
//! yields to the others. A WRITE's status goes out only after its last byte is in memory.
//!
//! A WRITE body's last piece is received together with whatever of the next header has come
//! (one `recvmsg`; the second buffer is the header's size, so no body byte is copied). A
//! receive that returns less than it asked for found the socket empty: the connection then
//! finishes what it can without receiving (sends the status) and waits for the next readiness
//! edge, which every arrival raises, instead of asking again only to be told `EAGAIN`. Once the
//! peer has closed its side ([`Protocol::peer_closing`]) no further edge comes, so it reads on
//! until a receive returns 0.
//!
//! [`Protocol::peer_closing`]: te_reactor::Protocol::peer_closing

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use te_core::Opcode;
use te_core::memory::RegionPin;

use te_reactor::Step;

use super::{CompatState, IDLE_MAX, Verdict};
use crate::sys::{self, SendPart};
use crate::wire::mooncake::{self as mooncake_wire, HEADER_LEN, Header, STATUS_LEN, STATUS_OK};

/// Bytes one connection may move per turn before the others get theirs.
const TURN: usize = 8 << 20;
/// Bytes one receive call takes at most. The socket is locked while the kernel copies, and
/// segments arriving meanwhile wait in its backlog, which overflows (drops, retransmits) under
/// megabyte copies; Mooncake's own target reads in 64 KiB pieces too.
const RECV_PIECE: usize = 64 << 10;
/// Requests of at least this many bytes make their connection bulk: copying them costs more
/// than the wake-ups around them, so such connections are worth spreading over the loops.
pub(super) const BULK: u64 = 256 << 10;
/// Whether a request of `size` bytes makes its connection bulk ([`BULK`]).
pub(super) fn is_bulk(size: u64) -> bool {
    size >= BULK
}

enum Phase {
    /// Reading a request header.
    Header { buf: [u8; HEADER_LEN], got: usize },
    /// Receiving a WRITE's body into pinned memory.
    Body {
        pin: RegionPin,
        addr: u64,
        left: usize,
        acked: bool,
    },
    /// Sending a status frame and, for a READ, its data from pinned memory.
    Reply {
        status: [u8; STATUS_LEN],
        status_left: usize,
        data: Option<(RegionPin, u64, usize)>,
        close: bool,
    },
    /// Refused in a way that ends the connection at once.
    Done,
}

pub(crate) struct Conn {
    pub(super) peer: SocketAddr,
    phase: Phase,
    /// The last time bytes moved.
    progress: Instant,
    /// The request that sends this connection to a thread of its own (GPU memory).
    pub(super) promoted: Option<Header>,
    /// Whether its latest request makes it bulk ([`is_bulk`]).
    pub(super) bulk: bool,
    /// The next request's header bytes, received with a WRITE body's last piece.
    ahead: [u8; HEADER_LEN],
    ahead_len: usize,
    /// A receive in this drive returned less than it asked for: the socket was empty then,
    /// and whatever comes after raises a new event, so the drive may end without asking again.
    drained: bool,
    /// The peer closed its sending side (or the socket failed): every drive reads on until a
    /// receive says so, since no event comes after the one that told.
    pub(super) peer_closed: bool,
}

fn fresh() -> Phase {
    Phase::Header {
        buf: [0; HEADER_LEN],
        got: 0,
    }
}

/// A reply: a status frame (none for Mooncake's unacknowledged framing), then `data` if any.
fn reply(
    frame: Option<[u8; STATUS_LEN]>,
    data: Option<(RegionPin, u64, usize)>,
    close: bool,
) -> Phase {
    Phase::Reply {
        status: frame.unwrap_or([0; STATUS_LEN]),
        status_left: if frame.is_some() { STATUS_LEN } else { 0 },
        data,
        close,
    }
}

impl Conn {
    /// A connection from `peer`.
    pub(super) fn new(peer: SocketAddr) -> Self {
        Conn {
            peer,
            phase: fresh(),
            progress: Instant::now(),
            promoted: None,
            bulk: false,
            ahead: [0; HEADER_LEN],
            ahead_len: 0,
            drained: false,
            peer_closed: false,
        }
    }

    /// Whether it has idled (between requests) or stalled (mid-request) too long.
    pub(super) fn expired(&self, now: Instant, stall: Duration) -> bool {
        let limit = match &self.phase {
            Phase::Header { got: 0, .. } => IDLE_MAX,
            _ => stall,
        };
        now.duration_since(self.progress) > limit
    }

    /// Since when it has waited for a request with nothing owed, or `None` while busy.
    pub(super) fn idle_since(&self) -> Option<Instant> {
        match &self.phase {
            Phase::Header { got: 0, .. } if self.ahead_len == 0 => Some(self.progress),
            _ => None,
        }
    }

    /// Moves the connection on as far as its socket allows.
    pub(super) fn drive(&mut self, state: &CompatState, stream: &mio::net::TcpStream) -> Step {
        let mut turn = 0usize;
        self.drained = false;
        loop {
            if turn >= TURN {
                return Step::Yield;
            }
            let moved = match &mut self.phase {
                Phase::Done => return Step::Close,
                Phase::Header { .. } if self.drained => return Step::Blocked,
                Phase::Header { buf, got } => {
                    let asked = HEADER_LEN - *got;
                    let n = sys::recv_now(stream, &mut buf[*got..]);
                    match n {
                        Ok(0) => return Step::Close,
                        Ok(n) => {
                            *got += n;
                            self.drained |= n < asked && !self.peer_closed;
                            if *got == HEADER_LEN {
                                let raw = *buf;
                                if let Some(step) = self.start(state, stream, &raw) {
                                    return step;
                                }
                            }
                            n
                        }
                        Err(e) => return blocked_or_closed(&e),
                    }
                }
                Phase::Body { .. } if self.drained => return Step::Blocked,
                Phase::Body {
                    pin,
                    addr,
                    left,
                    acked,
                } => {
                    // The last piece comes with the next header's bytes, if they are there, in
                    // one call: the body's place is known, and the header's buffer is the
                    // header's size, so no byte of the body is copied.
                    let last = *left <= RECV_PIECE;
                    let piece = (*left).min(RECV_PIECE);
                    let Some(range) = pin.range(*addr, piece) else {
                        return Step::Close;
                    };
                    let received = match last {
                        true => sys::recv_then(stream, range, &mut self.ahead),
                        false => sys::recv_some(stream, range),
                    };
                    match received {
                        Ok(0) => return Step::Close,
                        Ok(n) => {
                            let body = n.min(piece);
                            *addr += body as u64;
                            *left -= body;
                            self.ahead_len = n - body;
                            let asked = piece + if last { HEADER_LEN } else { 0 };
                            self.drained |= n < asked && !self.peer_closed;
                            if *left == 0 {
                                // The bytes are in memory: now the acknowledgement (v2).
                                let ok = acked.then(|| mooncake_wire::encode_status(STATUS_OK));
                                self.phase = reply(ok, None, false);
                            }
                            n
                        }
                        Err(e) => return blocked_or_closed(&e),
                    }
                }
                Phase::Reply {
                    status,
                    status_left,
                    data,
                    close,
                } => {
                    let head = &status[STATUS_LEN - *status_left..];
                    let body = match data {
                        Some((_, _, 0)) | None => SendPart::EMPTY,
                        Some((pin, a, l)) => match pin.range(*a, *l) {
                            Some(range) => range.into(),
                            None => return Step::Close,
                        },
                    };
                    let parts = [head.into(), body];
                    if parts.iter().all(SendPart::is_empty) {
                        if *close {
                            self.phase = Phase::Done;
                            continue;
                        }
                        // The next header, as much of it as came with the last body.
                        let (buf, got) = (self.ahead, std::mem::take(&mut self.ahead_len));
                        self.phase = Phase::Header { buf, got };
                        if got == HEADER_LEN
                            && let Some(step) = self.start(state, stream, &buf)
                        {
                            return step;
                        }
                        continue;
                    }
                    // A status ahead of READ data goes through the loop's pipe, so the data
                    // lands in the socket as aligned as it lies in memory (`sys::send_head`);
                    // what the pipe did not move goes out with the data below.
                    let spliced = match *status_left == STATUS_LEN && !body.is_empty() {
                        true => match sys::send_head(stream, head) {
                            Ok(n) => n,
                            Err(_) => return Step::Close,
                        },
                        false => 0,
                    };
                    if spliced > 0 {
                        *status_left -= spliced;
                        spliced
                    } else {
                        match sys::send_some(stream, &parts) {
                            Ok(n) => {
                                let from_head = n.min(*status_left);
                                *status_left -= from_head;
                                if let Some((_, a, l)) = data.as_mut() {
                                    *a += (n - from_head) as u64;
                                    *l -= n - from_head;
                                }
                                n
                            }
                            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                                return Step::BlockedSending;
                            }
                            Err(_) => return Step::Close,
                        }
                    }
                }
            };
            turn += moved;
            self.progress = Instant::now();
        }
    }

    /// Acts on a complete header: the next phase, or a step that ends this drive.
    fn start(
        &mut self,
        state: &CompatState,
        stream: &mio::net::TcpStream,
        raw: &[u8; HEADER_LEN],
    ) -> Option<Step> {
        let peer = Some(self.peer);
        let header = match state.admit(peer, raw) {
            Verdict::Serve(h) => h,
            Verdict::Refuse(frame) => return self.refuse(stream, frame),
        };
        let pin = match state.check(peer, &header) {
            Ok(pin) => pin,
            Err(frame) => return self.refuse(stream, frame),
        };
        if state.staging.device_of(header.addr, header.size).is_some() {
            self.promoted = Some(header);
            return Some(Step::Promote);
        }
        let Ok(len) = usize::try_from(header.size) else {
            return Some(Step::Close);
        };
        self.bulk = is_bulk(header.size);
        self.phase = match header.opcode {
            Opcode::Write => Phase::Body {
                pin,
                addr: header.addr,
                left: len,
                acked: header.acked,
            },
            _ => {
                let ok = header
                    .acked
                    .then(|| mooncake_wire::encode_status(STATUS_OK));
                reply(ok, Some((pin, header.addr, len)), false)
            }
        };
        None
    }

    /// A refusal: the status goes out, then the connection closes; without a status (v1),
    /// a reset now.
    fn refuse(
        &mut self,
        stream: &mio::net::TcpStream,
        frame: Option<[u8; STATUS_LEN]>,
    ) -> Option<Step> {
        match frame {
            Some(_) => {
                self.phase = reply(frame, None, true);
                None
            }
            None => {
                let _ = socket2::SockRef::from(stream).set_linger(Some(Duration::ZERO));
                Some(Step::Close)
            }
        }
    }
}

fn blocked_or_closed(e: &std::io::Error) -> Step {
    match e.kind() {
        std::io::ErrorKind::WouldBlock => Step::Blocked,
        _ => Step::Close,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_from_256_kib_make_a_connection_bulk() {
        assert!(!is_bulk(64 << 10));
        assert!(!is_bulk((256 << 10) - 1));
        assert!(is_bulk(256 << 10));
        assert!(is_bulk(1 << 20));
    }
}
