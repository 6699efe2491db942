//! The errors of te-cuda. te-core turns each into its own error of the same kind.

/// What went wrong.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No CUDA driver or device, or a driver call that failed.
    #[error("GPU: {0}")]
    Gpu(String),
    /// An argument the driver cannot honour (a range, a handle).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
}

/// te-cuda's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;
