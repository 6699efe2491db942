//! The frames on the wire, as Mooncake's `RpcInterface` (yalantinglibs' coro_rpc, as the
//! 0.3.13 wheel speaks it) sends them, learned by running the wheel:
//!
//! - A request is a 20-byte header (magic `0x15`, version, serialize type, message type, then
//!   little-endian `u32`s: sequence number, function id, body length, attachment length), the
//!   body (the function's arguments, struct_pack encoded), then the attachment (raw bytes).
//! - A response is a 16-byte header (magic, version, error code, message type, then sequence
//!   number, body length, attachment length), the body (the return value, or on an error the
//!   message as a packed string) and an attachment.
//! - Mooncake's data call takes one string: payloads up to [`MOONCAKE_INLINE_MAX`] bytes travel
//!   in it, larger ones as the attachment beside an empty string. Its tensor call takes no
//!   argument; the tensor's raw bytes are the attachment.
//!
//! Mooncake's server hands a data or tensor call that has no attachment the last attachment
//! its connection carried; te's client therefore sends every non-empty payload to a Mooncake
//! peer as the attachment (the receiver's callback sees the same bytes).
//!
//! te's own calls use the same headers with te's function ids ([`Function`]); their bodies are
//! te's (`handshake.rs`, `tensor.rs`). Pure encoding and decoding: no I/O.

use crate::error::{Error, Result};

/// The first byte of every frame.
pub const MAGIC: u8 = 0x15;
/// Bytes of a request's header.
pub const REQUEST_HEADER: usize = 20;
/// Bytes of a response's header.
pub const RESPONSE_HEADER: usize = 16;
/// The largest payload Mooncake's client sends inside the data call's argument.
pub const MOONCAKE_INLINE_MAX: usize = 1024;

/// The calls te serves and makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Function {
    /// Mooncake's data call (`handleDataTransfer`).
    MooncakeData,
    /// Mooncake's tensor call (`handleTensorTransfer`).
    MooncakeTensor,
    /// te's greeting: versions, nonces, whether the cluster secret must be proved.
    TeHello,
    /// te's proof of the cluster secret.
    TeProof,
    /// te's message: the attachment is the payload, exactly.
    TeData,
    /// te's tensor: the body its dtype and shape, the attachment its bytes.
    TeTensor,
}

impl Function {
    /// Every call, for lookups by id.
    pub const ALL: [Function; 6] = [
        Function::MooncakeData,
        Function::MooncakeTensor,
        Function::TeHello,
        Function::TeProof,
        Function::TeData,
        Function::TeTensor,
    ];

    /// Its id on the wire.
    pub const fn id(self) -> u32 {
        match self {
            Function::MooncakeData => 0x2576_4c34,
            Function::MooncakeTensor => 0x0169_7aab,
            Function::TeHello => 0x7465_7201,
            Function::TeProof => 0x7465_7202,
            Function::TeData => 0x7465_7203,
            Function::TeTensor => 0x7465_7204,
        }
    }

    /// The call with `id`, if te knows it.
    pub fn from_id(id: u32) -> Option<Function> {
        Function::ALL.into_iter().find(|f| f.id() == id)
    }

    /// Whether its attachment is a payload for the handler.
    pub fn carries_payload(self) -> bool {
        !matches!(self, Function::TeHello | Function::TeProof)
    }

    /// Whether Mooncake's engines make this call (te's answer it without te's handshake).
    pub fn is_mooncake(self) -> bool {
        matches!(self, Function::MooncakeData | Function::MooncakeTensor)
    }
}

/// A request's header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestHeader {
    /// Matches the response to the request.
    pub seq: u32,
    /// The function's id.
    pub function: u32,
    /// Bytes of the body.
    pub body: u32,
    /// Bytes of the attachment.
    pub attachment: u32,
}

impl RequestHeader {
    /// The header's bytes.
    pub fn encode(&self) -> [u8; REQUEST_HEADER] {
        let mut b = [0u8; REQUEST_HEADER];
        b[0] = MAGIC;
        b[4..8].copy_from_slice(&self.seq.to_le_bytes());
        b[8..12].copy_from_slice(&self.function.to_le_bytes());
        b[12..16].copy_from_slice(&self.body.to_le_bytes());
        b[16..20].copy_from_slice(&self.attachment.to_le_bytes());
        b
    }

    /// Reads a header, refusing another magic, version or serialization (struct_pack is 0).
    ///
    /// # Errors
    /// A description of what is wrong (the caller names the peer).
    pub fn decode(b: &[u8; REQUEST_HEADER]) -> std::result::Result<Self, String> {
        if b[0] != MAGIC {
            return Err(format!("magic {:#04x}, not {MAGIC:#04x}", b[0]));
        }
        if b[1] != 0 || b[2] != 0 {
            return Err(format!(
                "version {} serialization {} (only 0 0)",
                b[1], b[2]
            ));
        }
        Ok(RequestHeader {
            seq: u32_at(b, 4),
            function: u32_at(b, 8),
            body: u32_at(b, 12),
            attachment: u32_at(b, 16),
        })
    }
}

