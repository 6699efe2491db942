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
//! unacknowledged framing (v1) are refused by closing the connection, unless
//! `MC_TE_MOONCAKE_ALLOW_V1=1`: a v1 initiator reads no status, so it could take a refused
//! WRITE for a done one.
//!
//! Not here: the descriptor served to Mooncake peers (te-core's control listener) and any
//! notion of which regions Mooncake may see (every remotely accessible region is, with its
//! permission).

#![allow(unsafe_code)] // passes pinned registered addresses to `sys`

use std::io::{self, Read};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use te_core::Opcode;
use te_core::memory::RegionTable;
use te_core::mooncake::MooncakeCompat;
use tracing::{debug, error, warn};

use crate::mooncake_wire::{self, HEADER_LEN, Header, STATUS_OK, STATUS_REJECTED};
use crate::sys;

/// An idle connection (no request started) is closed after this long.
const IDLE_MAX: Duration = Duration::from_secs(600);
/// GPU memory moves through staging buffers this large (a Mooncake request is not sliced).
const STAGING_CHUNK: usize = 4 << 20;

/// What every Mooncake connection is checked against.
pub(crate) struct CompatState {
    pub(crate) regions: Arc<RegionTable>,
    pub(crate) compat: MooncakeCompat,
    /// How long a started request may stall.
    pub(crate) stall_timeout: Duration,
    pub(crate) staging: Arc<crate::staging::GpuStaging>,
}

/// Reads the next header: `None` when the peer closed (or idled out) between requests.
fn read_header(stream: &mut TcpStream, stall: Duration) -> io::Result<Option<[u8; HEADER_LEN]>> {
    let mut buf = [0u8; HEADER_LEN];
    let mut got = 0;
    let mut idle = Duration::ZERO;
    while got < HEADER_LEN {
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
                if idle >= IDLE_MAX {
                    return Ok(None);
                }
            }
            Err(e) => return Err(e),
        }
    }
    Ok(Some(buf))
}

/// Closes with a reset, so a v1 initiator's next write fails instead of vanishing.
fn reset(stream: &TcpStream) {
    let _ = socket2::SockRef::from(stream).set_linger(Some(Duration::ZERO));
}

/// Serves one Mooncake connection until the peer closes it, it stalls, or a request is refused.
pub(crate) fn serve(state: &CompatState, mut stream: TcpStream) {
    let peer = stream.peer_addr().ok();
    if !peer.is_some_and(|p| state.compat.admits(p.ip())) {
        warn!(
            ?peer,
            "Mooncake-compatible listener: peer not in MC_TE_MOONCAKE_ALLOW; connection refused"
        );
        return reset(&stream);
    }
    let _ = stream.set_nodelay(true);
    let _ = stream.set_read_timeout(Some(state.stall_timeout));
    let _ = stream.set_write_timeout(Some(state.stall_timeout));
    loop {
        let raw = match read_header(&mut stream, state.stall_timeout) {
            Ok(Some(h)) => h,
            Ok(None) => return,
            Err(e) => return debug!(?peer, error = %e, "Mooncake connection ended mid-header"),
        };
        let header = match Header::decode(&raw) {
            Ok(h) => h,
            Err(e) => {
                warn!(?peer, error = %e, "malformed Mooncake request; closing the connection");
                let _ = sys::send_buf(&stream, &mooncake_wire::encode_status(STATUS_REJECTED));
                return;
            }
        };
        if !header.acked && !state.compat.allow_v1 {
            // Loud: a v1 initiator reads no status, so it may report this WRITE done.
            error!(
                ?peer,
                op = ?header.opcode,
                size = header.size,
                "Mooncake request in the unacknowledged framing (v1, MC_TCP_PROTO=1 on that \
                 engine) REFUSED and NOT APPLIED; a v1 initiator may still report a WRITE done. \
                 Unset MC_TCP_PROTO there, or set MC_TE_MOONCAKE_ALLOW_V1=1 here to apply v1"
            );
            return reset(&stream);
        }
        if let Err(e) = handle(state, &stream, peer, &header) {
            return debug!(?peer, error = %e, "Mooncake connection closed");
        }
    }
}

/// Serves one request; an `Err` closes the connection (refusals included).
fn handle(
    state: &CompatState,
    stream: &TcpStream,
    peer: Option<SocketAddr>,
    h: &Header,
) -> io::Result<()> {
    let _pin = match state.regions.pin_remote(h.addr, h.size, h.opcode) {
        Ok(pin) => pin,
        Err(denied) => {
            warn!(?peer, addr = h.addr, size = h.size, ?denied, op = ?h.opcode, "Mooncake request refused");
            if h.acked {
                let _ = sys::send_buf(stream, &mooncake_wire::encode_status(STATUS_REJECTED));
            } else {
                reset(stream);
            }
            return Err(io::Error::other("request refused"));
        }
    };
    let len = usize::try_from(h.size).map_err(|_| io::Error::other("size over usize"))?;
    let ok = mooncake_wire::encode_status(STATUS_OK);
    let device = state.staging.device_of(h.addr, h.size);
    match (h.opcode, device) {
        (Opcode::Write, None) => {
            // SAFETY: `_pin` keeps `[addr, addr+size)` registered (hence allocated, by the
            // registration contract) until this returns; the range was checked to lie inside
            // one region that permits remote writes.
            unsafe { sys::recv_exact(stream, h.addr, len)? };
        }
        (Opcode::Write, Some(device)) => {
            for (off, n) in chunks(len) {
                let bounce = state.staging.bounce(n).map_err(io::Error::other)?;
                // SAFETY: the staging buffer is on loan to this request and holds `n` bytes.
                unsafe { sys::recv_exact(stream, bounce.addr(), n)? };
                crate::staging::copy(device, h.addr + off, bounce.addr(), n)
                    .map_err(io::Error::other)?;
            }
        }
        (_, None) => {
            let status: &[u8] = if h.acked { &ok } else { &[] };
            let mut parts = [(status.as_ptr() as u64, status.len()), (h.addr, len)];
            // SAFETY: the status is a local array; the data range is pinned and was checked to
            // lie inside one region that permits remote reads.
            return unsafe { sys::send_parts(stream, &mut parts) };
        }
        (_, Some(device)) => {
            if h.acked {
                sys::send_buf(stream, &ok)?;
            }
            for (off, n) in chunks(len) {
                let bounce = state.staging.bounce(n).map_err(io::Error::other)?;
                crate::staging::copy(device, bounce.addr(), h.addr + off, n)
                    .map_err(io::Error::other)?;
                // SAFETY: the staging buffer is on loan to this request and holds `n` bytes.
                unsafe { sys::send_parts(stream, &mut [(bounce.addr(), n)])? };
            }
            return Ok(());
        }
    }
    // A WRITE is acknowledged only now that its bytes are in memory.
    if h.acked {
        sys::send_buf(stream, &ok)?;
    }
    Ok(())
}

/// `(offset, length)` pieces of a staged transfer.
fn chunks(len: usize) -> impl Iterator<Item = (u64, usize)> {
    (0..len)
        .step_by(STAGING_CHUNK)
        .map(move |off| (off as u64, STAGING_CHUNK.min(len - off)))
}
