//! The errors of te-rpc: a setting or argument te cannot honour, a message over its limit, a
//! peer that broke the protocol, refused a call or did not answer in time, a socket that failed.

use std::io;
use std::net::SocketAddr;

/// What went wrong.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A setting or argument te cannot honour, named.
    #[error("invalid {name} {value:?}: {reason}")]
    Invalid {
        /// What was given.
        name: String,
        /// Its value.
        value: String,
        /// Why it cannot be honoured.
        reason: String,
    },
    /// A variable te cannot honour (te-sys's error, naming it).
    #[error(transparent)]
    Setting(#[from] te_sys::Error),
    /// A message larger than the limit on one side.
    #[error("a message of {len} bytes is over the limit of {max} bytes")]
    TooLarge {
        /// Its length.
        len: u64,
        /// The limit.
        max: u64,
    },
    /// Bytes from the peer that are not a well-formed frame of either protocol.
    #[error("malformed frame from {peer}: {reason}")]
    Malformed {
        /// Who sent it.
        peer: SocketAddr,
        /// What is wrong with it.
        reason: String,
    },
    /// The peer answered the call with an error.
    #[error("{peer} refused the call (code {code}): {message}")]
    Refused {
        /// Who answered.
        peer: SocketAddr,
        /// The protocol's error code.
        code: u8,
        /// The peer's message.
        message: String,
    },
    /// The peer did not prove the cluster secret, or is not admitted without it.
    #[error("{peer} is not trusted: {reason}")]
    Untrusted {
        /// Who.
        peer: SocketAddr,
        /// Why.
        reason: String,
    },
    /// The call's deadline passed.
    #[error("{peer} did not answer within {secs} s ({what})")]
    TimedOut {
        /// The peer.
        peer: SocketAddr,
        /// What was waited for.
        what: &'static str,
        /// The timeout.
        secs: f64,
    },
    /// A socket operation failed.
    #[error("{context}: {source}")]
    Socket {
        /// What was being done.
        context: String,
        /// The operating system's error.
        #[source]
        source: io::Error,
    },
    /// The communicator was stopped.
    #[error("the RPC communicator is stopped")]
    Stopped,
}

impl Error {
    pub(crate) fn invalid(name: &str, value: impl ToString, reason: impl Into<String>) -> Self {
        Error::Invalid {
            name: name.into(),
            value: value.to_string(),
            reason: reason.into(),
        }
    }

    pub(crate) fn socket(context: impl Into<String>, source: io::Error) -> Self {
        Error::Socket {
            context: context.into(),
            source,
        }
    }

    /// The negative return code Mooncake's API gives for this error (its calls return 0 or
    /// a negative number): -1 for a refusal or broken peer, -2 for a timeout, -3 for bad
    /// arguments, -4 for an untrusted peer, -5 once stopped.
    pub fn code(&self) -> i32 {
        use crate::wire::code;
        match self {
            Error::Refused {
                code: code::TOO_LARGE,
                ..
            } => -3,
            Error::Refused {
                code: code::NOT_TRUSTED,
                ..
            } => -4,
            Error::Invalid { .. } | Error::TooLarge { .. } | Error::Setting(_) => -3,
            Error::TimedOut { .. } => -2,
            Error::Untrusted { .. } => -4,
            Error::Stopped => -5,
            Error::Malformed { .. } | Error::Refused { .. } | Error::Socket { .. } => -1,
        }
    }
}

/// te-rpc's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;
