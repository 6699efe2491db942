//! The HTTP metadata backend: Mooncake's REST protocol (`GET/PUT/DELETE <url>?key=<key>`, 404
//! when absent), spoken over plain HTTP/1.1 on keep-alive connections (a few kept idle between
//! requests, as Mooncake's curl handles are; one the server closed while idle is replaced and the
//! request sent again, which these idempotent requests allow). The message framing is
//! [`te_reactor::http`]'s, shared with the te-metadata server. HTTPS is not spoken.

use std::io::{BufRead, BufReader, Write};
use std::net::ToSocketAddrs;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::KvStore;
use crate::{KvError as Error, Result};
use te_reactor::deadline::DeadlineStream;
use te_reactor::http::{percent_encode, read_body, read_head};

fn bad(what: impl Into<String>) -> Error {
    Error::MalformedMessage(what.into())
}

/// Connections kept open between requests, at most (requests from more threads at once open
/// more, closed after use).
const IDLE_CONNECTIONS: usize = 4;
/// A connection idle longer than this is closed rather than used: servers close idle
/// connections (te-metadata after 30 s by default), and one closed under a request costs a
/// second try.
const IDLE_REUSE: Duration = Duration::from_secs(20);

/// An open connection to the server.
#[derive(Debug)]
struct Connection {
    reader: BufReader<DeadlineStream>,
    /// When it was last given back.
    idle_since: Instant,
    /// The process that opened it: a child forked since (Python's multiprocessing) shares the
    /// socket with its parent, and must not interleave its requests with the parent's.
    pid: u32,
}

/// How an exchange on a connection went wrong.
enum Failure {
    /// Nothing came back: on a connection used before, the server had closed it while idle,
    /// and the request may be sent again on a new one.
    Unanswered(Error),
    /// Anything else.
    Other(Error),
}

/// A client of Mooncake's HTTP metadata server. Clones share their idle connections.
#[derive(Debug, Clone)]
pub struct HttpStore {
    url: String,
    authority: String,
    path: String,
    timeout: Duration,
    max_len: usize,
    idle: Arc<Mutex<Vec<Connection>>>,
    /// `Authorization` header line sent with every request, if the server wants a token
    /// (never printed).
    authorization: Option<te_reactor::secret::Redacted>,
}

impl HttpStore {
    /// A client for `url` (`http://host:port/path`).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for HTTPS or a URL without a host.
    pub fn new(url: &str, timeout: Duration, max_len: usize) -> Result<Self> {
        let rest = url.strip_prefix("http://").ok_or_else(|| {
            Error::InvalidArgument(format!("{url}: only http:// is spoken (no TLS)"))
        })?;
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        if authority.is_empty() {
            return Err(Error::InvalidArgument(format!("{url}: no host")));
        }
        let authority = match authority.contains(':') {
            true => authority.to_string(),
            false => format!("{authority}:80"),
        };
        Ok(HttpStore {
            url: url.to_string(),
            authority,
            path: path.to_string(),
            timeout,
            max_len,
            idle: Arc::new(Mutex::new(Vec::new())),
            authorization: None,
        })
    }

    /// Sends `token` (printable ASCII) with every request, as te-metadata's `--token-file`
    /// asks: `Authorization: Bearer <token>`.
    pub fn with_token(mut self, token: Option<String>) -> Self {
        self.authorization =
            token.map(|t| te_reactor::secret::Redacted(format!("Authorization: Bearer {t}\r\n")));
        self
    }

