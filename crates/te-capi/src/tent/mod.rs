//! TENT's C API (`tent/transfer_engine.h`, the `tent_*` functions NIXL's TENT backend calls)
//! over te-tent's runtime, reached through te-facade's engine (the one engine type under both
//! C APIs, started on TENT by `tent_create_engine`). Its convention is TENT's: 0 for success,
//! -1 for any failure (the reason goes to the log); `tent_allocate_batch` returns 0 for
//! failure. Settings given with `tent_set_config` (JSON paths like `transports/rdma/enable`,
//! values as JSON or plain text) and `tent_load_config_from_file` apply to the engines created
//! after them, over `MC_TENT_CONF` and under the `MC_*` variables, as in TENT.
//!
//! `memory` holds the memory functions, `batch` the batches, notifications and statistics.
//! Not here: Mooncake's classic C API (`engine_api`, `batch_api`).

#![allow(non_snake_case)]

mod batch;
mod memory;

use std::ffi::{c_char, c_int, c_void};
use std::sync::Mutex;

use te_facade::FacadeError;
use te_facade::tent::{TentConfig, TentEngine, TentFile};

use crate::registry::{Handles, guard, text, write_text};

/// TENT's failure code.
pub(crate) const FAIL: c_int = -1;

/// `LOCAL_SEGMENT_ID`.
pub(crate) const LOCAL_SEGMENT_ID: u64 = 0;

/// `struct tent_request` (callers zero it; `transport_hint` 0 follows the policy).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct TentRequestC {
    pub(crate) opcode: c_int,
    pub(crate) source: *mut c_void,
    pub(crate) target_id: u64,
    pub(crate) target_offset: u64,
    pub(crate) length: u64,
    pub(crate) priority: c_int,
    pub(crate) transport_hint: c_int,
}

/// `struct tent_status`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct TentStatusC {
    pub(crate) status: c_int,
    pub(crate) transferred_bytes: u64,
}

/// `struct tent_buffer_info`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct TentBufferInfoC {
    base: u64,
    length: u64,
    location: [c_char; 64],
}

/// `struct tent_segment_info`.
#[repr(C)]
#[derive(Debug)]
pub struct TentSegmentInfoC {
    kind: c_int,
    num_buffers: c_int,
    buffers: *mut TentBufferInfoC,
}

/// `struct tent_notifi_record`.
#[repr(C)]
pub struct TentNotifyRecordC {
    pub(crate) handle: u64,
    pub(crate) name: [c_char; 256],
    pub(crate) msg: [c_char; 4096],
}

/// `struct tent_notifi_info`.
#[repr(C)]
#[derive(Debug)]
pub struct TentNotifyInfoC {
    pub(crate) num_records: c_int,
    pub(crate) records: *mut TentNotifyRecordC,
}

/// `struct tent_memory_options`.
#[repr(C)]
pub struct TentMemoryOptionsC {
    pub(crate) location: [c_char; 64],
    pub(crate) permission: c_int,
    pub(crate) transport_type: c_int,
    pub(crate) shm_path: [c_char; 256],
    pub(crate) shm_offset: usize,
    pub(crate) internal: c_int,
}

/// `struct tent_nic_load_stat` (the same layout as Mooncake's `nic_load_stat`).
pub type TentNicLoadStatC = crate::types::NicLoadStatC;

/// A TENT engine: te-facade's engine, on TENT's runtime.
pub(crate) struct TentHandle {
    pub(crate) engine: te_facade::MooncakeEngine,
}

impl TentHandle {
    /// Runs `body` with TENT's runtime of this engine.
    pub(crate) fn with<T>(
        &self,
        body: impl FnOnce(&TentEngine) -> Result<T, FacadeError>,
    ) -> Result<T, FacadeError> {
        let live = self.engine.live()?;
        body(live.tent()?)
    }
}

pub(crate) static TENTS: Handles<TentHandle> = Handles::new();

/// Settings for the next `tent_create_engine`: a file (or inline JSON), then key/value pairs.
struct Settings {
    file: Option<String>,
    values: Vec<(String, serde_json::Value)>,
}

static SETTINGS: Mutex<Settings> = Mutex::new(Settings {
    file: None,
    values: Vec::new(),
});

/// Sets the JSON path `keys` under `at` to `value`, making objects on the way.
fn set_path(at: &mut serde_json::Value, keys: &[&str], value: serde_json::Value) {
    let Some((first, rest)) = keys.split_first() else {
        *at = value;
        return;
    };
    if !at.is_object() {
        *at = serde_json::Value::Object(serde_json::Map::new());
    }
    if let serde_json::Value::Object(map) = at {
        let slot = map
            .entry((*first).to_string())
            .or_insert(serde_json::Value::Null);
        set_path(slot, rest, value);
    }
}

fn settings() -> std::sync::MutexGuard<'static, Settings> {
    SETTINGS.lock().unwrap_or_else(|e| e.into_inner())
}

