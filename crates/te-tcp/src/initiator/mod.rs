//! The initiator side: per peer, a fixed set of lanes (TCP connections), all driven by the
//! transport's event loops ([`crate::initiator::dialer`]): no thread of a lane's own. A lane connects
//! lazily (non-blocking, from its local rail's address), pipelines request headers (and WRITE
//! bodies, straight from registered memory) onto the socket, reads replies in order and
//! completes slices (READ data lands straight in registered memory) — all in [`conn`], a state
//! machine the loop drives whenever the socket is ready or the lane was handed slices.
//!
//! The submitting thread only enqueues and wakes the lane's loop, with one exception. A lone
//! small slice of a synchronous call (its token says the caller waits) on a connected lane with
//! nothing queued or in flight is carried out on the submitting thread: it marks the lane as
//! its own, sends the request and reads the reply itself (the socket blocking for that
//! exchange), so the slice is done when `post` returns and no hand-off to the loop adds to a
//! small transfer's latency. The loop leaves a lane alone while it is marked.
//!
//! A lane whose connection breaks fails its in-flight slices as path errors (the engine retries
//! them) and reconnects for its next slice; a failed connect fails everything queued with it,
//! and retried slices then back off once per failed connect (a timer on the loop), not once
//! per slice. A lane speaks te's framing ([`crate::wire`]) to te targets and Mooncake's
//! acknowledged framing ([`crate::wire::mooncake`]) to Mooncake targets, pipelined the same way:
//! Mooncake's target answers in order, so replies are matched to requests by their place in the
//! queue. A Mooncake refusal fails its slice for good and closes the connection (Mooncake's
//! target closes it after refusing), so what was pipelined behind it fails as path errors and
//! is retried on a fresh connection. A slice on GPU memory is sent (or received) whole with the
//! socket blocking, through a staging buffer, on the loop.

mod conn;
pub(crate) mod dialer;
mod inbox;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use te_core::Opcode;
use te_core::transport::{CompletionSink, SliceError, SliceOp};
use tracing::debug;

use crate::error::Error;
use crate::sys::{self, SendPart};
use crate::wire::mooncake as mooncake_wire;
use crate::wire::{REPLY_LEN, Reply, Request, Status};
use dialer::LoopShared;

/// The framing a peer's data listener speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Framing {
    /// te's own: a greeting, then the connection's proof of the segment secret in every request.
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

    /// Bytes of a reply's status: te's reply header, Mooncake's status frame, or none (a v1
    /// READ's data is its answer).
    fn status_len(self) -> usize {
        match self {
            Framing::Te => REPLY_LEN,
            Framing::Mooncake { acked: true } => mooncake_wire::STATUS_LEN,
            Framing::Mooncake { acked: false } => 0,
        }
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
    /// The congestion control of the lanes' connections (`MC_TE_TCP_CONGESTION`).
    pub(crate) congestion: te_reactor::congestion::Congestion,
}

/// The largest slice a submitting thread carries out itself (see the module doc).
const INLINE_MAX: u64 = 64 << 10;
/// How long that thread polls for the reply before it sleeps in a blocking read: a small
/// request's reply comes within tens of microseconds, and on a virtual machine a sleep and
/// wake-up costs as much again. Bounded, so a slow peer costs a waiting thread little CPU.
const INLINE_SPIN: Duration = Duration::from_micros(50);

/// A lane's state, shared by its loop and the submitting threads.
pub(crate) struct LaneState {
    /// Slices waiting to be sent.
    queue: VecDeque<SliceOp>,
    /// No new slices: once drained, the connection closes and the lane is done.
    closed: bool,
    conn: Option<conn::Conn>,
    /// When the last connect failed: retried slices back off from it.
    last_failure: Option<Instant>,
    /// A submitting thread is carrying out a slice on the connection ([`Lane::try_inline`]).
    inline: bool,
}