    /// Connections open and idle now.
    pub fn idle_connections(&self) -> usize {
        self.idle.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// `method` on `key` with `body`: the status and body of the answer, all of it (a second
    /// try on a new connection included) within the client's timeout from now, however the
    /// server trickles its answer.
    fn request(&self, method: &str, key: &str, body: &[u8]) -> Result<(u16, Vec<u8>)> {
        let end = Instant::now() + self.timeout;
        let reused = {
            let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
            let pid = std::process::id();
            idle.retain(|c| c.pid == pid && c.idle_since.elapsed() < IDLE_REUSE);
            idle.pop()
        };
        if let Some(mut conn) = reused {
            conn.reader.get_mut().set_deadline(end);
            match self.exchange(conn, method, key, body) {
                Ok(answer) => return Ok(answer),
                Err(Failure::Unanswered(_)) => {}
                Err(Failure::Other(e)) => return Err(e),
            }
        }
        let conn = self.connect(method, end)?;
        self.exchange(conn, method, key, body)
            .map_err(|(Failure::Unanswered(e) | Failure::Other(e))| e)
    }

    /// A new connection to the server, for an exchange that must end by `end`.
    fn connect(&self, method: &str, end: Instant) -> Result<Connection> {
        let fail = |what: String| Error::Metadata(format!("{} {}: {what}", method, self.url));
        let addr = self
            .authority
            .to_socket_addrs()
            .map_err(|e| fail(format!("resolving {}: {e}", self.authority)))?
            .next()
            .ok_or_else(|| fail(format!("{} resolves to nothing", self.authority)))?;
        let stream =
            DeadlineStream::connect(&addr, end).map_err(|e| fail(format!("connecting: {e}")))?;
        let _ = stream.get_ref().set_nodelay(true);
        Ok(Connection {
            reader: BufReader::new(stream),
            idle_since: Instant::now(),
            pid: std::process::id(),
        })
    }

    /// Sends one request on `conn` and reads its answer; the connection is kept for the next
    /// request when the answer allows it.
    fn exchange(
        &self,
        mut conn: Connection,
        method: &str,
        key: &str,
        body: &[u8],
    ) -> std::result::Result<(u16, Vec<u8>), Failure> {
        let fail = |what: String| Error::Metadata(format!("{} {}: {what}", method, self.url));
        let sep = if self.path.contains('?') { '&' } else { '?' };
        let mut req = format!(
            "{method} {}{sep}key={} HTTP/1.1\r\nHost: {}\r\n{}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            self.path,
            percent_encode(key),
            self.authority,
            self.authorization
                .as_ref()
                .map_or("", te_reactor::secret::Redacted::expose),
            body.len()
        )
        .into_bytes();
        req.extend_from_slice(body);
        if let Err(e) = conn.reader.get_mut().write_all(&req) {
            return Err(Failure::Unanswered(fail(format!("sending: {e}"))));
        }
        // The first byte of the answer, or the close of a connection the server had dropped.
        match conn.reader.fill_buf() {
            Ok([]) => {
                return Err(Failure::Unanswered(fail("closed without an answer".into())));
            }
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::ConnectionReset
                        | std::io::ErrorKind::ConnectionAborted
                        | std::io::ErrorKind::BrokenPipe
                ) =>
            {
                return Err(Failure::Unanswered(fail(format!("receiving: {e}"))));
            }
            Err(e) => {
                let e = Error::socket("reading an HTTP head", e).timed_out_within(self.timeout);
                return Err(Failure::Other(e));
            }
        }
        let head = read_head(&mut conn.reader)
            .map_err(|e| Failure::Other(Error::from(e).timed_out_within(self.timeout)))?
            .ok_or_else(|| Failure::Other(fail("closed without an answer".into())))?;
        let status: u16 = head
            .first_line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| {
                Failure::Other(bad(format!("bad HTTP status line {:?}", head.first_line)))
            })?;
        let body = read_body(&mut conn.reader, &head, self.max_len, true)
            .map_err(|e| Failure::Other(Error::from(e).timed_out_within(self.timeout)))?;
        // Kept when the server keeps it and the answer's end was where its length said.
        let closes = head
            .header("connection")
            .is_some_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case("close")))
            || head.first_line.starts_with("HTTP/1.0")
            || head.header("content-length").is_none();
        if !closes {
            conn.idle_since = Instant::now();
            let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
            if idle.len() < IDLE_CONNECTIONS {
                idle.push(conn);
            }
        }
        Ok((status, body))
    }
}

impl KvStore for HttpStore {
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>> {
        match self.request("GET", key, b"")? {
            (200, body) => Ok(Some(body)),
            (404, _) => Ok(None),
            (status, body) => Err(Error::Metadata(format!(
                "GET {} key {key}: HTTP {status}: {}",
                self.url,
                String::from_utf8_lossy(&body[..body.len().min(200)])
            ))),
        }
    }

    fn put(&self, key: &str, value: &[u8]) -> Result<()> {
        match self.request("PUT", key, value)? {
            (200..=299, _) => Ok(()),
            (status, body) => Err(Error::Metadata(format!(
                "PUT {} key {key}: HTTP {status}: {}",
                self.url,
                String::from_utf8_lossy(&body[..body.len().min(200)])
            ))),
        }
    }

    fn delete(&self, key: &str) -> Result<()> {
        match self.request("DELETE", key, b"")? {
            (200..=299 | 404, _) => Ok(()),
            (status, _) => Err(Error::Metadata(format!(
                "DELETE {} key {key}: HTTP {status}",
                self.url
            ))),
        }
    }

    fn describe(&self) -> String {
        self.url.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_checked() {
        assert!(HttpStore::new("https://h/m", Duration::from_secs(1), 10).is_err());
        assert!(HttpStore::new("http:///m", Duration::from_secs(1), 10).is_err());
        let s = HttpStore::new("http://h/metadata", Duration::from_secs(1), 10).unwrap();
        assert_eq!(
            (s.authority.as_str(), s.path.as_str()),
            ("h:80", "/metadata")
        );
    }
}
