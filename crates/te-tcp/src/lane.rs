//! The initiator side: per peer, a fixed set of lanes (TCP connections). Each lane has a sender
//! thread that connects lazily, pipelines request headers (and WRITE bodies, straight from
//! registered memory) onto the socket, and a receiver thread that reads replies in order and
//! completes slices (READ data lands straight in registered memory).
//!
//! The submitting thread only enqueues: connects and I/O happen on lane threads, with one
//! exception. A lone small slice of a synchronous call (its token says the caller waits) on a
//! connected lane with nothing queued or in flight is carried out on the submitting thread: it
//! sends the request and reads the reply itself, so the slice is done when `post` returns and
//! no thread hand-off (sender, receiver, waking the caller) adds to a small transfer's latency.
//! A lane whose connection breaks fails its in-flight slices as path errors (the engine retries
//! them) and reconnects on its next slice.
//!
//! A lane speaks te's framing ([`crate::wire`]) to te targets and Mooncake's acknowledged
//! framing ([`crate::mooncake_wire`]) to Mooncake targets, pipelined the same way: Mooncake's
//! target answers in order, so replies are matched to requests by their place in the queue. A
//! Mooncake refusal fails its slice for good and closes the connection (Mooncake's target
//! closes it after refusing), so what was pipelined behind it fails as path errors and is
//! retried on a fresh connection.

#![allow(unsafe_code)] // passes pinned registered addresses to `sys`

use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
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

impl Framing {
    /// Whether the target closes the connection after a slice ends with `outcome`: Mooncake's
    /// target does after a refusal.
    fn closes_after(self, outcome: &Result<(), SliceError>) -> bool {
        matches!(self, Framing::Mooncake { .. }) && matches!(outcome, Err(SliceError::Rejected(_)))
    }
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

/// The largest slice a submitting thread carries out itself (see the module doc).
const INLINE_MAX: u64 = 64 << 10;
/// How long that thread polls for the reply before it sleeps in a blocking read: a small
/// request's reply comes within tens of microseconds, and on a virtual machine a sleep and
/// wake-up costs as much again. Bounded, so a slow peer costs a waiting thread little CPU.
const INLINE_SPIN: Duration = Duration::from_micros(50);

/// One lane: a queue feeding a sender thread, and the connection they share.
pub(crate) struct Lane {
    queue: Mutex<Option<Sender<Vec<SliceOp>>>>,
    queued_bytes: Arc<AtomicU64>,
    conn: Arc<Mutex<Option<Connection>>>,
    framing: Framing,
    settings: Arc<LaneSettings>,
    sink: Arc<dyn CompletionSink>,
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
        let conn = Arc::new(Mutex::new(None));
        let framing = peer.framing;
        let worker = SenderWorker {
            peer,
            settings: settings.clone(),
            sink: sink.clone(),
            queued_bytes: queued_bytes.clone(),
            conn: conn.clone(),
        };
        std::thread::Builder::new()
            .name(format!("te-tcp-lane{index}"))
            .spawn(move || worker.run(rx))?;
        Ok(Lane {
            queue: Mutex::new(Some(tx)),
            queued_bytes,
            conn,
            framing,
            settings,
            sink,
        })
    }