/// The address of `peer`'s data listener: its host resolved (a name through the system's
/// resolver), preferring an address of the local rail's family.
///
/// # Errors
/// The host does not resolve, said with the host and port.
pub(crate) fn peer_address(peer: &PeerKey) -> Result<std::net::SocketAddr, String> {
    let addrs = te_core::control::resolve(&peer.host, peer.port).map_err(|e| e.to_string())?;
    prefer_family(&addrs, peer.local_ip)
        .ok_or_else(|| format!("{}:{} resolves to no address", peer.host, peer.port))
}

/// The first of `addrs` in `local`'s family (any, when `local` is unspecified), else the first.
fn prefer_family(
    addrs: &[std::net::SocketAddr],
    local: std::net::IpAddr,
) -> Option<std::net::SocketAddr> {
    let wanted =
        |a: &&std::net::SocketAddr| local.is_unspecified() || a.is_ipv4() == local.is_ipv4();
    addrs.iter().find(wanted).or(addrs.first()).copied()
}

/// One lane, as its loop holds it.
pub(crate) struct LaneCore {
    peer: PeerKey,
    /// Where the peer's data listener is: resolved when the lane was made, and again by a
    /// posting thread after a connect failed (a name may have moved to another address).
    to: Mutex<std::net::SocketAddr>,
    /// A connect failed since `to` was last resolved.
    unreachable: std::sync::atomic::AtomicBool,
    settings: Arc<LaneSettings>,
    sink: Arc<dyn CompletionSink>,
    queued_bytes: AtomicU64,
    state: Mutex<LaneState>,
    home: Arc<LoopShared>,
    token: usize,
}

/// What a drive left for the loop.
#[derive(Default)]
pub(crate) struct Driven {
    /// Drive the lane again then (a retry's backoff).
    pub(crate) timer: Option<Instant>,
    /// Closed and drained: the loop forgets it.
    pub(crate) finished: bool,
    /// It holds slices or a connection the loop should watch over (timeouts).
    pub(crate) active: bool,
}

/// One lane: its queue and connection, driven by a loop.
pub(crate) struct Lane {
    core: Arc<LaneCore>,
}

impl LaneCore {
    fn lock(&self) -> std::sync::MutexGuard<'_, LaneState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reports slices, outside the lane's lock (the sink may post retries to this lane).
    fn report(&self, done: Vec<(SliceOp, Result<(), SliceError>)>) {
        for (op, outcome) in done {
            self.sink.complete(op, outcome);
        }
    }

    /// The loop stopped: everything the lane holds fails.
    pub(crate) fn abandon(&self, home: &LoopShared) {
        let mut done = Vec::new();
        {
            let mut st = self.lock();
            let shut = || SliceError::Path("tcp transport shut down".into());
            self.fail_queued(&mut st, shut, &mut done);
            if !st.inline {
                if let Some(c) = st.conn.take() {
                    c.fail_all(home, "tcp transport shut down", &mut done);
                }
            }
            st.closed = true;
        }
        self.report(done);
    }
}

impl Lane {
    /// A lane to `peer` on loop `home` (placed by [`Dialer::place`](dialer::Dialer::place)) as
    /// `token`.
    pub(crate) fn new(
        peer: PeerKey,
        to: std::net::SocketAddr,
        settings: Arc<LaneSettings>,
        sink: Arc<dyn CompletionSink>,
        (home, token): (Arc<LoopShared>, usize),
    ) -> Self {
        let core = Arc::new(LaneCore {
            peer,
            to: Mutex::new(to),
            unreachable: std::sync::atomic::AtomicBool::new(false),
            settings,
            sink,
            queued_bytes: AtomicU64::new(0),
            state: Mutex::new(LaneState {
                queue: VecDeque::new(),
                closed: false,
                conn: None,
                last_failure: None,
                inline: false,
            }),
            home: home.clone(),
            token,
        });
        dialer::adopt(&home, token, core.clone());
        Lane { core }
    }

