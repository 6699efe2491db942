//! The initiator side: per peer, a fixed set of lanes (TCP connections). Each lane has a sender
//! thread that connects lazily, pipelines request headers (and WRITE bodies, straight from
//! registered memory) onto the socket, and a receiver thread that reads replies in order and
//! completes slices (READ data lands straight in registered memory).
//!
//! The submitting thread only enqueues: connects and I/O happen on lane threads. A lane whose
//! connection breaks fails its in-flight slices as path errors (the engine retries them) and
//! reconnects on its next slice.
//!
//! A lane speaks te's framing ([`crate::wire`]) to te targets and Mooncake's acknowledged
//! framing ([`crate::mooncake_wire`]) to Mooncake targets, pipelined the same way: Mooncake's
//! target answers in order, so replies are matched to requests by their place in the queue. A
//! Mooncake refusal fails its slice for good and closes the connection (Mooncake's target
//! closes it after refusing), so what was pipelined behind it fails as path errors and is
//! retried on a fresh connection.

#![allow(unsafe_code)] // passes pinned registered addresses to `sys`

use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use te_core::Opcode;
use te_core::transport::{CompletionSink, SliceError, SliceOp};
use tracing::debug;

use crate::error::Error;
use crate::mooncake_wire;
use crate::sys;
use crate::wire::{REPLY_LEN, Reply, Request, Status};

/// The framing a peer's data listener speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Framing {
    /// te's own, with the segment secret in every request.
    Te,
    /// Mooncake's framing, no credential: acknowledged ("v2", a status frame per request), or
    /// not (v1 targets, which get READs only: the data arriving is their acknowledgement).
    Mooncake {
        /// The acknowledged framing.
        acked: bool,
    },
}

/// Where a peer's data listener is.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct PeerKey {
    /// The local rail's address connections are made from.
    pub(crate) local_ip: std::net::IpAddr,
    pub(crate) host: String,
    pub(crate) port: u16,
    pub(crate) framing: Framing,
}

pub(crate) struct LaneSettings {
    pub(crate) connect_timeout: Duration,
    pub(crate) status_timeout: Duration,
    /// GPU regions and the staging pool (GPU slices bounce through host memory).
    pub(crate) staging: Arc<crate::staging::GpuStaging>,
}

/// One lane: a queue feeding a sender thread.
pub(crate) struct Lane {
    queue: Mutex<Option<Sender<SliceOp>>>,
    queued_bytes: Arc<AtomicU64>,
}

impl Lane {
    pub(crate) fn spawn(
        peer: PeerKey,
        index: usize,
        settings: Arc<LaneSettings>,
        sink: Arc<dyn CompletionSink>,
    ) -> std::io::Result<Self> {
        let (tx, rx) = mpsc::channel();
        let queued_bytes = Arc::new(AtomicU64::new(0));
        let worker = SenderWorker {
            peer,
            settings,
            sink,
            queued_bytes: queued_bytes.clone(),
            conn: None,
            next_id: 0,
        };
        std::thread::Builder::new()
            .name(format!("te-tcp-lane{index}"))
            .spawn(move || worker.run(rx))?;
        Ok(Lane {
            queue: Mutex::new(Some(tx)),
            queued_bytes,
        })
    }

    pub(crate) fn queued_bytes(&self) -> u64 {
        self.queued_bytes.load(Ordering::Relaxed)
    }

    /// Queues a slice; if the lane is closed, the slice comes back.
    pub(crate) fn push(&self, op: SliceOp) -> Result<(), SliceOp> {
        let queue = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        match queue.as_ref() {
            Some(tx) => {
                self.queued_bytes.fetch_add(op.len, Ordering::Relaxed);
                tx.send(op).map_err(|e| {
                    self.queued_bytes.fetch_sub(e.0.len, Ordering::Relaxed);
                    e.0
                })
            }
            None => Err(op),
        }
    }

