//! The HTTP metadata backend: Mooncake's REST protocol (`GET/PUT/DELETE <url>?key=<key>`, 404
//! when absent), spoken over plain HTTP/1.1 on keep-alive connections (a few kept idle between
//! requests, as Mooncake's curl handles are; one the server closed while idle is replaced and the
//! request sent again, which these idempotent requests allow), and the message framing the
//! te-metadata server shares: heads and bodies read with hard size bounds, `Content-Length` or
//! chunked bodies, percent-encoded keys. HTTPS is not spoken.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::store::KvStore;
use crate::error::{Error, Result};

/// Longest request or status line plus headers accepted.
pub const MAX_HEAD: usize = 16 << 10;

/// Percent-encodes everything but RFC 3986's unreserved characters.
pub fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 3);
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// Decodes `%XX` escapes and `+` (as a space); `None` for a bad escape or non-UTF-8 result.
pub fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = s.get(i + 1..i + 3)?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

/// A request or status line and its headers (names lower-cased).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    /// `GET /metadata?key=… HTTP/1.1` or `HTTP/1.1 200 OK`.
    pub first_line: String,
    /// Header names (lower case) and values.
    pub headers: Vec<(String, String)>,
}

impl Head {
    /// The first value of header `name` (lower case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

fn bad(what: impl Into<String>) -> Error {
    Error::MalformedMessage(what.into())
}

/// Reads a head of at most [`MAX_HEAD`] bytes; `Ok(None)` when the peer closed first.
///
/// # Errors
/// [`Error::MalformedMessage`] for an oversized or garbled head, [`Error::Socket`] on I/O.
pub fn read_head(r: &mut impl BufRead) -> Result<Option<Head>> {
    let mut lines = Vec::new();
    let mut total = 0;
    loop {
        let mut line = Vec::new();
        let n = r
            .by_ref()
            .take((MAX_HEAD - total + 1) as u64)
            .read_until(b'\n', &mut line)
            .map_err(|e| Error::socket("reading an HTTP head", e))?;
        if n == 0 {
            return match lines.is_empty() {
                true => Ok(None),
                false => Err(bad("HTTP head cut short")),
            };
        }
        total += n;
        if total > MAX_HEAD {
            return Err(bad(format!("HTTP head over {MAX_HEAD} bytes")));
        }
        let line = String::from_utf8(line).map_err(|_| bad("HTTP head is not UTF-8"))?;
        let line = line.trim_end_matches(['\r', '\n']).to_string();
        if line.is_empty() {
            if lines.is_empty() {
                continue;
            }
            break;
        }
        lines.push(line);
    }
    let first_line = lines.remove(0);
    let headers = lines
        .into_iter()
        .map(|l| {
            let (n, v) = l
                .split_once(':')
                .ok_or_else(|| bad(format!("bad header {l:?}")))?;
            Ok((n.trim().to_ascii_lowercase(), v.trim().to_string()))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Some(Head {
        first_line,
        headers,
    }))
}

/// Reads the body `head` announces (`Content-Length`, chunked, or — when `to_eof` — up to the
/// end of the stream), refusing more than `limit` bytes before reading them.
///
/// # Errors
/// [`Error::MalformedMessage`] for a bad length or an oversized body, [`Error::Socket`] on I/O.
pub fn read_body(r: &mut impl BufRead, head: &Head, limit: usize, to_eof: bool) -> Result<Vec<u8>> {
    let io = |e| Error::socket("reading an HTTP body", e);
    if head
        .header("transfer-encoding")
        .is_some_and(|t| t.eq_ignore_ascii_case("chunked"))
    {
        let mut body = Vec::new();
        loop {
            let mut size_line = String::new();
            r.by_ref().take(64).read_line(&mut size_line).map_err(io)?;
            let hex = size_line.trim().split(';').next().unwrap_or("");
            let size = usize::from_str_radix(hex, 16).map_err(|_| bad("bad chunk size"))?;
            if size == 0 {
                let mut end = String::new();
                r.by_ref().take(2).read_line(&mut end).map_err(io)?;
                return Ok(body);
            }
            if body.len() + size > limit {
                return Err(bad(format!("HTTP body over {limit} bytes")));
            }
            let at = body.len();
            body.resize(at + size, 0);
            r.read_exact(&mut body[at..]).map_err(io)?;
            let mut crlf = [0u8; 2];
            r.read_exact(&mut crlf).map_err(io)?;
        }
    }
    match head.header("content-length") {
        Some(len) => {
            let len: usize = len.parse().map_err(|_| bad("bad Content-Length"))?;
            if len > limit {
                return Err(bad(format!("HTTP body of {len} bytes over {limit}")));
            }
            let mut body = vec![0u8; len];
            r.read_exact(&mut body).map_err(io)?;
            Ok(body)
        }
        None if to_eof => {
            let mut body = Vec::new();
            r.by_ref()
                .take(limit as u64 + 1)
                .read_to_end(&mut body)
                .map_err(io)?;
            match body.len() > limit {
                true => Err(bad(format!("HTTP body over {limit} bytes"))),
                false => Ok(body),
            }
        }
        None => Ok(Vec::new()),
    }
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
    reader: BufReader<TcpStream>,
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
    authorization: Option<crate::config::Redacted>,
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
            token.map(|t| crate::config::Redacted(format!("Authorization: Bearer {t}\r\n")));
        self
    }

    /// Connections open and idle now.
    pub fn idle_connections(&self) -> usize {
        self.idle.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// `method` on `key` with `body`: the status and body of the answer.
    fn request(&self, method: &str, key: &str, body: &[u8]) -> Result<(u16, Vec<u8>)> {
        let reused = {
            let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
            let pid = std::process::id();
            idle.retain(|c| c.pid == pid && c.idle_since.elapsed() < IDLE_REUSE);
            idle.pop()
        };
        if let Some(conn) = reused {
            match self.exchange(conn, method, key, body) {
                Ok(answer) => return Ok(answer),
                Err(Failure::Unanswered(_)) => {}
                Err(Failure::Other(e)) => return Err(e),
            }
        }
        let conn = self.connect(method)?;
        self.exchange(conn, method, key, body)
            .map_err(|(Failure::Unanswered(e) | Failure::Other(e))| e)
    }

    /// A new connection to the server.
    fn connect(&self, method: &str) -> Result<Connection> {
        let fail = |what: String| Error::Metadata(format!("{} {}: {what}", method, self.url));
        let addr = self
            .authority
            .to_socket_addrs()
            .map_err(|e| fail(format!("resolving {}: {e}", self.authority)))?
            .next()
            .ok_or_else(|| fail(format!("{} resolves to nothing", self.authority)))?;
        let stream = TcpStream::connect_timeout(&addr, self.timeout)
            .map_err(|e| fail(format!("connecting: {e}")))?;
        let _ = stream.set_read_timeout(Some(self.timeout));
        let _ = stream.set_write_timeout(Some(self.timeout));
        let _ = stream.set_nodelay(true);
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
                .map_or("", crate::config::Redacted::expose),
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
            .map_err(|e| Failure::Other(e.timed_out_within(self.timeout)))?
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
            .map_err(|e| Failure::Other(e.timed_out_within(self.timeout)))?;
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
    fn keys_survive_encoding() {
        let key = "mooncake/ram/10.0.0.1:15000 x+y%";
        let enc = percent_encode(key);
        assert!(!enc.contains('/') && !enc.contains(' ') && !enc.contains(':'));
        assert_eq!(percent_decode(&enc).as_deref(), Some(key));
        assert_eq!(percent_decode("%zz"), None);
        assert_eq!(percent_decode("%4"), None);
        assert_eq!(percent_decode("a+b").as_deref(), Some("a b"));
    }

    #[test]
    fn heads_and_bodies_are_bounded() {
        let msg = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello";
        let mut r = &msg[..];
        let head = read_head(&mut r).unwrap().unwrap();
        assert_eq!(head.header("content-length"), Some("5"));
        assert_eq!(read_body(&mut r, &head, 10, false).unwrap(), b"hello");
        let mut r = &msg[..];
        let head = read_head(&mut r).unwrap().unwrap();
        assert!(
            read_body(&mut r, &head, 4, false).is_err(),
            "over the limit"
        );
        let chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n";
        let mut r = &chunked[..];
        let head = read_head(&mut r).unwrap().unwrap();
        assert_eq!(read_body(&mut r, &head, 10, false).unwrap(), b"abcde");
        let huge = vec![b'a'; MAX_HEAD + 10];
        assert!(read_head(&mut &huge[..]).is_err());
        let no_colon = b"GET / HTTP/1.1\r\nbroken\r\n\r\n";
        assert!(read_head(&mut &no_colon[..]).is_err());
        assert!(read_head(&mut &b""[..]).unwrap().is_none());
    }

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
