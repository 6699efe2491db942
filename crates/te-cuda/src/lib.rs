//! The CUDA driver, loaded at run time through `cudarc`: so every crate builds
//! and runs on a machine without CUDA, and a missing driver or device is a clear error when a
//! GPU path is asked for, never a panic. The engine's and transports' GPU `unsafe` is here.
//!
//! What it offers: whether and which device a pointer's memory lives on (for `*` locations),
//! copies between any two addresses (unified addressing) that return when the bytes are there, CUDA IPC handles of device memory
//! and their opening in another process, the dma-buf of a device range (for RDMA), and device
//! buffers for tests and benchmarks; fabric handles (MNNVL) are in `fabric`. Not here:
//! slicing, queues or completion (transports).

#![allow(unsafe_code)] // the boundary crate: every CUDA driver call of te behind safe functions

mod error;
mod fabric;

pub use error::{Error, Result};

use std::sync::OnceLock;

use cudarc::driver::sys;

pub use fabric::{FabricExport, MAX_FABRIC_MAPPING};

/// The loaded driver: its version and devices.
#[derive(Debug)]
pub struct Cuda {
    /// `cuDriverGetVersion` (12060 = 12.6).
    pub version: i32,
    /// Devices visible.
    pub devices: i32,
}

fn gpu(what: &str, r: sys::CUresult) -> Result<()> {
    r.result()
        .map_err(|e| Error::Gpu(format!("CUDA {what}: {e}")))
}

/// The CUDA driver, loaded and initialised once.
///
/// # Errors
/// [`Error::Gpu`] naming what is missing: `libcuda.so`, a working driver, or
/// any device.
pub fn driver() -> Result<&'static Cuda> {
    static DRIVER: OnceLock<std::result::Result<Cuda, String>> = OnceLock::new();
    DRIVER
        .get_or_init(|| {
            // SAFETY: only probes whether the library can be loaded.
            if !unsafe { sys::is_culib_present() } {
                return Err("no CUDA driver (libcuda.so) on this machine".into());
            }
            // SAFETY: the library is present; cuInit has no memory arguments.
            unsafe { sys::cuInit(0) }
                .result()
                .map_err(|e| format!("the CUDA driver did not initialise: {e}"))?;
            let mut version = 0;
            // SAFETY: a valid out-pointer.
            unsafe { sys::cuDriverGetVersion(&mut version) }
                .result()
                .map_err(|e| format!("CUDA driver version: {e}"))?;
            let mut devices = 0;
            // SAFETY: a valid out-pointer.
            unsafe { sys::cuDeviceGetCount(&mut devices) }
                .result()
                .map_err(|e| format!("CUDA devices: {e}"))?;
            if devices == 0 {
                return Err("the CUDA driver sees no device".into());
            }
            Ok(Cuda { version, devices })
        })
        .as_ref()
        .map_err(|why| Error::Gpu(why.clone()))
}

/// Makes device `ordinal`'s primary context current on this thread. The context is retained
/// once per device for the process's life (not once per call).
fn use_device(ordinal: i32) -> Result<()> {
    static RETAINED: std::sync::Mutex<Vec<(i32, usize)>> = std::sync::Mutex::new(Vec::new());
    let ctx = {
        let mut retained = RETAINED.lock().unwrap_or_else(|e| e.into_inner());
        match retained.iter().find(|(d, _)| *d == ordinal) {
            Some((_, ctx)) => *ctx as sys::CUcontext,
            None => {
                let mut dev = 0;
                // SAFETY: a valid out-pointer; the driver is initialised (callers hold a `Cuda`).
                gpu("device", unsafe { sys::cuDeviceGet(&mut dev, ordinal) })?;
                let mut ctx = std::ptr::null_mut();
                // SAFETY: as above; retained once, kept for the process's life.
                gpu("context", unsafe {
                    sys::cuDevicePrimaryCtxRetain(&mut ctx, dev)
                })?;
                retained.push((ordinal, ctx as usize));
                ctx
            }
        }
    };
    // SAFETY: a primary context retained above and never released.
    gpu("context", unsafe { sys::cuCtxSetCurrent(ctx) })
}

