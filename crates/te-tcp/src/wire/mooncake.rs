//! Mooncake's TCP data framing, decoded with every field checked (te's own framing is in
//! [`crate::wire`]).
//!
//! A Mooncake request is a 24-byte `SessionHeader`: `size u64 LE | addr u64 LE | opcode u8 |
//! 7 bytes of padding`, followed for a WRITE by `size` body bytes. Opcode 0 is READ, 1 WRITE;
//! bit 0x80 marks the acknowledged framing ("v2", Mooncake's `tcp_proto_version` 2). Mooncake
//! never initialises the padding, so it is ignored here too. There is no magic, request id or
//! credential: requests on one connection are answered strictly in order.
//!
//! A v2 target answers each request with an 8-byte status frame, u64 LE: "MCTV" in the high 32
//! bits, a code in the low 32 (0 done, anything else refused). A WRITE's frame goes out after the
//! last body byte is in memory; a READ's precedes its `size` data bytes. A v1 ("legacy") request
//! gets no status frame at all, so its WRITE cannot be acknowledged or refused: te refuses v1
//! unless told otherwise.
//!
//! This module only encodes and decodes; who speaks it, and to whom, is the server's and the
//! lanes' business.

use te_core::Opcode;

use crate::error::Error;

/// Bytes in Mooncake's request header (`sizeof(SessionHeader)`).
pub const HEADER_LEN: usize = 24;
/// Bytes in a status frame.
pub const STATUS_LEN: usize = 8;
/// The opcode bit of the acknowledged framing.
pub const V2_FLAG: u8 = 0x80;
/// "MCTV" in a status frame's high 32 bits.
pub const STATUS_MAGIC: u64 = 0x4D43_5456 << 32;
/// A status frame's code for "done".
pub const STATUS_OK: u32 = 0;
/// The code Mooncake's own target sends for a refused address; te sends it for every refusal.
pub const STATUS_REJECTED: u32 = 1;

/// A decoded Mooncake request header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// READ or WRITE.
    pub opcode: Opcode,
    /// Absolute address in the target's address space.
    pub addr: u64,
    /// Bytes to move (never zero).
    pub size: u64,
    /// The acknowledged framing (opcode bit 0x80).
    pub acked: bool,
}

impl Header {
    /// Encodes the header with zeroed padding.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..8].copy_from_slice(&self.size.to_le_bytes());
        b[8..16].copy_from_slice(&self.addr.to_le_bytes());
        let op = match self.opcode {
            Opcode::Read => 0,
            _ => 1,
        };
        b[16] = if self.acked { op | V2_FLAG } else { op };
        b
    }

    /// Decodes and checks a header. Unlike Mooncake's own target, which reads every opcode
    /// other than 1 as a READ, te accepts only 0 and 1.
    ///
    /// # Errors
    /// [`Error::BadOpcode`] or [`Error::BadLength`] (a zero size).
    pub fn decode(b: &[u8; HEADER_LEN]) -> Result<Self, Error> {
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap_or([0; 8]));
        let opcode = match b[16] & !V2_FLAG {
            0 => Opcode::Read,
            1 => Opcode::Write,
            _ => return Err(Error::BadOpcode(b[16])),
        };
        let size = u64_at(0);
        if size == 0 {
            return Err(Error::BadLength(0));
        }
        Ok(Header {
            opcode,
            addr: u64_at(8),
            size,
            acked: b[16] & V2_FLAG != 0,
        })
    }

    /// Whether `b` reads as a Mooncake header of the acknowledged framing: how te's own
    /// listener tells a Mooncake initiator that reached it apart from garbage, to answer it in
    /// a form it understands.
    pub fn is_acked_request(b: &[u8; HEADER_LEN]) -> bool {
        Header::decode(b).is_ok_and(|h| h.acked)
    }
}

/// Encodes a status frame.
pub fn encode_status(code: u32) -> [u8; STATUS_LEN] {
    (STATUS_MAGIC | u64::from(code)).to_le_bytes()
}

