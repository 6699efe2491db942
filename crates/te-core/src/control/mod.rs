//! The control channel: one listener per engine serving the P2P descriptor exchange,
//! notifications and liveness probes (and, with RDMA, endpoint handshakes), plus the client side.
//!
//! Framing is Mooncake's (see [`frame`]); payloads are Mooncake's JSON. Many connections are
//! served at once, each with an idle timeout; a bad frame closes only its own connection.
//! With a cluster secret every connection must pass [`auth`]'s challenge-response before it
//! gets a descriptor, a notification in, a probe answer or an endpoint; a peer without it gets
//! a refusal naming the reason, and the connection closes. The one exception is the Mooncake
//! opt-in ([`crate::mooncake`], with its second switch): a peer its allow-list admits is served
//! without the challenge, and gets a descriptor with no segment secret in it, sealed or not.
//! Untyped frames of older Mooncake peers are answered untyped.

pub mod auth;
pub mod frame;
mod server;

use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use serde_json::json;
use tracing::debug;

use crate::error::{Error, Result};
use crate::notify::{Notification, NotificationQueue, Sender};
use frame::{FrameError, FrameType, read_frame, write_frame};
use te_reactor::Server;
use te_reactor::deadline::DeadlineStream;

/// How long a control connection may sit idle (or stall mid-frame) before it is closed.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(5);

/// What the control listener answers with.
pub struct ControlState {
    /// The local segment descriptor, serialised.
    pub local_desc: RwLock<Arc<String>>,
    /// Where received notifications go.
    pub notifications: Arc<NotificationQueue>,
    /// Largest frame accepted: its length field, type byte included (`MC_HANDSHAKE_MAX_LENGTH`).
    pub max_payload: usize,
    /// The cluster key peers must prove, when a cluster secret is set.
    pub cluster_key: Option<Arc<auth::ClusterKey>>,
    /// Answers endpoint handshakes (`Connection` frames), when a transport set one up.
    pub connection_handler: RwLock<Option<ConnectionHandlerFn>>,
    /// Who may be served without the cluster secret's challenge (the Mooncake opt-in).
    pub mooncake: crate::mooncake::MooncakeCompat,
    /// The descriptor those peers get: the local one without its segment secret.
    pub public_desc: RwLock<Option<Arc<String>>>,
}

impl std::fmt::Debug for ControlState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlState")
            .field("max_payload", &self.max_payload)
            .field("authenticated", &self.cluster_key.is_some())
            .finish()
    }
}

/// A transport's answer to an endpoint handshake: request payload and the peer's address in
/// (the handler decides whether a handshake without te's credential is admitted), reply
/// payload out.
pub type ConnectionHandlerFn = Arc<dyn Fn(&[u8], Option<SocketAddr>) -> Vec<u8> + Send + Sync>;

impl ControlState {
    /// Routes `Connection` frames to `handler` (te-rdma's queue-pair handshake).
    pub fn set_connection_handler(&self, handler: ConnectionHandlerFn) {
        *self
            .connection_handler
            .write()
            .unwrap_or_else(|e| e.into_inner()) = Some(handler);
    }
}

