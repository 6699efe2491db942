//! The engine, segment, transport and memory functions of `transfer_engine_c.h`.

#![allow(non_snake_case)] // Mooncake's C names

use std::ffi::{c_char, c_int, c_void};

use te_core::Permission;
use te_facade::{FacadeError, MooncakeEngine};

use crate::registry::{self, err_code, guard, slice, text, write_text};
use crate::types::{
    BufferEntryC, ERR_INVALID_ARGUMENT, ERR_NOT_IMPLEMENTED, SegmentIdT, TransferEngineT,
    TransportT,
};

/// Stand-ins for Mooncake's `Transport*`: non-NULL, never dereferenced.
static TCP_TRANSPORT: u8 = 0;
static RDMA_TRANSPORT: u8 = 0;

/// Creates an engine (see the header); NULL on failure.
///
/// # Safety
/// The three strings are NULL or NUL-terminated and readable for the call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn createTransferEngine(
    metadata_conn_string: *const c_char,
    local_server_name: *const c_char,
    ip_or_host_name: *const c_char,
    rpc_port: u64,
    auto_discover: c_int,
) -> TransferEngineT {
    guard("createTransferEngine", std::ptr::null_mut(), || {
        let made = (|| {
            // SAFETY: the caller's contract for each string.
            let metadata = unsafe { text(metadata_conn_string, "metadata_conn_string")? };
            // SAFETY: as above.
            let local = unsafe { text(local_server_name, "local_server_name")? };
            let host = match ip_or_host_name.is_null() {
                true => "",
                // SAFETY: as above.
                false => unsafe { text(ip_or_host_name, "ip_or_host_name")? },
            };
            MooncakeEngine::create(metadata, local, host, rpc_port, auto_discover != 0)
        })();
        match made {
            Ok(engine) => registry::insert(engine),
            Err(e) => {
                registry::failed(&e);
                std::ptr::null_mut()
            }
        }
    })
}

/// Destroys an engine: listeners closed, memory unregistered, the handle invalid from now on
/// (later calls with it return errors). Unknown handles are ignored.
#[unsafe(no_mangle)]
pub extern "C" fn destroyTransferEngine(engine: TransferEngineT) {
    guard("destroyTransferEngine", (), || {
        if let Some(e) = registry::remove(engine) {
            e.close();
        }
    });
}

/// Discovers the topology (te does at start); 0, or -1 for a bad handle.
#[unsafe(no_mangle)]
pub extern "C" fn discoverTopology(engine: TransferEngineT) -> c_int {
    guard("discoverTopology", ERR_INVALID_ARGUMENT, || {
        err_code(registry::get(engine).map(|_| ()))
    })
}

/// Writes the engine's segment name (`ip:port` peer to peer) and a NUL into `buf_out`.
///
/// # Safety
/// `buf_out` is NULL or writable for `buf_len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn getLocalIpAndPort(
    engine: TransferEngineT,
    buf_out: *mut c_char,
    buf_len: usize,
) -> c_int {
    guard("getLocalIpAndPort", ERR_INVALID_ARGUMENT, || {
        err_code(registry::get(engine).and_then(|e| {
            let name = e.session_name()?;
            // SAFETY: the caller's contract for `buf_out`.
            unsafe { write_text(buf_out, buf_len, &name) }
        }))
    })
}

/// Installs transport `proto` (`tcp`, or `rdma` on the devices named by `args[0]`, a
/// comma-separated list, when `args` and `args[0]` are not NULL); NULL on failure.
///
/// # Safety
/// `proto` is NULL or a NUL-terminated string; `args` is NULL or points to at least one
/// pointer, and `args[0]` is NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn installTransport(
    engine: TransferEngineT,
    proto: *const c_char,
    args: *mut *mut c_void,
) -> TransportT {
    guard("installTransport", std::ptr::null_mut(), || {
        let installed = (|| {
            let e = registry::get(engine)?;
            // SAFETY: the caller's contract for `proto`.
            let proto = unsafe { text(proto, "proto")? };
            let first = match args.is_null() {
                true => std::ptr::null_mut(),
                // SAFETY: `args` is non-NULL and readable for one pointer (the caller's
                // contract).
                false => unsafe { *args },
            };
            let devices = match first.is_null() || proto != "rdma" {
                true => "",
                // SAFETY: `args[0]` is a NUL-terminated string (the caller's contract).
                false => unsafe { text(first as *const c_char, "args[0]")? },
            };
            // Mooncake's args[0] for rdma may be a topology JSON: te discovers its own.
            let devices = match devices.trim_start().starts_with('{') {
                true => "",
                false => devices,
            };
            e.install_transport(proto, devices)?;
            Ok::<_, FacadeError>(proto == "rdma")
        })();
        match installed {
            Ok(true) => (&raw const RDMA_TRANSPORT).cast_mut().cast(),
            Ok(false) => (&raw const TCP_TRANSPORT).cast_mut().cast(),
            Err(e) => {
                registry::failed(&e);
                std::ptr::null_mut()
            }
        }
    })
}

