//! te-tcp's error type: what can be wrong with bytes read from a TCP data connection.

/// A malformed header on the data wire, or the connection failing under it.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The header does not start with te's magic.
    #[error("bad magic {0:#010x}")]
    BadMagic(u32),
    /// Unknown opcode byte.
    #[error("bad opcode {0}")]
    BadOpcode(u8),
    /// Flags or reserved bytes are not zero.
    #[error("reserved header bytes are not zero")]
    Reserved,
    /// Zero or larger than the wire allows.
    #[error("bad request length {0}")]
    BadLength(u64),
    /// Unknown reply status code.
    #[error("bad reply status {0}")]
    BadStatus(u32),
    /// The reply answers another request than the one expected.
    #[error("reply for request {got}, expected {expected}")]
    OutOfOrder {
        /// Expected request id.
        expected: u64,
        /// Received request id.
        got: u64,
    },
    /// The listener, at its cap of data connections, refused the connection instead of
    /// greeting it.
    #[error("the target holds its cap of data connections (MC_TE_MAX_DATA_CONNECTIONS)")]
    Busy,
    /// The listener closed the connection after this many bytes of its greeting.
    #[error("the target closed the connection after {0} bytes of its greeting")]
    ShortGreeting(usize),
    /// The connection failed or timed out.
    #[error("{0}")]
    Io(#[from] std::io::Error),
}
