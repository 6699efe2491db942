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
    #[cfg(feature = "tent")]
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

#[cfg(feature = "tent")]
impl From<te_tent::TentError> for FacadeError {
    /// The classic engine's errors inside TENT's stay classic: one mapping for both backends.
    fn from(e: te_tent::TentError) -> Self {
        match e {
            te_tent::TentError::Engine(e) => FacadeError::Engine(e),
            other => FacadeError::Tent(other),
        }
    }
}

/// Every way a call can fail, as the bindings say it: one row of [`KINDS`] each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// A bad argument, configuration, batch or task id.
    InvalidArgument,
    /// A segment id that was never opened.
    UnknownSegment,
    /// More requests than the batch holds.
    TooManyRequests,
    /// An address in no registered region (local or remote).
    NotRegistered,
    /// A region's permission refuses the operation.
    AccessDenied,
    /// A batch or region still in use.
    Busy,
    /// A registration overlapping another.
    Overlap,
    /// No installed transport serves the request.
    NoTransport,
    /// No CUDA driver or device, or a driver call failed.
    Gpu,
    /// A socket failed.
    Socket,
    /// A wait ran out of time.
    WaitTimeout,
    /// A peer sent bytes that are not a well-formed message.
    Malformed,
    /// A peer refused the request.
    PeerRefused,
    /// The metadata service failed, or has no such segment.
    Metadata,
    /// A transport failed, or is not running.
    Transport,
    /// The engine is not initialized, or was closed.
    Closed,
    /// The engine belongs to the process this one was forked from.
    Forked,
    /// A transfer ended in timeout.
    TransferTimeout,
    /// A transfer was canceled.
    Canceled,
    /// A transfer failed.
    TransferFailed,
}

/// One kind: Mooncake's `ERR_*` code (what the C API and `te.mooncake` return) and the
/// `te.errors` class `te.Engine` raises.
#[derive(Clone, Copy, Debug)]
pub struct KindRow {
    /// The kind.
    pub kind: ErrorKind,
    /// Mooncake's code, negative.
    pub mooncake: i32,
    /// The Python exception class in `te.errors`.
    pub python: &'static str,
}

/// The one table from error kinds to Mooncake's codes and Python's exceptions.
pub const KINDS: [KindRow; 20] = {
    use ErrorKind as K;
    const fn row(kind: ErrorKind, mooncake: i32, python: &'static str) -> KindRow {
        KindRow {
            kind,
            mooncake,
            python,
        }
    }
    [
        row(K::InvalidArgument, -1, "InvalidArgumentError"),
        row(K::UnknownSegment, -1, "PeerError"),
        row(K::TooManyRequests, -2, "InvalidArgumentError"),
        row(K::NotRegistered, -3, "NotRegisteredError"),
        row(K::AccessDenied, -3, "AccessDeniedError"),
        row(K::Busy, -4, "BusyError"),
        row(K::Overlap, -7, "OverlapError"),
        row(K::NoTransport, -8, "TransportError"),
        row(K::Gpu, -8, "GpuError"),
        row(K::Socket, -102, "PeerError"),
        row(K::WaitTimeout, -102, "TransferTimeoutError"),
        row(K::Malformed, -103, "PeerError"),
        row(K::PeerRefused, -104, "PeerError"),
        row(K::Metadata, -200, "PeerError"),
        row(K::Transport, -202, "TeError"),
        row(K::Closed, -1, "ClosedError"),
        row(K::Forked, -1, "ForkedError"),
        row(K::TransferTimeout, -1, "TransferTimeoutError"),
        row(K::Canceled, -1, "CanceledError"),
        row(K::TransferFailed, -1, "TransferError"),
    ]
};