/// Decodes a status frame into its code.
///
/// # Errors
/// [`Error::BadMagic`] (with the high 32 bits) when the frame lacks "MCTV".
pub fn decode_status(b: &[u8; STATUS_LEN]) -> Result<u32, Error> {
    let frame = u64::from_le_bytes(*b);
    if frame & 0xFFFF_FFFF_0000_0000 != STATUS_MAGIC {
        return Err(Error::BadMagic((frame >> 32) as u32));
    }
    Ok(frame as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_match_the_bytes_mooncake_puts_on_the_wire() {
        // A v2 WRITE of 4 KiB to 0x7f00_0000_1000, as Mooncake 0.3.13 sends it.
        let h = Header {
            opcode: Opcode::Write,
            addr: 0x7f00_0000_1000,
            size: 4096,
            acked: true,
        };
        let b = h.encode();
        assert_eq!(&b[0..8], &[0, 0x10, 0, 0, 0, 0, 0, 0]);
        assert_eq!(&b[8..16], &[0, 0x10, 0, 0, 0, 0x7f, 0, 0]);
        assert_eq!(b[16], 0x81);
        assert_eq!(Header::decode(&b).unwrap(), h);
        // Padding is never initialised by Mooncake and is ignored.
        let mut padded = b;
        padded[17..].fill(0xaa);
        assert_eq!(Header::decode(&padded).unwrap(), h);
        let v1_read = Header {
            opcode: Opcode::Read,
            acked: false,
            ..h
        };
        assert_eq!(v1_read.encode()[16], 0);
        assert!(!Header::is_acked_request(&v1_read.encode()));
        assert!(Header::is_acked_request(&b));
    }

    #[test]
    fn malformed_headers_are_refused() {
        let good = Header {
            opcode: Opcode::Read,
            addr: 1,
            size: 1,
            acked: true,
        }
        .encode();
        let mut op = good;
        op[16] = 0x82;
        assert!(matches!(Header::decode(&op), Err(Error::BadOpcode(0x82))));
        op[16] = 2;
        assert!(matches!(Header::decode(&op), Err(Error::BadOpcode(2))));
        let mut zero = good;
        zero[0..8].fill(0);
        assert!(matches!(Header::decode(&zero), Err(Error::BadLength(0))));
        // te's own request header ("TET1" …) is not a Mooncake request of the acked framing.
        let te = crate::wire::Request {
            opcode: Opcode::Write,
            request_id: 1,
            addr: 0x1000,
            len: 4096,
            proof: [0; 16],
        }
        .encode();
        assert!(!Header::is_acked_request(
            te[..HEADER_LEN].try_into().unwrap()
        ));
    }

    #[test]
    fn status_frames_carry_the_magic() {
        assert_eq!(
            encode_status(STATUS_OK),
            [0, 0, 0, 0, 0x56, 0x54, 0x43, 0x4d]
        );
        assert_eq!(
            encode_status(STATUS_REJECTED),
            [1, 0, 0, 0, 0x56, 0x54, 0x43, 0x4d]
        );
        assert_eq!(decode_status(&encode_status(7)).unwrap(), 7);
        // te's own reply header is not a status frame.
        let te_reply = crate::wire::Reply {
            status: crate::wire::Status::Ok,
            request_id: 0,
        }
        .encode();
        assert!(matches!(
            decode_status(te_reply[..STATUS_LEN].try_into().unwrap()),
            Err(Error::BadMagic(0))
        ));
    }
}

/// Fuzz targets of Mooncake's framing (`cargo xtask fuzz mooncake-header|mooncake-status`):
/// the decoders must refuse, never panic, and what they accept must encode back to the same
/// bytes (padding aside).
#[cfg(test)]
mod fuzz_targets {
    use super::*;
    use te_testkit::fuzz::{budget, run};

    #[test]
    fn mooncake_header() {
        let seed = Header {
            opcode: Opcode::Write,
            addr: 0x7f00_0000_1000,
            size: 65536,
            acked: true,
        }
        .encode();
        run(
            "mooncake-header",
            env!("CARGO_MANIFEST_DIR"),
            &[&seed],
            budget(1.0),
            |b: &[u8]| {
                let mut head = [0u8; HEADER_LEN];
                let n = b.len().min(HEADER_LEN);
                head[..n].copy_from_slice(&b[..n]);
                if let Ok(h) = Header::decode(&head) {
                    assert!(h.size > 0);
                    assert_eq!(
                        h.encode()[..17],
                        head[..17],
                        "an accepted header re-encodes to itself"
                    );
                }
            },
        );
    }

    #[test]
    fn mooncake_status() {
        run(
            "mooncake-status",
            env!("CARGO_MANIFEST_DIR"),
            &[&encode_status(STATUS_REJECTED)],
            budget(1.0),
            |b: &[u8]| {
                let mut frame = [0u8; STATUS_LEN];
                let n = b.len().min(STATUS_LEN);
                frame[..n].copy_from_slice(&b[..n]);
                if let Ok(code) = decode_status(&frame) {
                    assert_eq!(encode_status(code), frame, "a frame re-encodes to itself");
                }
            },
        );
    }
}
