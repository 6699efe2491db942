//! te-metadata: the HTTP metadata server Mooncake deployments run beside their engines, speaking
//! Mooncake's REST protocol on one path (default `/metadata`):
//!
//! - `GET <path>?key=K`: 200 and the value, or 404 when absent;
//! - `PUT <path>?key=K` (or `POST`) with the value as body: 200, or 507 when the store would
//!   grow past `max_stored`;
//! - `DELETE <path>?key=K`: 200, or 404 when absent.
//!
//! With a persistence file, every change is appended to a log beside it and synced before the
//! reply, so a restart loses nothing, and the log is folded into the file once it outgrows it
//! (`store.rs`). The changes of all the connections an event-loop turn serves share one sync:
//! each connection waits for its reply, parked, until the turn ends (`conn.rs`).
//!
//! It serves any number of connections, up to its cap, on a fixed number of event-loop threads
//! (te-core's reactor; `conn.rs`): a cluster's engines connecting at once, or clients that keep
//! connections open between requests, cost a file descriptor each, not a thread. Requests are
//! gathered without blocking and bounded (head 16 KiB, value `max_value`, `request.rs`), and
//! the values in transit on all connections together (bodies coming in, replies going out) are
//! bounded by `max_buffered` (`budget.rs`): past it a request is answered 503 and may be
//! retried, its connection kept. A request must be whole within `request_timeout` of its first
//! byte and a silent connection is
//! closed after `idle_timeout`, so slow or silent clients hold up nobody; a connection over the
//! cap is answered 503; a bad request gets a 4xx and, when it could not be read whole, closes only
//! its own connection.
//! It does not authenticate clients: run it on a trusted network (te's cluster secret keeps
//! segment secrets out of what it stores).
#![forbid(unsafe_code)]

mod budget;
mod conn;
mod metrics;
mod request;
mod store;

use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use te_reactor::http::percent_decode;
use te_reactor::{Deal, ServerSettings};
use tracing::{info, warn};

use budget::Hold;
use request::Request;
use store::Store;

/// Settings of a server.
#[derive(Clone, Debug)]
pub struct Options {
    /// The path requests must use (`/metadata`).
    pub path: String,
    /// Where to keep the keys across restarts, if anywhere: a snapshot there and a log of
    /// changes beside it (its name with `.log` added).
    pub persist: Option<PathBuf>,
    /// Largest value accepted, bytes.
    pub max_value: usize,
    /// Bytes the keys held may cost together: each its key's bytes, its value's and 64 for
    /// the map's bookkeeping. A PUT that would grow the store past it is answered 507 and
    /// stores nothing; a DELETE, or a PUT that grows nothing, is always taken.
    pub max_stored: usize,
    /// Bytes of values all connections together may hold in transit: bodies being received,
    /// replies carrying values waiting to be sent. At least `max_value`.
    pub max_buffered: usize,
    /// Connections served at once; more are answered 503 and closed. Each costs a file
    /// descriptor (the binary raises its open-file limit to fit).
    pub max_connections: usize,
    /// Connections the kernel holds before they are accepted (the listener's backlog; Linux
    /// caps it at `net.core.somaxconn`): a cluster's engines starting together connect at once,
    /// and the standard library's 128 would drop their SYNs for a second.
    pub backlog: usize,
    /// Event-loop threads serving the connections.
    pub threads: usize,
    /// How long a connection may stay with nothing moving either way (between requests, or
    /// with a reply its client does not read) before it is closed.
    pub idle_timeout: Duration,
    /// How long a request may take to arrive whole, from its first byte.
    pub request_timeout: Duration,
    /// Connections one source address may hold (0: no cap of its own; this host's addresses
    /// are not capped).
    pub max_per_address: usize,
    /// The token every request must carry (`Authorization: Bearer <token>`), if any: a
    /// request without it is answered 401 before its body is read. Never printed.
    pub token: Option<te_reactor::secret::Redacted>,
    /// Where to serve the server's metrics (`/metrics`, `/metrics/json`, `/metrics/summary`,
    /// `/health`), if anywhere.
    pub metrics_addr: Option<SocketAddr>,
}

