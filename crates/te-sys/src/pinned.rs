//! [`PinnedRange`]: a range of memory that the kernel or a copy may read and write for as long
//! as the range lives. Registered memory is shared with the application and with peers, so no
//! Rust reference to it is ever formed; a range is how it travels from the pin that keeps it
//! registered to the system call that moves its bytes, without an `unsafe fn` on the way.
//!
//! A range is made in one of three ways: from a pin that keeps a registered region alive (the
//! engine's `RegionPin::range`, `SliceOp::local_range`), from a buffer of te's own
//! ([`HostBuffer::range`](crate::HostBuffer::range)), or from a Rust slice borrowed mutably for
//! the range's life ([`PinnedRange::of_mut`]). Only the first two are `unsafe` inside, each once.

use std::fmt;
use std::marker::PhantomData;

/// `len` bytes at `addr`, valid for reads and writes for `'a`.
#[derive(Clone, Copy)]
pub struct PinnedRange<'a> {
    addr: u64,
    len: usize,
    memory: PhantomData<&'a mut [u8]>,
}

impl fmt::Debug for PinnedRange<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PinnedRange({:#x}+{})", self.addr, self.len)
    }
}

impl<'a> PinnedRange<'a> {
    /// The range `[addr, addr+len)`.
    ///
    /// # Safety
    /// The range must be mapped memory that stays valid for reads and writes for `'a`, and
    /// that no Rust reference covers while the range is used (the kernel and peers write into
    /// it at any time).
    pub unsafe fn new(addr: u64, len: usize) -> Self {
        PinnedRange {
            addr,
            len,
            memory: PhantomData,
        }
    }

    /// The bytes of `buf`, borrowed for the range's life.
    pub fn of_mut(buf: &'a mut [u8]) -> Self {
        PinnedRange {
            addr: buf.as_mut_ptr() as u64,
            len: buf.len(),
            memory: PhantomData,
        }
    }

    /// An empty range (a part with nothing to send).
    pub fn empty() -> Self {
        PinnedRange {
            addr: 0,
            len: 0,
            memory: PhantomData,
        }
    }

    /// Start address.
    pub fn addr(self) -> u64 {
        self.addr
    }

    /// Length in bytes.
    pub fn len(self) -> usize {
        self.len
    }

    /// Whether the range holds no bytes.
    pub fn is_empty(self) -> bool {
        self.len == 0
    }

    /// `len` bytes from `offset` on: `None` unless they lie inside this range.
    pub fn part(self, offset: usize, len: usize) -> Option<Self> {
        let end = offset.checked_add(len)?;
        (end <= self.len).then_some(PinnedRange {
            addr: self.addr + offset as u64,
            len,
            memory: PhantomData,
        })
    }

    /// The first `len` bytes (all of them when the range is shorter).
    pub fn head(self, len: usize) -> Self {
        PinnedRange {
            len: len.min(self.len),
            ..self
        }
    }

    /// Drops the first `n` bytes (all of them when the range is shorter).
    pub fn advance(&mut self, n: usize) {
        let n = n.min(self.len);
        self.addr += n as u64;
        self.len -= n;
    }

    /// Copies `bytes` to the start of the range.
    ///
    /// # Panics
    /// When `bytes` is longer than the range: a caller's arithmetic went wrong.
    pub fn put(self, bytes: &[u8]) {
        assert!(
            bytes.len() <= self.len,
            "{} bytes into {self:?}",
            bytes.len()
        );
        // SAFETY: the range is valid for writes for `'a` (its constructor's contract) and holds
        // `bytes.len()` bytes; `copy` allows the two to overlap.
        unsafe { std::ptr::copy(bytes.as_ptr(), self.addr as *mut u8, bytes.len()) }
    }

    /// Copies the start of the range into `out`.
    ///
    /// # Panics
    /// When `out` is longer than the range.
    pub fn get(self, out: &mut [u8]) {
        assert!(out.len() <= self.len, "{} bytes out of {self:?}", out.len());
        // SAFETY: the range is valid for reads for `'a` and holds `out.len()` bytes; `copy`
        // allows the two to overlap.
        unsafe { std::ptr::copy(self.addr as *const u8, out.as_mut_ptr(), out.len()) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_stay_inside_their_range() {
        let mut buf = [0u8; 16];
        let base = buf.as_ptr() as u64;
        let r = PinnedRange::of_mut(&mut buf);
        assert_eq!(
            r.part(4, 12).map(|p| (p.addr(), p.len())),
            Some((base + 4, 12))
        );
        assert!(r.part(4, 13).is_none());
        assert!(r.part(usize::MAX, 2).is_none());
        assert_eq!(r.head(99).len(), 16);
        let mut tail = r;
        tail.advance(10);
        assert_eq!((tail.addr(), tail.len()), (base + 10, 6));
        tail.advance(99);
        assert!(tail.is_empty());
    }

    #[test]
    fn put_and_get_move_bytes_and_refuse_overruns() {
        let mut buf = [0u8; 8];
        let r = PinnedRange::of_mut(&mut buf);
        r.part(2, 3).unwrap().put(b"abc");
        let mut out = [0u8; 5];
        r.get(&mut out);
        assert_eq!(&out, b"\0\0abc");
        let overrun = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            r.part(6, 2).unwrap().put(b"xyz")
        }));
        assert!(overrun.is_err());
        assert_eq!(&buf, b"\0\0abc\0\0\0");
    }
}
