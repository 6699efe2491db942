//! Engine handles: what `createTransferEngine` (and `tent_create_engine`) hands out is a
//! number from a counter that never repeats, looked up in a table on every call, so a
//! destroyed, stale or made-up handle is found missing instead of dereferenced. Also the
//! boundary helpers every entry point uses: panics caught, failures logged under the entry
//! point's name, C strings and pointer-and-count arrays read with their errors.

use std::cell::Cell;
use std::collections::HashMap;
use std::ffi::{CStr, c_char, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, RwLock, RwLockReadGuard, RwLockWriteGuard};

use te_core::hashing::IdHashing;
use te_facade::{FacadeError, MooncakeEngine};

/// Handles are multiples of this, starting at it: never NULL, never a small integer.
const HANDLE_STEP: usize = 0x10;

/// One counter for every kind of handle: a Mooncake engine's handle is never a TENT engine's.
static NEXT: AtomicUsize = AtomicUsize::new(1);

/// Live objects of one kind by handle. Handles come from te's own counter, so the table
/// hashes them with one multiply (no caller can choose colliding ones); callers on many
/// threads look up at once (a read lock).
pub(crate) struct Handles<T> {
    table: OnceLock<RwLock<HashMap<usize, Arc<T>, IdHashing>>>,
}

impl<T> Handles<T> {
    pub(crate) const fn new() -> Self {
        Handles {
            table: OnceLock::new(),
        }
    }

    fn table(&self) -> &RwLock<HashMap<usize, Arc<T>, IdHashing>> {
        self.table.get_or_init(Default::default)
    }

    fn read(&self) -> RwLockReadGuard<'_, HashMap<usize, Arc<T>, IdHashing>> {
        self.table().read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, HashMap<usize, Arc<T>, IdHashing>> {
        self.table().write().unwrap_or_else(|e| e.into_inner())
    }

    /// Keeps `value` and returns its new handle.
    pub(crate) fn insert(&self, value: T) -> *mut c_void {
        let key = NEXT.fetch_add(1, Ordering::Relaxed) * HANDLE_STEP;
        self.write().insert(key, Arc::new(value));
        key as *mut c_void
    }

    /// The object behind `handle`.
    ///
    /// # Errors
    /// [`FacadeError::NotInitialized`] for a handle that is not (or no longer) one of these.
    pub(crate) fn get(&self, handle: *mut c_void) -> Result<Arc<T>, FacadeError> {
        self.read()
            .get(&(handle as usize))
            .cloned()
            .ok_or(FacadeError::NotInitialized)
    }

    /// Forgets `handle`; its object, if it had one.
    pub(crate) fn remove(&self, handle: *mut c_void) -> Option<Arc<T>> {
        self.write().remove(&(handle as usize))
    }
}

/// Mooncake engines (`createTransferEngine`).
static ENGINES: Handles<MooncakeEngine> = Handles::new();

/// Keeps `engine` and returns its new handle.
pub(crate) fn insert(engine: MooncakeEngine) -> *mut c_void {
    ENGINES.insert(engine)
}

/// The engine behind `handle`.
///
/// # Errors
/// [`FacadeError::NotInitialized`] for a handle that is not (or no longer) an engine's.
pub(crate) fn get(handle: *mut c_void) -> Result<Arc<MooncakeEngine>, FacadeError> {
    ENGINES.get(handle)
}

/// Forgets `handle`; its engine, if it had one.
pub(crate) fn remove(handle: *mut c_void) -> Option<Arc<MooncakeEngine>> {
    ENGINES.remove(handle)
}

thread_local! {
    /// The entry point this thread runs ([`guard`] sets it), named in the failures it logs.
    static ENTRY: Cell<&'static str> = const { Cell::new("") };
}

/// The entry point this thread runs.
pub(crate) fn entry() -> &'static str {
    ENTRY.get()
}

/// Runs entry point `what`'s body; a panic becomes `fallback` (and an error log), never an
/// unwind into C.
pub(crate) fn guard<T>(what: &'static str, fallback: T, body: impl FnOnce() -> T) -> T {
    crate::logging::init();
    let outer = ENTRY.replace(what);
    let ran = catch_unwind(AssertUnwindSafe(body));
    ENTRY.set(outer);
    match ran {
        Ok(v) => v,
        Err(_) => {
            tracing::error!(function = what, "a panic was caught at the C boundary");
            fallback
        }
    }
}

/// A C string argument as UTF-8.
///
/// # Safety
/// `p` is NULL or points to a NUL-terminated string readable for the call.
///
/// # Errors
/// A NULL pointer or bytes that are not UTF-8.
pub(crate) unsafe fn text<'a>(p: *const c_char, what: &str) -> Result<&'a str, FacadeError> {
    if p.is_null() {
        return Err(te_core::Error::InvalidArgument(format!("{what} is NULL")).into());
    }
    // SAFETY: the caller's contract: a NUL-terminated string, readable during the call.
    unsafe { CStr::from_ptr(p) }
        .to_str()
        .map_err(|_| te_core::Error::InvalidArgument(format!("{what} is not UTF-8")).into())
}

/// Copies `s` and a NUL into `buf` of `len` bytes.
///
/// # Safety
/// `buf` is NULL or writable for `len` bytes.
///
/// # Errors
/// A NULL buffer, or one too small for `s` and its NUL.
pub(crate) unsafe fn write_text(buf: *mut c_char, len: usize, s: &str) -> Result<(), FacadeError> {
    if buf.is_null() || s.len() >= len {
        return Err(te_core::Error::InvalidArgument(format!(
            "a buffer of {len} bytes cannot hold {} bytes and a NUL",
            s.len()
        ))
        .into());
    }
    // SAFETY: `buf` is writable for `len` > `s.len()` bytes (the caller's contract, checked
    // against `len` above); the source is a Rust string that does not overlap it.
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr(), buf.cast::<u8>(), s.len());
        *buf.add(s.len()) = 0;
    }
    Ok(())
}

/// Logs why the entry point failed (at WARNING, so `MC_LOG_LEVEL`'s default shows it): a C
/// caller gets only a code.
pub(crate) fn failed(e: &dyn std::fmt::Display) {
    tracing::warn!(function = entry(), error = %e, "C API call failed");
}

/// A negative `ERR_*` code (0 for success): registration's convention.
pub(crate) fn err_code(r: Result<(), FacadeError>) -> i32 {
    match r {
        Ok(()) => 0,
        Err(e) => {
            failed(&e);
            e.code()
        }
    }
}

/// A positive `Status` code (0 for success): submit, status and free's convention.
pub(crate) fn status_code(r: Result<(), FacadeError>) -> i32 {
    match r {
        Ok(()) => 0,
        Err(e) => {
            failed(&e);
            e.status_code()
        }
    }
}

/// `n` elements at `p` as a slice; NULL is refused unless `n` is 0, and so is a length whose
/// bytes overflow.
///
/// # Safety
/// `p` is NULL or readable for `n` elements.
pub(crate) unsafe fn slice<'a, T>(
    p: *const T,
    n: usize,
    what: &str,
) -> Result<&'a [T], FacadeError> {
    if n == 0 {
        return Ok(&[]);
    }
    if p.is_null()
        || n.checked_mul(size_of::<T>())
            .is_none_or(|b| b > isize::MAX as usize)
    {
        return Err(te_core::Error::InvalidArgument(format!("{what}: NULL or {n} entries")).into());
    }
    // SAFETY: non-NULL, readable for `n` elements (the caller's contract), size checked.
    Ok(unsafe { std::slice::from_raw_parts(p, n) })
}
