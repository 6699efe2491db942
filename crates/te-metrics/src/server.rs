//! The metrics endpoint and the periodic log. Both show [`crate::snapshot`], the sum of the
//! watched engines.
//!
//! The endpoint answers GET (and HEAD) on `/metrics`, `/metrics/json`, `/metrics/summary` and
//! `/health`; anything else is 404 or 405. It runs on one te-reactor event loop, so a slow
//! client holds a connection, never the thread: every request must arrive whole within
//! [`REQUEST_DEADLINE`] of its connection's accept (an absolute deadline, not one renewed per
//! byte), a head is at most [`MAX_REQUEST`] bytes, every connection is closed after its
//! answer, one source holds at most [`PER_SOURCE`] connections and the endpoint [`MAX_HELD`],
//! the oldest making room for a newcomer. `/health` answers within milliseconds whatever
//! other clients do.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use te_reactor::{Outbox, Protocol, Refusal, Server, Step};

use crate::MetricsError;

/// The longest request head read.
const MAX_REQUEST: usize = 8 << 10;
/// How long a client has, from its connection, to send its request whole.
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(2);
/// Connections held at once.
const MAX_HELD: usize = 256;
/// Connections one source holds at once.
const PER_SOURCE: usize = 16;

/// What an endpoint serves: the engines' figures ([`MetricsServer::start`]) or a server's own
/// (te-metadata's).
pub trait Pages: Send + Sync + 'static {
    /// `/metrics`: Prometheus's text format.
    fn prometheus(&self) -> String;
    /// `/metrics/json`.
    fn json(&self) -> String;
    /// `/metrics/summary`: one line.
    fn summary(&self) -> String;
}

/// The watched engines' figures.
struct Engines;

impl Pages for Engines {
    fn prometheus(&self) -> String {
        crate::prometheus_text(&crate::snapshot())
    }
    fn json(&self) -> String {
        crate::json(&crate::snapshot()).to_string()
    }
    fn summary(&self) -> String {
        crate::summary(&crate::snapshot())
    }
}

/// The running endpoint; stops when dropped.
#[derive(Debug)]
pub struct MetricsServer {
    addr: SocketAddr,
    server: Server,
}

impl MetricsServer {
    /// Binds `addr` (port 0: any free one) and serves the watched engines' figures on a
    /// thread of its own.
    ///
    /// # Errors
    /// [`MetricsError::Bind`] when the address cannot be bound; [`MetricsError::Thread`].
    pub fn start(addr: SocketAddr) -> Result<MetricsServer, MetricsError> {
        Self::start_with(addr, Arc::new(Engines))
    }

    /// As [`start`](Self::start), serving `pages`.
    ///
    /// # Errors
    /// As [`start`](Self::start).
    pub fn start_with(
        addr: SocketAddr,
        pages: Arc<dyn Pages>,
    ) -> Result<MetricsServer, MetricsError> {
        let listener = TcpListener::bind(addr).map_err(|source| MetricsError::Bind {
            addr: addr.to_string(),
            source,
        })?;
        let bound = listener.local_addr().map_err(MetricsError::Thread)?;
        let settings = te_reactor::ServerSettings {
            threads: 1,
            max_connections: MAX_HELD,
            per_address: te_reactor::AddressCap {
                max: PER_SOURCE,
                loopback: true,
            },
            deal: te_reactor::Deal::RoundRobin,
            backlog: 1024,
            congestion: te_reactor::congestion::Congestion::Host,
        };
        let server = Server::start(listener, Arc::new(PageProtocol { pages }), settings)
            .map_err(MetricsError::Thread)?;
        tracing::info!(addr = %bound, "metrics endpoint serving /metrics, /metrics/json, /metrics/summary, /health");
        Ok(MetricsServer {
            addr: bound,
            server,
        })
    }

    /// The address it is bound to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Connections held now.
    pub fn connections(&self) -> usize {
        self.server.connections()
    }
}

/// The endpoint's protocol: one request and its answer per connection.
struct PageProtocol {
    pages: Arc<dyn Pages>,
}

/// One connection: the head read so far, then the answer going out.
struct PageConn {
    head: Vec<u8>,
    out: Outbox,
    answered: bool,
    opened: Instant,
    last: Instant,
}

impl PageConn {
    fn head_done(&self) -> bool {
        self.head.windows(4).any(|w| w == b"\r\n\r\n") || self.head.len() >= MAX_REQUEST
    }
}

impl Protocol for PageProtocol {
    type Conn = PageConn;

