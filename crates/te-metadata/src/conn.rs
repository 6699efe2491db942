//! The server's connections on te-core's event loops ([`te_reactor`]): each a small
//! state machine that reads what its socket has, gathers requests ([`Gatherer`]), answers them
//! one at a time and in order, and sends each reply before it reads the next request, so a
//! connection holds at most one request being gathered and one reply.
//!
//! Memory: what a connection buffers of values (a body being gathered, a reply carrying a value
//! of more than [`UNCOUNTED_REPLY`] bytes until it is sent) is held against the server's
//! [`Budget`]; a reply that finds no room is answered 503 instead, which the client may retry.
//! Replies to changes are small and never counted, so a change applied is never answered 503.
//!
//! Changes: a PUT or DELETE on a persisted store is written to the log and its connection
//! parks ([`Step::Parked`]) until its loop's turn ends, when [`Protocol::turn_end`] settles
//! every change written so far with one sync ([`Store::settle`]); the reply (200, or 500 if
//! the sync failed) is queued when the connection is driven again, and only then is its next
//! request read.
//!
//! Timeouts, checked every second by the loops ([`overdue`]): a request must be whole within
//! the request timeout of its first byte, so a client that trickles a head or a body cannot
//! hold its place for ever; a connection with nothing moving either way (idle between
//! requests, or a reply its client does not read) is closed after the idle timeout.
//!
//! Not here: what a request means ([`crate::answer`]).

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use te_reactor::{Outbox, Protocol, Refusal, Step};
use tracing::debug;

use crate::budget::{Budget, Hold, Spent};
use crate::metrics::{ServerMetrics, TurnedAway};
use crate::request::{Gathered, Gatherer};
use crate::store::Ticket;
use crate::{Answer, Options, Store};

/// A change's method as its label (the methods that change are few and known).
fn method_label(method: &str) -> &'static str {
    match method {
        "PUT" => "PUT",
        "POST" => "POST",
        "DELETE" => "DELETE",
        _ => "other",
    }
}

/// Bytes read per call.
const READ_CHUNK: usize = 64 << 10;
/// Buffers larger than this are released once empty, so an idle connection holds none.
const KEEP_CAPACITY: usize = 4 << 10;
/// Requests answered per turn before the loop's other connections get theirs.
const REQUESTS_PER_TURN: usize = 64;
/// Bytes read and dropped after the last reply of a connection being closed, so unread
/// request bytes do not turn the close into a reset that could destroy that reply.
const LINGER_DRAIN: usize = 64 << 10;
/// Replies with bodies up to this many bytes (every status and error text, small values) are
/// part of a connection's own bounded cost, not counted against the budget.
const UNCOUNTED_REPLY: usize = 4 << 10;
/// The interim answer to `Expect: 100-continue`.
const CONTINUE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";

/// The server's protocol.
pub(crate) struct MetadataProtocol {
    pub(crate) store: Arc<Store>,
    pub(crate) options: Arc<Options>,
    pub(crate) budget: Arc<Budget>,
    /// The `Authorization` value every request must carry, if a token is set.
    pub(crate) authorization: Option<Arc<te_reactor::secret::Redacted>>,
    /// What it did, for `--metrics-addr`.
    pub(crate) metrics: Arc<ServerMetrics>,
}

/// One client connection.
pub(crate) struct HttpConn {
    peer: SocketAddr,
    input: Vec<u8>,
    gatherer: Gatherer,
    /// The budget held by the body being gathered.
    body_hold: Hold,
    output: Outbox,
    /// The budget held by the reply waiting in `output`.
    reply_hold: Hold,
    /// Close once the output is sent.
    closing: bool,
    /// A change waiting for its sync, and whether to keep the connection open once answered.
    /// A change waiting for its sync: its ticket, reply, keep-alive and method.
    waiting: Option<(Ticket, &'static str, bool, &'static str)>,
    /// When the first byte of the request being gathered came, if one is.
    since: Option<Instant>,
    /// When bytes last moved either way.
    last: Instant,
}

/// Whether a connection is to be closed at `now`: its request began (`since`) more than the
/// request timeout ago, or nothing moved since `last` for the idle timeout.
pub(crate) fn overdue(
    since: Option<Instant>,
    last: Instant,
    now: Instant,
    request_timeout: Duration,
    idle_timeout: Duration,
) -> bool {
    since.is_some_and(|t| now.saturating_duration_since(t) > request_timeout)
        || now.saturating_duration_since(last) > idle_timeout
}