    /// Carries `op` out on this thread when it may (a lone small slice whose caller waits, on a
    /// connected, idle lane, host memory on both ends); otherwise hands it back.
    pub(crate) fn try_inline(&self, op: SliceOp) -> Result<(), SliceOp> {
        let core = &self.core;
        if !op.token.caller_waits() || op.len > INLINE_MAX || self.queued_bytes() > 0 {
            return Err(op);
        }
        if core
            .settings
            .staging
            .device_of(op.local_addr, op.len)
            .is_some()
        {
            return Err(op);
        }
        let (stream, request_id, proof) = {
            let mut st = core.lock();
            if st.inline || st.closed || !st.queue.is_empty() {
                return Err(op);
            }
            let Some(c) = st.conn.as_mut().filter(|c| c.idle()) else {
                return Err(op);
            };
            let taken = (c.stream(), c.next_request_id(), c.proof_for(&op));
            st.inline = true;
            taken
        };
        if op.is_canceled() {
            core.lock().inline = false;
            self.core.sink.complete(op, Err(SliceError::Canceled));
            return Ok(());
        }
        // The loop leaves the socket alone while the lane is marked: the exchange is this
        // thread's, with the socket blocking (bounded by the status timeout).
        let framing = core.peer.framing;
        let exchanged = conn::blocking(&stream, true)
            .map_err(Error::Io)
            .and_then(|()| {
                send_request(&*stream, framing, &op, request_id, proof).map_err(Error::Io)?;
                sys::spin_until_readable(&*stream, INLINE_SPIN);
                read_outcome(&*stream, framing, &core.settings.staging, &op, request_id)
            });
        let restored = conn::blocking(&stream, false);
        let mut done = Vec::new();
        let wake = {
            let mut st = core.lock();
            st.inline = false;
            let broken = match (&exchanged, restored) {
                (Err(e), _) => Some(format!("lane failed: {e}")),
                (_, Err(e)) => Some(format!("lane failed: {e}")),
                (Ok(outcome), Ok(())) if framing.closes_after(outcome) => {
                    Some("the Mooncake target refused a request and closed the lane".into())
                }
                _ => None,
            };
            if let Some(why) = broken {
                debug!(reason = %why, "inline exchange ended the connection; the lane reconnects");
                if let Some(c) = st.conn.take() {
                    c.fail_all(&core.home, &why, &mut done);
                }
            }
            !st.queue.is_empty() || st.closed
        };
        let outcome =
            exchanged.unwrap_or_else(|e| Err(SliceError::Path(format!("lane failed: {e}"))));
        core.sink.complete(op, outcome);
        core.report(done);
        if wake {
            core.home.wake(core.token);
        }
        Ok(())
    }

    /// Whether a connect failed since the peer's address was last resolved.
    pub(crate) fn address_stale(&self) -> bool {
        self.core.unreachable.load(Ordering::Acquire)
    }

    /// The peer's address, resolved again; the next connect goes there.
    pub(crate) fn readdress(&self, to: std::net::SocketAddr) {
        *self.core.to.lock().unwrap_or_else(|e| e.into_inner()) = to;
        self.core.unreachable.store(false, Ordering::Release);
    }

    pub(crate) fn queued_bytes(&self) -> u64 {
        self.core.queued_bytes.load(Ordering::Relaxed)
    }

    /// Queues slices in one hand-off (one wake-up of the lane's loop); if the lane is closed,
    /// they come back.
    pub(crate) fn push(&self, ops: Vec<SliceOp>) -> Result<(), Vec<SliceOp>> {
        let core = &self.core;
        {
            let mut st = core.lock();
            if st.closed {
                return Err(ops);
            }
            let bytes = ops.iter().map(|op| op.len).sum::<u64>();
            core.queued_bytes.fetch_add(bytes, Ordering::Relaxed);
            st.queue.extend(ops);
        }
        core.home.wake(core.token);
        Ok(())
    }

    /// Stops taking slices; queued ones are still sent, then the connection closes.
    pub(crate) fn close(&self) {
        self.core.lock().closed = true;
        self.core.home.wake(self.core.token);
    }
}

/// The bytes of one post a lane takes before the next lane is woken for it.
const MIN_SHARE: u64 = 512 << 10;
/// As [`MIN_SHARE`], for a post whose submitter waits for it at once (a synchronous call). That
/// thread sleeps until the post is done, and every further loop woken costs it about 10 µs of
/// CPU on this VM, while a second lane gains a call of this size nothing measurable
/// (`docs/tuning.md`).
const SYNC_SHARE: u64 = 1 << 20;

