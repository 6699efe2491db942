//! HTTP/1.1 message framing shared by te's metadata client and the te-metadata server: heads
//! and bodies read with hard size bounds, `Content-Length` or chunked bodies, percent-encoded
//! keys. Framing only; what a request means is the caller's.

use std::io::{BufRead, Read};

use crate::error::{Error, Result};

fn bad(what: impl Into<String>) -> Error {
    Error::Malformed(what.into())
}

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

/// Reads a head of at most [`MAX_HEAD`] bytes; `Ok(None)` when the peer closed first.
///
/// # Errors
/// [`Error::Malformed`] for an oversized or garbled head, [`Error::Socket`] on I/O.
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
/// [`Error::Malformed`] for a bad length or an oversized body, [`Error::Socket`] on I/O.
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
            // A size from the peer: compared without overflow, before any room is made.
            if size > limit.saturating_sub(body.len()) {
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
        // A chunk size near 2^64 (a hostile server): refused, no arithmetic overflows.
        let giant =
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\nffffffffffffffff\r\n";
        let mut r = &giant[..];
        let head = read_head(&mut r).unwrap().unwrap();
        assert!(read_body(&mut r, &head, 10, false).is_err());
        let huge = vec![b'a'; MAX_HEAD + 10];
        assert!(read_head(&mut &huge[..]).is_err());
        let no_colon = b"GET / HTTP/1.1\r\nbroken\r\n\r\n";
        assert!(read_head(&mut &no_colon[..]).is_err());
        assert!(read_head(&mut &b""[..]).unwrap().is_none());
    }
}