impl Cuda {
    /// The device holding `addr`, when it is device memory (`None` for host memory or an
    /// address CUDA does not know).
    pub fn device_of(&self, addr: u64) -> Option<u32> {
        let mut kind: u32 = 0;
        // SAFETY: a valid out-pointer of the attribute's size; the driver checks `addr`.
        let r = unsafe {
            sys::cuPointerGetAttribute(
                (&mut kind as *mut u32).cast(),
                sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                addr,
            )
        };
        if r.result().is_err() || kind != sys::CUmemorytype::CU_MEMORYTYPE_DEVICE as u32 {
            return None;
        }
        let mut ordinal: i32 = -1;
        // SAFETY: as above.
        let r = unsafe {
            sys::cuPointerGetAttribute(
                (&mut ordinal as *mut i32).cast(),
                sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                addr,
            )
        };
        r.result().ok().and_then(|()| u32::try_from(ordinal).ok())
    }

    /// Makes device `device`'s primary context current on this thread, for libraries that
    /// expect one (cuFile).
    ///
    /// # Errors
    /// The driver refused the device.
    pub fn make_current(&self, device: u32) -> Result<()> {
        use_device(device as i32)
    }

    /// Copies `len` bytes from `src` to `dst` (host or device, either way) and waits until the
    /// bytes are there: queued on this thread's stream for the device (so copies of different
    /// threads run side by side) and waited for on it. A plain `cuMemcpy` would not do: it
    /// returns before a device-to-device copy, or the DMA of a pageable host-to-device copy,
    /// has finished.
    ///
    /// # Safety
    /// Both ranges must be memory of this process (or mapped into it) that stays valid for the
    /// copy, and `dst` must not be read or written by others meanwhile.
    ///
    /// # Errors
    /// The driver refused the copy or the stream.
    pub unsafe fn copy(&self, device: u32, dst: u64, src: u64, len: usize) -> Result<()> {
        thread_local! {
            static STREAMS: std::cell::RefCell<Vec<(u32, usize)>> = const { std::cell::RefCell::new(Vec::new()) };
        }
        use_device(device as i32)?;
        let stream = STREAMS.with(|s| -> Result<sys::CUstream> {
            let mut s = s.borrow_mut();
            if let Some((_, st)) = s.iter().find(|(d, _)| *d == device) {
                return Ok(*st as sys::CUstream);
            }
            let mut st: sys::CUstream = std::ptr::null_mut();
            // SAFETY: a valid out-pointer; the stream lives as long as the thread.
            gpu("stream", unsafe {
                sys::cuStreamCreate(&mut st, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32)
            })?;
            s.push((device, st as usize));
            Ok(st)
        })?;
        // SAFETY: the caller guarantees both ranges; the stream is this thread's.
        gpu("copy", unsafe { sys::cuMemcpyAsync(dst, src, len, stream) })?;
        // SAFETY: as above.
        gpu("waiting for a copy", unsafe {
            sys::cuStreamSynchronize(stream)
        })
    }

    /// The CUDA IPC handle of the allocation holding `addr`, and `addr`'s offset in it.
    ///
    /// # Errors
    /// Not device memory, or the driver refused.
    pub fn ipc_handle(&self, addr: u64) -> Result<([u8; 64], u64)> {
        let device = self
            .device_of(addr)
            .ok_or_else(|| Error::InvalidArgument(format!("{addr:#x} is not GPU memory")))?;
        use_device(device as i32)?;
        let (mut base, mut size) = (0u64, 0usize);
        // SAFETY: valid out-pointers; `addr` is device memory.
        gpu("address range", unsafe {
            sys::cuMemGetAddressRange_v2(&mut base, &mut size, addr)
        })?;
        // SAFETY: an all-zero handle is a valid out-value to fill.
        let mut handle: sys::CUipcMemHandle = unsafe { std::mem::zeroed() };
        // SAFETY: a valid out-pointer; `base` is an allocation's start.
        gpu("IPC handle", unsafe {
            sys::cuIpcGetMemHandle(&mut handle, base)
        })?;
        let bytes = handle.reserved.map(|b| b as u8);
        Ok((bytes, addr - base))
    }