    /// Carries `op` out on this thread when it may (a lone small slice whose caller waits, on a
    /// connected, idle lane, host memory on both ends); otherwise hands it back.
    pub(crate) fn try_inline(&self, op: SliceOp) -> Result<(), SliceOp> {
        if !op.token.caller_waits() || op.len > INLINE_MAX || self.queued_bytes() > 0 {
            return Err(op);
        }
        if self
            .settings
            .staging
            .device_of(op.local_addr, op.len)
            .is_some()
        {
            return Err(op);
        }
        // Nothing is queued, so the sender thread holds the connection at most while it
        // finishes the slice it took last (its reply may already have completed the caller's
        // previous call): wait for it rather than queue behind it.
        let mut guard = self.conn.lock().unwrap_or_else(|e| e.into_inner());
        let Some(conn) = guard.as_mut() else {
            return Err(op);
        };
        if conn.broken.load(Ordering::Acquire) || conn.in_flight_count.load(Ordering::Acquire) > 0 {
            return Err(op);
        }
        if op.is_canceled() {
            self.sink.complete(op, Err(SliceError::Canceled));
            return Ok(());
        }
        // The receiver thread reads the socket only for slices queued to it, and none is: the
        // reply is this thread's to read while it holds the connection.
        let request_id = conn.next_request_id();
        let exchanged = RequestHead::of(&op)
            .send(
                conn,
                self.framing,
                request_id,
                (op.local_addr, op.len as usize),
            )
            .map_err(Error::Io)
            .and_then(|()| {
                sys::spin_until_readable(&conn.stream, INLINE_SPIN);
                read_outcome(
                    &conn.stream,
                    self.framing,
                    &self.settings.staging,
                    &op,
                    request_id,
                )
            });
        match exchanged {
            Ok(outcome) => {
                if self.framing.closes_after(&outcome) {
                    conn.break_off();
                    *guard = None;
                }
                drop(guard);
                self.sink.complete(op, outcome);
            }
            Err(e) => {
                debug!(error = %e, "inline exchange failed; the lane reconnects");
                conn.break_off();
                *guard = None;
                drop(guard);
                self.sink
                    .complete(op, Err(SliceError::Path(format!("lane failed: {e}"))));
            }
        }
        Ok(())
    }

    pub(crate) fn queued_bytes(&self) -> u64 {
        self.queued_bytes.load(Ordering::Relaxed)
    }

    /// Queues slices in one hand-off (one wake-up of the sender thread); if the lane is
    /// closed, they come back.
    pub(crate) fn push(&self, ops: Vec<SliceOp>) -> Result<(), Vec<SliceOp>> {
        let queue = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        let bytes = ops.iter().map(|op| op.len).sum::<u64>();
        match queue.as_ref() {
            Some(tx) => {
                self.queued_bytes.fetch_add(bytes, Ordering::Relaxed);
                tx.send(ops).map_err(|e| {
                    self.queued_bytes.fetch_sub(bytes, Ordering::Relaxed);
                    e.0
                })
            }
            None => Err(ops),
        }
    }

    /// Stops taking slices; queued ones are still sent, then the threads exit.
    pub(crate) fn close(&self) {
        self.queue.lock().unwrap_or_else(|e| e.into_inner()).take();
    }
}

/// The bytes of one post a lane takes before the next lane is woken for it.
const MIN_SHARE: u64 = 512 << 10;

/// One `post`'s slices for one peer's lanes: each goes to the least-loaded lane, counting what
/// this post adds, and each lane gets its share in one hand-off (one wake-up of its thread per
/// post, not one per slice).
pub(crate) struct Shares {
    lanes: Arc<Vec<Lane>>,
    /// Each lane's queued bytes, this post's included.
    loads: Vec<u64>,
    /// Each lane's bytes of this post.
    added: Vec<u64>,
    shares: Vec<Vec<SliceOp>>,
}

impl Shares {
    pub(crate) fn new(lanes: Arc<Vec<Lane>>) -> Self {
        Shares {
            loads: lanes.iter().map(Lane::queued_bytes).collect(),
            added: vec![0; lanes.len()],
            shares: lanes.iter().map(|_| Vec::new()).collect(),
            lanes,
        }
    }

    pub(crate) fn is_for(&self, lanes: &Arc<Vec<Lane>>) -> bool {
        Arc::ptr_eq(&self.lanes, lanes)
    }

    /// Adds `op` to the least-loaded lane's share; a `lone` slice (the only one of its post)
    /// may be carried out on this thread at once instead ([`Lane::try_inline`]).
    pub(crate) fn add(&mut self, op: SliceOp, lone: bool) {
        // A lane already given a share of this post takes more until it holds MIN_SHARE:
        // waking a lane's thread costs the posting thread more than a few slices' worth of
        // sending on a lane that is awake anyway.
        let filling =
            (0..self.added.len()).find(|&i| self.added[i] > 0 && self.added[i] < MIN_SHARE);
        let i = filling.unwrap_or_else(|| {
            (0..self.loads.len())
                .min_by_key(|&i| self.loads[i])
                .unwrap_or(0)
        });
        let op = match lone {
            true => match self.lanes[i].try_inline(op) {
                Ok(()) => return,
                Err(op) => op,
            },
            false => op,
        };
        self.loads[i] += op.len;
        self.added[i] += op.len;
        self.shares[i].push(op);
    }

