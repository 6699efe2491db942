//! The Redis backend: a RESP2 client for the three commands te needs (`GET`, `SET`, `DEL`),
//! after `AUTH` (`MC_REDIS_USERNAME`, `MC_REDIS_PASSWORD`) and `SELECT` (`MC_REDIS_DB_INDEX`).
//! One connection, reopened after an error; every reply is parsed with its sizes bounded.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::ToSocketAddrs;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use te_reactor::deadline::DeadlineStream;

use crate::KvStore;
use crate::{KvError as Error, Result};

/// How to reach and log in to a Redis server.
#[derive(Clone, PartialEq, Eq)]
pub struct RedisTarget {
    /// `host:port`.
    pub address: String,
    /// ACL user (`MC_REDIS_USERNAME`, or the URL's).
    pub username: Option<String>,
    /// Password (`MC_REDIS_PASSWORD`, or the URL's).
    pub password: Option<String>,
    /// Database (`MC_REDIS_DB_INDEX`, or the URL's path).
    pub db: u32,
}

impl std::fmt::Debug for RedisTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisTarget")
            .field("address", &self.address)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("db", &self.db)
            .finish()
    }
}

impl RedisTarget {
    /// Parses `redis://[user[:password]@]host[:port][/db]`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for another scheme, no host, or a bad db index.
    pub fn parse(url: &str) -> Result<Self> {
        let bad = |why: &str| Error::InvalidArgument(format!("{}: {why}", redact(url)));
        let rest = url
            .strip_prefix("redis://")
            .ok_or_else(|| bad("expected redis://"))?;
        let (auth, rest) = match rest.rsplit_once('@') {
            Some((a, r)) => (Some(a), r),
            None => (None, rest),
        };
        let (host, db) = match rest.split_once('/') {
            Some((h, d)) if !d.is_empty() => (h, d.parse().map_err(|_| bad("bad db index"))?),
            Some((h, _)) => (h, 0),
            None => (rest, 0),
        };
        if host.is_empty() {
            return Err(bad("no host"));
        }
        let address = match host.contains(':') {
            true => host.to_string(),
            false => format!("{host}:6379"),
        };
        let (username, password) = match auth {
            Some(a) => match a.split_once(':') {
                Some((u, p)) => ((!u.is_empty()).then(|| u.to_string()), Some(p.to_string())),
                None => (None, Some(a.to_string())),
            },
            None => (None, None),
        };
        Ok(RedisTarget {
            address,
            username,
            password,
            db,
        })
    }
}

/// The URL with any password replaced, for messages.
fn redact(url: &str) -> String {
    match url.rsplit_once('@') {
        Some((_, rest)) => format!("redis://<credentials>@{rest}"),
        None => url.to_string(),
    }
}

/// A RESP2 reply.
#[derive(Debug, PartialEq, Eq)]
pub enum Reply {
    /// `+OK`.
    Status(String),
    /// `:1`.
    Int(i64),
    /// `$n` and its bytes, or `$-1` (none).
    Bulk(Option<Vec<u8>>),
    /// `-ERR ...`.
    Error(String),
}

fn read_line(r: &mut impl BufRead) -> Result<String> {
    let mut line = Vec::new();
    r.by_ref()
        .take(4096)
        .read_until(b'\n', &mut line)
        .map_err(|e| Error::socket("reading a Redis reply", e))?;
    if !line.ends_with(b"\r\n") {
        return Err(Error::MalformedMessage(
            "Redis reply line cut or too long".into(),
        ));
    }
    line.truncate(line.len() - 2);
    String::from_utf8(line).map_err(|_| Error::MalformedMessage("Redis reply not UTF-8".into()))
}