/// A reply's status line and the headers every reply carries, for a body of `len` bytes.
pub(crate) fn reply_head(status: u16, len: usize, keep_alive: bool) -> String {
    let reason = match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        413 => "Payload Too Large",
        500 => "Internal Server Error",
        507 => "Insufficient Storage",
        _ => "Service Unavailable",
    };
    format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Length: {len}\r\nContent-Type: application/json\r\nConnection: {}\r\n\r\n",
        if keep_alive { "keep-alive" } else { "close" }
    )
}

/// Holds room for a reply carrying `len` bytes of a value in `hold`, unless it is small
/// enough to be part of its connection's own cost ([`UNCOUNTED_REPLY`]).
pub(crate) fn hold_reply(hold: &mut Hold, len: usize) -> Result<(), Spent> {
    match len > UNCOUNTED_REPLY {
        true => hold.grow(len),
        false => Ok(()),
    }
}

/// Queues a reply.
fn queue_reply(out: &mut Outbox, status: u16, body: &[u8], keep_alive: bool) {
    out.push(reply_head(status, body.len(), keep_alive).as_bytes());
    out.push(body);
}

impl HttpConn {
    /// Queues the answer to a request that came whole: its framing holds whatever the answer
    /// (a 404 for a key not there is routine), so the connection stays open if asked.
    fn answer(&mut self, status: u16, body: &[u8], keep_alive: bool) {
        queue_reply(&mut self.output, status, body, keep_alive);
        self.closing = !keep_alive;
        self.since = (!self.input.is_empty()).then(Instant::now);
    }

    /// Sends what is queued: `Some(step)` when the drive ends here.
    fn flush(&mut self, mut stream: &mio::net::TcpStream) -> Option<Step> {
        if let Some(step) = self.output.send(stream, &mut self.last) {
            return Some(step);
        }
        self.reply_hold.release();
        if !self.closing {
            return None;
        }
        // The last reply is out: say so, and take what the client still sends, so the close
        // is a FIN it reads after the reply.
        let _ = stream.shutdown(Shutdown::Write);
        let mut sink = [0u8; 4096];
        let mut drained = 0;
        while drained < LINGER_DRAIN {
            match stream.read(&mut sink) {
                Ok(n) if n > 0 => drained += n,
                _ => break,
            }
        }
        Some(Step::Close)
    }

    /// Reads what the socket has towards the request being gathered: `Some(step)` when the
    /// drive ends here.
    fn fill(&mut self, mut stream: &mio::net::TcpStream) -> Option<Step> {
        let at = self.input.len();
        self.input.resize(at + READ_CHUNK, 0);
        let read = stream.read(&mut self.input[at..]);
        self.input.truncate(at + *read.as_ref().unwrap_or(&0));
        match read {
            Ok(0) => Some(Step::Close),
            Ok(_) => {
                let now = Instant::now();
                self.last = now;
                self.since.get_or_insert(now);
                None
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if self.input.is_empty() && self.input.capacity() > KEEP_CAPACITY {
                    self.input = Vec::new();
                }
                Some(Step::Blocked)
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => None,
            Err(_) => Some(Step::Close),
        }
    }
}

impl Protocol for MetadataProtocol {
    type Conn = HttpConn;

    fn name(&self) -> &'static str {
        "te-metadata"
    }

    fn open(&self, peer: SocketAddr, _stream: &mio::net::TcpStream) -> HttpConn {
        HttpConn {
            peer,
            input: Vec::new(),
            gatherer: Gatherer::new(self.options.max_value).requiring(self.authorization.clone()),
            body_hold: Hold::new(&self.budget),
            output: Outbox::default(),
            reply_hold: Hold::new(&self.budget),
            closing: false,
            waiting: None,
            since: None,
            last: Instant::now(),
        }
    }

