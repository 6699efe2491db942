//! The errors of te-reactor: a setting out of range (te-sys's error, as its environment reader
//! gives it), a malformed HTTP message, a socket that failed. te-core turns each into its own
//! error of the same kind.

use std::io;

/// What went wrong.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
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

/// te-reactor's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;
