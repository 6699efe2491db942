//! How a slice ended, as a transport reports it: [`SliceError`] (and [`Rejection`], a
//! target's refusal), with what the engine's retry and metrics make of each. A leaf: the
//! seam ([`crate::transport`]) and the batch both stand on it.

use std::fmt;

use crate::error::Result;

/// Why a target refused a request. Carried on the wire by transports as a small integer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rejection {
    /// The request's segment secret did not match.
    BadSecret,
    /// The range is not inside one registered region.
    OutOfBounds,
    /// The region does not permit the operation (local-only, or read-only for a WRITE).
    PermissionDenied,
    /// The request itself was malformed.
    Malformed,
}

/// How a slice failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SliceError {
    /// The target checked the request and refused it; no memory was touched. Not retried.
    Rejected(Rejection),
    /// The path failed (connect refused, reset, timeout, protocol violation). Retried.
    Path(String),
    /// The local NIC failed (down, no route from it, address gone): retried, and the local rail
    /// is charged towards every remote rail, so the retry leaves it.
    LocalPath(String),
    /// The task was canceled before the slice went on the wire.
    Canceled,
    /// The transport cannot make this request to this peer (a WRITE to a Mooncake target whose
    /// framing cannot acknowledge it). Nothing was sent. Not retried.
    Unsupported(String),
    /// The target holds its cap of connections and turned this one away: nothing was sent.
    /// Retried after a backoff; the path is sound, so its rail is not charged.
    Busy(String),
}

/// The metrics' kind of a failed slice's error.
pub fn failure_kind(error: &SliceError) -> te_metrics::counters::FailureKind {
    use te_metrics::counters::FailureKind;
    match error {
        SliceError::Canceled => FailureKind::Canceled,
        SliceError::Rejected(_) | SliceError::Unsupported(_) => FailureKind::Refused,
        SliceError::Path(_) | SliceError::LocalPath(_) | SliceError::Busy(_) => FailureKind::Path,
    }
}

/// How a slice's outcome settles its rail's load ([`te_metrics::rail::RailCounters`]).
pub fn settled(outcome: &Result<(), SliceError>) -> te_metrics::rail::Settled {
    use te_metrics::rail::Settled;
    match outcome {
        Ok(()) => Settled::Done,
        Err(SliceError::Path(_) | SliceError::LocalPath(_)) => Settled::PathFailed,
        Err(_) => Settled::Other,
    }
}

impl SliceError {
    /// Whether the engine may try the slice again.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            SliceError::Path(_) | SliceError::LocalPath(_) | SliceError::Busy(_)
        )
    }
}

impl fmt::Display for SliceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SliceError::Rejected(r) => write!(f, "target rejected the request: {r:?}"),
            SliceError::Path(m) => write!(f, "path failed: {m}"),
            SliceError::LocalPath(m) => write!(f, "local NIC failed: {m}"),
            SliceError::Canceled => f.write_str("canceled"),
            SliceError::Unsupported(m) => write!(f, "not possible on this path: {m}"),
            SliceError::Busy(m) => write!(f, "target busy: {m}"),
        }
    }
}