impl Options {
    /// Whether the options can serve: a budget for values in transit that the largest value
    /// could never fit is refused, in the binary's flag names.
    ///
    /// # Errors
    /// What is wrong, one sentence.
    pub fn check(&self) -> Result<(), String> {
        match self.max_buffered < self.max_value {
            true => Err(format!(
                "--max-buffered {} is below --max-value {}: the largest value could never come in",
                self.max_buffered, self.max_value
            )),
            false => Ok(()),
        }
    }
}

impl Default for Options {
    fn default() -> Self {
        Options {
            path: "/metadata".into(),
            persist: None,
            max_value: 16 << 20,
            max_stored: 2 << 30,
            max_buffered: 1 << 30,
            max_connections: 10_000,
            backlog: 4096,
            threads: 2,
            idle_timeout: Duration::from_secs(30),
            request_timeout: Duration::from_secs(30),
            max_per_address: 256,
            token: None,
            metrics_addr: None,
        }
    }
}

/// A running server. Dropping it stops it.
pub struct Server {
    addr: SocketAddr,
    reactor: te_reactor::Server,
    metrics: Option<te_metrics::MetricsServer>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("addr", &self.addr)
            .field("connections", &self.reactor.connections())
            .finish()
    }
}

impl Server {
    /// Serves on `listener` with `options`, loading the persistence file if there is one.
    ///
    /// # Errors
    /// The options fail [`Options::check`], the
    /// persistence files cannot be read or synced, the snapshot is not a JSON object of strings
    /// or a line of the log is not a change, or the event loops cannot be set up.
    pub fn start(listener: TcpListener, options: Options) -> std::io::Result<Server> {
        options
            .check()
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
        let store = Arc::new(Store::load(options.persist.clone(), options.max_stored)?);
        let settings = ServerSettings {
            threads: options.threads.max(1),
            max_connections: options.max_connections.max(1),
            per_address: te_reactor::AddressCap {
                max: options.max_per_address,
                loopback: false,
            },
            deal: Deal::RoundRobin,
            backlog: options.backlog,
            congestion: te_reactor::congestion::Congestion::Host,
        };
        let authorization = options.token.as_ref().map(|t| {
            Arc::new(te_reactor::secret::Redacted(format!(
                "Bearer {}",
                t.expose()
            )))
        });
        let counters = Arc::new(metrics::ServerMetrics::default());
        let protocol = Arc::new(conn::MetadataProtocol {
            store: store.clone(),
            budget: budget::Budget::new(options.max_buffered),
            options: Arc::new(options),
            authorization,
            metrics: counters.clone(),
        });
        let open = protocol.options.token.is_none();
        let metrics_addr = protocol.options.metrics_addr;
        // Dropped on a metrics error below, the reactor stops again.
        let reactor = te_reactor::Server::start(listener, protocol, settings)?;
        let metrics = match metrics_addr {
            None => None,
            Some(at) => {
                let pages = Arc::new(metrics::MetadataPages {
                    metrics: counters,
                    store,
                    held: reactor.held(),
                });
                Some(
                    te_metrics::MetricsServer::start_with(at, pages).map_err(|e| match e {
                        te_metrics::MetricsError::Bind { source, .. } => std::io::Error::new(
                            source.kind(),
                            format!("--metrics-addr {at}: {source}"),
                        ),
                        other => std::io::Error::other(other.to_string()),
                    })?,
                )
            }
        };
        let addr = reactor.local_addr();
        info!(%addr, "metadata server listening");
        if open && !addr.ip().is_loopback() {
            warn!(%addr, "no --token-file: anyone who reaches this address can read, change \
                and delete every key (engines' descriptors included)");
        }
        Ok(Server {
            addr,
            reactor,
            metrics,
        })
    }

    /// Where its metrics are served, if they are.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics.as_ref().map(te_metrics::MetricsServer::addr)
    }

    /// The address served.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Connections held now.
    pub fn connections(&self) -> usize {
        self.reactor.connections()
    }

    /// Stops serving: the listener and every connection close. A change already applied was
    /// persisted before it was answered.
    pub fn stop(&mut self) {
        self.reactor.shutdown();
    }
}

