//! The one error type of te-core and Mooncake's numeric codes for it.
//!
//! Synchronous refusals (bad arguments, unknown handles, busy resources) are `Err(Error)`.
//! A slice failing on the wire is not an `Error`: it is a [`crate::transport::SliceError`]
//! reported through the completion sink, and shows up in the task's status.

use std::io;

/// Result alias used across te-core.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything te-core can refuse or fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An argument is out of its domain (zero length, overflow, bad location string).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// An `MC_*` variable (or config field) holds a value te cannot use.
    #[error("invalid value {value:?} for {name}: {reason}")]
    InvalidConfig {
        /// The variable or field name.
        name: String,
        /// The value as given.
        value: String,
        /// Why it was refused.
        reason: String,
    },
    /// A batch would exceed the capacity it was allocated with.
    #[error("too many requests: batch holds {capacity} tasks, {requested} requested in all")]
    TooManyRequests {
        /// Capacity given to `allocate_batch`.
        capacity: usize,
        /// Tasks already submitted plus those asked for.
        requested: usize,
    },
    /// A local range is not inside one registered region.
    #[error("address range {addr:#x}+{len} is not inside one registered region")]
    AddressNotRegistered {
        /// Start of the range.
        addr: u64,
        /// Length of the range.
        len: u64,
    },
    /// A remote range is not inside one buffer published by the target segment.
    #[error("remote range {addr:#x}+{len} is not inside one buffer of segment {segment}")]
    RemoteAddressNotRegistered {
        /// Target segment name.
        segment: String,
        /// Start of the range.
        addr: u64,
        /// Length of the range.
        len: u64,
    },
    /// The remote buffer's permission does not allow the operation.
    #[error("segment {segment} buffer at {addr:#x} does not permit {operation}")]
    PermissionDenied {
        /// Target segment name.
        segment: String,
        /// Start of the requested range.
        addr: u64,
        /// "read" or "write".
        operation: &'static str,
    },
    /// A new region overlaps one already registered.
    #[error("range {addr:#x}+{len} overlaps the registered region {existing:#x}+{existing_len}")]
    AddressOverlapped {
        /// Start of the refused range.
        addr: u64,
        /// Length of the refused range.
        len: u64,
        /// Start of the region it overlaps.
        existing: u64,
        /// Length of the region it overlaps.
        existing_len: u64,
    },
    /// The region still has slices in flight; try again once they complete.
    #[error("region {addr:#x} has {pins} transfers in flight")]
    RegionBusy {
        /// Start of the region.
        addr: u64,
        /// Transfers holding it.
        pins: u64,
    },
    /// The batch still has tasks in flight.
    #[error("batch {0:#x} still has tasks in flight")]
    BatchBusy(u64),
    /// The batch handle is stale (already freed), foreign (another engine's) or made up.
    #[error("batch handle {id:#x} is {reason}")]
    InvalidBatch {
        /// The raw handle value.
        id: u64,
        /// "stale", "foreign" or "malformed".
        reason: &'static str,
    },
    /// A task index past the tasks submitted to the batch.
    #[error("batch {batch:#x} has no task {task}")]
    InvalidTask {
        /// The raw batch handle.
        batch: u64,
        /// The task index asked for.
        task: usize,
    },
    /// The segment id was never opened here, or was closed.
    #[error("unknown segment id {0}")]
    UnknownSegment(u64),
    /// No installed transport can serve the request: the message says which was wanted and why.
    #[error("transport: {0}")]
    NotSupportedTransport(String),
    /// GPU memory was asked for where the CUDA driver, a device or a driver feature is missing
    /// (the message names which).
    #[error("GPU: {0}")]
    Gpu(String),
    /// The metadata service (or the peer, in P2P mode) could not be reached or refused.
    #[error("metadata: {0}")]
    Metadata(String),
    /// The metadata service answered, and holds no such segment (never published, or removed
    /// when its owner exited cleanly).
    #[error(
        "segment {segment} is not published in {service} (never published, or removed when its owner exited)"
    )]
    SegmentNotFound {
        /// The segment name.
        segment: String,
        /// The service asked.
        service: String,
    },
    /// A descriptor or control message was not the JSON te expects.
    #[error("malformed message: {0}")]
    MalformedMessage(String),
    /// A socket operation failed.
    #[error("{context}: {source}")]
    Socket {
        /// What te was doing.
        context: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The peer answered a control request with an error.
    #[error("peer {peer} refused: {reason}")]
    PeerRefused {
        /// The peer's address.
        peer: String,
        /// Its reason.
        reason: String,
    },
    /// A blocking wait ran out of time (the transfer goes on; cancel it or wait again).
    #[error("timed out after {0:?}")]
    WaitTimeout(std::time::Duration),
    /// The engine is not initialised, or already shut down.
    #[error("engine is not running: {0}")]
    NotRunning(&'static str),
    /// A transport failed to install or to register memory.
    #[error("transport {transport}: {reason}")]
    Transport {
        /// The transport's name.
        transport: &'static str,
        /// What went wrong.
        reason: String,
    },
}

impl From<te_reactor::Error> for Error {
    fn from(e: te_reactor::Error) -> Self {
        match e {
            te_reactor::Error::Sys(e) => Error::from(e),
            te_reactor::Error::Malformed(what) => Error::MalformedMessage(what),
            te_reactor::Error::Socket { context, source } => Error::Socket { context, source },
        }
    }
}

impl From<te_kv::KvError> for Error {
    fn from(e: te_kv::KvError) -> Self {
        match e {
            te_kv::KvError::InvalidArgument(what) => Error::InvalidArgument(what),
            te_kv::KvError::Metadata(what) => Error::Metadata(what),
            te_kv::KvError::MalformedMessage(what) => Error::MalformedMessage(what),
            te_kv::KvError::Socket { context, source } => Error::Socket { context, source },
        }
    }
}

#[cfg(feature = "cuda")]
impl From<te_cuda::Error> for Error {
    fn from(e: te_cuda::Error) -> Self {
        match e {
            te_cuda::Error::Gpu(what) => Error::Gpu(what),
            te_cuda::Error::InvalidArgument(what) => Error::InvalidArgument(what),
        }
    }
}

impl From<te_sys::Error> for Error {
    fn from(e: te_sys::Error) -> Self {
        match e {
            te_sys::Error::InvalidArgument(what) => Error::InvalidArgument(what),
            te_sys::Error::InvalidConfig {
                name,
                value,
                reason,
            } => Error::InvalidConfig {
                name,
                value,
                reason,
            },
            te_sys::Error::Memory { owner, reason } => Error::Transport {
                transport: owner,
                reason,
            },
        }
    }
}

impl Error {
    pub(crate) fn socket(context: impl Into<String>, source: io::Error) -> Self {
        Error::Socket {
            context: context.into(),
            source,
        }
    }

    /// This error, said as the wait it was when it is a socket read or write that ran out of
    /// `timeout` ([`te_reactor::waited`]). Any other error is returned as it is.
    pub(crate) fn timed_out_within(self, timeout: std::time::Duration) -> Self {
        match self {
            Error::Socket { context, source } => {
                let (context, source) = te_reactor::waited(context, source, timeout);
                Error::Socket { context, source }
            }
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_socket_timeout_is_said_as_one_and_other_errors_pass_unchanged() {
        let wait = std::time::Duration::from_millis(1500);
        let e = Error::socket("reading from x", io::ErrorKind::WouldBlock.into())
            .timed_out_within(wait);
        assert!(
            matches!(&e, Error::Socket { source, .. } if source.kind() == io::ErrorKind::TimedOut)
        );
        assert_eq!(
            e.to_string(),
            "reading from x: no answer within 1.5 s: timed out"
        );
        let refused = Error::socket("connecting to x", io::ErrorKind::ConnectionRefused.into());
        let text = refused.to_string();
        assert_eq!(refused.timed_out_within(wait).to_string(), text);
        let other = Error::InvalidArgument("y".into()).timed_out_within(wait);
        assert!(matches!(other, Error::InvalidArgument(ref s) if s == "y"));
    }
}
