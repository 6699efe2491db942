//! One HTTP/1.1 request at a time, gathered from a connection's bytes as they arrive, so the
//! server's loops never wait on a socket: the head (at most [`MAX_HEAD`] bytes, its end looked
//! for only in bytes not yet scanned), then the body its head announces (`Content-Length`, or
//! chunked with optional trailers), at most the server's largest value, and refused before
//! any room is made for more. The framing is read strictly (RFC 9112): several
//! `Transfer-Encoding` headers, one with a `Content-Length`, one in an HTTP/1.0 request, a
//! coding list that does not end in `chunked`, whitespace before a header's colon or a folded
//! header line are refused, as a request smuggled past another parser would use them.
//!
//! Room for a body is asked of a [`Room`] (the server's budget for values in transit) as its
//! bytes arrive, never for what a head merely announces: a client that sends a head and waits
//! holds none. A body of known length that finds no room is read past, unkept, and answered
//! 503 on a connection that stays open; a chunked one is refused. A client that sent
//! `Expect: 100-continue` is told to go on if its body fits now, and refused before it sends it
//! if not. What is refused comes back as the status to answer with; the connection is closed
//! after that answer, since its framing can no longer be trusted (or the body it will still
//! send is not wanted).
//!
//! Not here: what a request means (`lib.rs`), sockets and timeouts (`conn.rs`).

use te_reactor::http::MAX_HEAD;
use te_reactor::secret::same_bytes;

/// Longest chunk-size line accepted (hex size and extensions).
const MAX_CHUNK_LINE: usize = 256;

/// A request whose head and body are in.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Request {
    /// `GET`, `PUT`, ...
    pub(crate) method: String,
    /// The request target (`/metadata?key=...`).
    pub(crate) target: String,
    /// Whether the connection stays open after the reply.
    pub(crate) keep_alive: bool,
    /// The body.
    pub(crate) body: Vec<u8>,
}

/// A request refused before it was whole: answered with `status` and `reason`, then the
/// connection is closed.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Refusal {
    /// The HTTP status (400, 413).
    pub(crate) status: u16,
    /// Why, sent as the body.
    pub(crate) reason: String,
}

fn refuse(status: u16, reason: impl Into<String>) -> Refusal {
    Refusal {
        status,
        reason: reason.into(),
    }
}

/// Where a body's bytes are accounted before they are kept.
pub(crate) trait Room {
    /// Makes room for `bytes` more bytes of body, or says why there is none.
    fn make(&mut self, bytes: usize) -> Result<(), String>;

    /// Whether `bytes` more would fit now (nothing is taken), or why not.
    fn fits(&self, _bytes: usize) -> Result<(), String> {
        Ok(())
    }
}

/// Room without end, for callers that bound nothing beyond the largest value.
#[cfg(test)]
pub(crate) struct Unbounded;

#[cfg(test)]
impl Room for Unbounded {
    fn make(&mut self, _: usize) -> Result<(), String> {
        Ok(())
    }
}

/// What the gatherer has after taking what it could from the input.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Gathered {
    /// More bytes are needed.
    More,
    /// The client waits for `100 Continue` before it sends the body.
    Continue,
    /// A whole request.
    Request(Request),
    /// A request whose body found no room and was read past: answered with `refusal`, the
    /// connection kept open if `keep_alive`.
    Turned {
        /// The answer (503).
        refusal: Refusal,
        /// Whether the connection stays open after it.
        keep_alive: bool,
    },
}

/// What a request's head says.
#[derive(Debug)]
struct Head {
    method: String,
    target: String,
    keep_alive: bool,
    expect_continue: bool,
    /// The `Authorization` header's value.
    authorization: Option<String>,
}

/// Where a chunked body is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chunk {
    /// At a chunk-size line.
    Size,
    /// Inside a chunk's data, `left` bytes to go.
    Data { left: usize },
    /// At the line end after a chunk's data.
    DataEnd,
    /// After the last chunk: trailer lines up to an empty one.
    Trailer,
}

#[derive(Debug)]
enum Stage {
    /// Gathering a head; its end was looked for up to `scanned`.
    Head { scanned: usize },
    /// A body of known length, `left` bytes to go.
    Sized { head: Head, left: usize },
    /// A chunked body.
    Chunked { head: Head, chunk: Chunk },
    /// A body of known length being read past without keeping it, `left` bytes to go.
    Skip {
        left: usize,
        refusal: Refusal,
        keep_alive: bool,
    },
}