    /// Stops taking slices; queued ones are still sent, then the threads exit.
    pub(crate) fn close(&self) {
        self.queue.lock().unwrap_or_else(|e| e.into_inner()).take();
    }
}

/// A failed connect as a slice error: the local NIC's fault when the kernel says the local side
/// cannot send at all (network down or unreachable from it, address not available).
fn connect_fault(e: &std::io::Error, msg: String) -> SliceError {
    match e.raw_os_error() {
        Some(libc::ENETDOWN | libc::ENETUNREACH | libc::EADDRNOTAVAIL) => {
            SliceError::LocalPath(msg)
        }
        _ => SliceError::Path(msg),
    }
}

/// Connects to `to` from the local rail's address `from` (when both are of one family).
fn connect_from(
    from: std::net::IpAddr,
    to: SocketAddr,
    timeout: Duration,
) -> std::io::Result<TcpStream> {
    use socket2::{Domain, Socket, Type};
    let socket = Socket::new(Domain::for_address(to), Type::STREAM, None)?;
    if from.is_ipv4() == to.is_ipv4() && !from.is_unspecified() {
        socket.bind(&SocketAddr::new(from, 0).into())?;
    }
    socket.connect_timeout(&to.into(), timeout)?;
    Ok(socket.into())
}

struct InFlight {
    op: SliceOp,
    request_id: u64,
}

struct Connection {
    stream: TcpStream,
    in_flight: Sender<InFlight>,
    broken: Arc<AtomicBool>,
    /// Held by the sender from queueing a slice for the receiver until its bytes are on the
    /// socket; a receiver failing slices takes it first, so a slice's memory is never released
    /// to the application while its body is still being sent.
    sending: Arc<Mutex<()>>,
}

struct SenderWorker {
    peer: PeerKey,
    settings: Arc<LaneSettings>,
    sink: Arc<dyn CompletionSink>,
    queued_bytes: Arc<AtomicU64>,
    conn: Option<Connection>,
    next_id: u64,
}

impl SenderWorker {
    fn run(mut self, rx: Receiver<SliceOp>) {
        for op in rx {
            self.queued_bytes.fetch_sub(op.len, Ordering::Relaxed);
            if op.is_canceled() {
                self.sink.complete(op, Err(SliceError::Canceled));
                continue;
            }
            if self
                .conn
                .as_ref()
                .is_some_and(|c| c.broken.load(Ordering::Acquire))
            {
                self.conn = None;
            }
            if self.conn.is_none() {
                if op.token.attempt() > 0 {
                    // A retried slice after a failure: back off a little before reconnecting.
                    let backoff = 5u64 << op.token.attempt().min(7);
                    std::thread::sleep(Duration::from_millis(backoff));
                }
                match self.connect() {
                    Ok(c) => self.conn = Some(c),
                    Err(e) => {
                        let msg = format!(
                            "connecting from {} to {}:{}: {e}",
                            self.peer.local_ip, self.peer.host, self.peer.port
                        );
                        self.sink.complete(op, Err(connect_fault(&e, msg)));
                        continue;
                    }
                }
            }
            self.send(op);
        }
        if let Some(c) = self.conn.take() {
            // Let the receiver finish what is in flight, then the socket closes with it.
            drop(c.in_flight);
        }
    }

