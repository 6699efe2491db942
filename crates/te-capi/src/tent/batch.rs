//! TENT's C API: batches, requests, task status, notifications and NIC loads.

#![allow(non_snake_case)] // TENT's C names

use std::ffi::{c_char, c_int, c_void};

use te_core::{Notification, TransferStatus};
use te_facade::FacadeError;
use te_facade::tent::{Priority, Request, TentBatchId, TentEngine};

use super::{
    TENTS, TentNicLoadStatC, TentNotifyInfoC, TentNotifyRecordC, TentRequestC, TentStatusC, fail,
    fixed, segment, tent_err, with,
};
use crate::registry::{guard, slice, text};

/// A batch of `batch_size` tasks: its id, or 0.
#[unsafe(no_mangle)]
pub extern "C" fn tent_allocate_batch(engine: *mut c_void, batch_size: usize) -> u64 {
    guard("tent_allocate_batch", 0, || {
        match TENTS
            .get(engine)
            .and_then(|h| h.with(|t| t.allocate_batch(batch_size).map_err(tent_err)))
        {
            Ok(b) => b.0,
            Err(e) => {
                fail(e);
                0
            }
        }
    })
}

/// Frees a batch whose tasks have ended.
#[unsafe(no_mangle)]
pub extern "C" fn tent_free_batch(engine: *mut c_void, batch_id: u64) -> c_int {
    with("tent_free_batch", engine, |t| {
        t.free_batch(TentBatchId(batch_id)).map_err(tent_err)
    })
}

/// TENT's transport number as te's transport name (0: none); one te has no transport for is
/// an error naming it.
fn hint(n: c_int) -> Result<Option<&'static str>, FacadeError> {
    Ok(te_facade::Protocol::from_tent_number(n)?.map(te_facade::Protocol::transport))
}

/// The requests at `entries`.
///
/// # Safety
/// `entries` is NULL or readable for `count` requests.
unsafe fn requests(
    t: &TentEngine,
    entries: *const TentRequestC,
    count: usize,
) -> Result<Vec<Request>, FacadeError> {
    // SAFETY: the caller's contract for `entries`.
    let entries = unsafe { slice(entries, count, "entries")? };
    entries
        .iter()
        .map(|r| {
            let opcode = crate::types::opcode(r.opcode)?;
            let priority = match r.priority {
                0 => Priority::High,
                1 => Priority::Medium,
                2 => Priority::Low,
                p => return Err(te_core::Error::InvalidArgument(format!("priority {p}")).into()),
            };
            let mut req = Request::new(
                opcode,
                r.source as u64,
                segment(t, r.target_id)?,
                r.target_offset,
                r.length,
            )
            .priority(priority);
            if let Some(h) = hint(r.transport_hint)? {
                req = req.hint(h);
            }
            Ok(req)
        })
        .collect()
}

/// Adds `count` requests to the batch.
///
/// # Safety
/// `entries` is NULL or readable for `count` requests; each local range is registered memory
/// kept allocated until its task ends.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tent_submit(
    engine: *mut c_void,
    batch_id: u64,
    entries: *mut TentRequestC,
    count: usize,
) -> c_int {
    with("tent_submit", engine, |t| {
        // SAFETY: the caller's contract for `entries`.
        let reqs = unsafe { requests(t, entries, count)? };
        t.submit(TentBatchId(batch_id), &reqs).map_err(tent_err)
    })
}

/// As `tent_submit`; the target of the first request receives the notification once every
/// task of the batch has completed.
///
/// # Safety
/// As `tent_submit`; `name` and `message` are NUL-terminated strings.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tent_submit_notif(
    engine: *mut c_void,
    batch_id: u64,
    entries: *mut TentRequestC,
    count: usize,
    name: *const c_char,
    message: *const c_char,
) -> c_int {
    with("tent_submit_notif", engine, |t| {
        // SAFETY: the caller's contract for `entries` and the strings.
        let (reqs, n) = unsafe { (requests(t, entries, count)?, note(name, message)?) };
        t.submit_with_notification(TentBatchId(batch_id), &reqs, n)
            .map_err(tent_err)
    })
}