/// Gathers requests from one connection's input.
#[derive(Debug)]
pub(crate) struct Gatherer {
    max_body: usize,
    /// The `Authorization` value every request must carry (`Bearer <token>`), if any.
    authorization: Option<std::sync::Arc<te_reactor::secret::Redacted>>,
    stage: Stage,
    body: Vec<u8>,
}

impl Gatherer {
    /// A gatherer refusing bodies over `max_body` bytes.
    pub(crate) fn new(max_body: usize) -> Self {
        Gatherer {
            max_body,
            authorization: None,
            stage: Stage::Head { scanned: 0 },
            body: Vec::new(),
        }
    }

    /// Refuses (401, then closes) a request whose head does not carry `Authorization:
    /// <expected>`, before any of its body is read.
    pub(crate) fn requiring(
        mut self,
        expected: Option<std::sync::Arc<te_reactor::secret::Redacted>>,
    ) -> Self {
        self.authorization = expected;
        self
    }

    /// Whether a head has been taken and its body is being gathered.
    pub(crate) fn in_body(&self) -> bool {
        !matches!(self.stage, Stage::Head { .. })
    }

    /// Takes what it can from the front of `input` (what it used is removed) towards the next
    /// request, asking `room` for room before it keeps a body's bytes.
    pub(crate) fn gather(
        &mut self,
        input: &mut Vec<u8>,
        room: &mut impl Room,
    ) -> Result<Gathered, Refusal> {
        loop {
            match &mut self.stage {
                Stage::Head { scanned } => {
                    if *scanned == 0 {
                        // Blank lines before a request (after a body, say) are not part of it.
                        let blank = input
                            .iter()
                            .take_while(|b| matches!(b, b'\r' | b'\n'))
                            .count();
                        input.drain(..blank);
                    }
                    let Some(end) = head_end(input, *scanned) else {
                        if input.len() > MAX_HEAD {
                            return Err(refuse(400, format!("HTTP head over {MAX_HEAD} bytes")));
                        }
                        *scanned = input.len().saturating_sub(2);
                        return Ok(Gathered::More);
                    };
                    if end > MAX_HEAD {
                        return Err(refuse(400, format!("HTTP head over {MAX_HEAD} bytes")));
                    }
                    let (head, framing) = parse_head(&input[..end], self.max_body)?;
                    if let Some(expected) = &self.authorization {
                        let given = head.authorization.as_deref().unwrap_or("");
                        if !same_bytes(given.as_bytes(), expected.expose().as_bytes()) {
                            return Err(refuse(
                                401,
                                "te-metadata wants its token: Authorization: Bearer <token> \
                                 (MC_TE_METADATA_TOKEN for te's engines)",
                            ));
                        }
                    }
                    input.drain(..end);
                    let continues = head.expect_continue && input.is_empty();
                    if let (true, Framing::Sized(left @ 1..)) = (continues, &framing) {
                        // It waits to be told to send its body: if it would not fit, told
                        // no, it need not send it.
                        room.fits(*left).map_err(|why| refuse(503, why))?;
                    }
                    self.stage = match framing {
                        Framing::Chunked => Stage::Chunked {
                            head,
                            chunk: Chunk::Size,
                        },
                        Framing::Sized(0) => return Ok(Gathered::Request(self.finish(head))),
                        Framing::Sized(left) => Stage::Sized { head, left },
                    };
                    if continues {
                        return Ok(Gathered::Continue);
                    }
                }
                Stage::Sized { left, head } => {
                    let take = (*left).min(input.len());
                    if take == 0 {
                        return Ok(Gathered::More);
                    }
                    if let Err(why) = room.make(take) {
                        // Read the rest past, unkept; what was kept goes (the caller gives
                        // its room back with the answer).
                        self.body = Vec::new();
                        self.stage = Stage::Skip {
                            left: *left,
                            refusal: refuse(503, why),
                            keep_alive: head.keep_alive,
                        };
                        continue;
                    }
                    self.body.extend_from_slice(&input[..take]);
                    input.drain(..take);
                    *left -= take;
                    if *left > 0 {
                        return Ok(Gathered::More);
                    }
                    return Ok(Gathered::Request(self.take_request()));
                }
                Stage::Skip { left, .. } => {
                    let take = (*left).min(input.len());
                    input.drain(..take);
                    *left -= take;
                    if *left > 0 {
                        return Ok(Gathered::More);
                    }
                    let Stage::Skip {
                        refusal,
                        keep_alive,
                        ..
                    } = std::mem::replace(&mut self.stage, Stage::Head { scanned: 0 })
                    else {
                        unreachable!("the stage was just matched");
                    };
                    return Ok(Gathered::Turned {
                        refusal,
                        keep_alive,
                    });
                }
                Stage::Chunked { chunk, .. } => {
                    let next = step_chunked(*chunk, input, &mut self.body, self.max_body, room)?;
                    match next {
                        None => return Ok(Gathered::More),
                        Some(Chunk::Size) if *chunk == Chunk::Trailer => {
                            return Ok(Gathered::Request(self.take_request()));
                        }
                        Some(c) => *chunk = c,
                    }
                }
            }
        }
    }