impl ControlState {
    /// The reply to one request; `authenticated` is false for a peer served under the
    /// Mooncake opt-in without the cluster secret.
    fn answer(
        &self,
        kind: FrameType,
        payload: &[u8],
        authenticated: bool,
        peer: Option<SocketAddr>,
    ) -> Vec<u8> {
        match kind {
            FrameType::Metadata if !authenticated => self
                .public_desc
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .as_ref()
                .map_or_else(
                    || json!({"error": "te: no descriptor for unauthenticated peers"}).to_string(),
                    |d| d.to_string(),
                )
                .into_bytes(),
            FrameType::Metadata => self
                .local_desc
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .as_bytes()
                .to_vec(),
            FrameType::Probe => br#"{"status":"success"}"#.to_vec(),
            FrameType::Notify => match serde_json::from_slice::<Notification>(payload) {
                Ok(n) => {
                    let Some(addr) = peer else {
                        return json!({"error": "te: no peer address"})
                            .to_string()
                            .into_bytes();
                    };
                    let sender = Sender {
                        addr,
                        authenticated: authenticated && self.cluster_key.is_some(),
                    };
                    match self.notifications.push(n, sender) {
                        Ok(()) => br#"{"name":"","notify_msg":"success"}"#.to_vec(),
                        Err(why) => json!({"error": format!("te: {why}")})
                            .to_string()
                            .into_bytes(),
                    }
                }
                Err(e) => json!({"error": format!("malformed notification: {e}")})
                    .to_string()
                    .into_bytes(),
            },
            FrameType::Connection => {
                let handler = self
                    .connection_handler
                    .read()
                    .unwrap_or_else(|e| e.into_inner())
                    .clone();
                match handler {
                    Some(h) => h(payload, peer),
                    None => json!({"reply_msg": "te: no transport accepts endpoint handshakes"})
                        .to_string()
                        .into_bytes(),
                }
            }
            FrameType::Auth => json!({"error": "te: this engine has no cluster secret"})
                .to_string()
                .into_bytes(),
        }
    }
}

/// Starts serving `state` on `listener` with `limits.control_threads` event loops, at most
/// `limits.max_control_connections` connections at once.
///
/// # Errors
/// A loop cannot start.
pub fn start_server(
    listener: std::net::TcpListener,
    state: Arc<ControlState>,
    limits: &te_reactor::limits::ServerLimits,
) -> Result<Server> {
    Server::start(
        listener,
        Arc::new(server::ControlProtocol { state }),
        limits.control_server(),
    )
    .map_err(|e| Error::socket("starting the control listener", e))
}

/// Resolves `host:port` (IPv6 hosts may be bracketed).
///
/// # Errors
/// [`Error::Socket`] when the name does not resolve.
pub fn resolve(host: &str, port: u16) -> Result<Vec<SocketAddr>> {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    (host, port)
        .to_socket_addrs()
        .map(|a| a.collect())
        .map_err(|e| Error::socket(format!("resolving {host}:{port}"), e))
}

/// Sends one request frame to the control listener at `host:port` and returns the reply payload.
///
/// # Errors
/// [`Error::Socket`] for connect, I/O and timeout failures; [`Error::MalformedMessage`] for a
/// bad reply frame.
pub fn request(
    host: &str,
    port: u16,
    kind: FrameType,
    payload: &[u8],
    connect_timeout: Duration,
    max_payload: usize,
    key: Option<&auth::ClusterKey>,
) -> Result<Vec<u8>> {
    exchange(host, port, kind, payload, connect_timeout, max_payload, key).map(|(reply, _)| reply)
}

/// As [`request`], and the connection the reply came on, still open: what the reply names on
/// this host can then be bound to the process at its other end
/// ([`crate::segment::Origin::served_over`]).
///
/// # Errors
/// As [`request`].
pub fn exchange(
    host: &str,
    port: u16,
    kind: FrameType,
    payload: &[u8],
    connect_timeout: Duration,
    max_payload: usize,
    key: Option<&auth::ClusterKey>,
) -> Result<(Vec<u8>, TcpStream)> {
    // A listener at its cap says so and closes: asked again after a backoff, within the
    // connect timeout, as room is made there.
    let give_up = std::time::Instant::now() + connect_timeout;
    let mut backoff = Duration::from_millis(10);
    loop {
        match exchange_once(host, port, kind, payload, connect_timeout, max_payload, key) {
            Err(Error::PeerRefused { reason, .. })
                if reason.contains(server::AT_CAP)
                    && std::time::Instant::now() + backoff < give_up =>
            {
                debug!(host, port, %reason, "control listener at its cap; asking again");
                std::thread::sleep(backoff);
                backoff = (backoff * 2).min(Duration::from_millis(500));
            }
            other => return other,
        }
    }
}

