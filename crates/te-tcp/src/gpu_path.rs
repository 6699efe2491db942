//! The target side's blocking path: a data connection on a thread of its own, where
//! [`crate::native_target`]'s event loops send a connection whose request touches GPU memory (staging
//! buffers and GPU copies may wait; the loops never do). It serves with the same checks as the
//! loops: the proof of the secret, the bounds of one registered region and its permission before
//! any byte of memory is touched; a refused request gets an error reply and touches no memory; a
//! refused WRITE's body is read and dropped so the connection stays usable. A malformed header
//! closes the connection. A Mooncake initiator that reaches te's data listener (te's descriptor
//! does not publish it as `tcp_data_port`, so only a stale or hand-made descriptor leads there) is
//! told its request was refused in its own framing ([`foreign_refusal`]), so it reports an error
//! instead of a WRITE that never landed.

use std::io::{self, Read};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Duration;

use te_core::Opcode;
use te_core::memory::{AccessDenied, RegionPin, RegionTable};
use te_core::segment::SegmentSecret;
use te_core::transport::Rejection;
use te_sys::PinnedRange;
use tracing::{debug, warn};

use crate::sys;
use crate::wire::mooncake as mooncake_wire;
use crate::wire::{REQUEST_LEN, REQUEST_MAGIC, Reply, Request, Status};

/// A rejected WRITE body up to this size is drained to keep the connection; larger ones close it.
pub(crate) const MAX_DRAIN: u64 = 64 << 20;
/// How long a connection's thread polls for the next request before it sleeps in a read, after
/// a request of at most [`SMALL_REQUEST`] bytes.
const NEXT_REQUEST_SPIN: Duration = Duration::from_micros(50);
/// A request this small is likely followed by the next within microseconds (a synchronous
/// caller's): the server polls for it briefly instead of sleeping at once.
pub(crate) const SMALL_REQUEST: u64 = 16 << 10;
/// An idle connection (no request started) is closed after this long.
pub(crate) const IDLE_MAX: Duration = Duration::from_secs(600);

/// What every data connection checks requests against.
pub(crate) struct TargetState {
    pub(crate) regions: Arc<RegionTable>,
    pub(crate) secret: SegmentSecret,
    /// How long a started request may stall.
    pub(crate) stall_timeout: Duration,
    /// GPU regions and the staging pool.
    pub(crate) staging: Arc<crate::staging::GpuStaging>,
}

impl TargetState {
    /// What requests on a connection must prove: the connection's proof of the segment secret
    /// for the greeting's `nonce`.
    pub(crate) fn expected_proof(&self, nonce: &[u8; 16]) -> [u8; 16] {
        crate::wire::connection_proof(&self.secret, nonce)
    }

    /// te's checks on a request, before any memory is touched: the connection's proof of the
    /// segment secret (`expected`), then one region's bounds and its permission, pinning the
    /// region until the pin drops.
    pub(crate) fn check(&self, r: &Request, expected: &[u8; 16]) -> Result<RegionPin, Rejection> {
        if !te_core::control::auth::same_bytes(expected, &r.proof) {
            return Err(Rejection::BadSecret);
        }
        self.regions
            .pin_remote(r.addr, r.len, r.opcode)
            .map_err(|denied| match denied {
                AccessDenied::Permission => Rejection::PermissionDenied,
                AccessDenied::BadRange => Rejection::Malformed,
                _ => Rejection::OutOfBounds,
            })
    }
}

enum Header {
    Ready([u8; REQUEST_LEN]),
    /// The first bytes are not te's magic: only the first `mooncake_wire::HEADER_LEN` were
    /// read, so a Mooncake header with a short body is not waited on.
    Foreign([u8; mooncake_wire::HEADER_LEN]),
    Closed,
}

/// Whether the first `got` bytes of a request header can no longer be te's: enough has arrived
/// to answer a Mooncake header, and it lacks te's magic.
fn foreign(buf: &[u8], got: usize) -> bool {
    got >= mooncake_wire::HEADER_LEN && buf[0..4] != REQUEST_MAGIC.to_le_bytes()
}

/// Replies waiting to go out: WRITE acknowledgements and refusals are sent together when the
/// connection has no further request ready (or when this many bytes are waiting), so a stream
/// of pipelined WRITEs costs one reply packet per burst instead of one per slice.
const REPLY_FLUSH_BYTES: usize = 4096;

