//! GPU memory over TCP: a slice whose memory (local on the initiator, the target range on the
//! target) lies in a GPU region is staged through a page-locked host buffer: copied out of the
//! GPU before it is sent, received into the buffer and copied into the GPU after. Buffers come
//! from a bounded pool (at most `MAX_BUFFERS`; a sender waits for one when all are in use).
//!
//! Host memory never touches this module beyond one relaxed load: `device_of` answers `None`
//! at once until a GPU region is registered.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, RwLock};

use te_core::memory::{Location, Region};
#[cfg(feature = "cuda")]
use te_cuda::PinnedBuffer;
use te_sys::PinnedRange;
#[cfg(not(feature = "cuda"))]
use without_cuda::PinnedBuffer;

/// Staging buffers at most, across every lane and connection of the transport.
const MAX_BUFFERS: usize = 32;
/// Buffers are made in multiples of this.
const GRAIN: usize = 64 << 10;

/// The GPU regions registered with the transport and the staging pool.
#[derive(Default)]
pub(crate) struct GpuStaging {
    any: AtomicBool,
    /// Start → (length, device).
    regions: RwLock<BTreeMap<u64, (u64, u32)>>,
    pool: Mutex<PoolState>,
    ready: Condvar,
}

#[derive(Default)]
struct PoolState {
    free: Vec<PinnedBuffer>,
    made: usize,
}

/// A staging buffer on loan; it goes back to the pool when dropped.
pub(crate) struct Bounce<'a> {
    buf: Option<PinnedBuffer>,
    owner: &'a GpuStaging,
}

impl Bounce<'_> {
    /// Its address.
    pub(crate) fn addr(&self) -> u64 {
        self.buf.as_ref().map_or(0, PinnedBuffer::addr)
    }

    /// Its first `len` bytes (fewer when it is shorter), for the kernel to move bytes through.
    pub(crate) fn range(&self, len: usize) -> PinnedRange<'_> {
        self.buf
            .as_ref()
            .map_or_else(PinnedRange::empty, |b| b.range().head(len))
    }
}

impl Drop for Bounce<'_> {
    fn drop(&mut self) {
        if let Some(b) = self.buf.take() {
            let mut pool = self.owner.pool.lock().unwrap_or_else(|e| e.into_inner());
            pool.free.push(b);
            self.owner.ready.notify_one();
        }
    }
}

impl GpuStaging {
    /// Notes a registered region that lives on a GPU.
    pub(crate) fn add(&self, region: &Region) {
        if let &Location::Cuda(device) = region.location() {
            self.regions
                .write()
                .unwrap_or_else(|e| e.into_inner())
                .insert(region.addr(), (region.len(), device));
            self.any.store(true, Ordering::Release);
        }
    }

    /// Whether a GPU region was ever registered (then requests may need staging, and a data
    /// connection reads only whole headers, never past a request that may leave the loop).
    pub(crate) fn any(&self) -> bool {
        self.any.load(Ordering::Acquire)
    }

    /// Forgets a region.
    pub(crate) fn remove(&self, addr: u64) {
        if self.any.load(Ordering::Acquire) {
            self.regions
                .write()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&addr);
        }
    }

    /// The GPU holding `[addr, addr+len)`, if it lies in a GPU region.
    pub(crate) fn device_of(&self, addr: u64, len: u64) -> Option<u32> {
        if !self.any.load(Ordering::Acquire) {
            return None;
        }
        let regions = self.regions.read().unwrap_or_else(|e| e.into_inner());
        let (start, (rlen, device)) = regions.range(..=addr).next_back()?;
        (addr.checked_add(len)? <= start + rlen).then_some(*device)
    }

    /// A staging buffer of at least `len` bytes, waiting while all are on loan.
    ///
    /// # Errors
    /// Page-locked memory could not be had.
    pub(crate) fn bounce(&self, len: usize) -> Result<Bounce<'_>, String> {
        let size = len.div_ceil(GRAIN).max(1) * GRAIN;
        let mut pool = self.pool.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(i) = pool.free.iter().position(|b| b.len() >= size) {
                let buf = pool.free.swap_remove(i);
                return Ok(Bounce {
                    buf: Some(buf),
                    owner: self,
                });
            }
            // Too small a free buffer is replaced by a larger one (the count stays).
            // (Dropping it frees its page-locked memory.)
            if pool.free.pop().is_some() {
                pool.made -= 1;
            }
            if pool.made < MAX_BUFFERS {
                pool.made += 1;
                drop(pool);
                return match PinnedBuffer::new(size) {
                    Ok(buf) => Ok(Bounce {
                        buf: Some(buf),
                        owner: self,
                    }),
                    Err(e) => {
                        self.pool.lock().unwrap_or_else(|e| e.into_inner()).made -= 1;
                        Err(format!("staging GPU memory over TCP: {e}"))
                    }
                };
            }
            pool = self.ready.wait(pool).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// Whether GPU memory can be staged: te-tcp built with `cuda` and a CUDA driver present.
