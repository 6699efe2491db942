//! A Mooncake connection on a thread of its own, with blocking I/O: where the event loop sends
//! a connection whose request touches GPU memory, which moves through staging buffers in
//! chunks (the loop never waits on the staging pool or a GPU copy). The connection stays here
//! until it closes, served with the same checks as the loop's.

use std::io;
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use te_core::Opcode;
use tracing::debug;

use super::{CompatState, IDLE_MAX, Verdict};
use crate::sys;
use crate::wire::mooncake::{self as mooncake_wire, HEADER_LEN, Header, STATUS_OK};

/// GPU memory moves through staging buffers this large (a Mooncake request is not sliced).
const STAGING_CHUNK: usize = 4 << 20;

/// Reads the next header: `None` when the peer closed (or idled out) between requests.
fn read_header(stream: &mut TcpStream, stall: Duration) -> io::Result<Option<[u8; HEADER_LEN]>> {
    let mut buf = [0u8; HEADER_LEN];
    let done = |_: &[u8], got: usize| got >= HEADER_LEN;
    let read = crate::gpu_path::read_head(stream, &mut buf, 0, stall, IDLE_MAX, done)?;
    Ok(read.map(|_| buf))
}

/// Serves `stream` from the request `first` (already read and admitted by the loop) until the
/// peer closes it, it stalls, or a request is refused.
pub(super) fn serve_from(
    state: &CompatState,
    mut stream: TcpStream,
    peer: Option<SocketAddr>,
    first: Header,
) {
    if let Err(e) = crate::gpu_path::go_blocking(&stream, state.stall_timeout) {
        return debug!(?peer, error = %e, "Mooncake connection could not go blocking");
    }
    let mut header = first;
    loop {
        if let Err(e) = handle(state, &stream, peer, &header) {
            return debug!(?peer, error = %e, "Mooncake connection closed");
        }
        let raw = match read_header(&mut stream, state.stall_timeout) {
            Ok(Some(h)) => h,
            Ok(None) => return,
            Err(e) => return debug!(?peer, error = %e, "Mooncake connection ended mid-header"),
        };
        header = match state.admit(peer, &raw) {
            Verdict::Serve(h) => h,
            Verdict::Refuse(status) => {
                if let Some(s) = status {
                    let _ = sys::send_buf(&stream, &s);
                } else {
                    super::reset(&stream);
                }
                return;
            }
        };
    }
}

/// Serves one admitted request; an `Err` closes the connection (refusals included).
fn handle(
    state: &CompatState,
    stream: &TcpStream,
    peer: Option<SocketAddr>,
    h: &Header,
) -> io::Result<()> {
    let pin = match state.check(peer, h) {
        Ok(pin) => pin,
        Err(status) => {
            match status {
                Some(s) => {
                    let _ = sys::send_buf(stream, &s);
                }
                None => super::reset(stream),
            }
            return Err(io::Error::other("request refused"));
        }
    };
    let len = usize::try_from(h.size).map_err(|_| io::Error::other("size over usize"))?;
    let ok = mooncake_wire::encode_status(STATUS_OK);
    let Some(device) = state.staging.device_of(h.addr, h.size) else {
        // Host memory after all (a later request on a promoted connection).
        let range = pin
            .range(h.addr, len)
            .ok_or_else(|| io::Error::other("a request left its region"))?;
        return match h.opcode {
            Opcode::Write => {
                sys::recv_exact(stream, range)?;
                match h.acked {
                    true => sys::send_buf(stream, &ok),
                    false => Ok(()),
                }
            }
            _ => {
                let status: &[u8] = if h.acked { &ok } else { &[] };
                sys::send_parts(stream, &mut [status.into(), range.into()])
            }
        };
    };
    match h.opcode {
        Opcode::Write => {
            for (off, n) in chunks(len) {
                let bounce = state.staging.bounce(n).map_err(io::Error::other)?;
                sys::recv_exact(stream, bounce.range(n))?;
                crate::staging::copy(device, h.addr + off, bounce.addr(), n)
                    .map_err(io::Error::other)?;
            }
            // A WRITE is acknowledged only now that its bytes are in memory.
            match h.acked {
                true => sys::send_buf(stream, &ok),
                false => Ok(()),
            }
        }
        _ => {
            if h.acked {
                sys::send_buf(stream, &ok)?;
            }
            for (off, n) in chunks(len) {
                let bounce = state.staging.bounce(n).map_err(io::Error::other)?;
                crate::staging::copy(device, bounce.addr(), h.addr + off, n)
                    .map_err(io::Error::other)?;
                sys::send_parts(stream, &mut [bounce.range(n).into()])?;
            }
            Ok(())
        }
    }
}

/// `(offset, length)` pieces of a staged transfer.
fn chunks(len: usize) -> impl Iterator<Item = (u64, usize)> {
    (0..len)
        .step_by(STAGING_CHUNK)
        .map(move |off| (off as u64, STAGING_CHUNK.min(len - off)))
}