/// The bytes of one post a lane takes before the next lane is given any of it.
fn share_of(caller_waits: bool) -> u64 {
    match caller_waits {
        true => SYNC_SHARE,
        false => MIN_SHARE,
    }
}

/// The lane that takes a post's next slice: one already given part of this post but less than
/// `share` bytes (`added`), else the least loaded (`loads`, this post included).
fn next_lane(added: &[u64], loads: &[u64], share: u64) -> usize {
    let filling = (0..added.len()).find(|&i| added[i] > 0 && added[i] < share);
    filling.unwrap_or_else(|| (0..loads.len()).min_by_key(|&i| loads[i]).unwrap_or(0))
}

/// One `post`'s slices for one peer's lanes: each goes to the least-loaded lane, counting what
/// this post adds, and each lane gets its share in one hand-off (one wake-up of its loop per
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
        // A lane already given a share of this post takes more until it holds its share:
        // waking a lane's loop costs the posting thread more than a few slices' worth of
        // sending on a lane that is being driven anyway.
        let share = share_of(op.token.caller_waits());
        let i = next_lane(&self.added, &self.loads, share);
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

/// A request's header in `framing`; te's carries the connection's `proof` of the segment
/// secret.
fn header(framing: Framing, op: &SliceOp, request_id: u64, proof: [u8; 16]) -> ([u8; 48], usize) {
    let mut out = [0u8; 48];
    match framing {
        Framing::Te => {
            let h = Request {
                opcode: op.opcode,
                request_id,
                addr: op.remote_addr,
                len: op.len,
                proof,
            }
            .encode();
            out[..h.len()].copy_from_slice(&h);
            (out, h.len())
        }
        Framing::Mooncake { acked } => {
            let h = mooncake_wire::Header {
                opcode: op.opcode,
                addr: op.remote_addr,
                size: op.len,
                acked,
            }
            .encode();
            out[..h.len()].copy_from_slice(&h);
            (out, h.len())
        }
    }
}

/// Puts `op`'s request (header, and a WRITE's body from its local memory) on a blocking socket.
fn send_request(
    sock: &impl std::os::fd::AsRawFd,
    framing: Framing,
    op: &SliceOp,
    request_id: u64,
    proof: [u8; 16],
) -> std::io::Result<()> {
    let (head, len) = header(framing, op, request_id, proof);
    let body = match op.opcode {
        Opcode::Write => op.local_range().ok_or_else(not_host)?.into(),
        _ => SendPart::EMPTY,
    };
    sys::send_parts(sock, &mut [head[..len].into(), body])
}

/// A GPU slice on a path that moves host memory only.
fn not_host() -> std::io::Error {
    std::io::Error::other("GPU memory on a host-memory path")
}

/// The status of the request in flight, read from a blocking socket: te's reply header, or
/// Mooncake's status frame.
fn read_status(
    sock: &impl std::os::fd::AsRawFd,
    framing: Framing,
    request_id: u64,
) -> Result<Status, Error> {
    let mut head = [0u8; REPLY_LEN];
    let len = framing.status_len();
    sys::recv_buf(sock, &mut head[..len])?;
    decode_status(framing, &head[..len], request_id)
}