/// te cannot remove an installed transport (it goes with the engine):
/// `ERR_NOT_IMPLEMENTED` (-303), or -1 for a bad handle or string.
///
/// # Safety
/// `proto` is NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn uninstallTransport(
    engine: TransferEngineT,
    proto: *const c_char,
) -> c_int {
    guard("uninstallTransport", ERR_INVALID_ARGUMENT, || {
        // SAFETY: the caller's contract for `proto`.
        match registry::get(engine).and_then(|_| unsafe { text(proto, "proto") }) {
            Ok(_) => ERR_NOT_IMPLEMENTED,
            Err(e) => e.code(),
        }
    })
}

/// Opens segment `segment_name`: its id (the engine's own name gives `LOCAL_SEGMENT`, 0), or
/// a negative `ERR_*`.
///
/// # Safety
/// `segment_name` is NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn openSegment(
    engine: TransferEngineT,
    segment_name: *const c_char,
) -> SegmentIdT {
    // SAFETY: forwarded.
    unsafe { open(engine, segment_name, false) }
}

/// As `openSegment`, fetching the descriptor again even when it is cached.
///
/// # Safety
/// As `openSegment`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn openSegmentNoCache(
    engine: TransferEngineT,
    segment_name: *const c_char,
) -> SegmentIdT {
    // SAFETY: forwarded.
    unsafe { open(engine, segment_name, true) }
}

/// te's extension: opens the regular file at `path` as a segment (READ only, or READ and
/// WRITE with `writable`): its segment id, or a negative `ERR_*` code.
///
/// # Safety
/// `path` is a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn te_openFile(
    engine: TransferEngineT,
    path: *const c_char,
    writable: c_int,
) -> SegmentIdT {
    guard("te_openFile", ERR_INVALID_ARGUMENT, || {
        let opened = registry::get(engine).and_then(|e| {
            // SAFETY: the caller's contract for `path`.
            let path = unsafe { text(path, "path")? };
            e.open_file(path, writable != 0)
        });
        match opened {
            Ok((_, id)) => id,
            Err(e) => {
                registry::failed(&e);
                e.code()
            }
        }
    })
}

/// te's extension: `length` bytes the engine allocates and registers for peers to read and
/// write (shared memory where shm runs, the CXL device where cxl runs without shm, else host
/// memory), as Mooncake's Python `allocate_managed_buffer`: the address, or NULL.
#[unsafe(no_mangle)]
pub extern "C" fn te_allocateManagedBuffer(engine: TransferEngineT, length: usize) -> *mut c_void {
    guard(
        "te_allocateManagedBuffer",
        std::ptr::null_mut(),
        || match registry::get(engine).and_then(|e| e.allocate_managed(length as u64)) {
            Ok(addr) => addr as usize as *mut c_void,
            Err(e) => {
                registry::failed(&format!("{length} bytes: {e}"));
                std::ptr::null_mut()
            }
        },
    )
}

/// te's extension: unregisters and frees a buffer from `te_allocateManagedBuffer` (`length`
/// as allocated): 0, or a negative `ERR_*` code.
#[unsafe(no_mangle)]
pub extern "C" fn te_freeManagedBuffer(
    engine: TransferEngineT,
    addr: *mut c_void,
    length: usize,
) -> c_int {
    guard(
        "te_freeManagedBuffer",
        ERR_INVALID_ARGUMENT,
        || match registry::get(engine).and_then(|e| e.free_managed(addr as u64, length as u64)) {
            Ok(()) => 0,
            Err(e) => {
                registry::failed(&e);
                e.code()
            }
        },
    )
}