    fn connect(&self) -> std::io::Result<Connection> {
        let addrs: Vec<SocketAddr> = te_core::control::resolve(&self.peer.host, self.peer.port)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::NotFound, e.to_string()))?;
        let mut last = std::io::Error::from(std::io::ErrorKind::NotFound);
        for addr in addrs {
            match connect_from(self.peer.local_ip, addr, self.settings.connect_timeout) {
                Ok(stream) => {
                    stream.set_nodelay(true)?;
                    stream.set_read_timeout(Some(self.settings.status_timeout))?;
                    stream.set_write_timeout(Some(self.settings.status_timeout))?;
                    let (tx, rx) = mpsc::channel();
                    let broken = Arc::new(AtomicBool::new(false));
                    let sending = Arc::new(Mutex::new(()));
                    let receiver = ReceiverWorker {
                        framing: self.peer.framing,
                        stream: stream.try_clone()?,
                        sink: self.sink.clone(),
                        broken: broken.clone(),
                        sending: sending.clone(),
                        staging: self.settings.staging.clone(),
                    };
                    std::thread::Builder::new()
                        .name("te-tcp-recv".into())
                        .spawn(move || receiver.run(rx))?;
                    debug!(%addr, "lane connected");
                    return Ok(Connection {
                        stream,
                        in_flight: tx,
                        broken,
                        sending,
                    });
                }
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    fn send(&mut self, op: SliceOp) {
        let Some(conn) = self.conn.as_ref() else {
            let reason = "lane has no connection".to_string();
            self.sink.complete(op, Err(SliceError::Path(reason)));
            return;
        };
        self.next_id += 1;
        let request_id = self.next_id;
        let te_header;
        let mooncake_header;
        let header: &[u8] = match self.peer.framing {
            Framing::Te => {
                te_header = Request {
                    opcode: op.opcode,
                    request_id,
                    addr: op.remote_addr,
                    len: op.len,
                    secret: op.target.secret().to_bytes(),
                }
                .encode();
                &te_header
            }
            Framing::Mooncake { acked } => {
                mooncake_header = mooncake_wire::Header {
                    opcode: op.opcode,
                    addr: op.remote_addr,
                    size: op.len,
                    acked,
                }
                .encode();
                &mooncake_header
            }
        };
        let staging = &self.settings.staging;
        // A WRITE from GPU memory leaves from a staging buffer, filled first.
        let mut bounce = None;
        let body = match op.opcode {
            Opcode::Write => match staging.device_of(op.local_addr, op.len) {
                None => (op.local_addr, op.len as usize),
                Some(device) => {
                    let staged = staging.bounce(op.len as usize).and_then(|b| {
                        crate::staging::copy(device, b.addr(), op.local_addr, op.len as usize)
                            .map(|()| b)
                    });
                    match staged {
                        Ok(b) => {
                            let body = (b.addr(), op.len as usize);
                            bounce = Some(b);
                            body
                        }
                        Err(e) => {
                            self.sink.complete(op, Err(SliceError::LocalPath(e)));
                            return;
                        }
                    }
                }
            },
            _ => (0, 0),
        };
        let sending = conn.sending.lock().unwrap_or_else(|e| e.into_inner());
        if let Err(e) = conn.in_flight.send(InFlight { op, request_id }) {
            drop(sending);
            // The receiver is gone (connection broken): fail the slice here.
            let InFlight { op, .. } = e.0;
            self.sink
                .complete(op, Err(SliceError::Path("lane connection closed".into())));
            self.conn = None;
            return;
        }
        let mut parts = [(header.as_ptr() as u64, header.len()), body];
        // SAFETY: the header is a local array; the body range lies in a local region the engine
        // pinned for this slice's task, which stays pinned until the receiver completes it.
        let sent = unsafe { sys::send_parts(&conn.stream, &mut parts) };
        drop(sending);
        drop(bounce);
        if let Err(e) = sent {
            debug!(error = %e, "lane send failed; reconnecting on next slice");
            conn.broken.store(true, Ordering::Release);
            let _ = conn.stream.shutdown(Shutdown::Both);
            self.conn = None;
        }
    }
}

struct ReceiverWorker {
    framing: Framing,
    stream: TcpStream,
    sink: Arc<dyn CompletionSink>,
    broken: Arc<AtomicBool>,
    sending: Arc<Mutex<()>>,
    staging: Arc<crate::staging::GpuStaging>,
}

impl ReceiverWorker {
    fn run(self, rx: Receiver<InFlight>) {
        while let Ok(flight) = rx.recv() {
            match self.receive(&flight) {
                Ok(outcome) => {
                    // Mooncake's target closes the connection after a refusal: what was
                    // pipelined behind the refused slice fails as path errors, and retries.
                    let closed = matches!(self.framing, Framing::Mooncake { .. })
                        && matches!(outcome, Err(SliceError::Rejected(_)));
                    self.sink.complete(flight.op, outcome);
                    if closed {
                        let msg = "the Mooncake target refused a request and closed the lane";
                        return self.fail_all(None, &rx, msg.into());
                    }
                }
                Err(e) => return self.fail_all(Some(flight.op), &rx, format!("lane failed: {e}")),
            }
        }
    }

    /// Breaks the lane: `first` and every slice still in flight fail as path errors.
    fn fail_all(&self, first: Option<SliceOp>, rx: &Receiver<InFlight>, msg: String) {
        self.broken.store(true, Ordering::Release);
        let _ = self.stream.shutdown(Shutdown::Both);
        let fail = |op| {
            // Wait until the sender is done with this slice's body (the shut-down socket makes
            // that quick) before its task may release the memory.
            drop(self.sending.lock().unwrap_or_else(|e| e.into_inner()));
            self.sink.complete(op, Err(SliceError::Path(msg.clone())));
        };
        first.into_iter().for_each(fail);
        rx.iter().for_each(|rest| fail(rest.op));
    }

    /// The status of the request in flight: te's reply header, or Mooncake's status frame.
    fn status(&self, flight: &InFlight) -> Result<Status, Error> {
        match self.framing {
            Framing::Te => {}
            // A v1 READ: the data follows at once; a refusal shows as the connection closing.
            Framing::Mooncake { acked: false } => return Ok(Status::Ok),
            Framing::Mooncake { acked: true } => {
                let mut frame = [0u8; mooncake_wire::STATUS_LEN];
                sys::recv_buf(&self.stream, &mut frame)?;
                return Ok(match mooncake_wire::decode_status(&frame)? {
                    mooncake_wire::STATUS_OK => Status::Ok,
                    // Mooncake's target refuses only what lies outside its registered buffers.
                    _ => Status::Rejected(te_core::transport::Rejection::OutOfBounds),
                });
            }
        }
        let mut head = [0u8; REPLY_LEN];
        sys::recv_buf(&self.stream, &mut head)?;
        let reply = Reply::decode(&head)?;
        if reply.request_id != flight.request_id {
            if let Status::Rejected(r) = reply.status {
                // The target refused a header it could not parse: it closes, we fail the lane.
                return Err(Error::Io(std::io::Error::other(format!(
                    "target closed the lane: {r:?}"
                ))));
            }
            return Err(Error::OutOfOrder {
                expected: flight.request_id,
                got: reply.request_id,
            });
        }
        Ok(reply.status)
    }

    fn receive(&self, flight: &InFlight) -> Result<Result<(), SliceError>, Error> {
        let op = &flight.op;
        match self.status(flight)? {
            Status::Rejected(r) => Ok(Err(SliceError::Rejected(r))),
            Status::Ok if op.opcode == Opcode::Read => {
                let len = op.len as usize;
                let Some(device) = self.staging.device_of(op.local_addr, op.len) else {
                    // SAFETY: the destination lies in a local region the engine pinned for this
                    // slice's task; it stays pinned until this slice is completed below.
                    unsafe { sys::recv_exact(&self.stream, op.local_addr, len)? };
                    return Ok(Ok(()));
                };
                // GPU memory: into a staging buffer, then onto the GPU.
                let bounce = self
                    .staging
                    .bounce(len)
                    .map_err(|e| Error::Io(std::io::Error::other(e)))?;
                // SAFETY: the staging buffer is on loan to this receiver and holds `len` bytes.
                unsafe { sys::recv_exact(&self.stream, bounce.addr(), len)? };
                Ok(
                    crate::staging::copy(device, op.local_addr, bounce.addr(), len)
                        .map_err(SliceError::LocalPath),
                )
            }
            Status::Ok => Ok(Ok(())),
        }
    }
}
