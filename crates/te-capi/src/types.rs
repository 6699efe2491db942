//! The C types and constants of `transfer_engine_c.h`, laid out as Mooncake's.

use std::ffi::{c_char, c_int, c_void};

/// `segment_id_t` / `segment_handle_t`.
pub type SegmentIdT = i32;
/// `batch_id_t`.
pub type BatchIdT = u64;
/// `transfer_engine_t`: an opaque handle (te looks it up; it is never dereferenced).
pub type TransferEngineT = *mut c_void;
/// `transport_t`: non-NULL when a transport was installed.
pub type TransportT = *mut c_void;

/// `LOCAL_SEGMENT`.
pub const LOCAL_SEGMENT: SegmentIdT = 0;
/// `INVALID_BATCH`.
pub const INVALID_BATCH: BatchIdT = u64::MAX;
/// `OPCODE_READ`.
pub const OPCODE_READ: c_int = 0;
/// `OPCODE_WRITE`.
pub const OPCODE_WRITE: c_int = 1;

/// `STATUS_WAITING` ... `STATUS_FAILED`, as `transfer_status.status` holds them.
pub const STATUS_WAITING: c_int = 0;
/// `STATUS_PENDING`.
pub const STATUS_PENDING: c_int = 1;
/// `STATUS_INVALID`.
pub const STATUS_INVALID: c_int = 2;
/// `STATUS_CANCELED`.
pub const STATUS_CANCELED: c_int = 3;
/// `STATUS_COMPLETED`.
pub const STATUS_COMPLETED: c_int = 4;
/// `STATUS_TIMEOUT`.
pub const STATUS_TIMEOUT: c_int = 5;
/// `STATUS_FAILED`.
pub const STATUS_FAILED: c_int = 6;

/// `struct transfer_request`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct TransferRequestC {
    /// `OPCODE_READ` or `OPCODE_WRITE`.
    pub opcode: c_int,
    /// Local address.
    pub source: *mut c_void,
    /// From `openSegment`, or `LOCAL_SEGMENT`.
    pub target_id: SegmentIdT,
    /// Address in the target segment.
    pub target_offset: u64,
    /// Bytes.
    pub length: u64,
}

/// `struct notify_msg`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct NotifyMsgC {
    /// NUL-terminated.
    pub name: *mut c_char,
    /// NUL-terminated.
    pub msg: *mut c_char,
}

/// `struct transfer_status`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct TransferStatusC {
    /// One of the `STATUS_*` values.
    pub status: c_int,
    /// Bytes moved so far.
    pub transferred_bytes: u64,
}

/// `struct buffer_entry`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BufferEntryC {
    /// Start.
    pub addr: *mut c_void,
    /// Bytes.
    pub length: usize,
}

/// `struct nic_load_stat`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct NicLoadStatC {
    /// NUL-terminated device name, truncated to 63 bytes.
    pub device_name: [c_char; 64],
    /// Bytes posted and not yet completed.
    pub inflight_bytes: u64,
    /// Smoothed completed bandwidth, bytes per second.
    pub ewma_bandwidth_bps: f64,
}

/// `ERR_INVALID_ARGUMENT`: what te returns for a bad handle, a null pointer or a bad string.
pub const ERR_INVALID_ARGUMENT: c_int = -1;
/// `ERR_NOT_IMPLEMENTED` (Mooncake's `Status::NotImplemented` is 999; its `ERR_*` is -303).
pub const ERR_NOT_IMPLEMENTED: c_int = -303;

/// `OPCODE_READ`/`OPCODE_WRITE` as te's opcode.
///
/// # Errors
/// Any other number.
pub(crate) fn opcode(n: c_int) -> Result<te_core::Opcode, te_facade::FacadeError> {
    match n {
        OPCODE_READ => Ok(te_core::Opcode::Read),
        OPCODE_WRITE => Ok(te_core::Opcode::Write),
        other => Err(te_core::Error::InvalidArgument(format!(
            "opcode {other}: OPCODE_READ (0) or OPCODE_WRITE (1)"
        ))
        .into()),
    }
}

/// A task state as the `STATUS_*` number both headers use.
pub(crate) fn status_number(state: te_core::TransferState) -> c_int {
    use te_core::TransferState as S;
    match state {
        S::Waiting => STATUS_WAITING,
        S::Pending => STATUS_PENDING,
        S::Completed => STATUS_COMPLETED,
        S::Canceled => STATUS_CANCELED,
        S::Timeout => STATUS_TIMEOUT,
        S::Failed => STATUS_FAILED,
    }
}