/// te's extension: the engine's figures as JSON (te-metrics': TENT's totals by name, then
/// every series) and a NUL into `buf_out`: 0, or `ERR_INVALID_ARGUMENT` for a bad handle or a
/// buffer too small. With `count` 0 or 1 counting is switched off or on first; -1 leaves it.
///
/// # Safety
/// `buf_out` is writable for `buf_len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn te_getMetrics(
    engine: TransferEngineT,
    buf_out: *mut c_char,
    buf_len: usize,
    count: c_int,
) -> c_int {
    guard("te_getMetrics", ERR_INVALID_ARGUMENT, || {
        let written = registry::get(engine).and_then(|e| {
            match count {
                -1 => {}
                0 | 1 => e.set_metrics(count == 1)?,
                other => {
                    return Err(te_core::Error::InvalidArgument(format!(
                        "count {other}: -1 (leave), 0 (off) or 1 (on)"
                    ))
                    .into());
                }
            }
            let json = e.metrics_json()?;
            // SAFETY: the caller's contract for `buf_out`.
            unsafe { write_text(buf_out, buf_len, &json) }
        });
        match written {
            Ok(()) => 0,
            Err(e) => {
                registry::failed(&e);
                ERR_INVALID_ARGUMENT
            }
        }
    })
}

/// # Safety
/// As `openSegment`.
unsafe fn open(engine: TransferEngineT, segment_name: *const c_char, fresh: bool) -> SegmentIdT {
    guard("openSegment", ERR_INVALID_ARGUMENT, || {
        let opened = registry::get(engine).and_then(|e| {
            // SAFETY: the caller's contract for `segment_name`.
            let name = unsafe { text(segment_name, "segment_name")? };
            e.open_segment_id(name, fresh)
        });
        match opened {
            Ok(id) => id,
            Err(e) => {
                registry::failed(&e);
                e.code()
            }
        }
    })
}

/// Closes segment `segment_id`: 0, or a negative `ERR_*`.
#[unsafe(no_mangle)]
pub extern "C" fn closeSegment(engine: TransferEngineT, segment_id: SegmentIdT) -> c_int {
    guard("closeSegment", ERR_INVALID_ARGUMENT, || {
        err_code(registry::get(engine).and_then(|e| e.close_segment_id(segment_id)))
    })
}

/// Pre-connects EFA endpoints in Mooncake; te has no EFA transport: 0 (a no-op), or -1 for a
/// bad handle or string.
///
/// # Safety
/// `segment_name` is NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn warmupEfaSegment(
    engine: TransferEngineT,
    segment_name: *const c_char,
) -> c_int {
    guard("warmupEfaSegment", ERR_INVALID_ARGUMENT, || {
        // SAFETY: the caller's contract for `segment_name`.
        err_code(
            registry::get(engine)
                .and_then(|_| unsafe { text(segment_name, "segment_name") }.map(|_| ())),
        )
    })
}

/// Removing the local segment from the metadata service is not offered by te (destroying the
/// engine withdraws it): `ERR_NOT_IMPLEMENTED` (-303), or -1 for a bad handle or string.
///
/// # Safety
/// `segment_name` is NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn removeLocalSegment(
    engine: TransferEngineT,
    segment_name: *const c_char,
) -> c_int {
    guard("removeLocalSegment", ERR_INVALID_ARGUMENT, || {
        // SAFETY: the caller's contract for `segment_name`.
        match registry::get(engine).and_then(|_| unsafe { text(segment_name, "segment_name") }) {
            Ok(_) => ERR_NOT_IMPLEMENTED,
            Err(e) => e.code(),
        }
    })
}

/// Fetches every open segment's descriptor again: 0, or a negative `ERR_*`.
#[unsafe(no_mangle)]
pub extern "C" fn syncSegmentCache(engine: TransferEngineT) -> c_int {
    guard("syncSegmentCache", ERR_INVALID_ARGUMENT, || {
        err_code(registry::get(engine).and_then(|e| e.sync_segments()))
    })
}