/// Reads a header. Waiting for its first byte may take up to `IDLE_MAX`; a started header must
/// finish within the stall timeout. Queued replies are flushed before any wait.
fn read_header(
    stream: &mut TcpStream,
    stall: Duration,
    replies: &mut Vec<u8>,
    poll_first: bool,
) -> io::Result<Header> {
    let mut buf = [0u8; REQUEST_LEN];
    let mut got = 0;
    if !replies.is_empty() {
        match sys::recv_now(stream, &mut buf) {
            Ok(0) => {
                // The peer finished sending; it may still read what it is owed.
                let _ = sys::send_buf(stream, replies);
                return Ok(Header::Closed);
            }
            Ok(n) => got = n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
        if got < REQUEST_LEN {
            sys::send_buf(stream, replies)?;
            replies.clear();
        }
    }
    if got == 0 && poll_first {
        // After a small request the initiator (a synchronous caller, most likely) sends its
        // next one within microseconds: a short poll spares this thread a sleep and a wake-up.
        // Bounded, and never between the large requests of a bulk stream, whose threads must
        // leave the CPU to the copies.
        sys::spin_until_readable(stream, NEXT_REQUEST_SPIN);
    }
    let done = |b: &[u8], got: usize| got >= REQUEST_LEN || foreign(b, got);
    let Some(got) = read_head(stream, &mut buf, got, stall, IDLE_MAX, done)? else {
        return Ok(Header::Closed);
    };
    if foreign(&buf, got) {
        let mut head = [0u8; mooncake_wire::HEADER_LEN];
        head.copy_from_slice(&buf[..mooncake_wire::HEADER_LEN]);
        return Ok(Header::Foreign(head));
    }
    Ok(Header::Ready(buf))
}

/// Reads into `buf` (which holds `got` bytes already) until `done(buf, got)`: blocking reads,
/// each bounded by the socket's timeout (`stall`). Waiting for the first byte may last up to
/// `idle`, a started head must not stall. `None` when the peer closed, or idled out, before
/// the first byte; otherwise the bytes read.
pub(crate) fn read_head(
    stream: &mut TcpStream,
    buf: &mut [u8],
    mut got: usize,
    stall: Duration,
    idle_max: Duration,
    done: impl Fn(&[u8], usize) -> bool,
) -> io::Result<Option<usize>> {
    let mut idle = Duration::ZERO;
    while !done(buf, got) {
        match stream.read(&mut buf[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e)
                if got == 0
                    && matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
            {
                idle += stall;
                if idle >= idle_max {
                    return Ok(None);
                }
            }
            Err(e) => return Err(e),
        }
    }
    Ok(Some(got))
}

fn queue_reply(replies: &mut Vec<u8>, request_id: u64, status: Status) {
    replies.extend_from_slice(&Reply { status, request_id }.encode());
}

/// Makes a connection an event loop handed over blocking, each read and write bounded by
/// `stall`.
pub(crate) fn go_blocking(stream: &TcpStream, stall: Duration) -> io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(stall))?;
    stream.set_write_timeout(Some(stall))
}

/// Serves `stream` (handed over by an event loop, non-blocking) from the request `first`,
/// already read, with `replies` still owed to the peer, until the peer closes it, it stalls,
/// or it sends garbage.
pub(crate) fn serve_from(
    state: &TargetState,
    mut stream: TcpStream,
    first: Request,
    mut replies: Vec<u8>,
    expected: [u8; 16],
) {
    let peer = stream.peer_addr().ok();
    if let Err(e) = go_blocking(&stream, state.stall_timeout) {
        return debug!(?peer, error = %e, "data connection could not go blocking");
    }
    let mut request = first;
    loop {
        let last_small = request.len <= SMALL_REQUEST;
        let handled = handle(state, &stream, &request, &mut replies, &expected).and_then(|()| {
            if replies.len() >= REPLY_FLUSH_BYTES {
                sys::send_buf(&stream, &replies)?;
                replies.clear();
            }
            Ok(())
        });
        if let Err(e) = handled {
            return debug!(?peer, error = %e, "data connection failed");
        }
        let header = match read_header(&mut stream, state.stall_timeout, &mut replies, last_small) {
            Ok(Header::Ready(h)) => h,
            Ok(Header::Foreign(h)) => {
                if let Some(peer) = peer {
                    replies
                        .extend_from_slice(&foreign_refusal(peer, &h, h.len()).unwrap_or_default());
                }
                let _ = sys::send_buf(&stream, &replies);
                return;
            }
            Ok(Header::Closed) => return,
            Err(e) => return debug!(?peer, error = %e, "data connection ended mid-header"),
        };
        request = match Request::decode(&header) {
            Ok(r) => r,
            Err(e) => {
                warn!(?peer, error = %e, "malformed data request; closing the connection");
                queue_reply(&mut replies, 0, Status::Rejected(Rejection::Malformed));
                let _ = sys::send_buf(&stream, &replies);
                return;
            }
        };
    }
}

