//! The server: te's reactor serves the listening socket; each connection reads one call at a
//! time (header, then body and attachment straight into owned buffers), hands the message to
//! the handler on the loop's thread and answers once the handler returned. A connection does
//! not read its next call before the reply to this one is sent, so a slow handler holds its
//! senders back instead of queueing their bytes.

use std::io::{self, Read};
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use te_reactor::{Deal, Outbox, Protocol, Step};

use crate::config::ServerConfig;
use crate::error::{Error, Result};
use crate::filling::Filling;
use crate::message::{GIVEN_MIN, Handler};
use crate::service::{Admit, Service, Trust, error};
use crate::wire::{Function, REQUEST_HEADER, RequestHeader, code};

/// Bytes a connection buffers from its socket for headers and small calls.
const INBOX: usize = 16 << 10;
/// Bytes one drive reads before it lets the loop's other connections run.
const TURN: usize = 8 << 20;
/// A call's attachment that counts as bulk.
const BULK: u32 = 256 << 10;

/// Where a connection is in its current call.
#[derive(Debug)]
enum Phase {
    Header,
    Frame {
        seq: u32,
        function: Function,
        body: Filling,
        attachment: Filling,
    },
    Skip {
        left: u64,
    },
}

/// One connection's state.
#[derive(Debug)]
struct Conn {
    peer: SocketAddr,
    inbox: Vec<u8>,
    start: usize,
    end: usize,
    phase: Phase,
    outbox: Outbox,
    after_reply: Option<Vec<u8>>,
    last: Instant,
    trust: Trust,
    close_after_send: bool,
    bulk: bool,
}

/// The protocol the reactor's loops speak.
struct RpcProtocol {
    service: Service,
    handler: Arc<dyn Handler>,
    stopping: Arc<AtomicBool>,
    idle: Duration,
    stall: Duration,
}

/// A running RPC server. Dropping it stops it.
pub struct Server {
    inner: te_reactor::Server,
    stopping: Arc<AtomicBool>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("addr", &self.local_addr())
            .finish()
    }
}

impl Server {
    /// Listens on `listen` (`host:port`; port 0 picks one) and hands what comes to `handler`.
    ///
    /// # Errors
    /// The address does not parse or cannot be bound, or the loops could not start.
    pub fn start(listen: &str, config: &ServerConfig, handler: Arc<dyn Handler>) -> Result<Self> {
        let addr = crate::config::resolve(listen)?;
        let listener = TcpListener::bind(addr)
            .map_err(|e| Error::socket(format!("listening on {addr}"), e))?;
        let stopping = Arc::new(AtomicBool::new(false));
        let protocol = Arc::new(RpcProtocol {
            service: Service {
                limits: config.limits(),
                key: config.key.clone(),
                mooncake_allow: config.mooncake_allow.clone(),
            },
            handler,
            stopping: stopping.clone(),
            idle: config.idle_timeout,
            stall: config.timeout,
        });
        let limits = te_reactor::limits::ServerLimits::default();
        let mut settings = limits.data_server(
            config.server_threads(),
            Deal::RoundRobin,
            &Default::default(),
        );
        settings.max_connections = config.max_connections;
        let inner = te_reactor::Server::start(listener, protocol, settings)
            .map_err(|e| Error::socket(format!("starting the RPC server on {addr}"), e))?;
        tracing::info!(addr = %inner.local_addr(), "RPC server listening");
        Ok(Server { inner, stopping })
    }

    /// Where it listens.
    pub fn local_addr(&self) -> SocketAddr {
        self.inner.local_addr()
    }

    /// Connections held now.
    pub fn connections(&self) -> usize {
        self.inner.connections()
    }