/// Decodes a whole reply status (`raw` holds `framing.status_len()` bytes).
fn decode_status(framing: Framing, raw: &[u8], request_id: u64) -> Result<Status, Error> {
    match framing {
        // A v1 READ: the data follows at once; a refusal shows as the connection closing.
        Framing::Mooncake { acked: false } => Ok(Status::Ok),
        Framing::Mooncake { acked: true } => {
            let mut frame = [0u8; mooncake_wire::STATUS_LEN];
            frame.copy_from_slice(raw);
            Ok(match mooncake_wire::decode_status(&frame)? {
                mooncake_wire::STATUS_OK => Status::Ok,
                // Mooncake's target refuses only what lies outside its registered buffers.
                _ => Status::Rejected(te_core::transport::Rejection::OutOfBounds),
            })
        }
        Framing::Te => {
            let mut head = [0u8; REPLY_LEN];
            head.copy_from_slice(raw);
            let reply = Reply::decode(&head)?;
            if reply.status == Status::Busy {
                return Err(busy());
            }
            if reply.request_id != request_id {
                if let Status::Rejected(r) = reply.status {
                    // The target refused a header it could not parse: it closes, we fail the
                    // lane.
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
    }
}

/// Reads the reply to `op` (sent as `request_id`) from a blocking socket: its status and a
/// READ's data, which lands in `op`'s local memory (through a staging buffer for GPU memory).
/// The outer error breaks the connection; the inner one fails the slice.
fn read_outcome(
    sock: &impl std::os::fd::AsRawFd,
    framing: Framing,
    staging: &crate::staging::GpuStaging,
    op: &SliceOp,
    request_id: u64,
) -> Result<Result<(), SliceError>, Error> {
    match read_status(sock, framing, request_id)? {
        Status::Rejected(r) => Ok(Err(SliceError::Rejected(r))),
        Status::Ok if op.opcode == Opcode::Read => {
            let len = op.len as usize;
            let Some(device) = staging.device_of(op.local_addr, op.len) else {
                sys::recv_exact(sock, op.local_range().ok_or_else(not_host)?)?;
                return Ok(Ok(()));
            };
            // GPU memory: into a staging buffer, then onto the GPU.
            let bounce = staging
                .bounce(len)
                .map_err(|e| Error::Io(std::io::Error::other(e)))?;
            sys::recv_exact(sock, bounce.range(len))?;
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The lane of each of `slices` slices of `len` bytes, as `Shares::add` deals them.
    fn dealt(lanes: usize, slices: usize, len: u64, caller_waits: bool) -> Vec<usize> {
        let (mut added, mut loads) = (vec![0; lanes], vec![0; lanes]);
        (0..slices)
            .map(|_| {
                let i = next_lane(&added, &loads, share_of(caller_waits));
                added[i] += len;
                loads[i] += len;
                i
            })
            .collect()
    }

    #[test]
    fn a_synchronous_call_of_up_to_1_mib_goes_on_one_lane_and_a_batch_spreads_by_512_kib() {
        let kib64 = 64 << 10;
        assert_eq!(dealt(4, 16, kib64, true), vec![0; 16]);
        let batch = dealt(4, 16, kib64, false);
        assert_eq!(&batch[..8], &[0; 8]);
        assert_eq!(&batch[8..], &[1; 8]);
        // Past its share a synchronous call spreads too.
        let big = dealt(4, 32, kib64, true);
        assert_eq!(&big[..16], &[0; 16]);
        assert_eq!(&big[16..], &[1; 16]);
        // A lane already loaded by earlier posts is passed over.
        let (added, loads) = (vec![0, 0], vec![4 << 20, 0]);
        assert_eq!(next_lane(&added, &loads, SYNC_SHARE), 1);
    }

    #[test]
    fn a_name_with_both_families_gives_the_local_rails_family() {
        let v6: std::net::SocketAddr = "[::1]:7000".parse().unwrap();
        let v4: std::net::SocketAddr = "127.0.0.1:7000".parse().unwrap();
        let both = [v6, v4];
        let rail_v4: std::net::IpAddr = "127.0.0.1".parse().unwrap();
        let rail_v6: std::net::IpAddr = "::1".parse().unwrap();
        let any: std::net::IpAddr = "0.0.0.0".parse().unwrap();
        assert_eq!(prefer_family(&both, rail_v4), Some(v4));
        assert_eq!(prefer_family(&both, rail_v6), Some(v6));
        assert_eq!(
            prefer_family(&both, any),
            Some(v6),
            "no rail address: the first"
        );
        assert_eq!(
            prefer_family(&[v6], rail_v4),
            Some(v6),
            "only the other family: it"
        );
        assert_eq!(prefer_family(&[], rail_v4), None);
    }
}