/// Reads one reply, a bulk value of at most `max_len` bytes (bounded before it is read).
///
/// # Errors
/// [`KvError::MalformedMessage`](crate::KvError::MalformedMessage) for bytes that are not a
/// reply; [`KvError::Socket`](crate::KvError::Socket) when the read fails.
pub fn read_reply(r: &mut impl BufRead, max_len: usize) -> Result<Reply> {
    let line = read_line(r)?;
    // The type byte; a non-ASCII first character (not a char boundary at 1) is no type at all.
    let (kind, rest) = match line.as_bytes().first() {
        Some(b) if b.is_ascii() => line.split_at(1),
        _ => ("", line.as_str()),
    };
    let int = |s: &str| {
        s.parse::<i64>()
            .map_err(|_| Error::MalformedMessage(format!("Redis: bad number {s:?}")))
    };
    match kind {
        "+" => Ok(Reply::Status(rest.to_string())),
        "-" => Ok(Reply::Error(rest.to_string())),
        ":" => Ok(Reply::Int(int(rest)?)),
        "$" => {
            let len = int(rest)?;
            if len < 0 {
                return Ok(Reply::Bulk(None));
            }
            let len = len as usize;
            if len > max_len {
                return Err(Error::MalformedMessage(format!(
                    "Redis value of {len} bytes over the limit of {max_len}"
                )));
            }
            let mut data = vec![0u8; len + 2];
            r.read_exact(&mut data)
                .map_err(|e| Error::socket("reading a Redis value", e))?;
            data.truncate(len);
            Ok(Reply::Bulk(Some(data)))
        }
        _ => Err(Error::MalformedMessage(format!(
            "Redis: unexpected reply {line:?}"
        ))),
    }
}

fn encode(args: &[&[u8]]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
    out
}

struct Conn {
    reader: BufReader<DeadlineStream>,
}

/// A Redis server holding descriptors.
pub struct RedisStore {
    target: RedisTarget,
    timeout: Duration,
    max_len: usize,
    conn: Mutex<Option<Conn>>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("target", &self.target)
            .finish()
    }
}

impl RedisStore {
    /// A client for `target`; connects on first use.
    pub fn new(target: RedisTarget, timeout: Duration, max_len: usize) -> Self {
        RedisStore {
            target,
            timeout,
            max_len,
            conn: Mutex::new(None),
        }
    }

    fn fail(&self, what: impl std::fmt::Display) -> Error {
        Error::Metadata(format!("redis://{}: {what}", self.target.address))
    }

    /// A new connection, logged in, for a command that must end by `end`.
    fn connect(&self, end: Instant) -> Result<Conn> {
        let addr = self
            .target
            .address
            .to_socket_addrs()
            .map_err(|e| self.fail(format!("resolving: {e}")))?
            .next()
            .ok_or_else(|| self.fail("resolves to nothing"))?;
        let stream = DeadlineStream::connect(&addr, end)
            .map_err(|e| self.fail(format!("connecting: {e}")))?;
        let _ = stream.get_ref().set_nodelay(true);
        let mut conn = Conn {
            reader: BufReader::new(stream),
        };
        if let Some(password) = &self.target.password {
            let reply = match &self.target.username {
                Some(user) => {
                    self.call(&mut conn, &[b"AUTH", user.as_bytes(), password.as_bytes()])
                }
                None => self.call(&mut conn, &[b"AUTH", password.as_bytes()]),
            }?;
            if let Reply::Error(e) = reply {
                return Err(self.fail(format!("authentication refused: {e}")));
            }
        }
        if self.target.db != 0 {
            let db = self.target.db.to_string();
            if let Reply::Error(e) = self.call(&mut conn, &[b"SELECT", db.as_bytes()])? {
                return Err(self.fail(format!("SELECT {db}: {e}")));
            }
        }
        Ok(conn)
    }

    fn call(&self, conn: &mut Conn, args: &[&[u8]]) -> Result<Reply> {
        conn.reader
            .get_mut()
            .write_all(&encode(args))
            .map_err(|e| self.fail(format!("sending: {e}")))?;
        read_reply(&mut conn.reader, self.max_len).map_err(|e| e.timed_out_within(self.timeout))
    }