/// One try of [`exchange`].
fn exchange_once(
    host: &str,
    port: u16,
    kind: FrameType,
    payload: &[u8],
    connect_timeout: Duration,
    max_payload: usize,
    key: Option<&auth::ClusterKey>,
) -> Result<(Vec<u8>, TcpStream)> {
    let addrs = resolve(host, port)?;
    // Every address a name gives shares one connect timeout.
    let connect_end = std::time::Instant::now() + connect_timeout;
    let mut last = None;
    let mut stream = None;
    for addr in &addrs {
        match DeadlineStream::connect(addr, connect_end) {
            Ok(s) => {
                stream = Some(s.into_inner());
                break;
            }
            Err(e) => last = Some(e),
        }
    }
    let stream = stream.ok_or_else(|| {
        Error::socket(
            format!("connecting to {host}:{port}"),
            last.unwrap_or_else(|| std::io::ErrorKind::NotFound.into()),
        )
    })?;
    let _ = stream.set_nodelay(true);
    // The exchange (authentication, request, reply) ends by one deadline, however the peer
    // trickles its bytes.
    let io_timeout = connect_timeout.max(IDLE_TIMEOUT);
    let ctx = |what: &str| format!("{what} {host}:{port}");
    let mut s = DeadlineStream::new(stream, std::time::Instant::now() + io_timeout);
    if let Some(key) = key {
        auth::client_handshake(&mut s, key, &format!("{host}:{port}"))?;
    }
    let io_error =
        |what: &str, e: std::io::Error| Error::socket(ctx(what), e).timed_out_within(io_timeout);
    write_frame(&mut s, kind, payload).map_err(|e| io_error("writing to", e))?;
    let (reply_kind, reply) = read_frame(&mut s, max_payload).map_err(|e| match e {
        FrameError::Io(io) => io_error("reading from", io),
        other => Error::MalformedMessage(format!("reply from {host}:{port}: {other}")),
    })?;
    debug!(host, port, ?kind, bytes = reply.len(), "control reply");
    // A refusal is `{"error": …}` alone (wrong or missing cluster secret, a full queue, a
    // listener at its connection cap, which answers before it knows the request's type).
    if reply.first() == Some(&b'{') {
        if let Ok(serde_json::Value::Object(map)) = serde_json::from_slice(&reply) {
            if let (1, Some(reason)) = (map.len(), map.get("error").and_then(|e| e.as_str())) {
                return Err(Error::PeerRefused {
                    peer: format!("{host}:{port}"),
                    reason: reason.to_string(),
                });
            }
        }
    }
    if reply_kind != kind {
        return Err(Error::MalformedMessage(format!(
            "reply from {host}:{port} has type {reply_kind:?}, asked {kind:?}"
        )));
    }
    Ok((reply, s.into_inner()))
}

/// Splits a P2P segment name `host:port` (or `[v6]:port`).
///
/// # Errors
/// [`Error::InvalidArgument`] when there is no valid port.
pub fn split_host_port(name: &str) -> Result<(String, u16)> {
    let bad = || Error::InvalidArgument(format!("segment name {name:?} is not host:port"));
    let (host, port) = name.rsplit_once(':').ok_or_else(bad)?;
    let port: u16 = port.parse().map_err(|_| bad())?;
    if host.is_empty() || port == 0 {
        return Err(bad());
    }
    Ok((host.to_string(), port))
}

