//! The facade's one error type, and Mooncake's numbers for it.

use te_core::TransferState;

/// Result alias of the facade.
pub type Result<T, E = FacadeError> = std::result::Result<T, E>;

/// Everything a Mooncake-shaped call can fail with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FacadeError {
    /// A call that needs an engine came before `initialize` (or after `close`). Mooncake
    /// dereferences a null pointer here; te answers this.
    #[error("the engine is not initialized: call initialize() first (or it was closed)")]
    NotInitialized,
    /// The engine was initialized in another process: this one is a child forked since, and
    /// has none of the engine's threads or listeners. Initialize a new engine here.
    #[error(
        "the engine belongs to process {owner}; this process ({this}) was forked from it: initialize a new engine here"
    )]
    Forked {
        /// The process that initialized the engine.
        owner: u32,
        /// This process.
        this: u32,
    },
    /// te refused or failed the call.
    #[error(transparent)]
    Engine(#[from] te_core::Error),
    /// TENT refused or failed the call (a `te.Engine(backend="tent")`).
    #[error(transparent)]
    Tent(te_tent::TentError),
    /// A transfer was submitted and ended in another state than COMPLETED.
    #[error("transfer to {target} ended {state:?}{}", detail.as_deref().map(|d| format!(": {d}")).unwrap_or_default())]
    Transfer {
        /// The peer's segment name.
        target: String,
        /// The state it ended in.
        state: TransferState,
        /// The first slice error, when one was recorded.
        detail: Option<String>,
    },
}

impl From<te_tent::TentError> for FacadeError {
    /// The classic engine's errors inside TENT's stay classic: one mapping for both backends.
    fn from(e: te_tent::TentError) -> Self {
        match e {
            te_tent::TentError::Engine(e) => FacadeError::Engine(e),
            other => FacadeError::Tent(other),
        }
    }
}

impl FacadeError {
    /// Mooncake's `ERR_*` code (`mooncake/error.h`), negative: what registration calls,
    /// `send_probe` and the C API's registration functions return.
    pub fn code(&self) -> i32 {
        match self {
            FacadeError::NotInitialized | FacadeError::Forked { .. } => ERR_INVALID_ARGUMENT,
            FacadeError::Engine(e) => e.mooncake_code(),
            FacadeError::Tent(te_tent::TentError::Engine(e)) => e.mooncake_code(),
            FacadeError::Tent(te_tent::TentError::TooManyRequests { .. }) => -2,
            FacadeError::Tent(te_tent::TentError::BatchBusy(_)) => -4,
            FacadeError::Tent(te_tent::TentError::NoTransport(_)) => -8,
            FacadeError::Tent(_) => ERR_INVALID_ARGUMENT,
            FacadeError::Transfer { .. } => ERR_INVALID_ARGUMENT,
        }
    }
}

/// `ERR_INVALID_ARGUMENT`: also what Mooncake's transfer calls return for every failure.
pub const ERR_INVALID_ARGUMENT: i32 = -1;