/// # Safety
/// Both strings are NULL or NUL-terminated.
unsafe fn note(name: *const c_char, message: *const c_char) -> Result<Notification, FacadeError> {
    Ok(Notification {
        // SAFETY: the caller's contract.
        name: unsafe { text(name, "name")? }.to_string(),
        // SAFETY: the caller's contract.
        notify_msg: unsafe { text(message, "message")? }.to_string(),
    })
}

/// Sends a notification to the owner of segment `handle` without a transfer.
///
/// # Safety
/// `name` and `message` are NULL or NUL-terminated strings.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tent_send_notifs(
    engine: *mut c_void,
    handle: u64,
    name: *const c_char,
    message: *const c_char,
) -> c_int {
    with("tent_send_notifs", engine, |t| {
        // SAFETY: the caller's contract for the strings.
        let n = unsafe { note(name, message)? };
        t.send_notification(segment(t, handle)?, &n)
            .map_err(tent_err)
    })
}

/// Fills `*info` with the notifications received (drained; a `malloc`'d array, free with
/// `tent_free_notifs`). `handle` is the id of an open segment whose name is the sender's
/// `name`, else 0.
///
/// # Safety
/// `info` is NULL or writable for one `tent_notifi_info`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tent_recv_notifs(
    engine: *mut c_void,
    info: *mut TentNotifyInfoC,
) -> c_int {
    with("tent_recv_notifs", engine, |t| {
        if info.is_null() {
            return Err(te_core::Error::InvalidArgument("info is NULL".into()).into());
        }
        let got = t.receive_notifications();
        let n = got.len().min(c_int::MAX as usize);
        let records = match n {
            0 => std::ptr::null_mut(),
            // SAFETY: a fresh allocation for `n` records, each written below.
            _ => unsafe {
                libc::malloc(n * size_of::<TentNotifyRecordC>()).cast::<TentNotifyRecordC>()
            },
        };
        if n > 0 && records.is_null() {
            return Err(te_core::Error::InvalidArgument("out of memory".into()).into());
        }
        let open = t.core().open_segment_names();
        for (i, m) in got.iter().take(n).enumerate() {
            let handle = match open.contains(&m.name) {
                true => t.open_segment(&m.name).unwrap_or(0),
                false => 0,
            };
            // SAFETY: `records` holds `n` > i entries.
            unsafe {
                records.add(i).write(TentNotifyRecordC {
                    handle,
                    name: fixed(&m.name),
                    msg: fixed(&m.notify_msg),
                });
            }
        }
        // SAFETY: non-NULL and writable (the caller's contract).
        unsafe {
            info.write(TentNotifyInfoC {
                num_records: n as c_int,
                records,
            });
        }
        Ok(())
    })
}

/// Frees what `tent_recv_notifs` filled in.
///
/// # Safety
/// `info` is NULL or filled by `tent_recv_notifs` and not freed since.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tent_free_notifs(info: *mut TentNotifyInfoC) {
    guard("tent_free_notifs", (), || {
        if info.is_null() {
            return;
        }
        // SAFETY: filled by tent_recv_notifs (the caller's contract); freed once.
        unsafe {
            libc::free((*info).records.cast());
            (*info).records = std::ptr::null_mut();
            (*info).num_records = 0;
        }
    });
}

fn status_c(s: TransferStatus) -> TentStatusC {
    TentStatusC {
        status: crate::types::status_number(s.state),
        transferred_bytes: s.transferred_bytes,
    }
}

/// Writes `s` into `out` after checking it.
///
/// # Safety
/// `out` is NULL or writable for one status.
unsafe fn put(out: *mut TentStatusC, s: TransferStatus) -> Result<(), FacadeError> {
    if out.is_null() {
        return Err(te_core::Error::InvalidArgument("status is NULL".into()).into());
    }
    // SAFETY: non-NULL and writable (the caller's contract).
    unsafe { out.write(status_c(s)) };
    Ok(())
}