/// A response's header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResponseHeader {
    /// The request's sequence number.
    pub seq: u32,
    /// 0, or the error's code (the body is then its message).
    pub error: u8,
    /// Bytes of the body.
    pub body: u32,
    /// Bytes of the attachment.
    pub attachment: u32,
}

impl ResponseHeader {
    /// The header's bytes.
    pub fn encode(&self) -> [u8; RESPONSE_HEADER] {
        let mut b = [0u8; RESPONSE_HEADER];
        b[0] = MAGIC;
        b[2] = self.error;
        b[4..8].copy_from_slice(&self.seq.to_le_bytes());
        b[8..12].copy_from_slice(&self.body.to_le_bytes());
        b[12..16].copy_from_slice(&self.attachment.to_le_bytes());
        b
    }

    /// Reads a header.
    ///
    /// # Errors
    /// A description of what is wrong.
    pub fn decode(b: &[u8; RESPONSE_HEADER]) -> std::result::Result<Self, String> {
        if b[0] != MAGIC || b[1] != 0 || b[3] != 0 {
            return Err(format!(
                "response magic {:#04x} version {} message type {}",
                b[0], b[1], b[3]
            ));
        }
        Ok(ResponseHeader {
            seq: u32_at(b, 4),
            error: b[2],
            body: u32_at(b, 8),
            attachment: u32_at(b, 12),
        })
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// The error codes coro_rpc answers with (those te sends and Mooncake's server sent).
pub mod code {
    /// The arguments did not decode.
    pub const INVALID_ARGUMENT: u8 = 4;
    /// No function with that id.
    pub const NOT_REGISTERED: u8 = 11;
    /// te's: the message is over the server's limit.
    pub const TOO_LARGE: u8 = 27;
    /// te's: the caller has not proved the cluster secret, or is not admitted.
    pub const NOT_TRUSTED: u8 = 28;
    /// te's: the server is stopping.
    pub const STOPPING: u8 = 29;
}

/// The type hash of a packed string (the data call's argument, an error's message), its low
/// bit (metadata follows) cleared.
const STRING_HASH: u32 = 0x9dcf_fa76;
/// The type information Mooncake's build adds after a string's metadata byte.
const STRING_TYPE_INFO: [u8; 3] = [0x80, 0x0c, 0x00];
/// A packed `void` return, as Mooncake's server answers a data or tensor call.
pub const VOID_RETURN: [u8; 7] = [0xeb, 0xcf, 0x01, 0x89, 0x04, 0xfa, 0x00];
/// The metadata byte's bit saying type information follows.
const META_TYPE_INFO: u8 = 0x04;

/// Packs `s` as Mooncake's client packs the data call's string (type information included,
/// the length in 1, 2, 4 or 8 bytes as it needs).
pub fn pack_string(s: &[u8], out: &mut Vec<u8>) {
    let width: usize = match s.len() {
        0..=0xff => 1,
        0x100..=0xffff => 2,
        0x1_0000..=0xffff_ffff => 4,
        _ => 8,
    };
    let width_bits = width.trailing_zeros() as u8;
    out.extend_from_slice(&(STRING_HASH | 1).to_le_bytes());
    out.push(META_TYPE_INFO | (width_bits << 3));
    out.extend_from_slice(&STRING_TYPE_INFO);
    out.extend_from_slice(&(s.len() as u64).to_le_bytes()[..width]);
    out.extend_from_slice(s);
}

/// The bytes of a packed string: where they start in `body` and how many, checked against
/// `body` (with or without metadata, as a release or a debug build packs it).
///
/// # Errors
/// What is wrong with the body.
pub fn unpack_string(body: &[u8]) -> std::result::Result<std::ops::Range<usize>, String> {
    let hash = body
        .get(..4)
        .map(|h| u32_at(h, 0))
        .ok_or("a string shorter than its type hash")?;
    if hash & !1 != STRING_HASH {
        return Err(format!("type hash {hash:#010x} is not a string's"));
    }
    let mut at = 4;
    let mut width = 1usize;
    if hash & 1 == 1 {
        let meta = *body.get(at).ok_or("no metadata byte")?;
        at += 1;
        if meta & 0x03 != 0 || meta & 0xe0 != 0 {
            return Err(format!(
                "metadata {meta:#04x} (compatible fields, reserved bits)"
            ));
        }
        width = 1 << ((meta >> 3) & 0x03);
        if meta & META_TYPE_INFO != 0 {
            let info = body.get(at..at + STRING_TYPE_INFO.len());
            if info != Some(&STRING_TYPE_INFO[..]) {
                return Err("type information is not a string's".into());
            }
            at += STRING_TYPE_INFO.len();
        }
    }
    let len_bytes = body
        .get(at..at + width)
        .ok_or("a string cut in its length")?;
    let mut len = [0u8; 8];
    len[..width].copy_from_slice(len_bytes);
    let len = u64::from_le_bytes(len);
    at += width;
    let left = (body.len() - at) as u64;
    if len != left {
        return Err(format!("a string of {len} bytes in {left} bytes"));
    }
    Ok(at..body.len())
}

/// Bounds announced lengths before anything is allocated for them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// The largest payload (a message's or a tensor's bytes).
    pub max_message: u64,
}

impl Limits {
    /// The largest body beside a payload: a packed string's prefix, or a tensor's shape.
    pub const MAX_OVERHEAD: u64 = 256;

