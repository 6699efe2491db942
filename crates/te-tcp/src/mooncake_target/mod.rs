//! The listener for Mooncake initiators (opt-in, `MC_TE_MOONCAKE_COMPAT=1`): Mooncake's framing
//! ([`crate::wire::mooncake`]) on a port of its own, published as Mooncake's `tcp_data_port`
//! with `tcp_data_host` and `tcp_proto_version` 2, so te's own listeners and their secret check
//! are untouched.
//!
//! Mooncake's requests carry no credential, so what guards memory here is everything else te
//! checks: the peer's address against `MC_TE_MOONCAKE_ALLOW` (at accept), then for every
//! request the bounds of one registered region, that region's permission, and a pin that
//! keeps it registered until the bytes have moved. A refused request gets Mooncake's refusal
//! status and the connection closes (as Mooncake's own target does). Requests in Mooncake's
//! unacknowledged framing (v1) are refused by resetting the connection, unless
//! `MC_TE_MOONCAKE_ALLOW_V1=1`: a v1 initiator reads no status, so it could take a refused
//! WRITE for a done one.
//!
//! Threads: a fixed set of event loops (`MC_TE_MOONCAKE_THREADS`, te-core's
//! [`reactor`](te_reactor)) serve every connection, readiness driven, moving bytes between
//! sockets and registered memory without copies ([`conn`]). Mooncake's initiator keeps one
//! request in flight per connection over several connections, so for requests of up to
//! [`conn::BULK`] a wake-up costs more than the copy: every connection starts on the first
//! loop, which serves them all with the fewest wake-ups (as Mooncake's own target serves them
//! on one thread). A connection whose latest request is larger is bulk, and the reactor spreads
//! bulk connections over the loops, where their copies run side by side ([`conn::is_bulk`]). A connection whose request touches GPU memory
//! leaves the loops for a thread of its own ([`blocking`]), where staging may wait without
//! holding anybody up.
//!
//! Not here: the descriptor served to Mooncake peers (te-core's control listener), and any
//! notion of which regions Mooncake may see (every remotely accessible region is, with its
//! permission).

mod blocking;
mod conn;

use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use te_core::memory::{AccessDenied, RegionPin, RegionTable};
use te_core::mooncake::MooncakeCompat;
use te_reactor::{Deal, Protocol, Refusal, Server, Slot, Step};
use tracing::{error, warn};

use crate::wire::mooncake::{self as mooncake_wire, HEADER_LEN, Header, STATUS_REJECTED};

/// An idle connection (no request started) is closed after this long.
pub(super) const IDLE_MAX: Duration = Duration::from_secs(600);

/// What every Mooncake connection is checked against.
pub(crate) struct CompatState {
    pub(crate) regions: Arc<RegionTable>,
    pub(crate) compat: MooncakeCompat,
    /// The listener's thread count.
    pub(crate) tcp: crate::TcpSettings,
    /// How long a started request may stall.
    pub(crate) stall_timeout: Duration,
    pub(crate) staging: Arc<crate::staging::GpuStaging>,
}

/// What to do with a header.
pub(super) enum Verdict {
    Serve(Header),
    /// Refuse: send this status and close, or (`None`) reset the connection.
    Refuse(Option<[u8; mooncake_wire::STATUS_LEN]>),
}

impl CompatState {
    /// Decodes a header and applies the framing policy: a malformed one is refused with
    /// Mooncake's status, one in the unacknowledged framing is refused by a reset (its
    /// initiator reads no status) unless v1 is allowed.
    pub(super) fn admit(&self, peer: Option<SocketAddr>, raw: &[u8; HEADER_LEN]) -> Verdict {
        let refused = Some(mooncake_wire::encode_status(STATUS_REJECTED));
        let header = match Header::decode(raw) {
            Ok(h) => h,
            Err(e) => {
                warn!(?peer, error = %e, "malformed Mooncake request; closing the connection");
                return Verdict::Refuse(refused);
            }
        };
        if !header.acked && !self.compat.allow_v1 {
            // Loud: a v1 initiator reads no status, so it may report this WRITE done.
            error!(
                ?peer,
                op = ?header.opcode,
                size = header.size,
                "Mooncake request in the unacknowledged framing (v1, MC_TCP_PROTO=1 on that \
                 engine) REFUSED and NOT APPLIED; a v1 initiator may still report a WRITE done. \
                 Unset MC_TCP_PROTO there, or set MC_TE_MOONCAKE_ALLOW_V1=1 here to apply v1"
            );
            return Verdict::Refuse(None);
        }
        Verdict::Serve(header)
    }