    fn name(&self) -> &'static str {
        "te-metrics"
    }

    fn open(&self, _peer: SocketAddr, _stream: &mio::net::TcpStream) -> PageConn {
        let now = Instant::now();
        PageConn {
            head: Vec::new(),
            out: Outbox::default(),
            answered: false,
            opened: now,
            last: now,
        }
    }

    fn drive(&self, c: &mut PageConn, mut stream: &mio::net::TcpStream) -> Step {
        loop {
            if let Some(step) = c.out.send(stream, &mut c.last) {
                return step;
            }
            if c.answered {
                return Step::Close;
            }
            if c.head_done() {
                c.out.push(&answer(&c.head, &*self.pages));
                c.answered = true;
                continue;
            }
            let mut buf = [0u8; 1024];
            let room = (MAX_REQUEST - c.head.len()).min(buf.len());
            match stream.read(&mut buf[..room]) {
                Ok(0) => return Step::Close,
                Ok(n) => c.head.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Step::Blocked,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => return Step::Close,
            }
        }
    }

    fn expired(&self, c: &PageConn, now: Instant) -> bool {
        now.duration_since(c.opened) > REQUEST_DEADLINE
    }

    fn proves(&self) -> bool {
        true
    }

    /// No client proves anything here: at a cap the oldest makes room.
    fn unproven_since(&self, c: &PageConn) -> Option<Instant> {
        Some(c.opened)
    }

    fn refuse(&self, mut stream: &mio::net::TcpStream, _peer: SocketAddr, _why: Refusal) {
        let _ = stream.write(
            b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        );
    }
}

/// What a request's head asks for: (method, path), or why it is refused.
fn route(head: &[u8]) -> Result<(&str, &str), &'static str> {
    let line = head.split(|b| *b == b'\n').next().unwrap_or_default();
    let line = std::str::from_utf8(line)
        .map_err(|_| "400 Bad Request")?
        .trim_end();
    let mut parts = line.split(' ');
    match (parts.next(), parts.next(), parts.next()) {
        (Some(method), Some(target), Some(version)) if version.starts_with("HTTP/1.") => {
            Ok((method, target.split('?').next().unwrap_or(target)))
        }
        _ => Err("400 Bad Request"),
    }
}

/// The status, content type and body for `method` on `path`.
fn respond(pages: &dyn Pages, method: &str, path: &str) -> (&'static str, &'static str, String) {
    if method != "GET" && method != "HEAD" {
        return ("405 Method Not Allowed", "text/plain", "GET only\n".into());
    }
    match path {
        "/metrics" => ("200 OK", prometheus::TEXT_FORMAT, pages.prometheus()),
        "/metrics/json" => ("200 OK", "application/json", pages.json()),
        "/metrics/summary" => (
            "200 OK",
            "text/plain; charset=utf-8",
            pages.summary() + "\n",
        ),
        "/health" => ("200 OK", "text/plain", "OK\n".into()),
        _ => ("404 Not Found", "text/plain", "not found\n".into()),
    }
}

/// The whole answer to the request whose head is `head`.
fn answer(head: &[u8], pages: &dyn Pages) -> Vec<u8> {
    let (status, kind, body, head_only) = match route(head) {
        Ok((method, path)) => {
            let (status, kind, body) = respond(pages, method, path);
            (status, kind, body, method == "HEAD")
        }
        Err(status) => (status, "text/plain", "bad request\n".into(), false),
    };
    let mut reply = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    if !head_only {
        reply.extend_from_slice(body.as_bytes());
    }
    reply
}

/// The periodic log: TENT's summary of totals, or the classic engine's line (Mooncake's
/// `MC_TE_METRIC`: throughput and latency distribution over the interval, nothing when
/// idle). Stops when dropped.
#[derive(Debug)]
pub struct Reporter {
    stop: Arc<(std::sync::Mutex<bool>, std::sync::Condvar)>,
    thread: Option<JoinHandle<()>>,
}

impl Reporter {
    /// Logs every `every`, the classic line when `classic`.
    ///
    /// # Errors
    /// [`MetricsError::Thread`].
    pub fn start(every: Duration, classic: bool) -> Result<Reporter, MetricsError> {
        let stop = Arc::new((std::sync::Mutex::new(false), std::sync::Condvar::new()));
        let stopping = stop.clone();
        let thread = std::thread::Builder::new()
            .name("te-metric-log".into())
            .spawn(move || {
                let (lock, cv) = &*stopping;
                let mut last = crate::snapshot();
                let mut stopped = lock.lock().unwrap_or_else(|e| e.into_inner());
                loop {
                    stopped = cv
                        .wait_timeout(stopped, every)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                    if *stopped {
                        return;
                    }
                    let now = crate::snapshot();
                    if !classic {
                        tracing::info!("[Metrics] {}", crate::summary(&now));
                    } else if let Some(line) = crate::classic_report(
                        every.as_secs(),
                        moved(&now).saturating_sub(moved(&last)),
                        &now.task_latency_us.since(&last.task_latency_us),
                    ) {
                        tracing::info!("{line}");
                    }
                    last = now;
                }
            })
            .map_err(MetricsError::Thread)?;
        Ok(Reporter {
            stop,
            thread: Some(thread),
        })
    }
}