/// Registers `[addr, addr+length)` at `location` (`"*"`: found by te); peers may read and
/// write it when `remote_accessible` is not 0. 0, or a negative `ERR_*` (-7 overlap).
///
/// # Safety
/// `location` is NULL or a NUL-terminated string; `[addr, addr+length)` is memory of this
/// process that stays allocated until it is unregistered (peers write into it).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn registerLocalMemory(
    engine: TransferEngineT,
    addr: *mut c_void,
    length: usize,
    location: *const c_char,
    remote_accessible: c_int,
) -> c_int {
    guard("registerLocalMemory", ERR_INVALID_ARGUMENT, || {
        err_code(registry::get(engine).and_then(|e| {
            // SAFETY: the caller's contract for `location`.
            let location = unsafe { text(location, "location")? };
            let permission = match remote_accessible {
                0 => Permission::LocalOnly,
                _ => Permission::RemoteReadWrite,
            };
            // SAFETY: the caller's contract for the range.
            unsafe { e.register_batch_with(&[addr as u64], &[length as u64], location, permission) }
        }))
    })
}

/// Unregisters the region starting at `addr` (waiting briefly for peers' requests that hold
/// it): 0, or a negative `ERR_*` (-3 not registered, -4 busy).
#[unsafe(no_mangle)]
pub extern "C" fn unregisterLocalMemory(engine: TransferEngineT, addr: *mut c_void) -> c_int {
    guard("unregisterLocalMemory", ERR_INVALID_ARGUMENT, || {
        err_code(registry::get(engine).and_then(|e| e.unregister_batch(&[addr as u64])))
    })
}

/// Registers `buffer_len` ranges, all or none, remotely accessible: 0, or a negative `ERR_*`.
///
/// # Safety
/// `buffer_list` is NULL or readable for `buffer_len` entries; `location` is NULL or a
/// NUL-terminated string; every range is memory of this process that stays allocated until
/// it is unregistered.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn registerLocalMemoryBatch(
    engine: TransferEngineT,
    buffer_list: *mut BufferEntryC,
    buffer_len: usize,
    location: *const c_char,
) -> c_int {
    guard("registerLocalMemoryBatch", ERR_INVALID_ARGUMENT, || {
        err_code(registry::get(engine).and_then(|e| {
            // SAFETY: the caller's contract for `buffer_list`.
            let entries = unsafe { slice(buffer_list, buffer_len, "buffer_list")? };
            // SAFETY: the caller's contract for `location`.
            let location = unsafe { text(location, "location")? };
            let addrs: Vec<u64> = entries.iter().map(|b| b.addr as u64).collect();
            let lens: Vec<u64> = entries.iter().map(|b| b.length as u64).collect();
            // SAFETY: the caller's contract for every range.
            unsafe { e.register_batch_with(&addrs, &lens, location, Permission::RemoteReadWrite) }
        }))
    })
}

/// Unregisters `addr_len` regions, all or none: 0, or a negative `ERR_*`.
///
/// # Safety
/// `addr_list` is NULL or readable for `addr_len` pointers.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn unregisterLocalMemoryBatch(
    engine: TransferEngineT,
    addr_list: *mut *mut c_void,
    addr_len: usize,
) -> c_int {
    guard("unregisterLocalMemoryBatch", ERR_INVALID_ARGUMENT, || {
        err_code(registry::get(engine).and_then(|e| {
            // SAFETY: the caller's contract for `addr_list`.
            let addrs = unsafe { slice(addr_list, addr_len, "addr_list")? };
            let addrs: Vec<u64> = addrs.iter().map(|&a| a as u64).collect();
            e.unregister_batch(&addrs)
        }))
    })
}

/// te shuts down gracefully on `destroyTransferEngine` always (listeners closed, transfers
/// ended): nothing to enable.
#[unsafe(no_mangle)]
pub extern "C" fn enableGracefulShutdown(engine: TransferEngineT) {
    guard("enableGracefulShutdown", (), || {
        let _ = registry::get(engine);
    });
}

/// Writes the link table (one line per rail, or a JSON array when `json` is not 0) and a NUL
/// into `buf_out`: 0, or -1 for a bad handle or a buffer too small.
///
/// # Safety
/// `buf_out` is NULL or writable for `buf_len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn showLinks(
    engine: TransferEngineT,
    buf_out: *mut c_char,
    buf_len: usize,
    json: c_int,
) -> c_int {
    guard("showLinks", ERR_INVALID_ARGUMENT, || {
        match registry::get(engine).and_then(|e| {
            let links = e.links(json != 0)?;
            // SAFETY: the caller's contract for `buf_out`.
            unsafe { write_text(buf_out, buf_len, &links) }
        }) {
            Ok(()) => 0,
            Err(_) => ERR_INVALID_ARGUMENT,
        }
    })
}
