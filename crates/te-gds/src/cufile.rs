//! cuFile through `cudarc` (loaded at run time): opening the driver, registering file handles,
//! and the read and write calls. All of te-gds's `unsafe` code is here.

#![allow(unsafe_code)]

use std::fs::File;
use std::os::fd::AsRawFd;

use cudarc::cufile::sys;

/// Opens the cuFile driver once per process.
///
/// # Errors
/// A sentence saying what is missing: the library, or a driver that would not open (GDS not
/// installed and compatibility mode off).
pub fn open_driver() -> Result<(), String> {
    static OPEN: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    OPEN.get_or_init(|| {
        // SAFETY: only probes whether the library loads.
        if !unsafe { sys::is_culib_present() } {
            return Err("no cuFile library (libcufile.so): install GPUDirect Storage, or move host memory with te-uring".into());
        }
        // SAFETY: the library is present; no arguments.
        let e = unsafe { sys::cuFileDriverOpen() };
        match e.err {
            sys::CUfileOpError::CU_FILE_SUCCESS => Ok(()),
            err => Err(format!(
                "cuFileDriverOpen failed ({err:?}, CUDA {:?}): GDS is not usable here; set \"allow_compat_mode\": true in cufile.json to run through the POSIX path",
                e.cu_err
            )),
        }
    })
    .clone()
}

/// A file registered with cuFile; deregistered on drop (before the file closes).
pub struct Handle {
    raw: sys::CUfileHandle_t,
    // Declared after `raw`: the descriptor outlives the registration.
    _file: File,
}

// SAFETY: a cuFile handle may be used from any thread (the API is thread-safe per handle).
unsafe impl Send for Handle {}
// SAFETY: as above.
unsafe impl Sync for Handle {}

impl Handle {
    /// Registers `file` (opened with `O_DIRECT`).
    ///
    /// # Errors
    /// cuFile refused the file (filesystem not supported, no `O_DIRECT`).
    pub fn register(file: File) -> Result<Handle, String> {
        // SAFETY: an all-zero descriptor is valid to fill; the union's fd is set below.
        let mut descr: sys::CUfileDescr_t = unsafe { std::mem::zeroed() };
        descr.type_ = sys::CUfileFileHandleType::CU_FILE_HANDLE_TYPE_OPAQUE_FD;
        descr.handle.fd = file.as_raw_fd();
        let mut raw: sys::CUfileHandle_t = std::ptr::null_mut();
        // SAFETY: valid pointers for the call's duration; the fd stays open in `Handle`.
        let e = unsafe { sys::cuFileHandleRegister(&mut raw, &mut descr) };
        match e.err {
            sys::CUfileOpError::CU_FILE_SUCCESS => Ok(Handle { raw, _file: file }),
            err => Err(format!("cuFileHandleRegister: {err:?}")),
        }
    }

    /// Reads (`write` false) or writes `len` bytes between GPU (or host) memory at `buf` and
    /// the file at `offset`; the bytes moved.
    ///
    /// # Safety
    /// `[buf, buf+len)` must be memory of this process that stays valid for the call and is not
    /// touched by others while cuFile writes it.
    ///
    /// # Errors
    /// The I/O failed (errno or cuFile's error code).
    pub unsafe fn io(
        &self,
        write: bool,
        buf: u64,
        len: usize,
        offset: u64,
    ) -> Result<usize, String> {
        let off = i64::try_from(offset).map_err(|_| format!("offset {offset} too large"))?;
        let ptr = buf as *mut std::ffi::c_void;
        // SAFETY: the caller guarantees the memory range; the handle is registered.
        let n = unsafe {
            match write {
                true => sys::cuFileWrite(self.raw, ptr, len, off as _, 0),
                false => sys::cuFileRead(self.raw, ptr, len, off as _, 0),
            }
        };
        match n {
            n if n >= 0 => Ok(n as usize),
            -1 => Err(format!("cuFile I/O: {}", std::io::Error::last_os_error())),
            n => Err(format!("cuFile I/O: cuFile error {}", -n)),
        }
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: registered once, deregistered once, before the fd closes.
        unsafe { sys::cuFileHandleDeregister(self.raw) };
    }
}
