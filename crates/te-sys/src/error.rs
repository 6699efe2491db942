//! The errors of te-sys. te-core turns each into its own error of the same kind.

/// What went wrong.
#[derive(Clone, Debug, thiserror::Error)]
pub enum Error {
    /// A setting te cannot honour (the variable named).
    #[error("invalid setting {name}={value:?}: {reason}")]
    InvalidConfig {
        /// The variable.
        name: String,
        /// The value as given.
        value: String,
        /// Why it was refused.
        reason: String,
    },
    /// An argument that cannot be honoured (a zero length, a range past a buffer's end, a
    /// shared-memory name that is not te's).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// Memory could not be had or mapped.
    #[error("{owner}: {reason}")]
    Memory {
        /// Whose memory: `host` (heap) or `shm` (a shared file).
        owner: &'static str,
        /// What went wrong.
        reason: String,
    },
}

/// te-sys's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;