pub(crate) fn driver_present() -> bool {
    #[cfg(feature = "cuda")]
    return te_cuda::driver().is_ok();
    #[cfg(not(feature = "cuda"))]
    false
}

/// Copies `len` bytes between a staging buffer and GPU memory on `device`.
#[cfg(feature = "cuda")]
pub(crate) fn copy(device: u32, dst: u64, src: u64, len: usize) -> Result<(), String> {
    let cuda = te_cuda::driver().map_err(|e| e.to_string())?;
    crate::sys::gpu_copy(cuda, device, dst, src, len).map_err(|e| e.to_string())
}

/// Copies `len` bytes between a staging buffer and GPU memory on `device`.
#[cfg(not(feature = "cuda"))]
pub(crate) fn copy(_device: u32, _dst: u64, _src: u64, _len: usize) -> Result<(), String> {
    Err(without_cuda::REASON.into())
}

/// te-tcp built without `cuda`: no staging buffer can exist, so every GPU slice fails with a
/// reason naming the feature.
#[cfg(not(feature = "cuda"))]
mod without_cuda {
    pub(super) const REASON: &str =
        "GPU memory over TCP needs te-tcp built with its `cuda` feature";

    /// A staging buffer, which `new` never makes: the pool stays empty.
    pub(super) struct PinnedBuffer {
        _unmade: (),
    }

    impl PinnedBuffer {
        pub(super) fn new(_len: usize) -> Result<Self, String> {
            Err(REASON.into())
        }

        pub(super) fn addr(&self) -> u64 {
            0
        }

        pub(super) fn len(&self) -> usize {
            0
        }

        pub(super) fn range(&self) -> te_sys::PinnedRange<'_> {
            te_sys::PinnedRange::empty()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use te_core::Permission;

    #[test]
    fn only_gpu_regions_are_staged() {
        let s = GpuStaging::default();
        let host = Region::new(
            0x1000,
            0x1000,
            Location::Cpu(0),
            Permission::RemoteReadWrite,
            None,
        );
        s.add(&host);
        assert_eq!(
            s.device_of(0x1000, 16),
            None,
            "host memory: nothing to stage"
        );
        let gpu = Region::new(
            0x10000,
            0x1000,
            Location::Cuda(2),
            Permission::RemoteReadWrite,
            None,
        );
        s.add(&gpu);
        assert_eq!(s.device_of(0x10000, 0x1000), Some(2));
        assert_eq!(s.device_of(0x10800, 0x100), Some(2));
        assert_eq!(s.device_of(0x10800, 0x1000), None, "past the region's end");
        assert_eq!(s.device_of(0x1000, 16), None);
        s.remove(0x10000);
        assert_eq!(s.device_of(0x10000, 16), None);
    }

    #[test]
    fn without_a_driver_staging_fails_with_a_reason() {
        let s = GpuStaging::default();
        if !driver_present() {
            let err = s.bounce(100).err().expect("no pinned memory without CUDA");
            assert!(err.contains("GPU"), "{err}");
            assert_eq!(
                s.pool.lock().unwrap().made,
                0,
                "the failed loan is not counted"
            );
            assert!(copy(0, 0, 0, 0).is_err());
        }
    }
}
