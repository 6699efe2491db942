//! [`HostBuffer`]: page-aligned host memory owned by te, safe to register and to share with peers.
//!
//! Remote peers write into registered memory from transport threads while the application may
//! look at it, so this type never hands out `&[u8]` / `&mut [u8]` views of its bytes: reads and
//! writes are explicit copies through raw pointers. It does not register itself; pass it to
//! [`TransferEngine::register_buffer`](crate::engine::TransferEngine::register_buffer).
#![allow(unsafe_code)]

use std::alloc::{self, Layout};
use std::ptr::NonNull;

use crate::error::{Error, Result};

const PAGE: usize = 4096;

/// A zeroed, page-aligned allocation of host memory.
#[derive(Debug)]
pub struct HostBuffer {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the buffer is a plain heap allocation with no thread affinity; all access goes
// through raw-pointer copies, which the owner synchronises like any shared DMA target.
unsafe impl Send for HostBuffer {}
// SAFETY: no method hands out references to the bytes, so shared use cannot create aliasing
// references; concurrent copies are the same contract as memory a NIC writes into.
unsafe impl Sync for HostBuffer {}

impl HostBuffer {
    /// Allocates `len` zeroed bytes aligned to 4096.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for zero or absurd lengths; [`Error::Transport`] if the
    /// allocator fails.
    pub fn new(len: usize) -> Result<Self> {
        if len == 0 {
            return Err(Error::InvalidArgument("zero-length buffer".into()));
        }
        let layout = Layout::from_size_align(len, PAGE)
            .map_err(|_| Error::InvalidArgument(format!("buffer of {len} bytes")))?;
        // SAFETY: the layout has a non-zero size (checked above).
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).ok_or(Error::Transport {
            transport: "host",
            reason: format!("allocation of {len} bytes failed"),
        })?;
        Ok(HostBuffer { ptr, len })
    }

    /// The first byte's address, as used in transfer requests.
    pub fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: empty buffers cannot be made.
    pub fn is_empty(&self) -> bool {
        false
    }

    fn check(&self, offset: usize, len: usize) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(Error::InvalidArgument(format!(
                "range {offset}+{len} outside a buffer of {} bytes",
                self.len
            ))),
        }
    }

    /// Copies `src` into the buffer at `offset`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if the range leaves the buffer.
    pub fn write_at(&self, offset: usize, src: &[u8]) -> Result<()> {
        self.check(offset, src.len())?;
        // SAFETY: the range is inside the allocation (checked), `src` is a distinct Rust slice,
        // and a raw copy creates no reference to the buffer's bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.as_ptr().add(offset), src.len());
        }
        Ok(())
    }

    /// Copies bytes at `offset` into `dst`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if the range leaves the buffer.
    pub fn read_at(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        self.check(offset, dst.len())?;
        // SAFETY: as in `write_at`, with the copy going the other way.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.ptr.as_ptr().add(offset),
                dst.as_mut_ptr(),
                dst.len(),
            );
        }
        Ok(())
    }

    /// Returns a copy of `len` bytes at `offset`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if the range leaves the buffer.
    pub fn to_vec(&self, offset: usize, len: usize) -> Result<Vec<u8>> {
        let mut out = vec![0u8; len];
        self.read_at(offset, &mut out)?;
        Ok(out)
    }
}

impl Drop for HostBuffer {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from `alloc_zeroed` with exactly this layout (validated in `new`).
        unsafe {
            alloc::dealloc(
                self.ptr.as_ptr(),
                Layout::from_size_align_unchecked(self.len, PAGE),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_in_and_out_within_bounds() {
        let b = HostBuffer::new(10_000).unwrap();
        assert_eq!(b.addr() % 4096, 0);
        assert_eq!(b.to_vec(0, 16).unwrap(), vec![0u8; 16]);
        b.write_at(9_990, &[7u8; 10]).unwrap();
        assert_eq!(b.to_vec(9_989, 11).unwrap()[1..], [7u8; 10]);
        assert!(b.write_at(9_991, &[1u8; 10]).is_err());
        assert!(b.read_at(usize::MAX, &mut [0u8; 2]).is_err());
        assert!(HostBuffer::new(0).is_err());
    }
}