    /// Hands each lane its share; the slices of lanes that were closed meanwhile come back.
    pub(crate) fn hand_off(self) -> Vec<SliceOp> {
        let mut refused = Vec::new();
        for (lane, share) in self.lanes.iter().zip(self.shares) {
            if share.is_empty() {
                continue;
            }
            if let Err(ops) = lane.push(share) {
                refused.extend(ops);
            }
        }
        refused
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
    /// Slices queued to the receiver and not yet completed by it.
    in_flight_count: Arc<AtomicUsize>,
    next_id: u64,
}

impl Connection {
    fn next_request_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// Marks the connection broken and shuts its socket (the receiver fails what it holds).
    fn break_off(&self) {
        self.broken.store(true, Ordering::Release);
        let _ = self.stream.shutdown(Shutdown::Both);
    }
}

/// What a request's header says, taken from its slice before the slice is queued away.
struct RequestHead {
    opcode: Opcode,
    remote_addr: u64,
    len: u64,
    secret: [u8; 16],
}

impl RequestHead {
    fn of(op: &SliceOp) -> Self {
        RequestHead {
            opcode: op.opcode,
            remote_addr: op.remote_addr,
            len: op.len,
            secret: op.target.secret().to_bytes(),
        }
    }

    /// Puts the request (header, and a WRITE's `body`) on the connection's socket.
    fn send(
        &self,
        conn: &Connection,
        framing: Framing,
        request_id: u64,
        body: (u64, usize),
    ) -> std::io::Result<()> {
        let te_header;
        let mooncake_header;
        let header: &[u8] = match framing {
            Framing::Te => {
                te_header = Request {
                    opcode: self.opcode,
                    request_id,
                    addr: self.remote_addr,
                    len: self.len,
                    secret: self.secret,
                }
                .encode();
                &te_header
            }
            Framing::Mooncake { acked } => {
                mooncake_header = mooncake_wire::Header {
                    opcode: self.opcode,
                    addr: self.remote_addr,
                    size: self.len,
                    acked,
                }
                .encode();
                &mooncake_header
            }
        };
        let body = match self.opcode {
            Opcode::Write => body,
            _ => (0, 0),
        };
        let mut parts = [(header.as_ptr() as u64, header.len()), body];
        // SAFETY: the header is a local array; the body range lies in a local region (or a
        // staging buffer) the engine pinned for this slice's task, which stays pinned until
        // the slice is completed, after this call.
        unsafe { sys::send_parts(&conn.stream, &mut parts) }
    }
}

struct SenderWorker {
    peer: PeerKey,
    settings: Arc<LaneSettings>,
    sink: Arc<dyn CompletionSink>,
    queued_bytes: Arc<AtomicU64>,
    conn: Arc<Mutex<Option<Connection>>>,
}

impl SenderWorker {
    fn run(self, rx: Receiver<Vec<SliceOp>>) {
        // When the last connect failed: retried slices back off from it, once per failure
        // (not once per slice, which made a dead peer's queue drain one backoff at a time).
        let mut last_failure: Option<std::time::Instant> = None;
        while let Ok(ops) = rx.recv() {
            let mut ops = ops.into_iter();
            while let Some(op) = ops.next() {
                self.queued_bytes.fetch_sub(op.len, Ordering::Relaxed);
                if op.is_canceled() {
                    self.sink.complete(op, Err(SliceError::Canceled));
                    continue;
                }
                let reconnecting = self
                    .lock_conn()
                    .as_ref()
                    .is_none_or(|c| c.broken.load(Ordering::Acquire));
                if let Some(at) = last_failure.filter(|_| reconnecting && op.token.attempt() > 0) {
                    // A retried slice after a failed connect: give the peer a moment.
                    let backoff = Duration::from_millis(5u64 << op.token.attempt().min(7));
                    std::thread::sleep(backoff.saturating_sub(at.elapsed()));
                }
                let mut conn = self.lock_conn();
                if conn
                    .as_ref()
                    .is_some_and(|c| c.broken.load(Ordering::Acquire))
                {
                    *conn = None;
                }
                if conn.is_none() {
                    match self.connect() {
                        Ok(c) => {
                            *conn = Some(c);
                            last_failure = None;
                        }
                        Err(e) => {
                            drop(conn);
                            last_failure = Some(std::time::Instant::now());
                            // The peer cannot be reached now: what is queued here fails with
                            // this slice (and is retried after the backoff) instead of each
                            // waiting for a connect of its own. A snapshot: slices re-posted
                            // meanwhile wait for the next round.
                            let queued: Vec<SliceOp> =
                                ops.by_ref().chain(rx.try_iter().flatten()).collect();
                            self.fail_unreachable(op, queued, &e);
                            break;
                        }
                    }
                }
                self.send(&mut conn, op);
            }
        }
        if let Some(c) = self.lock_conn().take() {
            // Let the receiver finish what is in flight, then the socket closes with it.
            drop(c.in_flight);
        }
    }