/// Bytes of completed requests, both operations.
fn moved(s: &crate::counters::Snapshot) -> u64 {
    s.series.iter().map(|x| x.bytes).sum()
}

impl Drop for Reporter {
    fn drop(&mut self) {
        *self.stop.0.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.stop.1.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_routed_and_bad_ones_refused() {
        assert_eq!(
            route(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"),
            Ok(("GET", "/metrics"))
        );
        assert_eq!(
            route(b"GET /metrics/json?x=1 HTTP/1.0\r\n\r\n"),
            Ok(("GET", "/metrics/json"))
        );
        assert_eq!(route(b"\xff\xfe"), Err("400 Bad Request"));
        assert_eq!(route(b"GET /metrics\r\n\r\n"), Err("400 Bad Request"));
        assert_eq!(
            respond(&Engines, "POST", "/metrics").0,
            "405 Method Not Allowed"
        );
        assert_eq!(respond(&Engines, "GET", "/nope").0, "404 Not Found");
        assert_eq!(
            respond(&Engines, "GET", "/health"),
            ("200 OK", "text/plain", "OK\n".to_string())
        );
    }

    /// GET `path` on a fresh connection, waiting at most `wait` for the whole answer.
    fn get(addr: SocketAddr, path: &str, wait: Duration) -> std::io::Result<String> {
        let mut s = std::net::TcpStream::connect(addr)?;
        s.set_read_timeout(Some(wait))?;
        write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n")?;
        let mut got = String::new();
        s.read_to_string(&mut got)?;
        Ok(got)
    }

    /// Clients that send half a head, or trickle one, hold connections and nothing else:
    /// `/health` is answered at once all along, each slow client is closed at its deadline from
    /// accept, and a source holding its cap makes room with its oldest.
    #[test]
    fn slow_clients_cannot_hold_the_endpoint() {
        let server = MetricsServer::start("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = server.addr();
        let mut slow: Vec<std::net::TcpStream> = (0..PER_SOURCE + 4)
            .map(|_| {
                let mut s = std::net::TcpStream::connect(addr).unwrap();
                s.write_all(b"GET /metr").unwrap();
                s
            })
            .collect();
        let mut trickler = std::net::TcpStream::connect(addr).unwrap();
        let opened = Instant::now();
        let health = get(addr, "/health", Duration::from_secs(1)).expect("answered at once");
        assert!(
            health.starts_with("HTTP/1.1 200") && health.ends_with("OK\n"),
            "{health}"
        );
        // The trickler sends a byte every 300 ms: each read is short, the request never whole.
        let mut closed_at = None;
        for b in b"GET /metrics HTTP/1.1\r\n".iter() {
            if trickler.write_all(&[*b]).is_err() {
                closed_at = Some(opened.elapsed());
                break;
            }
            let h = get(addr, "/health", Duration::from_secs(1)).expect("answered meanwhile");
            assert!(h.starts_with("HTTP/1.1 200"), "{h}");
            std::thread::sleep(Duration::from_millis(300));
        }
        let closed_at = closed_at.expect("the trickler was cut off");
        assert!(closed_at >= REQUEST_DEADLINE, "{closed_at:?}");
        // Every slow client is gone: by its deadline, or to make room for a newer one.
        for s in &mut slow {
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let mut rest = Vec::new();
            assert!(s.read_to_end(&mut rest).is_ok(), "closed");
            assert!(rest.is_empty() || rest.starts_with(b"HTTP/1.1 503"));
        }
        assert!(server.connections() <= 1, "{}", server.connections());
    }

    #[test]
    fn a_taken_port_is_an_error_naming_it() {
        let first = MetricsServer::start("127.0.0.1:0".parse().unwrap()).unwrap();
        let e = MetricsServer::start(first.addr()).unwrap_err().to_string();
        assert!(
            e.contains(&first.addr().to_string()) && e.contains("TENT_METRICS_HTTP_PORT"),
            "{e}"
        );
    }
}
