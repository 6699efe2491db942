//! Control-channel framing, Mooncake-compatible: `u64` little-endian length (= 1 + payload
//! length), one type byte, then the payload (JSON text). Sizes are bounded before allocation:
//! the length field, type byte included, may not exceed the limit (`MC_HANDSHAKE_MAX_LENGTH`),
//! as in Mooncake.
//!
//! Mooncake before the type byte sent untyped frames (`u64` payload length, then JSON): a
//! server reads one, as Mooncake does, when the byte after the length is not a type te knows
//! but a printable one, takes it as an endpoint handshake ([`FrameType::Connection`]) and
//! answers untyped ([`read_request_frame`], [`write_untyped_frame`]). Clients always send
//! typed frames.

use std::io::{self, Read, Write};

/// The frame types (Mooncake's handshake message types).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
#[non_exhaustive]
pub enum FrameType {
    /// Endpoint set-up (RDMA queue-pair handshake).
    Connection = 0,
    /// P2P descriptor exchange.
    Metadata = 1,
    /// A notification.
    Notify = 2,
    /// A liveness probe.
    Probe = 3,
    /// te: cluster authentication (see [`auth`](super::auth)); not a Mooncake type.
    Auth = 4,
}

impl FrameType {
    fn from_u8(v: u8) -> Option<Self> {
        match v {
            0 => Some(FrameType::Connection),
            1 => Some(FrameType::Metadata),
            2 => Some(FrameType::Notify),
            3 => Some(FrameType::Probe),
            4 => Some(FrameType::Auth),
            _ => None,
        }
    }
}

/// Why a frame could not be read.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The peer closed the connection between frames.
    #[error("connection closed")]
    Closed,
    /// A length field of zero (no type byte).
    #[error("empty frame")]
    Empty,
    /// The frame is larger than allowed; nothing was allocated.
    #[error("frame of {0} bytes exceeds the limit")]
    TooLarge(u64),
    /// The type byte is not one te knows.
    #[error("unknown frame type {0}")]
    UnknownType(u8),
    /// The connection failed or timed out mid-frame.
    #[error("{0}")]
    Io(#[from] io::Error),
}

/// A frame as a server reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    /// Its type ([`FrameType::Connection`] for an untyped frame).
    pub kind: FrameType,
    /// The JSON payload.
    pub payload: Vec<u8>,
    /// Sent without a type byte (older Mooncake): the reply goes back the same way.
    pub untyped: bool,
}

/// Reads one frame of at most `max_length` bytes (type byte included).
///
/// # Errors
/// [`FrameError`]; after an error the connection should be closed.
pub fn read_frame(
    r: &mut impl Read,
    max_length: usize,
) -> Result<(FrameType, Vec<u8>), FrameError> {
    let frame = read_any(r, max_length, false)?;
    Ok((frame.kind, frame.payload))
}

/// Reads one request: a typed frame, or an untyped one from an older Mooncake.
///
/// # Errors
/// As [`read_frame`].
pub fn read_request_frame(r: &mut impl Read, max_length: usize) -> Result<Frame, FrameError> {
    read_any(r, max_length, true)
}

fn read_any(r: &mut impl Read, max_length: usize, untyped_ok: bool) -> Result<Frame, FrameError> {
    let mut len = [0u8; 8];
    let mut got = 0;
    while got < len.len() {
        match r.read(&mut len[got..]) {
            Ok(0) if got == 0 => return Err(FrameError::Closed),
            Ok(0) => return Err(FrameError::Io(io::ErrorKind::UnexpectedEof.into())),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(FrameError::Io(e)),
        }
    }
    let len = u64::from_le_bytes(len);
    if len == 0 {
        return Err(FrameError::Empty);
    }
    if len > max_length as u64 {
        return Err(FrameError::TooLarge(len));
    }
    let mut first = [0u8; 1];
    r.read_exact(&mut first)?;
    let (kind, mut payload, untyped) = match FrameType::from_u8(first[0]) {
        Some(kind) => (kind, vec![0u8; (len - 1) as usize], false),
        // JSON's first byte ('{', whitespace): Mooncake's untyped handshake. Anything else is
        // no type and no JSON object (Mooncake closes on it too, failing to parse it).
        None if untyped_ok && matches!(first[0], b'{' | b' ' | b'\t' | b'\n' | b'\r') => {
            let mut payload = vec![0u8; len as usize];
            payload[0] = first[0];
            (FrameType::Connection, payload, true)
        }
        None => return Err(FrameError::UnknownType(first[0])),
    };
    let start = usize::from(untyped);
    r.read_exact(&mut payload[start..])?;
    Ok(Frame {
        kind,
        payload,
        untyped,
    })
}

