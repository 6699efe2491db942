//! The batch, notification and statistics functions of `transfer_engine_c.h`.

#![allow(non_snake_case)] // Mooncake's C names

use std::ffi::{c_char, c_int};

use te_core::Notification;
use te_facade::{FacadeError, SegmentRequest};

use crate::registry::{self, err_code, guard, slice, status_code, text};
use crate::types::{
    BatchIdT, ERR_INVALID_ARGUMENT, INVALID_BATCH, NicLoadStatC, NotifyMsgC, STATUS_INVALID,
    TransferEngineT, TransferRequestC, TransferStatusC,
};

/// Mooncake's `Status::InvalidArgument`, positive: submit, status and free's answer for a bad
/// handle or pointer.
const STATUS_INVALID_ARGUMENT: c_int = 1;

/// Allocates a batch of `batch_size` tasks: its id, or `INVALID_BATCH` (`UINT64_MAX`).
#[unsafe(no_mangle)]
pub extern "C" fn allocateBatchID(engine: TransferEngineT, batch_size: usize) -> BatchIdT {
    guard("allocateBatchID", INVALID_BATCH, || {
        match registry::get(engine).and_then(|e| e.allocate_batch_id(batch_size)) {
            Ok(id) => id,
            Err(e) => {
                registry::failed(&e);
                INVALID_BATCH
            }
        }
    })
}

/// The requests at `entries` in te's terms, converted as the facade takes them (a bad opcode
/// is that request's error).
///
/// # Safety
/// `entries` is NULL or readable for `count` requests.
unsafe fn requests(
    entries: *const TransferRequestC,
    count: usize,
) -> Result<impl Iterator<Item = Result<SegmentRequest, FacadeError>>, FacadeError> {
    // SAFETY: the caller's contract for `entries`.
    let entries = unsafe { slice(entries, count, "entries")? };
    Ok(entries.iter().map(|r| {
        Ok(SegmentRequest {
            opcode: crate::types::opcode(r.opcode)?,
            source: r.source as u64,
            target_id: r.target_id,
            target_offset: r.target_offset,
            length: r.length,
        })
    }))
}

/// A notification from C strings.
///
/// # Safety
/// Both strings are NULL or NUL-terminated.
unsafe fn notification(msg: &NotifyMsgC) -> Result<Notification, FacadeError> {
    Ok(Notification {
        // SAFETY: the caller's contract for `name`.
        name: unsafe { text(msg.name, "notify_msg.name")? }.to_string(),
        // SAFETY: the caller's contract for `msg`.
        notify_msg: unsafe { text(msg.msg, "notify_msg.msg")? }.to_string(),
    })
}

/// Adds `count` requests to batch `batch_id` (repeatable until the batch is full): 0, or
/// Mooncake's positive `Status` code (1 invalid argument, 3 not registered, ...).
///
/// # Safety
/// `entries` is NULL or readable for `count` requests; each request's local range lies in
/// memory registered with this engine (te checks it), kept until the task ends.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn submitTransfer(
    engine: TransferEngineT,
    batch_id: BatchIdT,
    entries: *mut TransferRequestC,
    count: usize,
) -> c_int {
    guard("submitTransfer", STATUS_INVALID_ARGUMENT, || {
        status_code(registry::get(engine).and_then(|e| {
            // SAFETY: the caller's contract for `entries`.
            let reqs = unsafe { requests(entries, count)? };
            e.submit_to_batch(batch_id, reqs, None)
        }))
    })
}

/// As `submitTransfer`; once every task of the batch has completed, the target of the first
/// request receives `notify_msg` (after the data).
///
/// # Safety
/// As `submitTransfer`; `notify_msg.name` and `.msg` are NUL-terminated strings.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn submitTransferWithNotify(
    engine: TransferEngineT,
    batch_id: BatchIdT,
    entries: *mut TransferRequestC,
    count: usize,
    notify_msg: NotifyMsgC,
) -> c_int {
    guard("submitTransferWithNotify", STATUS_INVALID_ARGUMENT, || {
        status_code(registry::get(engine).and_then(|e| {
            // SAFETY: the caller's contract for `entries` and the strings.
            let reqs = unsafe { requests(entries, count)? };
            // SAFETY: as above.
            let n = unsafe { notification(&notify_msg)? };
            e.submit_to_batch(batch_id, reqs, Some(n))
        }))
    })
}