    /// Opens a peer's IPC handle on device `device`: the allocation's address in this process.
    ///
    /// # Errors
    /// The driver refused (a handle of this same process, another host, a device not here).
    pub fn ipc_open(&self, handle: &[u8; 64], device: u32) -> Result<u64> {
        use_device(device as i32)?;
        // SAFETY: an all-zero handle is valid to fill.
        let mut h: sys::CUipcMemHandle = unsafe { std::mem::zeroed() };
        for (d, s) in h.reserved.iter_mut().zip(handle) {
            *d = *s as std::ffi::c_char;
        }
        let mut ptr = 0u64;
        // SAFETY: a valid out-pointer and handle.
        gpu("opening an IPC handle", unsafe {
            sys::cuIpcOpenMemHandle_v2(
                &mut ptr,
                h,
                sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32,
            )
        })?;
        Ok(ptr)
    }

    /// Closes an address [`ipc_open`](Self::ipc_open) returned.
    pub fn ipc_close(&self, ptr: u64) {
        // SAFETY: `ptr` came from `cuIpcOpenMemHandle`; errors leave nothing to undo.
        let _ = unsafe { sys::cuIpcCloseMemHandle(ptr) };
    }

    /// A dma-buf file descriptor covering `[addr, addr+len)` of device memory (for
    /// `ibv_reg_dmabuf_mr`), and `addr`'s offset in it: the driver exports whole host pages,
    /// so the range is widened to page boundaries. The caller closes the descriptor.
    ///
    /// # Errors
    /// The driver or kernel lacks dma-buf export (the message says so).
    pub fn dmabuf_fd(&self, addr: u64, len: usize) -> Result<(i32, u64)> {
        let device = self
            .device_of(addr)
            .ok_or_else(|| Error::InvalidArgument(format!("{addr:#x} is not GPU memory")))?;
        use_device(device as i32)?;
        let (start, size) = page_span(addr, len as u64, te_sys::page_size())?;
        let mut fd: i32 = -1;
        gpu(
            "dma-buf export (needs a driver and kernel with dma-buf)",
            // SAFETY: a valid out-pointer of the handle type's size (an int fd); the range is
            // page-aligned as the call requires, and the driver checks it is device memory.
            unsafe {
                sys::cuMemGetHandleForAddressRange(
                    (&mut fd as *mut i32).cast(),
                    start,
                    size as usize,
                    sys::CUmemRangeHandleType::CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
                    0,
                )
            },
        )?;
        Ok((fd, addr - start))
    }
}

/// `[addr, addr+len)` widened to whole pages of `page` bytes: (start, size).
fn page_span(addr: u64, len: u64, page: u64) -> Result<(u64, u64)> {
    let page = page.max(1);
    let start = addr - addr % page;
    let end = addr
        .checked_add(len)
        .and_then(|e| e.checked_next_multiple_of(page))
        .ok_or_else(|| Error::InvalidArgument(format!("{addr:#x}+{len} overflows")))?;
    Ok((start, end - start))
}

/// Page-locked host memory (`cuMemHostAlloc`): the staging buffers GPU slices bounce through,
/// which the copy engine reaches directly. Freed on drop.
#[derive(Debug)]
pub struct PinnedBuffer {
    ptr: u64,
    len: usize,
}

// SAFETY: plain host memory owned by this value; access is through addresses the owner hands
// out under its own synchronisation.
unsafe impl Send for PinnedBuffer {}
// SAFETY: as above.
unsafe impl Sync for PinnedBuffer {}

impl PinnedBuffer {
    /// `len` bytes of page-locked host memory.
    ///
    /// # Errors
    /// No driver, or the allocation failed.
    pub fn new(len: usize) -> Result<Self> {
        driver()?;
        use_device(0)?;
        let mut ptr: *mut std::ffi::c_void = std::ptr::null_mut();
        // SAFETY: a valid out-pointer; portable so any device's context can use it.
        gpu("pinned host allocation", unsafe {
            sys::cuMemHostAlloc(&mut ptr, len.max(1), sys::CU_MEMHOSTALLOC_PORTABLE)
        })?;
        Ok(PinnedBuffer {
            ptr: ptr as u64,
            len,
        })
    }

    /// Its address.
    pub fn addr(&self) -> u64 {
        self.ptr
    }

    /// Bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no byte.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The whole buffer as a range for the kernel or a copy to move bytes through.
    pub fn range(&self) -> te_sys::PinnedRange<'_> {
        // SAFETY: host memory allocated for `self` and freed only on drop, after this borrow;
        // no reference to its bytes is handed out.
        unsafe { te_sys::PinnedRange::new(self.ptr, self.len) }
    }
}

