//! te's TCP data wire format: fixed little-endian headers, decoded with every field checked.
//!
//! The listener speaks first: a 20-byte greeting `magic "TEG1" | nonce [u8; 16]`, fresh for
//! each connection. Then requests, each a 48-byte header followed for a WRITE by exactly `len`
//! body bytes: `magic "TET2" | opcode u8 | flags u8 (0) | reserved u16 (0) | request_id u64 |
//! addr u64 | len u64 | proof [u8; 16]`. The proof is [`connection_proof`]: a keyed hash, with
//! the segment secret, of the greeting's nonce. The secret itself never travels: a listener
//! that is not the target (one a forged descriptor names) learns nothing it could replay, and
//! a proof taken to another connection is worthless. (A relay that forwards a live connection
//! is on the path; under a cluster secret the descriptors that could name one are refused.)
//! A reply is a 16-byte header `magic "TER1" | status u32 | request_id u64`, followed for an
//! accepted READ by exactly `len` bytes. Requests on one connection are answered in order.
//! Unlike Mooncake's 24-byte header, nothing is left uninitialised.

pub mod mooncake;
use te_core::Opcode;
use te_core::transport::Rejection;

use crate::error::Error;

/// Request header magic, "TET2" (requests carrying a connection proof; "TET1" carried the
/// secret itself and is refused).
pub const REQUEST_MAGIC: u32 = u32::from_le_bytes(*b"TET2");
/// Greeting magic, "TEG1".
pub const GREETING_MAGIC: u32 = u32::from_le_bytes(*b"TEG1");
/// Bytes in the greeting.
pub const GREETING_LEN: usize = 20;
/// Reply header magic, "TER1".
pub const REPLY_MAGIC: u32 = u32::from_le_bytes(*b"TER1");
/// Bytes in a request header.
pub const REQUEST_LEN: usize = 48;
/// Bytes in a reply header.
pub const REPLY_LEN: usize = 16;
/// Largest `len` a request may carry (larger ones are malformed).
pub const MAX_REQUEST_LEN: u64 = 4 << 30;

/// A decoded request header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    /// READ or WRITE.
    pub opcode: Opcode,
    /// Echoed in the reply.
    pub request_id: u64,
    /// Absolute address in the target.
    pub addr: u64,
    /// Bytes to move.
    pub len: u64,
    /// The connection's proof of the target segment's secret ([`connection_proof`]).
    pub proof: [u8; 16],
}

impl Request {
    /// Encodes the header.
    pub fn encode(&self) -> [u8; REQUEST_LEN] {
        let mut b = [0u8; REQUEST_LEN];
        b[0..4].copy_from_slice(&REQUEST_MAGIC.to_le_bytes());
        b[4] = match self.opcode {
            Opcode::Read => 0,
            _ => 1,
        };
        b[8..16].copy_from_slice(&self.request_id.to_le_bytes());
        b[16..24].copy_from_slice(&self.addr.to_le_bytes());
        b[24..32].copy_from_slice(&self.len.to_le_bytes());
        b[32..48].copy_from_slice(&self.proof);
        b
    }

    /// Decodes and checks a header.
    ///
    /// # Errors
    /// [`Error::BadMagic`], [`Error::BadOpcode`], [`Error::Reserved`], [`Error::BadLength`].
    pub fn decode(b: &[u8; REQUEST_LEN]) -> Result<Self, Error> {
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap_or([0; 8]));
        let magic = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        if magic != REQUEST_MAGIC {
            return Err(Error::BadMagic(magic));
        }
        let opcode = match b[4] {
            0 => Opcode::Read,
            1 => Opcode::Write,
            other => return Err(Error::BadOpcode(other)),
        };
        if b[5] != 0 || b[6] != 0 || b[7] != 0 {
            return Err(Error::Reserved);
        }
        let len = u64_at(24);
        if len == 0 || len > MAX_REQUEST_LEN {
            return Err(Error::BadLength(len));
        }
        let mut proof = [0u8; 16];
        proof.copy_from_slice(&b[32..48]);
        Ok(Request {
            opcode,
            request_id: u64_at(8),
            addr: u64_at(16),
            len,
            proof,
        })
    }
}

/// The greeting carrying `nonce`.
pub fn encode_greeting(nonce: &[u8; 16]) -> [u8; GREETING_LEN] {
    let mut b = [0u8; GREETING_LEN];
    b[0..4].copy_from_slice(&GREETING_MAGIC.to_le_bytes());
    b[4..].copy_from_slice(nonce);
    b
}