    /// The request whose body is in; the gatherer is ready for the next head.
    fn take_request(&mut self) -> Request {
        match std::mem::replace(&mut self.stage, Stage::Head { scanned: 0 }) {
            Stage::Sized { head, .. } | Stage::Chunked { head, .. } => self.finish(head),
            Stage::Head { .. } | Stage::Skip { .. } => {
                unreachable!("a request is taken only once its head is in, and a skipped one never")
            }
        }
    }

    fn finish(&mut self, head: Head) -> Request {
        self.stage = Stage::Head { scanned: 0 };
        Request {
            method: head.method,
            target: head.target,
            keep_alive: head.keep_alive,
            body: std::mem::take(&mut self.body),
        }
    }
}

/// The index just past the blank line ending a head in `input`, looking from `from`.
fn head_end(input: &[u8], from: usize) -> Option<usize> {
    let mut i = from;
    while let Some(at) = input.get(i..)?.iter().position(|&b| b == b'\n') {
        let nl = i + at;
        match input.get(nl + 1..) {
            Some([b'\n', ..]) => return Some(nl + 2),
            Some([b'\r', b'\n', ..]) => return Some(nl + 3),
            _ => i = nl + 1,
        }
    }
    None
}

/// How a request's body is framed.
enum Framing {
    Sized(usize),
    Chunked,
}

fn parse_head(bytes: &[u8], max_body: usize) -> Result<(Head, Framing), Refusal> {
    let text = std::str::from_utf8(bytes).map_err(|_| refuse(400, "HTTP head is not UTF-8"))?;
    let mut lines = text
        .split('\n')
        .map(|l| l.trim_end_matches('\r'))
        .take_while(|l| !l.is_empty());
    let first = lines.next().unwrap_or("");
    let mut words = first.split_whitespace();
    let method = words.next().unwrap_or("").to_string();
    let target = words.next().unwrap_or("").to_string();
    let http10 = words.next() == Some("HTTP/1.0");
    let (mut keep_alive, mut expect_continue, mut chunked) = (!http10, false, false);
    let mut length: Option<usize> = None;
    let mut codings = 0;
    let mut authorization = None;
    for line in lines {
        if line.starts_with([' ', '\t']) {
            return Err(refuse(400, "a folded header line"));
        }
        let (name, value) = line
            .split_once(':')
            .ok_or_else(|| refuse(400, format!("bad header {line:?}")))?;
        if name.is_empty() || !name.bytes().all(is_token_byte) {
            return Err(refuse(400, format!("bad header name {name:?}")));
        }
        let value = value.trim();
        let has = |token: &str| {
            value
                .split(',')
                .any(|t| t.trim().eq_ignore_ascii_case(token))
        };
        if name.eq_ignore_ascii_case("connection") {
            keep_alive = match (has("close"), has("keep-alive")) {
                (true, _) => false,
                (false, true) => true,
                (false, false) => keep_alive,
            };
        } else if name.eq_ignore_ascii_case("authorization") {
            authorization = Some(value.to_string());
        } else if name.eq_ignore_ascii_case("expect") {
            expect_continue = value.eq_ignore_ascii_case("100-continue");
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            codings += 1;
            let list: Vec<&str> = value.split(',').map(str::trim).collect();
            if list
                .last()
                .is_none_or(|c| !c.eq_ignore_ascii_case("chunked"))
            {
                return Err(refuse(400, "Transfer-Encoding does not end in chunked"));
            }
            if list.len() > 1 {
                return Err(refuse(
                    501,
                    format!("Transfer-Encoding {value:?}: only chunked is decoded"),
                ));
            }
            chunked = true;
        } else if name.eq_ignore_ascii_case("content-length") {
            let n = parse_length(value)
                .ok_or_else(|| refuse(400, format!("bad Content-Length {value:?}")))?;
            if length.is_some_and(|m| m != n) {
                return Err(refuse(400, "two different Content-Length headers"));
            }
            length = Some(n);
        }
    }
    if codings > 1 {
        return Err(refuse(400, "several Transfer-Encoding headers"));
    }
    if chunked && length.is_some() {
        return Err(refuse(400, "Transfer-Encoding with Content-Length"));
    }
    if chunked && http10 {
        return Err(refuse(400, "Transfer-Encoding in an HTTP/1.0 request"));
    }
    let framing = match (chunked, length) {
        (true, _) => Framing::Chunked,
        (false, Some(n)) if n > max_body => {
            return Err(refuse(
                413,
                format!("HTTP body of {n} bytes over {max_body}"),
            ));
        }
        (false, n) => Framing::Sized(n.unwrap_or(0)),
    };
    let head = Head {
        method,
        target,
        keep_alive,
        expect_continue,
        authorization,
    };
    Ok((head, framing))
}