/// The answer to a request that is not in te's framing, once its first `got` bytes say so
/// (`None` while they may still be te's): a Mooncake initiator of the acknowledged framing gets
/// Mooncake's refusal status, so it fails the request instead of waiting; anything else gets
/// te's Malformed reply. (A Mooncake initiator of the unacknowledged framing reads no reply at
/// all and sees only the closed connection.) The connection closes after it.
pub(crate) fn foreign_refusal(
    peer: std::net::SocketAddr,
    buf: &[u8],
    got: usize,
) -> Option<Vec<u8>> {
    if !foreign(buf, got) {
        return None;
    }
    let mut head = [0u8; mooncake_wire::HEADER_LEN];
    head.copy_from_slice(&buf[..mooncake_wire::HEADER_LEN]);
    if mooncake_wire::Header::is_acked_request(&head) {
        warn!(
            %peer,
            "a Mooncake-framed request reached te's data listener, which serves te's framing \
             only; refused (MC_TE_MOONCAKE_COMPAT=1 serves Mooncake initiators on a separate \
             listener)"
        );
        return Some(mooncake_wire::encode_status(mooncake_wire::STATUS_REJECTED).to_vec());
    }
    warn!(
        %peer,
        magic = format_args!(
            "{:#010x}",
            u32::from_le_bytes([head[0], head[1], head[2], head[3]])
        ),
        "malformed data request (not te's framing); closing the connection"
    );
    let mut out = Vec::new();
    queue_reply(&mut out, 0, Status::Rejected(Rejection::Malformed));
    Some(out)
}

fn handle(
    state: &TargetState,
    stream: &TcpStream,
    r: &Request,
    replies: &mut Vec<u8>,
    expected: &[u8; 16],
) -> io::Result<()> {
    let checked = state.check(r, expected);
    let len = r.len as usize;
    match (checked, r.opcode) {
        (Ok(pin), Opcode::Write) => {
            match state.staging.device_of(r.addr, r.len) {
                None => sys::recv_exact(stream, host_range(&pin, r.addr, len)?)?,
                Some(device) => {
                    // GPU memory: into a staging buffer, then onto the GPU (a failed copy
                    // closes the connection, so the initiator retries the slice).
                    let bounce = state.staging.bounce(len).map_err(io::Error::other)?;
                    sys::recv_exact(stream, bounce.range(len))?;
                    crate::staging::copy(device, r.addr, bounce.addr(), len)
                        .map_err(io::Error::other)?;
                }
            }
            queue_reply(replies, r.request_id, Status::Ok);
            Ok(())
        }
        (Ok(pin), _) => match state.staging.device_of(r.addr, r.len) {
            None => {
                let range = host_range(&pin, r.addr, len)?;
                send_data(stream, replies, r.request_id, range)
            }
            Some(device) => {
                // GPU memory: copied out into a staging buffer, sent from there.
                let bounce = state.staging.bounce(len).map_err(io::Error::other)?;
                crate::staging::copy(device, bounce.addr(), r.addr, len)
                    .map_err(io::Error::other)?;
                send_data(stream, replies, r.request_id, bounce.range(len))
            }
        },
        (Err(rejection), opcode) => {
            debug!(addr = r.addr, len = r.len, ?rejection, "request refused");
            if opcode == Opcode::Write {
                if r.len > MAX_DRAIN {
                    queue_reply(replies, r.request_id, Status::Rejected(rejection));
                    let _ = sys::send_buf(stream, replies);
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "refused oversized write",
                    ));
                }
                sys::discard(stream, r.len)?;
            }
            queue_reply(replies, r.request_id, Status::Rejected(rejection));
            Ok(())
        }
    }
}

/// `[addr, addr+len)` of `pin`'s region (checked against it when the request was).
fn host_range(pin: &RegionPin, addr: u64, len: usize) -> io::Result<PinnedRange<'_>> {
    pin.range(addr, len)
        .ok_or_else(|| io::Error::other("a request left its region"))
}

/// Sends the queued replies, an OK reply for `request_id`, and `data`.
fn send_data(
    stream: &TcpStream,
    replies: &mut Vec<u8>,
    request_id: u64,
    data: PinnedRange<'_>,
) -> io::Result<()> {
    let head = Reply {
        status: Status::Ok,
        request_id,
    }
    .encode();
    replies.extend_from_slice(&head);
    let sent = sys::send_parts(stream, &mut [replies[..].into(), data.into()]);
    replies.clear();
    sent
}