    /// Runs one command, reconnecting once if the kept connection has gone bad: all of it
    /// within the client's timeout from now, however the server trickles its replies.
    fn command(&self, args: &[&[u8]]) -> Result<Reply> {
        let end = Instant::now() + self.timeout;
        let mut slot = self.conn.lock().unwrap_or_else(|e| e.into_inner());
        for attempt in 0..2 {
            let mut conn = match slot.take() {
                Some(mut c) => {
                    c.reader.get_mut().set_deadline(end);
                    c
                }
                None => self.connect(end)?,
            };
            match self.call(&mut conn, args) {
                Ok(Reply::Error(e)) if e.starts_with("NOAUTH") || e.starts_with("WRONGPASS") => {
                    return Err(self.fail(format!("authentication needed: {e}")));
                }
                Ok(reply) => {
                    *slot = Some(conn);
                    return Ok(reply);
                }
                Err(e) if attempt == 0 => {
                    tracing::debug!(error = %e, "redis connection lost; reconnecting")
                }
                Err(e) => return Err(e),
            }
        }
        Err(self.fail("unreachable"))
    }
}

impl KvStore for RedisStore {
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>> {
        match self.command(&[b"GET", key.as_bytes()])? {
            Reply::Bulk(v) => Ok(v),
            Reply::Error(e) => Err(self.fail(format!("GET {key}: {e}"))),
            other => Err(self.fail(format!("GET {key}: unexpected {other:?}"))),
        }
    }

    fn put(&self, key: &str, value: &[u8]) -> Result<()> {
        match self.command(&[b"SET", key.as_bytes(), value])? {
            Reply::Status(_) => Ok(()),
            Reply::Error(e) => Err(self.fail(format!("SET {key}: {e}"))),
            other => Err(self.fail(format!("SET {key}: unexpected {other:?}"))),
        }
    }

    fn delete(&self, key: &str) -> Result<()> {
        match self.command(&[b"DEL", key.as_bytes()])? {
            Reply::Int(_) => Ok(()),
            Reply::Error(e) => Err(self.fail(format!("DEL {key}: {e}"))),
            other => Err(self.fail(format!("DEL {key}: unexpected {other:?}"))),
        }
    }

    fn describe(&self) -> String {
        format!("redis://{}", self.target.address)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_with_credentials_and_db() {
        let t = RedisTarget::parse("redis://u:p%w@h:7000/3").unwrap();
        assert_eq!(t.address, "h:7000");
        assert_eq!(
            (t.username.as_deref(), t.password.as_deref(), t.db),
            (Some("u"), Some("p%w"), 3)
        );
        let t = RedisTarget::parse("redis://h").unwrap();
        assert_eq!((t.address.as_str(), t.db, t.password), ("h:6379", 0, None));
        assert!(RedisTarget::parse("redis://h/x").is_err());
        assert!(RedisTarget::parse("redis://").is_err());
        assert!(
            !format!("{:?}", RedisTarget::parse("redis://:secret@h").unwrap()).contains("secret")
        );
        assert!(!redact("redis://:secret@h").contains("secret"));
    }

    #[test]
    fn replies_parse_and_are_bounded() {
        let mut r = &b"+OK\r\n-ERR no\r\n:7\r\n$3\r\nabc\r\n$-1\r\n"[..];
        assert_eq!(read_reply(&mut r, 10).unwrap(), Reply::Status("OK".into()));
        assert_eq!(
            read_reply(&mut r, 10).unwrap(),
            Reply::Error("ERR no".into())
        );
        assert_eq!(read_reply(&mut r, 10).unwrap(), Reply::Int(7));
        assert_eq!(
            read_reply(&mut r, 10).unwrap(),
            Reply::Bulk(Some(b"abc".to_vec()))
        );
        assert_eq!(read_reply(&mut r, 10).unwrap(), Reply::Bulk(None));
        assert!(read_reply(&mut &b"$99999999999\r\n"[..], 10).is_err());
        assert!(read_reply(&mut &b"?what\r\n"[..], 10).is_err());
        assert!(read_reply(&mut &b"+no end"[..], 10).is_err());
        assert_eq!(encode(&[b"GET", b"k"]), b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n");
    }
}