/// The nonce in what a listener said first (`said`: up to [`GREETING_LEN`] bytes, fewer when
/// it closed the connection).
///
/// # Errors
/// [`Error::Busy`]: a refusal at the listener's connection cap instead;
/// [`Error::ShortGreeting`]: fewer bytes than a greeting; [`Error::BadMagic`]: not te's
/// greeting (an older te, or not te at all).
pub fn greeting_of(said: &[u8]) -> Result<[u8; 16], Error> {
    if let Some(head) = said.get(..REPLY_LEN) {
        let head: &[u8; REPLY_LEN] = head.try_into().map_err(|_| Error::ShortGreeting(0))?;
        if matches!(Reply::decode(head), Ok(r) if r.status == Status::Busy) {
            return Err(Error::Busy);
        }
    }
    let b: &[u8; GREETING_LEN] = said
        .get(..GREETING_LEN)
        .and_then(|b| b.try_into().ok())
        .ok_or(Error::ShortGreeting(said.len()))?;
    decode_greeting(b)
}

/// The nonce of a greeting.
///
/// # Errors
/// [`Error::BadMagic`]: not te's greeting (an older te, or not te at all).
pub fn decode_greeting(b: &[u8; GREETING_LEN]) -> Result<[u8; 16], Error> {
    let magic = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    if magic != GREETING_MAGIC {
        return Err(Error::BadMagic(magic));
    }
    let mut nonce = [0u8; 16];
    nonce.copy_from_slice(&b[4..]);
    Ok(nonce)
}

/// The proof every request carries on a connection whose greeting had `nonce`.
pub fn connection_proof(secret: &te_core::segment::SegmentSecret, nonce: &[u8; 16]) -> [u8; 16] {
    secret.prove(&[b"te-tcp-data-2", nonce])
}

/// A reply's status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// Done (WRITE: the bytes are in the target's memory) or, for a READ, data follows.
    Ok,
    /// Refused; nothing was read or written.
    Rejected(Rejection),
    /// Sent once, unasked (request id 0), by a target that holds its cap of data connections
    /// (`MC_TE_MAX_DATA_CONNECTIONS`) before it closes the new connection.
    Busy,
}

impl Status {
    fn code(self) -> u32 {
        match self {
            Status::Ok => 0,
            Status::Rejected(Rejection::BadSecret) => 1,
            Status::Rejected(Rejection::OutOfBounds) => 2,
            Status::Rejected(Rejection::PermissionDenied) => 3,
            Status::Rejected(_) => 4,
            Status::Busy => 5,
        }
    }

    fn from_code(code: u32) -> Option<Self> {
        Some(match code {
            0 => Status::Ok,
            1 => Status::Rejected(Rejection::BadSecret),
            2 => Status::Rejected(Rejection::OutOfBounds),
            3 => Status::Rejected(Rejection::PermissionDenied),
            4 => Status::Rejected(Rejection::Malformed),
            5 => Status::Busy,
            _ => return None,
        })
    }
}

/// A decoded reply header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reply {
    /// The outcome.
    pub status: Status,
    /// The request it answers.
    pub request_id: u64,
}

impl Reply {
    /// Encodes the header.
    pub fn encode(&self) -> [u8; REPLY_LEN] {
        let mut b = [0u8; REPLY_LEN];
        b[0..4].copy_from_slice(&REPLY_MAGIC.to_le_bytes());
        b[4..8].copy_from_slice(&self.status.code().to_le_bytes());
        b[8..16].copy_from_slice(&self.request_id.to_le_bytes());
        b
    }