impl Drop for PinnedBuffer {
    fn drop(&mut self) {
        // SAFETY: allocated by cuMemHostAlloc, freed once.
        let _ = unsafe { sys::cuMemFreeHost(self.ptr as *mut std::ffi::c_void) };
    }
}

/// Device memory owned by te (tests, benchmarks): `cuMemAlloc` memory (shared by legacy IPC
/// handles) or, from [`new_fabric`](Self::new_fabric), a fabric allocation mapped through the
/// virtual memory API. Freed (or unmapped) on drop.
#[derive(Debug)]
pub struct DeviceBuffer {
    ptr: u64,
    len: usize,
    device: u32,
    /// Mapped through the virtual memory API (unmapped on drop), not `cuMemAlloc`ed.
    mapped: bool,
}

impl DeviceBuffer {
    /// `len` bytes on device `device`.
    ///
    /// # Errors
    /// No driver, or the allocation failed.
    pub fn new(device: u32, len: usize) -> Result<Self> {
        driver()?;
        use_device(device as i32)?;
        let mut ptr = 0u64;
        // SAFETY: a valid out-pointer.
        gpu("allocation", unsafe {
            sys::cuMemAlloc_v2(&mut ptr, len.max(1))
        })?;
        Ok(DeviceBuffer {
            ptr,
            len,
            device,
            mapped: false,
        })
    }

    fn mapped(ptr: u64, len: usize, device: u32) -> Self {
        DeviceBuffer {
            ptr,
            len,
            device,
            mapped: true,
        }
    }

    /// Whether it is a fabric allocation (shared by fabric handle, not legacy IPC).
    pub fn is_fabric(&self) -> bool {
        self.mapped
    }

    /// Device address.
    pub fn addr(&self) -> u64 {
        self.ptr
    }

    /// Bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no byte.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Its device.
    pub fn device(&self) -> u32 {
        self.device
    }

    /// Writes `data` at `offset`.
    ///
    /// # Errors
    /// Out of bounds, or the copy failed.
    pub fn write_at(&self, offset: usize, data: &[u8]) -> Result<()> {
        self.check(offset, data.len())?;
        // SAFETY: the range is inside this allocation; `data` is valid host memory.
        unsafe {
            driver()?.copy(
                self.device,
                self.ptr + offset as u64,
                data.as_ptr() as u64,
                data.len(),
            )
        }
    }

    /// Reads `len` bytes at `offset`.
    ///
    /// # Errors
    /// Out of bounds, or the copy failed.
    pub fn to_vec(&self, offset: usize, len: usize) -> Result<Vec<u8>> {
        self.check(offset, len)?;
        let mut out = vec![0u8; len];
        // SAFETY: the range is inside this allocation; `out` is valid host memory of `len`.
        unsafe {
            driver()?.copy(
                self.device,
                out.as_mut_ptr() as u64,
                self.ptr + offset as u64,
                len,
            )?
        };
        Ok(out)
    }

    fn check(&self, offset: usize, len: usize) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(Error::InvalidArgument(format!(
                "{offset}+{len} outside a device buffer of {}",
                self.len
            ))),
        }
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        if use_device(self.device as i32).is_err() {
            return;
        }
        match self.mapped {
            true => fabric::unmap(self.ptr, self.len),
            false => {
                // SAFETY: `ptr` came from cuMemAlloc and is freed once.
                let _ = unsafe { sys::cuMemFree_v2(self.ptr) };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dma_buf_ranges_cover_whole_pages() {
        assert_eq!(page_span(0x10000, 0x2000, 4096).unwrap(), (0x10000, 0x2000));
        assert_eq!(page_span(0x10010, 0x10, 4096).unwrap(), (0x10000, 0x1000));
        assert_eq!(page_span(0x10ff0, 0x20, 4096).unwrap(), (0x10000, 0x2000));
        assert_eq!(
            page_span(0x10001, 0xffff, 65536).unwrap(),
            (0x10000, 0x10000)
        );
        assert!(page_span(u64::MAX - 10, 100, 4096).is_err());
    }

    #[test]
    fn without_a_driver_gpu_paths_say_so() {
        // On a machine with CUDA this checks nothing more than that the driver loads.
        match driver() {
            Ok(c) => assert!(c.devices > 0),
            Err(e) => {
                let msg = e.to_string();
                assert!(msg.contains("GPU:"), "{msg}");
                assert!(DeviceBuffer::new(0, 16).is_err());
            }
        }
    }
}