/// Logs `e` (at WARNING, as te's C API does) and answers TENT's failure.
pub(crate) fn fail(e: impl std::fmt::Display) -> c_int {
    tracing::warn!(function = crate::registry::entry(), error = %e, "TENT C API call failed");
    FAIL
}

pub(crate) fn tent_err(e: te_facade::tent::TentError) -> FacadeError {
    FacadeError::from(e)
}

/// The configuration for a new engine: the file, `MC_TENT_CONF`, the keys set, then `MC_*`.
fn config() -> Result<TentConfig, FacadeError> {
    let s = settings();
    let mut root = match s.file.clone().or_else(TentConfig::source_from_env) {
        Some(source) if !source.trim().is_empty() => {
            let text = match source.trim_start().starts_with('{') {
                true => source,
                false => std::fs::read_to_string(&source).map_err(|e| {
                    te_core::Error::InvalidArgument(format!("TENT config {source}: {e}"))
                })?,
            };
            serde_json::from_str::<serde_json::Value>(&text).map_err(|e| {
                te_core::Error::InvalidArgument(format!("TENT config: not JSON: {e}"))
            })?
        }
        _ => serde_json::Value::Object(serde_json::Map::new()),
    };
    for (path, value) in &s.values {
        let keys: Vec<&str> = path.split(['/', '.']).filter(|k| !k.is_empty()).collect();
        set_path(&mut root, &keys, value.clone());
    }
    drop(s);
    let file = TentFile::from_value(root).map_err(tent_err)?;
    TentConfig::from_file_and_env(file).map_err(tent_err)
}

/// Reads the settings file at `path` for the engines created next (inline JSON works too).
///
/// # Safety
/// `path` is NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tent_load_config_from_file(path: *const c_char) {
    guard("tent_load_config_from_file", (), || {
        // SAFETY: the caller's contract for `path`.
        match unsafe { text(path, "path") } {
            Ok(p) => settings().file = Some(p.to_string()),
            Err(e) => tracing::warn!(error = %e, "tent_load_config_from_file"),
        }
    });
}

/// Sets `key` (a JSON path: `metadata_type`, `transports/rdma/enable`) to `value` for the
/// engines created next; the value's type is inferred as TENT infers it (`true`/`false` in any
/// case, an integer, JSON, else text), and checked when the engine is created.
///
/// # Safety
/// `key` and `value` are NULL or NUL-terminated strings.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tent_set_config(key: *const c_char, value: *const c_char) {
    guard("tent_set_config", (), || {
        // SAFETY: the caller's contract for both strings.
        let parsed = unsafe { text(key, "key").and_then(|k| Ok((k, text(value, "value")?))) };
        match parsed {
            Ok((k, v)) => {
                let v = te_facade::tent::config::infer_value(v);
                let mut s = settings();
                s.values.retain(|(key, _)| key != k);
                s.values.push((k.to_string(), v));
            }
            Err(e) => tracing::warn!(error = %e, "tent_set_config"),
        }
    });
}

/// Creates a TENT engine from the settings; NULL on failure.
#[unsafe(no_mangle)]
pub extern "C" fn tent_create_engine() -> *mut c_void {
    guard(
        "tent_create_engine",
        std::ptr::null_mut(),
        || match config().and_then(te_facade::MooncakeEngine::started_on_tent) {
            Ok(engine) => TENTS.insert(TentHandle { engine }),
            Err(e) => {
                tracing::warn!(error = %e, "tent_create_engine failed");
                std::ptr::null_mut()
            }
        },
    )
}

/// Shuts an engine down and invalidates its handle; unknown handles are ignored.
#[unsafe(no_mangle)]
pub extern "C" fn tent_destroy_engine(engine: *mut c_void) {
    guard("tent_destroy_engine", (), || {
        if let Some(h) = TENTS.remove(engine) {
            h.engine.close();
        }
    });
}

/// Runs `body` with the engine behind `handle`: 0, or -1 (logged).
pub(crate) fn with(
    what: &'static str,
    handle: *mut c_void,
    body: impl FnOnce(&TentEngine) -> Result<(), FacadeError>,
) -> c_int {
    guard(what, FAIL, || {
        match TENTS.get(handle).and_then(|h| h.with(body)) {
            Ok(()) => 0,
            Err(e) => fail(e),
        }
    })
}

/// Whether `handle` is a live TENT engine: 1, else 0.
#[unsafe(no_mangle)]
pub extern "C" fn tent_available(engine: *mut c_void) -> c_int {
    guard("tent_available", 0, || {
        c_int::from(TENTS.get(engine).is_ok())
    })
}

/// Writes the segment name and a NUL into `buf`.
///
/// # Safety
/// `buf` is NULL or writable for `buf_len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tent_segment_name(
    engine: *mut c_void,
    buf: *mut c_char,
    buf_len: usize,
) -> c_int {
    // SAFETY: the caller's contract for `buf`.
    with("tent_segment_name", engine, |t| unsafe {
        write_text(buf, buf_len, t.segment_name())
    })
}

