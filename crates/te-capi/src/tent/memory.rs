//! TENT's C API: allocating, registering and unregistering memory.

#![allow(non_snake_case)] // TENT's C names

use std::sync::Arc;

use std::ffi::{c_char, c_int, c_void};

use te_core::{HostBuffer, Permission};
use te_facade::FacadeError;
use te_facade::tent::{MemoryOptions, TentEngine};

use super::{TentMemoryOptionsC, tent_err, unfixed, with};
use crate::registry::{slice, text};

fn permission(p: c_int) -> Result<Permission, FacadeError> {
    match p {
        0 => Ok(Permission::LocalOnly),
        1 => Ok(Permission::RemoteRead),
        2 => Ok(Permission::RemoteReadWrite),
        other => Err(te_core::Error::InvalidArgument(format!("permission {other}")).into()),
    }
}

/// Memory options from the C struct (NULL: `*`, remote read-write).
///
/// # Safety
/// `opts` is NULL or readable for one `tent_memory_options_t`.
unsafe fn options(opts: *const TentMemoryOptionsC) -> Result<MemoryOptions, FacadeError> {
    if opts.is_null() {
        return Ok(MemoryOptions::default());
    }
    // SAFETY: non-NULL and readable (the caller's contract).
    let o = unsafe { &*opts };
    let location = match unfixed(&o.location) {
        l if l.is_empty() => "*".to_string(),
        l => l,
    };
    Ok(MemoryOptions {
        location,
        permission: permission(o.permission)?,
    })
}

fn allocate(
    t: &TentEngine,
    addr: *mut *mut c_void,
    size: usize,
    o: &MemoryOptions,
) -> Result<(), FacadeError> {
    if addr.is_null() {
        return Err(te_core::Error::InvalidArgument("addr is NULL".into()).into());
    }
    let buffer: Arc<HostBuffer> = t.allocate_memory(size, o).map_err(tent_err)?;
    // SAFETY: non-NULL and writable (the caller's contract).
    unsafe { addr.write(buffer.addr() as usize as *mut c_void) };
    Ok(())
}

/// Allocates `size` bytes at `location`, registered; its address into `*addr`.
///
/// # Safety
/// `addr` is NULL or writable; `location` is NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tent_allocate_memory(
    engine: *mut c_void,
    addr: *mut *mut c_void,
    size: usize,
    location: *const c_char,
) -> c_int {
    with("tent_allocate_memory", engine, |t| {
        let location = match location.is_null() {
            true => "*",
            // SAFETY: the caller's contract for `location`.
            false => unsafe { text(location, "location")? },
        };
        let o = MemoryOptions {
            location: location.to_string(),
            ..MemoryOptions::default()
        };
        allocate(t, addr, size, &o)
    })
}

/// As `tent_allocate_memory`, with options.
///
/// # Safety
/// `addr` is NULL or writable; `opts` is NULL or readable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tent_allocate_memory_ex(
    engine: *mut c_void,
    addr: *mut *mut c_void,
    size: usize,
    opts: *mut TentMemoryOptionsC,
) -> c_int {
    with("tent_allocate_memory_ex", engine, |t| {
        // SAFETY: the caller's contract for `opts`.
        let o = unsafe { options(opts)? };
        allocate(t, addr, size, &o)
    })
}

/// Frees memory from `tent_allocate_memory`.
#[unsafe(no_mangle)]
pub extern "C" fn tent_free_memory(engine: *mut c_void, addr: *mut c_void) -> c_int {
    with("tent_free_memory", engine, |t| {
        t.free_memory(addr as u64).map_err(tent_err)
    })
}

/// Registers ranges with `o`, all or none.
///
/// # Safety
/// Every range is memory of this process kept allocated until it is unregistered.
unsafe fn register(
    t: &TentEngine,
    ranges: &[(u64, usize)],
    o: &MemoryOptions,
) -> Result<(), FacadeError> {
    let raw: Vec<(*mut u8, usize)> = ranges
        .iter()
        .map(|&(a, l)| (a as usize as *mut u8, l))
        .collect();
    // SAFETY: forwarded from this function's contract. The engine tells TENT's runtime.
    unsafe {
        t.core()
            .register_memory_batch(&raw, &o.location, o.permission)?
    };
    Ok(())
}