/// Parses one request from the front of `buf` without blocking: `Ok(None)` until the whole
/// frame is there, then the frame and the bytes it took. Bounds the length field before the
/// caller reserves room for it: [`needed`] says how many bytes the frame takes in all.
///
/// # Errors
/// As [`read_request_frame`] (never `Closed` or `Io`).
pub fn parse_request(buf: &[u8], max_length: usize) -> Result<Option<(Frame, usize)>, FrameError> {
    let Some(total) = needed(buf, max_length)? else {
        return Ok(None);
    };
    if buf.len() < total {
        return Ok(None);
    }
    let (kind, untyped) = match FrameType::from_u8(buf[8]) {
        Some(kind) => (kind, false),
        None => (FrameType::Connection, true),
    };
    let payload = buf[8 + usize::from(!untyped)..total].to_vec();
    Ok(Some((
        Frame {
            kind,
            payload,
            untyped,
        },
        total,
    )))
}

/// The length in bytes of the request frame at the front of `buf` (length field included),
/// once its first nine bytes are there; `Ok(None)` before.
///
/// # Errors
/// [`FrameError::Empty`], [`FrameError::TooLarge`] or [`FrameError::UnknownType`].
pub fn needed(buf: &[u8], max_length: usize) -> Result<Option<usize>, FrameError> {
    let Some(len) = buf.first_chunk::<8>().map(|b| u64::from_le_bytes(*b)) else {
        return Ok(None);
    };
    if len == 0 {
        return Err(FrameError::Empty);
    }
    if len > max_length as u64 {
        return Err(FrameError::TooLarge(len));
    }
    let Some(&first) = buf.get(8) else {
        return Ok(None);
    };
    if FrameType::from_u8(first).is_none() && !matches!(first, b'{' | b' ' | b'\t' | b'\n' | b'\r')
    {
        return Err(FrameError::UnknownType(first));
    }
    // Typed and untyped alike: the length counts the bytes after the field.
    Ok(Some(8 + len as usize))
}

/// The length field (type byte included) and the type of the frame at the front of `buf`,
/// once its first nine bytes are there (`None` for the type of an untyped or unknown frame):
/// enough to refuse a frame by its kind and size before any more of it is read.
pub fn head(buf: &[u8]) -> Option<(u64, Option<FrameType>)> {
    let len = u64::from_le_bytes(*buf.first_chunk::<8>()?);
    Some((len, FrameType::from_u8(*buf.get(8)?)))
}

/// One frame's bytes, typed (`Some(kind)`) or untyped (the reply to an older Mooncake).
pub fn encode_frame(kind: Option<FrameType>, payload: &[u8]) -> Vec<u8> {
    let mut buf = Vec::with_capacity(9 + payload.len());
    let len = payload.len() as u64 + u64::from(kind.is_some());
    buf.extend_from_slice(&len.to_le_bytes());
    if let Some(kind) = kind {
        buf.push(kind as u8);
    }
    buf.extend_from_slice(payload);
    buf
}

/// Writes a reply to an untyped request: the payload's length, then the payload.
///
/// # Errors
/// The write failed.
pub fn write_untyped_frame(w: &mut impl Write, payload: &[u8]) -> io::Result<()> {
    w.write_all(&encode_frame(None, payload))?;
    w.flush()
}

