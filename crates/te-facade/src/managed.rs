//! Memory the facade owns or copies for its caller (and, beside it, the engine's figures):
//! Mooncake's managed buffers
//! (`allocate_managed_buffer`, one registered host buffer per call) and its byte helpers
//! (`write_bytes_to_buffer`, `read_bytes_from_buffer`), which here only touch registered
//! memory, pinned for the copy.

#![allow(unsafe_code)] // copies between a caller's bytes and registered memory

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use te_core::{Error, HostBuffer, TransferEngine};

use crate::engine::MooncakeEngine;
use crate::error::Result;
use crate::runtime::Runtime;

/// Allocates registrable memory that peers map: shared memory, a CXL device.
pub(crate) type Allocator = Arc<dyn Fn(usize) -> te_core::Result<Arc<HostBuffer>> + Send + Sync>;

/// Where managed buffers come from: set by the first transport installed that allocates
/// memory peers map (shm, or cxl; `auto` installs shm first); host memory while unset.
pub(crate) type MemorySource = std::sync::OnceLock<Allocator>;

/// Buffers allocated for the caller, by address, with their lengths.
#[derive(Default)]
pub(crate) struct ManagedBuffers {
    lengths: Mutex<HashMap<u64, u64>>,
    /// Set when shm or cxl is installed: managed buffers then come from there, and a peer on
    /// this host (or sharing the device) maps them, whatever ptrace allows.
    pub(crate) source: MemorySource,
}

impl ManagedBuffers {
    /// A new registered buffer of `len` bytes, from the source where one is set.
    fn block(&self, runtime: &Runtime, len: u64) -> Result<Arc<HostBuffer>> {
        let size = usize::try_from(len)
            .ok()
            .filter(|l| *l > 0)
            .ok_or_else(|| Error::InvalidArgument(format!("managed buffer of {len} bytes")))?;
        let buffer = match self.source.get() {
            Some(allocate) => allocate(size)?,
            None => Arc::new(HostBuffer::new(size).map_err(te_core::Error::from)?),
        };
        runtime.register_buffer(&buffer)?;
        Ok(buffer)
    }

    fn free(&self, runtime: &Runtime, addr: u64, len: u64) -> Result<()> {
        let mut lengths = self.lock();
        if lengths.get(&addr) != Some(&len) {
            return Err(Error::AddressNotRegistered { addr, len }.into());
        }
        // The engine holds the buffer; unregistering drops it.
        crate::engine::until_unpinned(|| runtime.unregister(&[addr]))?;
        lengths.remove(&addr);
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, u64>> {
        self.lengths.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl MooncakeEngine {
    /// This engine's figures (te-metrics' JSON: TENT's totals by name, then every series);
    /// they count while [`set_metrics`](Self::set_metrics) is on, or the variables turned
    /// counting on.
    ///
    /// # Errors
    /// A closed engine.
    pub fn metrics_json(&self) -> Result<String> {
        let live = self.live()?;
        Ok(te_metrics::json(&live.engine().metrics().snapshot()).to_string())
    }

    /// Starts or stops counting this engine's requests.
    ///
    /// # Errors
    /// A closed engine.
    pub fn set_metrics(&self, on: bool) -> Result<()> {
        self.live()?.engine().set_metrics_enabled(on);
        Ok(())
    }

    /// Allocates `len` bytes (shared memory where shm runs, the CXL device where cxl runs
    /// without shm, else host memory) and registers
    /// them for peers to read and write; the address, never 0. The engine owns them:
    /// [`free_managed`](Self::free_managed) or closing frees them.
    ///
    /// # Errors
    /// A zero or impossible length, or registration refused.
    pub fn allocate_managed(&self, len: u64) -> Result<u64> {
        let live = self.live()?;
        let buffer = live.managed.block(live.runtime(), len)?;
        live.managed.lock().insert(buffer.addr(), len);
        Ok(buffer.addr())
    }

    /// Allocates and registers `len` bytes as [`allocate_managed`](Self::allocate_managed)
    /// does, and shares ownership with the caller: the memory stays allocated while either
    /// holds it. [`unregister_batch`](Self::unregister_batch) or closing ends the engine's
    /// part (and peers' access); the caller's handle keeps the bytes readable after that.
    ///
    /// # Errors
    /// A zero or impossible length, or registration refused.
    pub fn allocate_block(&self, len: u64) -> Result<Arc<HostBuffer>> {
        let live = self.live()?;
        live.managed.block(live.runtime(), len)
    }

    /// Unregisters and frees a buffer from [`allocate_managed`](Self::allocate_managed).
    ///
    /// # Errors
    /// -3 for an address that is not such a buffer or a length that is not its length.
    pub fn free_managed(&self, addr: u64, len: u64) -> Result<()> {
        let live = self.live()?;
        live.managed.free(live.runtime(), addr, len)
    }

    /// Copies `data` to `dest`, which must lie inside one registered region (Mooncake copies
    /// to any address; te refuses what it cannot vouch for).
    ///
    /// # Errors
    /// -3 when `[dest, dest+len)` is not inside one registered region.
    pub fn write_bytes(&self, dest: u64, data: &[u8]) -> Result<()> {
        let live = self.live()?;
        write_bytes(live.engine(), dest, data)
    }

    /// A copy of `len` bytes at `src`, which must lie inside one registered region.
    ///
    /// # Errors
    /// -3 when `[src, src+len)` is not inside one registered region.
    pub fn read_bytes(&self, src: u64, len: u64) -> Result<Vec<u8>> {
        let live = self.live()?;
        read_bytes(live.engine(), src, len)
    }
}

/// Copies `data` into registered memory at `dest`.
fn write_bytes(engine: &TransferEngine, dest: u64, data: &[u8]) -> Result<()> {
    if data.is_empty() {
        return Ok(());
    }
    let _pin = engine.pin_local(dest, data.len() as u64)?;
    // SAFETY: the pin keeps `[dest, dest+len)` inside one registered region, which by the
    // registration contract is allocated, writable memory of this process; `data` is a
    // borrowed slice that cannot overlap memory handed to te by address.
    unsafe { std::ptr::copy(data.as_ptr(), dest as usize as *mut u8, data.len()) };
    Ok(())
}

/// Copies `len` bytes of registered memory at `src`.
fn read_bytes(engine: &TransferEngine, src: u64, len: u64) -> Result<Vec<u8>> {
    if len == 0 {
        return Ok(Vec::new());
    }
    let _pin = engine.pin_local(src, len)?;
    let len = usize::try_from(len).map_err(|_| Error::AddressNotRegistered { addr: src, len })?;
    let mut out = vec![0u8; len];
    // SAFETY: the pin keeps `[src, src+len)` inside one registered region, allocated and
    // readable by the registration contract; `out` is a fresh vector of `len` bytes.
    unsafe { std::ptr::copy(src as usize as *const u8, out.as_mut_ptr(), len) };
    Ok(out)
}