/// Splits a segment name as Mooncake's `parseHostNameWithPort` reads it: `host:port`,
/// `[v6]:port`, `[v6]`, a bare IPv6 address (`fe80::1`, `fe80::1%eth0`), an IPv6 address with a
/// scope and a port (`fe80::1%eth0:12345`), or a host alone. A name without a port means
/// `default_port` (`MC_HANDSHAKE_PORT`). IPv6 hosts come back bracketed. Unlike Mooncake, a port
/// that is there but not a port number is an error, not the default.
///
/// # Errors
/// [`Error::InvalidArgument`] for an empty host or a bad port.
pub fn parse_segment_name(name: &str, default_port: u16) -> Result<(String, u16)> {
    let bad = |why: &str| Error::InvalidArgument(format!("segment name {name:?}: {why}"));
    let port_of = |p: &str| match p.parse::<u16>() {
        Ok(port) if port != 0 => Ok(port),
        _ => Err(bad("the port is not 1..=65535")),
    };
    let is_v6 = |h: &str| {
        let (addr, scope) = h.split_once('%').unwrap_or((h, "x"));
        addr.parse::<std::net::Ipv6Addr>().is_ok() && !scope.is_empty() && !scope.contains(':')
    };
    if let Some(rest) = name.strip_prefix('[') {
        let (host, tail) = rest.split_once(']').ok_or_else(|| bad("no closing ]"))?;
        if !is_v6(host) {
            return Err(bad("not an IPv6 address in brackets"));
        }
        let port = match tail {
            "" => default_port,
            t => port_of(t.strip_prefix(':').ok_or_else(|| bad("junk after ]"))?)?,
        };
        return Ok((format!("[{host}]"), port));
    }
    if is_v6(name) {
        return Ok((format!("[{name}]"), default_port));
    }
    if let Some(scope) = name.find('%') {
        if let Some(colon) = name[scope..].find(':') {
            let (host, port) = name.split_at(scope + colon);
            if is_v6(host) {
                return Ok((format!("[{host}]"), port_of(&port[1..])?));
            }
        }
    }
    match name.rsplit_once(':') {
        None if !name.is_empty() => Ok((name.to_string(), default_port)),
        None => Err(bad("empty")),
        Some(("", _)) => Err(bad("no host")),
        Some((host, port)) => Ok((host.to_string(), port_of(port)?)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segment_names_as_mooncake_reads_them() {
        let ok = |name: &str, host: &str, port: u16| {
            assert_eq!(
                parse_segment_name(name, 12001).unwrap(),
                (host.to_string(), port),
                "{name}"
            );
        };
        ok("127.0.0.1:15000", "127.0.0.1", 15000);
        ok("127.0.0.1", "127.0.0.1", 12001);
        ok("node-a", "node-a", 12001);
        ok("node-a:9", "node-a", 9);
        ok("[::1]:9", "[::1]", 9);
        ok("[::1]", "[::1]", 12001);
        ok("::1", "[::1]", 12001);
        ok("fe80::1", "[fe80::1]", 12001);
        ok("fe80::1%eth0", "[fe80::1%eth0]", 12001);
        ok("fe80::1%eth0:7000", "[fe80::1%eth0]", 7000);
        ok("[fe80::1%eth0]:7000", "[fe80::1%eth0]", 7000);
        for bad in [
            "", ":80", "h:", "h:0", "h:70000", "h:x", "[::1", "[::1]x", "[host]:1",
        ] {
            assert!(parse_segment_name(bad, 12001).is_err(), "{bad}");
        }
        // A host and port the name resolves to, for IPv6 too.
        let (host, port) = parse_segment_name("::1", 12001).unwrap();
        assert_eq!(
            resolve(&host, port).unwrap()[0],
            "[::1]:12001".parse().unwrap()
        );
    }

    /// A peer that accepts and never answers (a stopped process: the kernel still accepts for
    /// it) ends the request after the time allowed, with an error that says so.
    #[test]
    fn a_peer_that_never_answers_is_a_timeout_that_says_so() {
        let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = silent.local_addr().unwrap().port();
        let err = request(
            "127.0.0.1",
            port,
            FrameType::Metadata,
            b"{}",
            Duration::from_millis(100),
            1 << 20,
            None,
        )
        .unwrap_err();
        let text = err.to_string();
        assert!(
            matches!(&err, Error::Socket { source, .. } if source.kind() == std::io::ErrorKind::TimedOut),
            "{text}"
        );
        let want = format!("reading from 127.0.0.1:{port}: no answer within 5 s");
        assert!(text.contains(&want), "{text}");
    }

    #[test]
    fn host_port_names() {
        assert_eq!(
            split_host_port("127.0.0.1:15000").unwrap(),
            ("127.0.0.1".into(), 15000)
        );
        assert_eq!(split_host_port("[::1]:9").unwrap(), ("[::1]".into(), 9));
        for bad in ["host", "host:", ":80", "h:0", "h:70000", "h:x"] {
            assert!(split_host_port(bad).is_err(), "{bad}");
        }
    }
}