impl ErrorKind {
    fn row(self) -> &'static KindRow {
        KINDS.iter().find(|r| r.kind == self).unwrap_or(&KINDS[0])
    }

    /// Mooncake's `ERR_*` code for this kind.
    pub fn mooncake_code(self) -> i32 {
        self.row().mooncake
    }

    /// The `te.errors` class for this kind.
    pub fn python_class(self) -> &'static str {
        self.row().python
    }

    /// The kind of an engine error.
    pub fn of_engine(e: &te_core::Error) -> Self {
        use te_core::Error as E;
        match e {
            E::InvalidArgument(_)
            | E::InvalidConfig { .. }
            | E::InvalidBatch { .. }
            | E::InvalidTask { .. } => ErrorKind::InvalidArgument,
            E::UnknownSegment(_) => ErrorKind::UnknownSegment,
            E::TooManyRequests { .. } => ErrorKind::TooManyRequests,
            E::AddressNotRegistered { .. } | E::RemoteAddressNotRegistered { .. } => {
                ErrorKind::NotRegistered
            }
            E::PermissionDenied { .. } => ErrorKind::AccessDenied,
            E::BatchBusy(_) | E::RegionBusy { .. } => ErrorKind::Busy,
            E::AddressOverlapped { .. } => ErrorKind::Overlap,
            E::NotSupportedTransport(_) => ErrorKind::NoTransport,
            E::Gpu(_) => ErrorKind::Gpu,
            E::Socket { .. } => ErrorKind::Socket,
            E::WaitTimeout(_) => ErrorKind::WaitTimeout,
            E::MalformedMessage(_) => ErrorKind::Malformed,
            E::PeerRefused { .. } => ErrorKind::PeerRefused,
            E::Metadata(_) | E::SegmentNotFound { .. } => ErrorKind::Metadata,
            E::Transport { .. } | E::NotRunning(_) => ErrorKind::Transport,
        }
    }
}

impl FacadeError {
    /// What kind of failure this is, for every binding.
    pub fn kind(&self) -> ErrorKind {
        #[cfg(feature = "tent")]
        use te_tent::TentError as T;
        match self {
            FacadeError::NotInitialized => ErrorKind::Closed,
            FacadeError::Forked { .. } => ErrorKind::Forked,
            FacadeError::Engine(e) => ErrorKind::of_engine(e),
            #[cfg(feature = "tent")]
            FacadeError::Tent(T::Engine(e)) => ErrorKind::of_engine(e),
            #[cfg(feature = "tent")]
            FacadeError::Tent(T::TooManyRequests { .. }) => ErrorKind::TooManyRequests,
            #[cfg(feature = "tent")]
            FacadeError::Tent(T::BatchBusy(_)) => ErrorKind::Busy,
            #[cfg(feature = "tent")]
            FacadeError::Tent(T::NoTransport(_)) => ErrorKind::NoTransport,
            #[cfg(feature = "tent")]
            FacadeError::Tent(
                T::Config(_)
                | T::Metrics(_)
                | T::InvalidBatch(_)
                | T::InvalidTask { .. }
                | T::InvalidArgument(_),
            ) => ErrorKind::InvalidArgument,
            FacadeError::Transfer { state, .. } => match state {
                TransferState::Timeout => ErrorKind::TransferTimeout,
                TransferState::Canceled => ErrorKind::Canceled,
                TransferState::Waiting
                | TransferState::Pending
                | TransferState::Completed
                | TransferState::Failed => ErrorKind::TransferFailed,
            },
        }
    }

    /// Mooncake's `ERR_*` code (`mooncake/error.h`), negative: what registration calls,
    /// `send_probe` and the C API's registration functions return.
    pub fn code(&self) -> i32 {
        self.kind().mooncake_code()
    }
}

/// `ERR_INVALID_ARGUMENT`: also what Mooncake's transfer calls return for every failure.
pub const ERR_INVALID_ARGUMENT: i32 = -1;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_has_one_row_with_a_negative_code_and_a_class() {
        for (i, r) in KINDS.iter().enumerate() {
            assert!(r.mooncake < 0, "{:?}", r.kind);
            assert!(r.python.ends_with("Error"), "{:?}", r.kind);
            assert_eq!(
                KINDS.iter().position(|o| o.kind == r.kind),
                Some(i),
                "{:?} twice",
                r.kind
            );
        }
    }

    #[test]
    fn engine_errors_keep_mooncakes_codes() {
        let e = |e: te_core::Error| FacadeError::Engine(e);
        assert_eq!(e(te_core::Error::InvalidArgument("x".into())).code(), -1);
        assert_eq!(e(te_core::Error::BatchBusy(1)).code(), -4);
        assert_eq!(e(te_core::Error::Gpu("none".into())).code(), -8);
        assert_eq!(e(te_core::Error::Metadata("down".into())).code(), -200);
        assert_eq!(
            e(te_core::Error::Gpu("none".into())).kind().python_class(),
            "GpuError"
        );
        let timeout = FacadeError::Transfer {
            target: "t".into(),
            state: TransferState::Timeout,
            detail: None,
        };
        assert_eq!(
            (timeout.code(), timeout.kind().python_class()),
            (-1, "TransferTimeoutError")
        );
    }
}