/// Writes one frame.
///
/// # Errors
/// The write failed.
pub fn write_frame(w: &mut impl Write, kind: FrameType, payload: &[u8]) -> io::Result<()> {
    w.write_all(&encode_frame(Some(kind), payload))?;
    w.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(len: u64, kind: u8, payload: &[u8]) -> Vec<u8> {
        let mut v = len.to_le_bytes().to_vec();
        v.push(kind);
        v.extend_from_slice(payload);
        v
    }

    #[test]
    fn round_trip() {
        let mut buf = Vec::new();
        write_frame(&mut buf, FrameType::Notify, b"{\"a\":1}").unwrap();
        let (k, p) = read_frame(&mut buf.as_slice(), 64).unwrap();
        assert_eq!((k, p.as_slice()), (FrameType::Notify, &b"{\"a\":1}"[..]));
    }

    #[test]
    fn bad_frames_are_refused_without_allocating() {
        assert!(matches!(
            read_frame(&mut &[][..], 64),
            Err(FrameError::Closed)
        ));
        assert!(matches!(
            read_frame(&mut &[1u8, 0, 0][..], 64),
            Err(FrameError::Io(_))
        ));
        assert!(matches!(
            read_frame(&mut raw(0, 1, b"").as_slice(), 64),
            Err(FrameError::Empty)
        ));
        assert!(matches!(
            read_frame(&mut raw(u64::MAX, 1, b"").as_slice(), 64),
            Err(FrameError::TooLarge(_))
        ));
        assert!(matches!(
            read_frame(&mut raw(65, 1, b"").as_slice(), 64),
            Err(FrameError::TooLarge(65))
        ));
        // The limit counts the type byte, as Mooncake's does.
        let at_limit = raw(64, 1, &[b' '; 63]);
        assert_eq!(
            read_frame(&mut at_limit.as_slice(), 64).unwrap().1.len(),
            63
        );
        assert!(matches!(
            read_frame(&mut raw(3, 9, b"ab").as_slice(), 64),
            Err(FrameError::UnknownType(9))
        ));
        assert!(
            matches!(
                read_frame(&mut raw(10, 1, b"ab").as_slice(), 64),
                Err(FrameError::Io(_))
            ),
            "truncated"
        );
    }

    #[test]
    fn the_incremental_parser_reads_what_the_blocking_reader_reads() {
        let mut two = encode_frame(Some(FrameType::Probe), b"{}");
        two.extend_from_slice(&[2u8, 0, 0, 0, 0, 0, 0, 0, b'{', b'}']);
        let first_len = 11;
        // Byte by byte: nothing until the frame is whole.
        for cut in 0..first_len {
            assert!(parse_request(&two[..cut], 64).unwrap().is_none(), "{cut}");
        }
        let (f, used) = parse_request(&two, 64).unwrap().unwrap();
        assert_eq!(used, first_len);
        assert_eq!(f, read_request_frame(&mut two.as_slice(), 64).unwrap());
        let (g, used2) = parse_request(&two[used..], 64).unwrap().unwrap();
        assert_eq!(
            (g.kind, g.untyped, used2),
            (FrameType::Connection, true, 10)
        );
        assert_eq!(g.payload, b"{}");
        // Bounds before anything is reserved, from the length field alone.
        assert!(matches!(
            needed(&u64::MAX.to_le_bytes(), 64),
            Err(FrameError::TooLarge(_))
        ));
        assert!(matches!(
            parse_request(&raw(0, 1, b""), 64),
            Err(FrameError::Empty)
        ));
        assert!(matches!(
            parse_request(&raw(3, 7, b"ab"), 64),
            Err(FrameError::UnknownType(7))
        ));
        assert_eq!(needed(&raw(64, 1, b""), 64).unwrap(), Some(72));
    }

    #[test]
    fn untyped_frames_from_older_mooncake_are_read_by_servers_only() {
        // Length 2, then `{}` with no type byte: an endpoint handshake.
        let old = [2u8, 0, 0, 0, 0, 0, 0, 0, b'{', b'}'];
        let f = read_request_frame(&mut old.as_slice(), 64).unwrap();
        assert_eq!(
            f,
            Frame {
                kind: FrameType::Connection,
                payload: b"{}".to_vec(),
                untyped: true
            }
        );
        assert!(matches!(
            read_frame(&mut old.as_slice(), 64),
            Err(FrameError::UnknownType(b'{'))
        ));
        let typed = raw(3, 1, b"{}");
        assert!(
            !read_request_frame(&mut typed.as_slice(), 64)
                .unwrap()
                .untyped
        );
        // Bounded the same way, and a byte of 0x80 or more is neither a type nor JSON.
        assert!(matches!(
            read_request_frame(&mut raw(65, b'{', b"").as_slice(), 64),
            Err(FrameError::TooLarge(65))
        ));
        for junk in [0x80, b'*', 9 + 0x30] {
            assert!(matches!(
                read_request_frame(&mut raw(3, junk, b"{}").as_slice(), 64),
                Err(FrameError::UnknownType(b)) if b == junk
            ));
        }
        let mut reply = Vec::new();
        write_untyped_frame(&mut reply, b"{\"a\":1}").unwrap();
        assert_eq!(&reply[..8], &7u64.to_le_bytes());
        assert_eq!(&reply[8..], b"{\"a\":1}");
    }
}