    /// Refuses new calls, then closes every connection.
    pub fn stop(&self) {
        self.stopping.store(true, Ordering::Release);
        self.inner.shutdown();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Protocol for RpcProtocol {
    type Conn = Conn;

    fn name(&self) -> &'static str {
        "te-rpc"
    }

    fn open(&self, peer: SocketAddr, _stream: &mio::net::TcpStream) -> Conn {
        Conn {
            peer,
            inbox: Vec::new(),
            start: 0,
            end: 0,
            phase: Phase::Header,
            outbox: Outbox::default(),
            after_reply: None,
            last: Instant::now(),
            trust: Trust::Fresh,
            close_after_send: false,
            bulk: false,
        }
    }

    fn drive(&self, conn: &mut Conn, stream: &mio::net::TcpStream) -> Step {
        let mut read = 0usize;
        loop {
            if let Some(step) = conn.outbox.send(stream, &mut conn.last) {
                return step;
            }
            if conn.close_after_send {
                return Step::Close;
            }
            if read >= TURN {
                return Step::Yield;
            }
            match self.advance(conn, stream) {
                Ok(Some(n)) => read += n,
                // Between calls, a peer's next call is often due within microseconds.
                Ok(None) if conn.start == conn.end && matches!(conn.phase, Phase::Header) => {
                    return Step::BlockedHotAlone;
                }
                Ok(None) => return Step::Blocked,
                Err(()) => return Step::Close,
            }
        }
    }

    fn bulk(&self, conn: &Conn) -> bool {
        conn.bulk
    }

    fn expired(&self, conn: &Conn, now: Instant) -> bool {
        let quiet = now.saturating_duration_since(conn.last);
        match conn.phase {
            Phase::Header if conn.start == conn.end && conn.outbox.is_empty() => quiet > self.idle,
            _ => quiet > self.stall,
        }
    }

    fn idle_since(&self, conn: &Conn) -> Option<Instant> {
        let idle =
            matches!(conn.phase, Phase::Header) && conn.start == conn.end && conn.outbox.is_empty();
        idle.then_some(conn.last)
    }

    fn proves(&self) -> bool {
        self.service.key.is_some()
    }

    fn unproven_since(&self, conn: &Conn) -> Option<Instant> {
        (conn.trust != Trust::Proven).then_some(conn.last)
    }
}

impl RpcProtocol {
    /// Moves the connection's current call on by one step: `Some(bytes read)` when it moved,
    /// `None` when the socket has nothing now, `Err` when the connection ends.
    fn advance(&self, conn: &mut Conn, stream: &mio::net::TcpStream) -> Result<Option<usize>, ()> {
        match &mut conn.phase {
            Phase::Header => {
                if conn.end - conn.start < REQUEST_HEADER {
                    return fill(conn, stream);
                }
                let raw: [u8; REQUEST_HEADER] = conn.inbox[conn.start..conn.start + REQUEST_HEADER]
                    .try_into()
                    .map_err(|_| ())?;
                conn.start += REQUEST_HEADER;
                self.header(conn, &raw)?;
                Ok(Some(0))
            }
            Phase::Skip { left } => {
                let have = (conn.end - conn.start) as u64;
                if have == 0 {
                    return fill(conn, stream);
                }
                let n = have.min(*left);
                conn.start += n as usize;
                *left -= n;
                if *left == 0 {
                    conn.phase = Phase::Header;
                    if let Some(reply) = conn.after_reply.take() {
                        conn.outbox.push(&reply);
                    }
                }
                Ok(Some(n as usize))
            }
            Phase::Frame {
                body, attachment, ..
            } => {
                let target = if body.done() { attachment } else { body };
                if target.done() {
                    self.finish(conn);
                    return Ok(Some(0));
                }
                if conn.start < conn.end {
                    let n = target.take_from(&conn.inbox[conn.start..conn.end]);
                    conn.start += n;
                    return Ok(Some(n));
                }
                if target.left() < INBOX {
                    return fill(conn, stream);
                }
                let got = receive(stream, target.room())?;
                match got {
                    Some(n) => {
                        target.advance(n);
                        conn.last = Instant::now();
                        Ok(Some(n))
                    }
                    None => Ok(None),
                }
            }
        }
    }