    /// Fails `op` and the `queued` slices behind it after a failed connect.
    fn fail_unreachable(&self, op: SliceOp, queued: Vec<SliceOp>, e: &std::io::Error) {
        let msg = format!(
            "connecting from {} to {}:{}: {e}",
            self.peer.local_ip, self.peer.host, self.peer.port
        );
        self.sink.complete(op, Err(connect_fault(e, msg.clone())));
        for op in queued {
            self.queued_bytes.fetch_sub(op.len, Ordering::Relaxed);
            self.sink.complete(op, Err(connect_fault(e, msg.clone())));
        }
    }

    fn lock_conn(&self) -> std::sync::MutexGuard<'_, Option<Connection>> {
        self.conn.lock().unwrap_or_else(|e| e.into_inner())
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
                    let in_flight_count = Arc::new(AtomicUsize::new(0));
                    let receiver = ReceiverWorker {
                        framing: self.peer.framing,
                        stream: stream.try_clone()?,
                        sink: self.sink.clone(),
                        broken: broken.clone(),
                        sending: sending.clone(),
                        staging: self.settings.staging.clone(),
                        in_flight_count: in_flight_count.clone(),
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
                        in_flight_count,
                        next_id: 0,
                    });
                }
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// Sends `op` on the connection in `slot` and queues it for the receiver; a send that
    /// fails breaks the connection (the receiver fails the slice and what is behind it).
    fn send(&self, slot: &mut Option<Connection>, op: SliceOp) {
        let Some(conn) = slot.as_mut() else {
            let reason = "lane has no connection".to_string();
            self.sink.complete(op, Err(SliceError::Path(reason)));
            return;
        };
        let request_id = conn.next_request_id();
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
        let sending = conn.sending.clone();
        let sending = sending.lock().unwrap_or_else(|e| e.into_inner());
        // The receiver may read the reply once the request is out: queue the slice first.
        let head = RequestHead::of(&op);
        conn.in_flight_count.fetch_add(1, Ordering::AcqRel);
        if let Err(e) = conn.in_flight.send(InFlight { op, request_id }) {
            conn.in_flight_count.fetch_sub(1, Ordering::AcqRel);
            drop(sending);
            // The receiver is gone (connection broken): fail the slice here.
            let InFlight { op, .. } = e.0;
            self.sink
                .complete(op, Err(SliceError::Path("lane connection closed".into())));
            *slot = None;
            return;
        }
        let sent = head.send(conn, self.peer.framing, request_id, body);
        drop(sending);
        drop(bounce);
        if let Err(e) = sent {
            debug!(error = %e, "lane send failed; reconnecting on next slice");
            conn.break_off();
            *slot = None;
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
    in_flight_count: Arc<AtomicUsize>,
}

impl ReceiverWorker {
    fn run(self, rx: Receiver<InFlight>) {
        while let Ok(flight) = rx.recv() {
            let received = read_outcome(
                &self.stream,
                self.framing,
                &self.staging,
                &flight.op,
                flight.request_id,
            );
            // Mooncake's target closes the connection after a refusal: what was pipelined
            // behind the refused slice fails as path errors, and retries.
            let closed = received
                .as_ref()
                .is_ok_and(|outcome| self.framing.closes_after(outcome));
            if closed || received.is_err() {
                // Before the count drops: no submitting thread may take the idle lane.
                self.broken.store(true, Ordering::Release);
            }
            self.in_flight_count.fetch_sub(1, Ordering::AcqRel);
            match received {
                Ok(outcome) => {
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
        rx.iter().for_each(|rest| {
            self.in_flight_count.fetch_sub(1, Ordering::AcqRel);
            fail(rest.op);
        });
    }
}

/// The status of the request in flight: te's reply header, or Mooncake's status frame.
fn read_status(stream: &TcpStream, framing: Framing, request_id: u64) -> Result<Status, Error> {
    match framing {
        Framing::Te => {}
        // A v1 READ: the data follows at once; a refusal shows as the connection closing.
        Framing::Mooncake { acked: false } => return Ok(Status::Ok),
        Framing::Mooncake { acked: true } => {
            let mut frame = [0u8; mooncake_wire::STATUS_LEN];
            sys::recv_buf(stream, &mut frame)?;
            return Ok(match mooncake_wire::decode_status(&frame)? {
                mooncake_wire::STATUS_OK => Status::Ok,
                // Mooncake's target refuses only what lies outside its registered buffers.
                _ => Status::Rejected(te_core::transport::Rejection::OutOfBounds),
            });
        }
    }
    let mut head = [0u8; REPLY_LEN];
    sys::recv_buf(stream, &mut head)?;
    let reply = Reply::decode(&head)?;
    if reply.status == Status::Busy {
        return Err(busy());
    }
    if reply.request_id != request_id {
        if let Status::Rejected(r) = reply.status {
            // The target refused a header it could not parse: it closes, we fail the lane.
            return Err(Error::Io(std::io::Error::other(format!(
                "target closed the lane: {r:?}"
            ))));
        }
        return Err(Error::OutOfOrder {
            expected: request_id,
            got: reply.request_id,
        });
    }
    Ok(reply.status)
}

/// Reads the reply to `op` (sent as `request_id`): its status and a READ's data, which lands
/// in `op`'s local memory. The outer error breaks the connection; the inner one fails the slice.
fn read_outcome(
    stream: &TcpStream,
    framing: Framing,
    staging: &crate::staging::GpuStaging,
    op: &SliceOp,
    request_id: u64,
) -> Result<Result<(), SliceError>, Error> {
    match read_status(stream, framing, request_id)? {
        Status::Rejected(r) => Ok(Err(SliceError::Rejected(r))),
        Status::Ok if op.opcode == Opcode::Read => {
            let len = op.len as usize;
            let Some(device) = staging.device_of(op.local_addr, op.len) else {
                // SAFETY: the destination lies in a local region the engine pinned for this
                // slice's task; it stays pinned until the slice is completed, after this call.
                unsafe { sys::recv_exact(stream, op.local_addr, len)? };
                return Ok(Ok(()));
            };
            // GPU memory: into a staging buffer, then onto the GPU.
            let bounce = staging
                .bounce(len)
                .map_err(|e| Error::Io(std::io::Error::other(e)))?;
            // SAFETY: the staging buffer is on loan to this call and holds `len` bytes.
            unsafe { sys::recv_exact(stream, bounce.addr(), len)? };
            Ok(
                crate::staging::copy(device, op.local_addr, bounce.addr(), len)
                    .map_err(SliceError::LocalPath),
            )
        }
        Status::Ok => Ok(Ok(())),
        Status::Busy => Err(busy()),
    }
}

/// The error of a lane whose target refused the connection at its cap.
fn busy() -> Error {
    Error::Io(std::io::Error::other(
        "the target refused the connection: it holds its cap of data connections \
         (MC_TE_MAX_DATA_CONNECTIONS)",
    ))
}