/// Task `task_id`'s status into `*status`.
///
/// # Safety
/// `status` is NULL or writable for one `tent_status_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tent_task_status(
    engine: *mut c_void,
    batch_id: u64,
    task_id: usize,
    status: *mut TentStatusC,
) -> c_int {
    with("tent_task_status", engine, |t| {
        let s = t
            .task_status(TentBatchId(batch_id), task_id)
            .map_err(tent_err)?;
        // SAFETY: the caller's contract for `status`.
        unsafe { put(status, s) }
    })
}

/// The batch's overall status into `*status`.
///
/// # Safety
/// `status` is NULL or writable for one `tent_status_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tent_overall_status(
    engine: *mut c_void,
    batch_id: u64,
    status: *mut TentStatusC,
) -> c_int {
    with("tent_overall_status", engine, |t| {
        let s = t.batch_status(TentBatchId(batch_id)).map_err(tent_err)?;
        // SAFETY: the caller's contract for `status`.
        unsafe { put(status, s) }
    })
}

/// Every task's status, up to `*count` of them, into `statuses`; `*count` becomes the number
/// of tasks.
///
/// # Safety
/// `count` is NULL or readable and writable; `statuses` is NULL or writable for `*count`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tent_task_status_list(
    engine: *mut c_void,
    batch_id: u64,
    statuses: *mut TentStatusC,
    count: *mut usize,
) -> c_int {
    with("tent_task_status_list", engine, |t| {
        if count.is_null() {
            return Err(te_core::Error::InvalidArgument("count is NULL".into()).into());
        }
        // SAFETY: non-NULL and readable (the caller's contract).
        let room = unsafe { count.read() };
        if statuses.is_null() && room > 0 {
            return Err(te_core::Error::InvalidArgument("statuses is NULL".into()).into());
        }
        let all = t.task_statuses(TentBatchId(batch_id)).map_err(tent_err)?;
        for (i, s) in all.iter().take(room).enumerate() {
            // SAFETY: writable for `room` > i entries (the caller's contract).
            unsafe { statuses.add(i).write(status_c(*s)) };
        }
        // SAFETY: non-NULL and writable.
        unsafe { count.write(all.len()) };
        Ok(())
    })
}

/// Cancels task `task_id`.
#[unsafe(no_mangle)]
pub extern "C" fn tent_cancel_task(engine: *mut c_void, batch_id: u64, task_id: usize) -> c_int {
    with("tent_cancel_task", engine, |t| {
        t.cancel_task(TentBatchId(batch_id), task_id)
            .map_err(tent_err)
    })
}

/// Each NIC's load, up to `*count` entries; `*count` becomes how many there are.
///
/// # Safety
/// `count` is NULL or readable and writable; `stats` is NULL or writable for `*count`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tent_get_nic_load_stats(
    engine: *mut c_void,
    stats: *mut TentNicLoadStatC,
    count: *mut usize,
) -> c_int {
    with("tent_get_nic_load_stats", engine, |t| {
        if count.is_null() {
            return Err(te_core::Error::InvalidArgument("count is NULL".into()).into());
        }
        // SAFETY: non-NULL and readable (the caller's contract).
        let room = unsafe { count.read() };
        if stats.is_null() && room > 0 {
            return Err(te_core::Error::InvalidArgument("stats is NULL".into()).into());
        }
        let loads = t.core().nic_load_stats();
        for (i, l) in loads.iter().take(room).enumerate() {
            // SAFETY: writable for `room` > i entries (the caller's contract).
            unsafe {
                stats.add(i).write(TentNicLoadStatC {
                    device_name: fixed(&l.name),
                    inflight_bytes: l.inflight_bytes,
                    ewma_bandwidth_bps: l.ewma_bandwidth_bps,
                });
            }
        }
        // SAFETY: non-NULL and writable.
        unsafe { count.write(loads.len()) };
        Ok(())
    })
}
