//! te's Python exceptions for the native calls of `te.Engine`: each [`FacadeError`] becomes an
//! instance of one class of `te.errors` (defined in Python, so that they can also derive from
//! the built-in exception a Python caller expects: `ValueError`, `TimeoutError`, ...), carrying
//! Mooncake's `ERR_*` number as `.code`.
//!
//! Not here: `te.mooncake`'s return codes, which never raise (lib.rs).

use pyo3::prelude::*;
use te_core::TransferState;
use te_facade::FacadeError;

/// The `te.errors` class for `e`.
fn class_of(e: &FacadeError) -> &'static str {
    use te_core::Error as E;
    match e {
        FacadeError::NotInitialized => "ClosedError",
        FacadeError::Forked { .. } => "ForkedError",
        FacadeError::Transfer { state, .. } => match state {
            TransferState::Timeout => "TransferTimeoutError",
            TransferState::Canceled => "CanceledError",
            _ => "TransferError",
        },
        FacadeError::Engine(e) => match e {
            E::InvalidArgument(_)
            | E::InvalidConfig { .. }
            | E::TooManyRequests { .. }
            | E::InvalidBatch { .. }
            | E::InvalidTask { .. } => "InvalidArgumentError",
            E::AddressNotRegistered { .. } | E::RemoteAddressNotRegistered { .. } => {
                "NotRegisteredError"
            }
            E::PermissionDenied { .. } => "AccessDeniedError",
            E::AddressOverlapped { .. } => "OverlapError",
            E::RegionBusy { .. } | E::BatchBusy(_) => "BusyError",
            E::Gpu(_) => "GpuError",
            E::NotSupportedTransport(_) => "TransportError",
            E::WaitTimeout(_) => "TransferTimeoutError",
            E::UnknownSegment(_)
            | E::SegmentNotFound { .. }
            | E::Metadata(_)
            | E::MalformedMessage(_)
            | E::Socket { .. }
            | E::PeerRefused { .. } => "PeerError",
            _ => "TeError",
        },
        FacadeError::Tent(e) => match e {
            te_tent::TentError::BatchBusy(_) => "BusyError",
            te_tent::TentError::NoTransport(_) => "TransportError",
            _ => "InvalidArgumentError",
        },
        _ => "TeError",
    }
}

/// `e` as a Python exception of `te.errors`, with `.code` set.
pub(crate) fn to_py(e: FacadeError) -> PyErr {
    Python::attach(|py| {
        let made = py
            .import("te.errors")
            .and_then(|m| m.getattr(class_of(&e)))
            .and_then(|class| class.call1((e.to_string(), e.code())));
        match made {
            Ok(instance) => PyErr::from_value(instance),
            Err(import_failed) => import_failed,
        }
    })
}

/// Converts a facade result, raising te's exception.
pub(crate) fn raise<T>(r: te_facade::Result<T>) -> PyResult<T> {
    r.map_err(to_py)
}