/// A byte of an HTTP token (a header name): RFC 9110's `tchar`.
fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// A `Content-Length` value: decimal digits only.
fn parse_length(value: &str) -> Option<usize> {
    match !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        true => value.parse().ok(),
        false => None,
    }
}

/// Takes one step of a chunked body from `input`: the next place, or `None` when more bytes
/// are needed. After the trailer's blank line the next place is [`Chunk::Size`] again.
fn step_chunked(
    chunk: Chunk,
    input: &mut Vec<u8>,
    body: &mut Vec<u8>,
    max_body: usize,
    room: &mut impl Room,
) -> Result<Option<Chunk>, Refusal> {
    match chunk {
        Chunk::Size => {
            let Some(nl) = input.iter().take(MAX_CHUNK_LINE).position(|&b| b == b'\n') else {
                return match input.len() >= MAX_CHUNK_LINE {
                    true => Err(refuse(400, "chunk-size line too long")),
                    false => Ok(None),
                };
            };
            let line = std::str::from_utf8(&input[..nl]).unwrap_or("");
            let hex = line.trim_end_matches('\r').split(';').next().unwrap_or("");
            let hex = hex.trim();
            let size = (!hex.is_empty() && hex.bytes().all(|b| b.is_ascii_hexdigit()))
                .then(|| usize::from_str_radix(hex, 16).ok())
                .flatten()
                .ok_or_else(|| refuse(400, format!("bad chunk size {hex:?}")))?;
            input.drain(..=nl);
            if size == 0 {
                return Ok(Some(Chunk::Trailer));
            }
            if body.len().saturating_add(size) > max_body {
                return Err(refuse(413, format!("HTTP body over {max_body} bytes")));
            }
            Ok(Some(Chunk::Data { left: size }))
        }
        Chunk::Data { left } => {
            let take = left.min(input.len());
            if take > 0 {
                room.make(take).map_err(|why| refuse(503, why))?;
            }
            body.extend_from_slice(&input[..take]);
            input.drain(..take);
            match left - take {
                0 => Ok(Some(Chunk::DataEnd)),
                _ if take == 0 => Ok(None),
                left => Ok(Some(Chunk::Data { left })),
            }
        }
        Chunk::DataEnd => match input.as_slice() {
            [b'\n', ..] => {
                input.drain(..1);
                Ok(Some(Chunk::Size))
            }
            [b'\r', b'\n', ..] => {
                input.drain(..2);
                Ok(Some(Chunk::Size))
            }
            [] | [b'\r'] => Ok(None),
            _ => Err(refuse(400, "chunk data not followed by a line end")),
        },
        Chunk::Trailer => {
            let Some(nl) = input.iter().take(MAX_HEAD).position(|&b| b == b'\n') else {
                return match input.len() >= MAX_HEAD {
                    true => Err(refuse(400, "chunk trailer too long")),
                    false => Ok(None),
                };
            };
            let blank = input[..nl].iter().all(|&b| b == b'\r');
            input.drain(..=nl);
            match blank {
                true => Ok(Some(Chunk::Size)),
                false => Ok(Some(Chunk::Trailer)),
            }
        }
    }
}

#[cfg(test)]
mod tests;