    /// Decodes and checks a header.
    ///
    /// # Errors
    /// [`Error::BadMagic`] or [`Error::BadStatus`].
    pub fn decode(b: &[u8; REPLY_LEN]) -> Result<Self, Error> {
        let magic = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        if magic != REPLY_MAGIC {
            return Err(Error::BadMagic(magic));
        }
        let code = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
        let status = Status::from_code(code).ok_or(Error::BadStatus(code))?;
        let mut id = [0u8; 8];
        id.copy_from_slice(&b[8..16]);
        Ok(Reply {
            status,
            request_id: u64::from_le_bytes(id),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request() -> Request {
        Request {
            opcode: Opcode::Write,
            request_id: 7,
            addr: 0x1000,
            len: 65536,
            proof: [9; 16],
        }
    }

    #[test]
    fn headers_round_trip() {
        let r = request();
        assert_eq!(Request::decode(&r.encode()).unwrap(), r);
        for status in [
            Status::Ok,
            Status::Rejected(Rejection::BadSecret),
            Status::Rejected(Rejection::OutOfBounds),
            Status::Rejected(Rejection::PermissionDenied),
            Status::Rejected(Rejection::Malformed),
        ] {
            let reply = Reply {
                status,
                request_id: u64::MAX,
            };
            assert_eq!(Reply::decode(&reply.encode()).unwrap(), reply);
        }
    }

    #[test]
    fn every_malformed_field_is_refused() {
        let good = request().encode();
        let mutate = |i: usize, v: u8| {
            let mut b = good;
            b[i] = v;
            Request::decode(&b)
        };
        assert!(matches!(mutate(0, b'X'), Err(Error::BadMagic(_))));
        assert!(matches!(mutate(4, 2), Err(Error::BadOpcode(2))));
        assert!(matches!(mutate(5, 1), Err(Error::Reserved)));
        assert!(matches!(mutate(7, 1), Err(Error::Reserved)));
        let mut zero = good;
        zero[24..32].copy_from_slice(&0u64.to_le_bytes());
        assert!(matches!(Request::decode(&zero), Err(Error::BadLength(0))));
        let mut huge = good;
        huge[24..32].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(matches!(Request::decode(&huge), Err(Error::BadLength(_))));
        let mut reply = Reply {
            status: Status::Ok,
            request_id: 1,
        }
        .encode();
        reply[4] = 99;
        assert!(matches!(Reply::decode(&reply), Err(Error::BadStatus(99))));
        assert!(matches!(
            Reply::decode(&[0u8; REPLY_LEN]),
            Err(Error::BadMagic(0))
        ));
    }

    #[test]
    fn random_bytes_never_panic() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..100_000 {
            let mut b = [0u8; REQUEST_LEN];
            for chunk in b.chunks_mut(8) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
            }
            if x % 3 == 0 {
                b[0..4].copy_from_slice(&REQUEST_MAGIC.to_le_bytes());
            }
            if let Ok(r) = Request::decode(&b) {
                assert!(r.len > 0 && r.len <= MAX_REQUEST_LEN);
            }
            let _ = Reply::decode(b[..REPLY_LEN].try_into().unwrap());
        }
    }
}

/// Fuzz targets of te's data wire (`cargo xtask fuzz tcp-request|tcp-reply --secs N`; CI runs
/// each for `TE_FUZZ_SECS`, 1 s by default): the header decoders must refuse, never panic, and
/// what they accept must encode back to the same bytes.
#[cfg(test)]
mod fuzz_targets {
    use super::*;
    use te_testkit::fuzz::{budget, run};

    #[test]
    fn tcp_request() {
        let seed = Request {
            opcode: Opcode::Write,
            request_id: 7,
            addr: 0x1000,
            len: 4096,
            proof: [3; 16],
        }
        .encode();
        run(
            "tcp-request",
            env!("CARGO_MANIFEST_DIR"),
            &[&seed],
            budget(1.0),
            |b: &[u8]| {
                let mut head = [0u8; REQUEST_LEN];
                let n = b.len().min(REQUEST_LEN);
                head[..n].copy_from_slice(&b[..n]);
                if let Ok(r) = Request::decode(&head) {
                    assert_eq!(r.encode(), head, "an accepted header re-encodes to itself");
                }
            },
        );
    }

    #[test]
    fn tcp_greeting() {
        let seed = encode_greeting(&[9; 16]);
        let busy = Reply {
            status: Status::Busy,
            request_id: 0,
        }
        .encode();
        assert_eq!(greeting_of(&seed).ok(), Some([9; 16]));
        assert!(matches!(greeting_of(&busy), Err(Error::Busy)));
        assert!(matches!(
            greeting_of(&seed[..19]),
            Err(Error::ShortGreeting(19))
        ));
        run(
            "tcp-greeting",
            env!("CARGO_MANIFEST_DIR"),
            &[&seed, &busy],
            budget(1.0),
            |b: &[u8]| {
                let said = &b[..b.len().min(GREETING_LEN)];
                if let Ok(nonce) = greeting_of(said) {
                    assert_eq!(&encode_greeting(&nonce)[..], said, "a greeting re-encodes");
                }
            },
        );
    }

    #[test]
    fn tcp_reply() {
        let seed = Reply {
            status: Status::Rejected(Rejection::OutOfBounds),
            request_id: 9,
        }
        .encode();
        run(
            "tcp-reply",
            env!("CARGO_MANIFEST_DIR"),
            &[&seed],
            budget(1.0),
            |b: &[u8]| {
                let mut head = [0u8; REPLY_LEN];
                let n = b.len().min(REPLY_LEN);
                head[..n].copy_from_slice(&b[..n]);
                if let Ok(r) = Reply::decode(&head) {
                    assert_eq!(r.encode(), head, "an accepted reply re-encodes to itself");
                }
            },
        );
    }
}