/// Writes the handshake host and a NUL into `addr_buf` and its port into `*port`.
///
/// # Safety
/// `addr_buf` is NULL or writable for `buf_len` bytes; `port` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tent_rpc_server_addr_port(
    engine: *mut c_void,
    addr_buf: *mut c_char,
    buf_len: usize,
    port: *mut u16,
) -> c_int {
    with("tent_rpc_server_addr_port", engine, |t| {
        if port.is_null() {
            return Err(te_core::Error::InvalidArgument("port is NULL".into()).into());
        }
        let (host, p) = te_core::control::parse_segment_name(t.segment_name(), 0)?;
        // SAFETY: the caller's contract for `addr_buf` and `port` (checked non-NULL).
        unsafe {
            write_text(addr_buf, buf_len, &host)?;
            port.write(p);
        }
        Ok(())
    })
}

/// Opens segment `name` and writes its id into `*handle` (the engine's own name gives
/// `LOCAL_SEGMENT_ID`, 0).
///
/// # Safety
/// `handle` is NULL or writable; `name` is NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tent_open_segment(
    engine: *mut c_void,
    handle: *mut u64,
    name: *const c_char,
) -> c_int {
    with("tent_open_segment", engine, |t| {
        // SAFETY: the caller's contract for `name`.
        let name = unsafe { text(name, "segment_name")? };
        if handle.is_null() {
            return Err(te_core::Error::InvalidArgument("handle is NULL".into()).into());
        }
        let id = match name == t.segment_name() {
            true => LOCAL_SEGMENT_ID,
            false => t.open_segment(name).map_err(tent_err)?,
        };
        // SAFETY: non-NULL and writable (the caller's contract).
        unsafe { handle.write(id) };
        Ok(())
    })
}

/// The te segment id of a C handle (`LOCAL_SEGMENT_ID` is the own segment).
pub(crate) fn segment(t: &TentEngine, id: u64) -> Result<u64, FacadeError> {
    match id {
        LOCAL_SEGMENT_ID => Ok(t.open_segment(t.segment_name()).map_err(tent_err)?),
        id => Ok(id),
    }
}

/// Closes a segment (the own segment stays open).
#[unsafe(no_mangle)]
pub extern "C" fn tent_close_segment(engine: *mut c_void, handle: u64) -> c_int {
    with("tent_close_segment", engine, |t| match handle {
        LOCAL_SEGMENT_ID => Ok(()),
        id => t.close_segment(id).map_err(tent_err),
    })
}

/// Fills `*info` with the segment's buffers (a `malloc`'d array; free with
/// `tent_free_segment_info`).
///
/// # Safety
/// `info` is NULL or writable for one `tent_segment_info_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tent_get_segment_info(
    engine: *mut c_void,
    handle: u64,
    info: *mut TentSegmentInfoC,
) -> c_int {
    with("tent_get_segment_info", engine, |t| {
        if info.is_null() {
            return Err(te_core::Error::InvalidArgument("info is NULL".into()).into());
        }
        let seg = t.core().segment(segment(t, handle)?)?;
        let desc = seg.desc();
        let n = desc.buffers.len().min(c_int::MAX as usize);
        let buffers = match n {
            0 => std::ptr::null_mut(),
            // SAFETY: a fresh allocation of `n` entries, each written below before use.
            _ => unsafe {
                libc::malloc(n * size_of::<TentBufferInfoC>()).cast::<TentBufferInfoC>()
            },
        };
        if n > 0 && buffers.is_null() {
            return Err(te_core::Error::InvalidArgument("out of memory".into()).into());
        }
        for (i, b) in desc.buffers.iter().take(n).enumerate() {
            // SAFETY: `buffers` holds `n` > i entries.
            unsafe {
                buffers.add(i).write(TentBufferInfoC {
                    base: b.addr,
                    length: b.length,
                    location: fixed(&b.name),
                });
            }
        }
        // SAFETY: non-NULL and writable (the caller's contract).
        unsafe {
            info.write(TentSegmentInfoC {
                kind: c_int::from(desc.is_file()),
                num_buffers: n as c_int,
                buffers,
            });
        }
        Ok(())
    })
}

/// Frees the buffers `tent_get_segment_info` filled in.
///
/// # Safety
/// `info` is NULL or filled by `tent_get_segment_info` and not freed since.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tent_free_segment_info(info: *mut TentSegmentInfoC) {
    guard("tent_free_segment_info", (), || {
        if info.is_null() {
            return;
        }
        // SAFETY: filled by tent_get_segment_info (the caller's contract); freed once.
        unsafe {
            libc::free((*info).buffers.cast());
            (*info).buffers = std::ptr::null_mut();
            (*info).num_buffers = 0;
        }
    });
}

/// `s` as a NUL-terminated fixed array, truncated.
pub(crate) fn fixed<const N: usize>(s: &str) -> [c_char; N] {
    let mut out = [0 as c_char; N];
    for (d, &b) in out.iter_mut().zip(s.as_bytes().iter().take(N - 1)) {
        *d = b as c_char;
    }
    out
}

/// A fixed C array's text up to its first NUL.
pub(crate) fn unfixed(a: &[c_char]) -> String {
    let bytes: Vec<u8> = a
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}