/// Fills `status` with task `task_id` of batch `batch_id`: 0, or a positive `Status` code
/// (the status then says `STATUS_INVALID`).
///
/// # Safety
/// `status` is NULL or writable for one `struct transfer_status`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn getTransferStatus(
    engine: TransferEngineT,
    batch_id: BatchIdT,
    task_id: usize,
    status: *mut TransferStatusC,
) -> c_int {
    guard("getTransferStatus", STATUS_INVALID_ARGUMENT, || {
        // SAFETY: the caller's contract for `status`.
        unsafe {
            report_status(status, || {
                registry::get(engine).and_then(|e| e.batch_task_status(batch_id, task_id))
            })
        }
    })
}

/// te's extension: waits up to `timeout_us` microseconds for every task of batch `batch_id` to
/// end, asleep (no polling), and fills `status` with the batch's state and bytes moved: a
/// terminal state when it ended, `STATUS_WAITING` or `STATUS_PENDING` when the time ran out.
/// Returns 0, or a positive `Status` code (the status then says `STATUS_INVALID`). The batch
/// is not freed.
///
/// # Safety
/// `status` is NULL or writable for one `struct transfer_status`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn te_waitBatch(
    engine: TransferEngineT,
    batch_id: BatchIdT,
    timeout_us: u64,
    status: *mut TransferStatusC,
) -> c_int {
    guard("te_waitBatch", STATUS_INVALID_ARGUMENT, || {
        let timeout = std::time::Duration::from_micros(timeout_us);
        // SAFETY: the caller's contract for `status`.
        unsafe {
            report_status(status, || {
                registry::get(engine).and_then(|e| e.wait_batch_status(batch_id, timeout))
            })
        }
    })
}

/// te's extension: cancels batch `batch_id`: no more of its slices start, those on the wire
/// finish, and it ends CANCELED (or COMPLETED, when nothing was left). Returns 0, or a positive
/// `Status` code (1 for an unknown or freed batch). The batch is not freed: wait for its end
/// (`te_waitBatch`), then call `freeBatchID`.
#[unsafe(no_mangle)]
pub extern "C" fn te_cancelBatch(engine: TransferEngineT, batch_id: BatchIdT) -> c_int {
    guard("te_cancelBatch", STATUS_INVALID_ARGUMENT, || {
        status_code(registry::get(engine).and_then(|e| e.cancel_batch_id(batch_id)))
    })
}

/// Writes the status `get` gives (or `STATUS_INVALID`, for its error) to `status`; returns 0
/// or the error's positive `Status` code. A NULL `status` is `InvalidArgument`, and `get` is
/// not called.
///
/// # Safety
/// `status` is NULL or writable for one `struct transfer_status`.
unsafe fn report_status(
    status: *mut TransferStatusC,
    get: impl FnOnce() -> Result<te_core::TransferStatus, FacadeError>,
) -> c_int {
    if status.is_null() {
        return STATUS_INVALID_ARGUMENT;
    }
    let (out, code) = match get() {
        Ok(s) => (
            TransferStatusC {
                status: crate::types::status_number(s.state),
                transferred_bytes: s.transferred_bytes,
            },
            0,
        ),
        Err(e) => {
            registry::failed(&e);
            (
                TransferStatusC {
                    status: STATUS_INVALID,
                    transferred_bytes: 0,
                },
                e.status_code(),
            )
        }
    };
    // SAFETY: non-NULL and writable for one struct (the caller's contract).
    unsafe { status.write(out) };
    code
}

/// Frees batch `batch_id`: 0, or a positive `Status` code (4 while tasks still move).
#[unsafe(no_mangle)]
pub extern "C" fn freeBatchID(engine: TransferEngineT, batch_id: BatchIdT) -> c_int {
    guard("freeBatchID", STATUS_INVALID_ARGUMENT, || {
        status_code(registry::get(engine).and_then(|e| e.free_batch_id(batch_id)))
    })
}

/// `s` as a `malloc`'d NUL-terminated copy (NULL when out of memory).
fn c_copy(s: &str) -> *mut c_char {
    // SAFETY: a fresh allocation of len+1 bytes, filled and terminated before it is returned.
    unsafe {
        let p = libc::malloc(s.len() + 1).cast::<u8>();
        if p.is_null() {
            return std::ptr::null_mut();
        }
        std::ptr::copy_nonoverlapping(s.as_ptr(), p, s.len());
        *p.add(s.len()) = 0;
        p.cast()
    }
}