    /// te's checks on an admitted request, before any memory is touched: one region's bounds,
    /// its permission, and a pin against unregistering. A refusal says what to send.
    pub(super) fn check(
        &self,
        peer: Option<SocketAddr>,
        h: &Header,
    ) -> Result<RegionPin, Option<[u8; mooncake_wire::STATUS_LEN]>> {
        self.regions
            .pin_remote(h.addr, h.size, h.opcode)
            .map_err(|denied: AccessDenied| {
                warn!(?peer, addr = h.addr, size = h.size, ?denied, op = ?h.opcode, "Mooncake request refused");
                h.acked
                    .then(|| mooncake_wire::encode_status(STATUS_REJECTED))
            })
    }
}

/// Closes with a reset, so a v1 initiator's next write fails instead of vanishing.
pub(super) fn reset(stream: &TcpStream) {
    let _ = socket2::SockRef::from(stream).set_linger(Some(Duration::ZERO));
}

impl Protocol for CompatState {
    type Conn = conn::Conn;

    fn name(&self) -> &'static str {
        "te-tcp-mooncake"
    }

    fn admits(&self, peer: SocketAddr) -> bool {
        let ok = self.compat.admits(peer.ip());
        if !ok {
            warn!(
                %peer,
                "Mooncake-compatible listener: peer not in MC_TE_MOONCAKE_ALLOW; refused"
            );
        }
        ok
    }

    fn open(&self, peer: SocketAddr, _stream: &mio::net::TcpStream) -> conn::Conn {
        conn::Conn::new(peer)
    }

    fn peer_closing(&self, c: &mut conn::Conn) {
        c.peer_closed = true;
    }

    fn drive(&self, c: &mut conn::Conn, stream: &mio::net::TcpStream) -> Step {
        c.drive(self, stream)
    }

    fn bulk(&self, c: &conn::Conn) -> bool {
        c.bulk
    }

    fn expired(&self, c: &conn::Conn, now: Instant) -> bool {
        c.expired(now, self.stall_timeout)
    }

    fn idle_since(&self, c: &conn::Conn) -> Option<Instant> {
        c.idle_since()
    }

    fn refuse(&self, stream: &mio::net::TcpStream, _peer: SocketAddr, _why: Refusal) {
        // Mooncake's framing has no word for "busy" before a request: its refusal status,
        // which its initiator reports as a failed request.
        let _ = std::io::Write::write(
            &mut &*stream,
            &mooncake_wire::encode_status(STATUS_REJECTED),
        );
    }

    fn promote(self: &Arc<Self>, c: conn::Conn, stream: TcpStream, peer: SocketAddr, slot: Slot) {
        let Some(header) = c.promoted else {
            return;
        };
        let state = self.clone();
        let spawned = std::thread::Builder::new()
            .name("te-tcp-mooncake-gpu".into())
            .spawn(move || {
                blocking::serve_from(&state, stream, Some(peer), header);
                drop(slot);
            });
        if let Err(e) = spawned {
            warn!(%peer, error = %e, "Mooncake listener: no thread for a GPU connection");
        }
    }
}

/// Starts the listener's event loops (`MC_TE_MOONCAKE_THREADS`).
///
/// # Errors
/// The listener or a loop could not be set up.
pub(crate) fn start(
    listener: std::net::TcpListener,
    state: Arc<CompatState>,
    limits: &te_reactor::limits::ServerLimits,
    congestion: &te_reactor::congestion::Congestion,
) -> std::io::Result<Server> {
    let settings = limits.data_server(state.tcp.mooncake_threads, Deal::Gather, congestion);
    Server::start(listener, state, settings)
}