/// Registers `[addr, addr+size)` for remote reads and writes.
///
/// # Safety
/// The range is memory of this process kept allocated until it is unregistered.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tent_register_memory(
    engine: *mut c_void,
    addr: *mut c_void,
    size: usize,
) -> c_int {
    // SAFETY: the caller's contract for the range.
    with("tent_register_memory", engine, |t| unsafe {
        register(t, &[(addr as u64, size)], &MemoryOptions::default())
    })
}

/// As `tent_register_memory`, with `permission` (`PERM_*`).
///
/// # Safety
/// As `tent_register_memory`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tent_register_memory_with_perm(
    engine: *mut c_void,
    addr: *mut c_void,
    size: usize,
    permission: c_int,
) -> c_int {
    with("tent_register_memory_with_perm", engine, |t| {
        let o = MemoryOptions {
            permission: self::permission(permission)?,
            ..MemoryOptions::default()
        };
        // SAFETY: the caller's contract for the range.
        unsafe { register(t, &[(addr as u64, size)], &o) }
    })
}

/// As `tent_register_memory`, with options.
///
/// # Safety
/// As `tent_register_memory`; `opts` is NULL or readable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tent_register_memory_ex(
    engine: *mut c_void,
    addr: *mut c_void,
    size: usize,
    opts: *mut TentMemoryOptionsC,
) -> c_int {
    with("tent_register_memory_ex", engine, |t| {
        // SAFETY: the caller's contract for `opts` and the range.
        unsafe { register(t, &[(addr as u64, size)], &options(opts)?) }
    })
}

/// `count` ranges from two arrays.
///
/// # Safety
/// Both arrays are NULL or readable for `count` entries.
unsafe fn ranges(
    addrs: *const *mut c_void,
    sizes: *const usize,
    count: usize,
) -> Result<Vec<(u64, usize)>, FacadeError> {
    // SAFETY: the caller's contract for both arrays.
    let (a, s) = unsafe { (slice(addrs, count, "addrs")?, slice(sizes, count, "sizes")?) };
    Ok(a.iter().zip(s).map(|(&a, &s)| (a as u64, s)).collect())
}

/// Registers `count` ranges, all or none, with `permission`.
///
/// # Safety
/// `addrs` and `sizes` are NULL or readable for `count` entries; every range is memory of
/// this process kept allocated until it is unregistered.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tent_register_memory_batch(
    engine: *mut c_void,
    addrs: *mut *mut c_void,
    sizes: *mut usize,
    count: usize,
    permission: c_int,
) -> c_int {
    with("tent_register_memory_batch", engine, |t| {
        let o = MemoryOptions {
            permission: self::permission(permission)?,
            ..MemoryOptions::default()
        };
        // SAFETY: the caller's contract for the arrays and the ranges.
        unsafe { register(t, &ranges(addrs, sizes, count)?, &o) }
    })
}

/// As `tent_register_memory_batch`, with options.
///
/// # Safety
/// As `tent_register_memory_batch`; `opts` is NULL or readable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tent_register_memory_batch_ex(
    engine: *mut c_void,
    addrs: *mut *mut c_void,
    sizes: *mut usize,
    count: usize,
    opts: *mut TentMemoryOptionsC,
) -> c_int {
    with("tent_register_memory_batch_ex", engine, |t| {
        // SAFETY: the caller's contract for the arrays, the ranges and `opts`.
        unsafe { register(t, &ranges(addrs, sizes, count)?, &options(opts)?) }
    })
}

/// Unregisters the region at `addr` (`size` is not needed: te knows it).
#[unsafe(no_mangle)]
pub extern "C" fn tent_unregister_memory(
    engine: *mut c_void,
    addr: *mut c_void,
    size: usize,
) -> c_int {
    let _ = size;
    with("tent_unregister_memory", engine, |t| {
        t.unregister_memory(addr as u64).map_err(tent_err)
    })
}

/// Unregisters `count` regions (each tried; the first failure is reported).
///
/// # Safety
/// `addrs` is NULL or readable for `count` pointers; `sizes` is ignored (may be NULL).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tent_unregister_memory_batch(
    engine: *mut c_void,
    addrs: *mut *mut c_void,
    sizes: *mut usize,
    count: usize,
) -> c_int {
    let _ = sizes;
    with("tent_unregister_memory_batch", engine, |t| {
        // SAFETY: the caller's contract for `addrs`.
        let addrs = unsafe { slice(addrs, count, "addrs")? };
        let mut first = None;
        for &a in addrs {
            if let Err(e) = t.unregister_memory(a as u64) {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), |e| Err(tent_err(e)))
    })
}