/// The notifications received (drained), as a `malloc`'d array of `*size` entries whose
/// strings are `malloc`'d too; NULL (and `*size` 0) when there are none or on error. Free it
/// with `freeNotifsMsgBuf`.
///
/// # Safety
/// `size` is NULL or writable for one `int`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn getNotifsFromEngine(
    engine: TransferEngineT,
    size: *mut c_int,
) -> *mut NotifyMsgC {
    guard("getNotifsFromEngine", std::ptr::null_mut(), || {
        if size.is_null() {
            return std::ptr::null_mut();
        }
        let got = registry::get(engine)
            .and_then(|e| e.take_notifies())
            .unwrap_or_default();
        let n = got.len().min(c_int::MAX as usize);
        // SAFETY: `size` is non-NULL and writable (the caller's contract).
        unsafe { size.write(0) };
        if n == 0 {
            return std::ptr::null_mut();
        }
        // SAFETY: a fresh allocation for `n` entries, each written before it is returned.
        unsafe {
            let array = libc::malloc(n * size_of::<NotifyMsgC>()).cast::<NotifyMsgC>();
            if array.is_null() {
                return std::ptr::null_mut();
            }
            for (i, note) in got.iter().take(n).enumerate() {
                array.add(i).write(NotifyMsgC {
                    name: c_copy(&note.notification.name),
                    msg: c_copy(&note.notification.notify_msg),
                });
            }
            size.write(n as c_int);
            array
        }
    })
}

/// Frees what `getNotifsFromEngine` returned: 0 (NULL or a size of 0 or less frees nothing).
///
/// # Safety
/// `msg` is NULL or an array from `getNotifsFromEngine` of `size` entries, not freed before.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn freeNotifsMsgBuf(msg: *mut NotifyMsgC, size: c_int) -> c_int {
    guard("freeNotifsMsgBuf", 0, || {
        if msg.is_null() {
            return 0;
        }
        // SAFETY: an array of `size` entries from getNotifsFromEngine (the caller's
        // contract), each string malloc'd there.
        unsafe {
            for i in 0..usize::try_from(size).unwrap_or(0) {
                let m = msg.add(i).read();
                libc::free(m.name.cast());
                libc::free(m.msg.cast());
            }
            libc::free(msg.cast());
        }
        0
    })
}

/// Sends `notify_msg` to the owner of segment `target_id` without a transfer: 0, or a
/// negative `ERR_*`.
///
/// # Safety
/// `notify_msg.name` and `.msg` are NULL or NUL-terminated strings.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn genNotifyInEngine(
    engine: TransferEngineT,
    target_id: u64,
    notify_msg: NotifyMsgC,
) -> c_int {
    guard("genNotifyInEngine", ERR_INVALID_ARGUMENT, || {
        err_code(registry::get(engine).and_then(|e| {
            // SAFETY: the caller's contract for the strings.
            let n = unsafe { notification(&notify_msg)? };
            e.notify_segment(target_id, &n)
        }))
    })
}

/// Fills up to `*count` entries of `stats` with each NIC's load and sets `*count` to how many
/// there are: 0; -1 for NULL arguments; a positive `Status` code for a bad handle.
///
/// # Safety
/// `count` is NULL or readable and writable for one `size_t`; `stats` is NULL or writable for
/// `*count` entries.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn getNicLoadStats(
    engine: TransferEngineT,
    stats: *mut NicLoadStatC,
    count: *mut usize,
) -> c_int {
    guard("getNicLoadStats", ERR_INVALID_ARGUMENT, || {
        if count.is_null() {
            return ERR_INVALID_ARGUMENT;
        }
        // SAFETY: non-NULL, readable (the caller's contract).
        let room = unsafe { count.read() };
        if stats.is_null() && room > 0 {
            return ERR_INVALID_ARGUMENT;
        }
        let loads = match registry::get(engine).and_then(|e| e.nic_loads()) {
            Ok(l) => l,
            Err(e) => return e.status_code(),
        };
        for (i, load) in loads.iter().take(room).enumerate() {
            let mut name = [0 as c_char; 64];
            for (d, &b) in name
                .iter_mut()
                .zip(load.device_name.as_bytes().iter().take(63))
            {
                *d = b as c_char;
            }
            // SAFETY: `stats` is writable for `room` > i entries (the caller's contract).
            unsafe {
                stats.add(i).write(NicLoadStatC {
                    device_name: name,
                    inflight_bytes: load.inflight_bytes,
                    ewma_bandwidth_bps: load.ewma_bandwidth_bps,
                });
            }
        }
        // SAFETY: non-NULL, writable (the caller's contract).
        unsafe { count.write(loads.len()) };
        0
    })
}