    /// Checks a request's lengths: the body and attachment together at most one payload and
    /// its overhead, so a header costs nothing until its bytes come.
    ///
    /// # Errors
    /// [`Error::TooLarge`].
    pub fn check(&self, body: u32, attachment: u32) -> Result<()> {
        let len = u64::from(body) + u64::from(attachment);
        if len > self.max_message + Self::MAX_OVERHEAD {
            return Err(Error::TooLarge {
                len,
                max: self.max_message,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bytes the wheel's client sent for `send_data(b"\0\x01\x02\x03\x04")` (header and
    /// body), and its server's answer.
    #[test]
    fn frames_match_what_the_wheel_sends() {
        let mut body = Vec::new();
        pack_string(&[0, 1, 2, 3, 4], &mut body);
        let head = RequestHeader {
            seq: 1,
            function: Function::MooncakeData.id(),
            body: body.len() as u32,
            attachment: 0,
        };
        let mut frame = head.encode().to_vec();
        frame.extend_from_slice(&body);
        let wheel = "1500000001000000344c76250e0000000000000077facf9d04800c00050001020304";
        assert_eq!(hex(&frame), wheel);
        assert_eq!(
            RequestHeader::decode(frame[..20].try_into().unwrap()),
            Ok(head)
        );
        let answer = ResponseHeader {
            seq: 1,
            error: 0,
            body: 7,
            attachment: 0,
        };
        let mut a = answer.encode().to_vec();
        a.extend_from_slice(&VOID_RETURN);
        assert_eq!(hex(&a), "15000000010000000700000000000000ebcf018904fa00");
    }

    #[test]
    fn strings_pack_and_unpack_at_every_length_width() {
        for len in [0usize, 5, 255, 256, 1024, 70_000] {
            let s: Vec<u8> = (0..len).map(|i| i as u8).collect();
            let mut body = Vec::new();
            pack_string(&s, &mut body);
            let range = unpack_string(&body).unwrap();
            assert_eq!(&body[range], &s[..], "{len}");
        }
        // The wheel's 1,024-byte argument: a two-byte length.
        let mut body = Vec::new();
        pack_string(&[7; 1024], &mut body);
        assert_eq!(hex(&body[..10]), "77facf9d0c800c000004");
        // A release build's string: no metadata.
        let plain = [0x76, 0xfa, 0xcf, 0x9d, 2, b'h', b'i'];
        assert_eq!(&plain[unpack_string(&plain).unwrap()], b"hi");
    }

    #[test]
    fn hostile_strings_are_refused_without_reading_past_the_body() {
        let cases: [&[u8]; 7] = [
            &[],
            &[0x11, 0x11, 0x11, 0x11, 5, b'h'],
            &[0x77, 0xfa, 0xcf, 0x9d],
            &[0x77, 0xfa, 0xcf, 0x9d, 0x04, 0x80, 0x0c],
            &[0x77, 0xfa, 0xcf, 0x9d, 0x05, 0x80, 0x0c, 0x00, 0],
            &[
                0x77, 0xfa, 0xcf, 0x9d, 0x1c, 0x80, 0x0c, 0x00, 0xff, 0xff, 0xff, 0xff,
            ],
            &[0x76, 0xfa, 0xcf, 0x9d, 200, b'x'],
        ];
        for body in cases {
            assert!(unpack_string(body).is_err(), "{body:?}");
        }
    }

    #[test]
    fn headers_refuse_other_magic_and_versions() {
        let mut b = RequestHeader {
            seq: 0,
            function: 1,
            body: 0,
            attachment: 0,
        }
        .encode();
        b[0] = 0x16;
        assert!(RequestHeader::decode(&b).unwrap_err().contains("magic"));
        b[0] = MAGIC;
        b[1] = 1;
        assert!(RequestHeader::decode(&b).unwrap_err().contains("version"));
    }

    #[test]
    fn limits_bound_the_announced_lengths() {
        let l = Limits { max_message: 1000 };
        assert!(l.check(10, 1000).is_ok());
        assert!(matches!(
            l.check(u32::MAX, u32::MAX),
            Err(Error::TooLarge { max: 1000, .. })
        ));
    }

    #[test]
    fn function_ids_are_distinct_and_round_trip() {
        for f in Function::ALL {
            assert_eq!(Function::from_id(f.id()), Some(f));
        }
        assert_eq!(Function::from_id(0x1234_5678), None);
    }

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }
}
