//! The metrics endpoint (a small HTTP/1.1 server on one thread: a scrape every few seconds
//! needs no more) and the periodic log. Both show [`crate::snapshot`], the sum of the watched
//! engines.
//!
//! The endpoint answers GET (and HEAD) on `/metrics`, `/metrics/json`, `/metrics/summary` and
//! `/health`; anything else is 404 or 405. A request is read with a time limit and a size
//! bound, and every connection is closed after its answer.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::MetricsError;

/// The longest request head read.
const MAX_REQUEST: usize = 8 << 10;
/// How long a client may take to send its request.
const READ_LIMIT: Duration = Duration::from_secs(2);

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
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
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
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let thread = std::thread::Builder::new()
            .name("te-metrics".into())
            .spawn(move || {
                for conn in listener.incoming() {
                    if stopping.load(Ordering::Acquire) {
                        return;
                    }
                    if let Ok(conn) = conn {
                        answer(conn, &*pages);
                    }
                }
            })
            .map_err(MetricsError::Thread)?;
        tracing::info!(addr = %bound, "metrics endpoint serving /metrics, /metrics/json, /metrics/summary, /health");
        Ok(MetricsServer {
            addr: bound,
            stop,
            thread: Some(thread),
        })
    }

    /// The address it is bound to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // Wakes the accept; it then sees the flag.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
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

fn answer(mut conn: TcpStream, pages: &dyn Pages) {
    let _ = conn.set_read_timeout(Some(READ_LIMIT));
    let _ = conn.set_write_timeout(Some(READ_LIMIT));
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < MAX_REQUEST {
        match conn.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    let (status, kind, body, head_only) = match route(&head) {
        Ok((method, path)) => {
            let (status, kind, body) = respond(pages, method, path);
            (status, kind, body, method == "HEAD")
        }
        Err(status) => (status, "text/plain", "bad request\n".into(), false),
    };
    let reply = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let _ = conn.write_all(reply.as_bytes());
    if !head_only {
        let _ = conn.write_all(body.as_bytes());
    }
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