    fn drive(&self, c: &mut HttpConn, stream: &mio::net::TcpStream) -> Step {
        let mut answered = 0;
        loop {
            if let Some(step) = c.flush(stream) {
                return step;
            }
            if let Some((ticket, done, keep_alive, method)) = &c.waiting {
                let (status, body) = match ticket.outcome() {
                    None => return Step::Parked,
                    Some(Ok(())) => (200, done.as_bytes().to_vec()),
                    Some(Err(why)) => (500, why.clone().into_bytes()),
                };
                let (keep_alive, method) = (*keep_alive, *method);
                c.waiting = None;
                self.metrics.answered(method, status);
                debug!(peer = %c.peer, status, "change answered after its sync");
                c.answer(status, &body, keep_alive);
                continue;
            }
            if answered >= REQUESTS_PER_TURN {
                return Step::Yield;
            }
            match c.gatherer.gather(&mut c.input, &mut c.body_hold) {
                Ok(Gathered::More) => {
                    if let Some(step) = c.fill(stream) {
                        return step;
                    }
                }
                Ok(Gathered::Continue) => c.output.push(CONTINUE),
                Ok(Gathered::Request(request)) => {
                    let answer =
                        crate::answer(&self.store, &self.options, &request, &mut c.reply_hold);
                    drop(request.body);
                    c.body_hold.release();
                    let (status, body) = match answer {
                        Answer::Now(status, body) => (status, body),
                        Answer::Durable { ticket, done } => {
                            debug!(peer = %c.peer, method = request.method, "change waiting for its sync");
                            let method = method_label(&request.method);
                            c.waiting = Some((ticket, done, request.keep_alive, method));
                            answered += 1;
                            continue;
                        }
                    };
                    self.metrics.answered(&request.method, status);
                    debug!(peer = %c.peer, method = request.method, status, "request answered");
                    c.answer(status, &body, request.keep_alive);
                    answered += 1;
                }
                Ok(Gathered::Turned {
                    refusal,
                    keep_alive,
                }) => {
                    c.body_hold.release();
                    self.metrics.answered("", refusal.status);
                    debug!(peer = %c.peer, reason = refusal.reason, "body turned away");
                    c.answer(refusal.status, refusal.reason.as_bytes(), keep_alive);
                    answered += 1;
                }
                Err(refusal) => {
                    c.body_hold.release();
                    self.metrics.answered("", refusal.status);
                    debug!(peer = %c.peer, status = refusal.status, reason = refusal.reason,
                        "request refused");
                    queue_reply(
                        &mut c.output,
                        refusal.status,
                        refusal.reason.as_bytes(),
                        false,
                    );
                    c.closing = true;
                }
            }
        }
    }

    fn turn_end(&self) {
        if let Some(took) = self.store.settle() {
            self.metrics
                .synced(u64::try_from(took.as_micros()).unwrap_or(u64::MAX));
        }
    }

    fn idle_since(&self, c: &HttpConn) -> Option<Instant> {
        let idle = !c.gatherer.in_body()
            && c.input.is_empty()
            && c.output.is_empty()
            && c.waiting.is_none()
            && !c.closing;
        idle.then_some(c.last)
    }

    fn expired(&self, c: &HttpConn, now: Instant) -> bool {
        let since = match c.gatherer.in_body() || !c.input.is_empty() {
            true => c.since,
            false => None,
        };
        overdue(
            since,
            c.last,
            now,
            self.options.request_timeout,
            self.options.idle_timeout,
        )
    }

    fn refuse(&self, mut stream: &mio::net::TcpStream, peer: SocketAddr, why: Refusal) {
        self.metrics.turned_away(match why {
            Refusal::AtCapacity { .. } => TurnedAway::Capacity,
            Refusal::AddressCap { .. } => TurnedAway::Address,
        });
        let reason = match why {
            Refusal::AtCapacity { max } => format!(
                "te-metadata serves at most {max} connections at once (--max-connections); \
                 try again later"
            ),
            Refusal::AddressCap { max } => format!(
                "te-metadata serves at most {max} connections from one address at once \
                 (--max-connections-per-address); try again later"
            ),
        };
        debug!(%peer, reason, "connection refused");
        let mut bytes = reply_head(503, reason.len(), false).into_bytes();
        bytes.extend_from_slice(reason.as_bytes());
        let _ = stream.write(&bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slow_request_and_a_silent_connection_are_overdue() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let (request, idle) = (s(10), s(30));
        // Idle between requests: only the idle timeout counts.
        assert!(!overdue(None, t0, t0 + s(29), request, idle));
        assert!(overdue(None, t0, t0 + s(31), request, idle));
        // A request trickling in (bytes keep moving) is cut at the request timeout.
        assert!(!overdue(Some(t0), t0 + s(9), t0 + s(9), request, idle));
        assert!(overdue(Some(t0), t0 + s(11), t0 + s(11), request, idle));
        // A clock that went back (a sweep's `now` taken before `last`) is no expiry.
        assert!(!overdue(Some(t0 + s(5)), t0 + s(5), t0, request, idle));
    }

    #[test]
    fn replies_carry_length_and_connection() {
        let mut out = Outbox::default();
        queue_reply(&mut out, 404, b"metadata not found", false);
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        let mut last = Instant::now();
        assert_eq!(
            out.send(&mio::net::TcpStream::from_std(server), &mut last),
            None
        );
        assert!(out.is_empty());
        let mut r = String::new();
        client
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        (&client).take(200).read_to_string(&mut r).unwrap();
        assert!(r.starts_with("HTTP/1.1 404 Not Found\r\n"), "{r}");
        assert!(r.contains("Content-Length: 18\r\n") && r.contains("Connection: close\r\n"));
        assert!(r.ends_with("\r\n\r\nmetadata not found"));
    }
}
