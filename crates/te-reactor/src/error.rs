//! The errors of te-reactor: a setting out of range (te-sys's error, as its environment reader
//! gives it), a malformed HTTP message, a socket that failed. te-core turns each into its own
//! error of the same kind.

use std::io;

/// What went wrong.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A setting te cannot honour (`te_sys::Error::InvalidConfig`, naming it).
    #[error(transparent)]
    Sys(#[from] te_sys::Error),
    /// Bytes from the network that are not a well-formed message.
    #[error("malformed message: {0}")]
    Malformed(String),
    /// A socket operation failed.
    #[error("{context}: {source}")]
    Socket {
        /// What was being done.
        context: String,
        /// The operating system's error.
        #[source]
        source: io::Error,
    },
}

impl Error {
    pub(crate) fn socket(context: impl Into<String>, source: io::Error) -> Self {
        Error::Socket {
            context: context.into(),
            source,
        }
    }
}

/// A socket error's `(context, source)` said as the wait it was when a read or write ran out
/// of `timeout` (a socket's timeout reports `WouldBlock`, "Resource temporarily unavailable"):
/// "no answer within N s", with a `TimedOut` source; any other returned as it is. The socket
/// errors of te-core and te-kv are said so.
pub fn waited(
    context: String,
    source: io::Error,
    timeout: std::time::Duration,
) -> (String, io::Error) {
    match source.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => (
            format!("{context}: no answer within {} s", timeout.as_secs_f64()),
            io::ErrorKind::TimedOut.into(),
        ),
        _ => (context, source),
    }
}

/// te-reactor's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;