/// The key of a request target `path?key=...`, when the path is ours.
fn key_of(target: &str, path: &str) -> Result<String, (u16, &'static str)> {
    let (p, query) = target.split_once('?').unwrap_or((target, ""));
    if p != path {
        return Err((404, "unknown path"));
    }
    query
        .split('&')
        .find_map(|kv| kv.strip_prefix("key="))
        .ok_or((400, "missing key"))
        .and_then(|k| percent_decode(k).ok_or((400, "bad key encoding")))
        .and_then(|k| match k.is_empty() {
            true => Err((400, "empty key")),
            false => Ok(k),
        })
}

/// The answer to a request: now, or once its change is durable.
#[derive(Debug)]
enum Answer {
    /// The status and body.
    Now(u16, Vec<u8>),
    /// A change written to the log: 200 and `done` once its ticket is filled, else 500.
    Durable {
        ticket: store::Ticket,
        done: &'static str,
    },
}

/// The answer to a change submitted to `store`: `done` when applied.
fn submitted(
    store: &Store,
    key: &str,
    value: Option<&str>,
    done: &'static str,
    absent: &'static str,
) -> Answer {
    match store.submit(key, value) {
        Ok(store::Submitted::Done) => Answer::Now(200, done.into()),
        Ok(store::Submitted::Absent) => Answer::Now(404, absent.into()),
        Ok(store::Submitted::Waiting(ticket)) => Answer::Durable { ticket, done },
        Err(e) if e.kind() == std::io::ErrorKind::StorageFull => {
            Answer::Now(507, format!("not stored: {e}").into_bytes())
        }
        Err(e) => Answer::Now(500, format!("not persisted, not changed: {e}").into_bytes()),
    }
}

/// What answers `request`; a value sent back is held against `reply_hold` (room asked for
/// before the value is copied: a 503 if there is none).
fn answer(store: &Store, options: &Options, request: &Request, reply_hold: &mut Hold) -> Answer {
    let key = match key_of(&request.target, &options.path) {
        Err((status, why)) => return Answer::Now(status, why.as_bytes().to_vec()),
        Ok(key) => key,
    };
    match request.method.as_str() {
        "GET" => store
            .with_value(&key, |v| match conn::hold_reply(reply_hold, v.len()) {
                Ok(()) => Answer::Now(200, v.as_bytes().to_vec()),
                Err(spent) => Answer::Now(503, spent.to_string().into_bytes()),
            })
            .unwrap_or_else(|| Answer::Now(404, b"metadata not found".to_vec())),
        "PUT" | "POST" => match std::str::from_utf8(&request.body) {
            Err(_) => Answer::Now(400, b"value is not UTF-8".to_vec()),
            Ok(value) => submitted(store, &key, Some(value), "metadata updated", ""),
        },
        "DELETE" => submitted(store, &key, None, "metadata deleted", "metadata not found"),
        _ => Answer::Now(405, b"method not allowed".to_vec()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_listener_takes_the_configured_backlog() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let options = Options {
            backlog: 1000,
            ..Options::default()
        };
        let server = Server::start(listener, options).unwrap();
        assert_eq!(te_testkit::listen_backlog(server.addr().port()), ["1000"]);
    }

    #[test]
    fn keys_come_from_the_query() {
        assert_eq!(
            key_of("/metadata?key=mooncake%2Fram%2Fa", "/metadata").unwrap(),
            "mooncake/ram/a"
        );
        assert_eq!(key_of("/metadata?x=1&key=b", "/metadata").unwrap(), "b");
        assert_eq!(key_of("/other?key=b", "/metadata").unwrap_err().0, 404);
        assert_eq!(key_of("/metadata", "/metadata").unwrap_err().0, 400);
        assert_eq!(key_of("/metadata?key=", "/metadata").unwrap_err().0, 400);
        assert_eq!(key_of("/metadata?key=%zz", "/metadata").unwrap_err().0, 400);
    }
}