    /// A call's header came: read, skip or refuse it.
    fn header(&self, conn: &mut Conn, raw: &[u8; REQUEST_HEADER]) -> Result<(), ()> {
        let head = match RequestHeader::decode(raw) {
            Ok(h) => h,
            Err(why) => {
                tracing::debug!(peer = %conn.peer, %why, "RPC connection closed on a bad header");
                return Err(());
            }
        };
        if self.stopping.load(Ordering::Acquire) {
            conn.outbox
                .push(&error(head.seq, code::STOPPING, "the server is stopping"));
            conn.close_after_send = true;
            return Ok(());
        }
        match self.service.admit(&conn.trust, conn.peer, &head) {
            Admit::Read(function) => {
                conn.bulk = head.attachment >= BULK;
                let len = head.attachment as usize;
                let given = (len >= GIVEN_MIN && function.carries_payload())
                    .then(|| self.handler.buffer(len))
                    .flatten()
                    .filter(|b| b.as_slice().len() == len);
                conn.phase = Phase::Frame {
                    seq: head.seq,
                    function,
                    body: Filling::new(head.body as usize),
                    attachment: given.map_or_else(|| Filling::new(len), Filling::into),
                };
            }
            Admit::Skip { len, reply } => {
                if len == 0 {
                    conn.outbox.push(&reply);
                } else {
                    conn.after_reply = Some(reply);
                    conn.phase = Phase::Skip { left: len };
                }
            }
            Admit::Refuse(reply) => {
                tracing::debug!(peer = %conn.peer, function = head.function, "RPC call refused");
                conn.outbox.push(&reply);
                conn.close_after_send = true;
            }
        }
        Ok(())
    }

    /// Every byte of the call came: answer it and hand its message on.
    fn finish(&self, conn: &mut Conn) {
        let Phase::Frame {
            seq,
            function,
            body,
            attachment,
        } = std::mem::replace(&mut conn.phase, Phase::Header)
        else {
            return;
        };
        conn.bulk = false;
        let answer = self.service.answer(
            &mut conn.trust,
            conn.peer,
            seq,
            function,
            body.into_vec(),
            attachment.into_bytes(),
        );
        let mut reply = answer.reply;
        if let Some(message) = answer.deliver {
            let handler = &self.handler;
            let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                handler.receive(message);
            }));
            if run.is_err() {
                tracing::error!(peer = %conn.peer, "the RPC handler panicked");
                reply = error(seq, code::INVALID_ARGUMENT, "the receiver's handler failed");
            }
        }
        conn.outbox.push(&reply);
        conn.close_after_send |= answer.close;
        conn.last = Instant::now();
    }
}

/// Reads what the socket has into the connection's inbox.
fn fill(conn: &mut Conn, stream: &mio::net::TcpStream) -> Result<Option<usize>, ()> {
    if conn.inbox.is_empty() {
        conn.inbox = vec![0; INBOX];
    }
    if conn.start == conn.end {
        conn.start = 0;
        conn.end = 0;
    } else if conn.start > 0 {
        conn.inbox.copy_within(conn.start..conn.end, 0);
        conn.end -= conn.start;
        conn.start = 0;
    }
    let got = receive(stream, &mut conn.inbox[conn.end..])?;
    if let Some(n) = got {
        conn.end += n;
        conn.last = Instant::now();
    } else if conn.start == conn.end && matches!(conn.phase, Phase::Header) {
        // Idle between calls: hold no buffer.
        conn.inbox = Vec::new();
    }
    Ok(got)
}

/// One read: `Some(n)` bytes, `None` when there is nothing now, `Err` at the end of the stream
/// or on an error.
fn receive(mut stream: &mio::net::TcpStream, buf: &mut [u8]) -> Result<Option<usize>, ()> {
    loop {
        return match stream.read(buf) {
            Ok(0) => Err(()),
            Ok(n) => Ok(Some(n)),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => Err(()),
        };
    }
}
