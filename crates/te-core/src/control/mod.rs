//! The control channel: one listener per engine serving the P2P descriptor exchange,
//! notifications and liveness probes (and, with RDMA, endpoint handshakes), plus the client side.
//!
//! Framing is Mooncake's (see [`frame`]); payloads are Mooncake's JSON. Many connections are
//! served at once, each with an idle timeout; a bad frame closes only its own connection.
//! With a cluster secret every connection must pass [`auth`]'s challenge-response before it
//! gets a descriptor, a notification in, a probe answer or an endpoint; a peer without it gets
//! a refusal naming the reason, and the connection closes.

pub mod auth;
pub mod frame;

use std::io::{BufReader, BufWriter};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use serde_json::json;
use tracing::{debug, warn};

use crate::error::{Error, Result};
use crate::net::{ConnectionHandler, ServiceListener};
use crate::notify::{Notification, NotificationQueue};
use frame::{FrameError, FrameType, read_frame, write_frame};

/// How long a control connection may sit idle (or stall mid-frame) before it is closed.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(5);
/// Control connections served at once.
pub const MAX_CONNECTIONS: usize = 1024;

/// What the control listener answers with.
pub struct ControlState {
    /// The local segment descriptor, serialised.
    pub local_desc: RwLock<Arc<String>>,
    /// Where received notifications go.
    pub notifications: Arc<NotificationQueue>,
    /// Largest frame payload accepted.
    pub max_payload: usize,
    /// The cluster key peers must prove, when a cluster secret is set.
    pub cluster_key: Option<Arc<auth::ClusterKey>>,
    /// Answers endpoint handshakes (`Connection` frames), when a transport set one up.
    pub connection_handler: RwLock<Option<ConnectionHandlerFn>>,
}

impl std::fmt::Debug for ControlState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlState")
            .field("max_payload", &self.max_payload)
            .field("authenticated", &self.cluster_key.is_some())
            .finish()
    }
}

/// A transport's answer to an endpoint handshake: request payload in, reply payload out.
pub type ConnectionHandlerFn = Arc<dyn Fn(&[u8]) -> Vec<u8> + Send + Sync>;

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
    fn answer(&self, kind: FrameType, payload: &[u8]) -> Vec<u8> {
        match kind {
            FrameType::Metadata => self
                .local_desc
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .as_bytes()
                .to_vec(),
            FrameType::Probe => br#"{"status":"success"}"#.to_vec(),
            FrameType::Notify => match serde_json::from_slice::<Notification>(payload) {
                Ok(n) => {
                    if self.notifications.push(n) {
                        br#"{"name":"","notify_msg":"success"}"#.to_vec()
                    } else {
                        json!({"error": "notification queue full"})
                            .to_string()
                            .into_bytes()
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
                    Some(h) => h(payload),
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

fn serve(state: &ControlState, stream: TcpStream) {
    let peer = stream.peer_addr().ok();
    let _ = stream.set_read_timeout(Some(IDLE_TIMEOUT));
    let _ = stream.set_write_timeout(Some(IDLE_TIMEOUT));
    let _ = stream.set_nodelay(true);
    let Ok(write_half) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(stream);
    let mut writer = BufWriter::new(write_half);
    let mut authenticated = state.cluster_key.is_none();
    loop {
        match read_frame(&mut reader, state.max_payload) {
            Ok((FrameType::Auth, hello)) if !authenticated => {
                let Some(key) = &state.cluster_key else {
                    return;
                };
                authenticated = auth::server_handshake(&mut reader, &mut writer, key, &hello);
                let _ = std::io::Write::flush(&mut writer);
                if !authenticated {
                    warn!(?peer, "control peer failed cluster authentication");
                    return;
                }
            }
            Ok((kind, _)) if !authenticated => {
                debug!(?peer, ?kind, "unauthenticated control request refused");
                let refusal = json!({"error": "te: authentication required: this cluster has a secret (MC_TE_CLUSTER_SECRET)"});
                let _ = write_frame(&mut writer, kind, refusal.to_string().as_bytes());
                return;
            }
            Ok((kind, payload)) => {
                let reply = state.answer(kind, &payload);
                if write_frame(&mut writer, kind, &reply).is_err() {
                    return;
                }
            }
            Err(FrameError::Closed) => return,
            Err(e) => {
                warn!(?peer, error = %e, "bad control frame; closing the connection");
                return;
            }
        }
    }
}

/// Starts serving `state` on `listener`.
///
/// # Errors
/// The accept thread cannot start.
pub fn start_server(
    listener: std::net::TcpListener,
    state: Arc<ControlState>,
) -> Result<ServiceListener> {
    let handler: ConnectionHandler = Arc::new(move |stream| serve(&state, stream));
    ServiceListener::spawn(listener, "te-control", MAX_CONNECTIONS, handler)
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
    let addrs = resolve(host, port)?;
    let mut last = None;
    let mut stream = None;
    for addr in &addrs {
        match TcpStream::connect_timeout(addr, connect_timeout) {
            Ok(s) => {
                stream = Some(s);
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
    let io_timeout = connect_timeout.max(IDLE_TIMEOUT);
    let ctx = |what: &str| format!("{what} {host}:{port}");
    stream
        .set_read_timeout(Some(io_timeout))
        .and_then(|_| stream.set_write_timeout(Some(io_timeout)))
        .map_err(|e| Error::socket(ctx("configuring"), e))?;
    let _ = stream.set_nodelay(true);
    let mut s = &stream;
    if let Some(key) = key {
        auth::client_handshake(&mut s, key, &format!("{host}:{port}"))?;
    }
    write_frame(&mut s, kind, payload).map_err(|e| Error::socket(ctx("writing to"), e))?;
    let (reply_kind, reply) = read_frame(&mut s, max_payload).map_err(|e| match e {
        FrameError::Io(io) => Error::socket(ctx("reading from"), io),
        other => Error::MalformedMessage(format!("reply from {host}:{port}: {other}")),
    })?;
    if reply_kind != kind {
        return Err(Error::MalformedMessage(format!(
            "reply from {host}:{port} has type {reply_kind:?}, asked {kind:?}"
        )));
    }
    debug!(host, port, ?kind, bytes = reply.len(), "control reply");
    // A refusal is `{"error": …}` alone (wrong or missing cluster secret, a full queue, …).
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
    Ok(reply)
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

#[cfg(test)]
mod tests {
    use super::*;

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
