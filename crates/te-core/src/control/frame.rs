//! Control-channel framing, Mooncake-compatible: `u64` little-endian length (= 1 + payload
//! length), one type byte, then the payload (JSON text). Sizes are bounded before allocation.

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
#[non_exhaustive]
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

/// Reads one frame of at most `max_payload` bytes of payload.
///
/// # Errors
/// [`FrameError`]; after an error the connection should be closed.
pub fn read_frame(
    r: &mut impl Read,
    max_payload: usize,
) -> Result<(FrameType, Vec<u8>), FrameError> {
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
    if len - 1 > max_payload as u64 {
        return Err(FrameError::TooLarge(len - 1));
    }
    let mut kind = [0u8; 1];
    r.read_exact(&mut kind)?;
    let kind = FrameType::from_u8(kind[0]).ok_or(FrameError::UnknownType(kind[0]))?;
    let mut payload = vec![0u8; (len - 1) as usize];
    r.read_exact(&mut payload)?;
    Ok((kind, payload))
}

/// Writes one frame.
///
/// # Errors
/// The write failed.
pub fn write_frame(w: &mut impl Write, kind: FrameType, payload: &[u8]) -> io::Result<()> {
    let mut buf = Vec::with_capacity(9 + payload.len());
    buf.extend_from_slice(&(payload.len() as u64 + 1).to_le_bytes());
    buf.push(kind as u8);
    buf.extend_from_slice(payload);
    w.write_all(&buf)?;
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
            read_frame(&mut raw(66, 1, b"").as_slice(), 64),
            Err(FrameError::TooLarge(65))
        ));
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
}
