//! [`CxlDevice`]: a CXL memory device (a DAX character device such as `/dev/dax0.0`, or a
//! regular file standing in for one) mapped shared into this process.
//!
//! The first 4 KiB hold a header that every process sharing the device agrees on: a magic, the
//! formatted size, a random device identity (peers use the device only if they map the same
//! one), and a bump allocator, so processes carve segments out of the device without
//! overlapping. Every copy is checked against the mapping; a copy into the device ends with a
//! store fence. Memory handed out is never reclaimed (the device is a scratch area owned by te).
#![allow(unsafe_code)]

use std::fs::OpenOptions;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use te_core::{Error, Result};

/// Bytes reserved for the header; allocations start after it.
pub const HEADER_LEN: u64 = 4096;
/// Allocation granularity.
pub const ALIGN: u64 = 4096;
const MAGIC: u64 = u64::from_le_bytes(*b"TECXL001");
const READY: u64 = u64::from_le_bytes(*b"ready!!!");
const FORMATTING: u64 = 1;

/// Header words, at these byte offsets of the device.
const MAGIC_AT: usize = 0;
const STATE_AT: usize = 8;
const SIZE_AT: usize = 16;
const NEXT_AT: usize = 24;
const ID_AT: usize = 32;

fn fail(path: &Path, reason: impl std::fmt::Display) -> Error {
    Error::Transport {
        transport: "cxl",
        reason: format!("{} (MC_CXL_DEV_PATH): {reason}", path.display()),
    }
}

/// A mapped CXL device.
#[derive(Debug)]
pub struct CxlDevice {
    base: *mut u8,
    len: u64,
    path: PathBuf,
    id: String,
    /// The device's (or stand-in file's) identity on this host: a process that maps it reaches
    /// it as this one does.
    file: te_sys::holder::FileId,
}

// SAFETY: the mapping is plain shared memory with no thread affinity; all access is through
// bounds-checked raw copies or atomics, never references to the bytes.
unsafe impl Send for CxlDevice {}
// SAFETY: as above; concurrent copies have the same contract as memory a NIC writes into.
unsafe impl Sync for CxlDevice {}

impl CxlDevice {
    /// Maps `path`. `size` is required for a DAX character device; for a regular file it
    /// defaults to the file's length and may not exceed it.
    ///
    /// # Errors
    /// [`Error::Transport`] naming the path: missing, not a DAX device or regular file, no size,
    /// too small, not mappable, or a header another process left half-formatted.
    pub fn open(path: &Path, size: Option<u64>) -> Result<Self> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(path)
            .map_err(|e| fail(path, e))?;
        let meta = file.metadata().map_err(|e| fail(path, e))?;
        let file_id = te_sys::holder::FileId::of(&file).map_err(|e| fail(path, e))?;
        let len = match (meta.file_type().is_char_device(), meta.is_file(), size) {
            (true, _, Some(s)) => s,
            (true, _, None) => {
                return Err(fail(path, "MC_CXL_DEV_SIZE is required for a DAX device"));
            }
            (false, true, Some(s)) if s > meta.len() => {
                return Err(fail(
                    path,
                    format!(
                        "MC_CXL_DEV_SIZE={s} exceeds the file ({} bytes)",
                        meta.len()
                    ),
                ));
            }
            (false, true, s) => s.unwrap_or(meta.len()),
            _ => return Err(fail(path, "neither a DAX device nor a regular file")),
        };
        if len < HEADER_LEN + ALIGN {
            return Err(fail(
                path,
                format!("{len} bytes is too small (at least {})", HEADER_LEN + ALIGN),
            ));
        }
        let map_len = usize::try_from(len).map_err(|_| fail(path, "too large to map"))?;
        // SAFETY: a fresh shared mapping of an open descriptor; the kernel picks the address.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                std::os::fd::AsRawFd::as_raw_fd(&file),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(fail(path, std::io::Error::last_os_error()));
        }
        let mut device = CxlDevice {
            base: base as *mut u8,
            len,
            path: path.to_path_buf(),
            id: String::new(),
            file: file_id,
        };
        device.id = device.attach()?;
        Ok(device)
    }

    fn word(&self, at: usize) -> &AtomicU64 {
        // SAFETY: `at` is one of the header's 8-byte-aligned offsets inside the first 4 KiB of
        // a page-aligned mapping that lives as long as `self`; the header words are only ever
        // accessed atomically, by every process.
        unsafe { &*(self.base.add(at) as *const AtomicU64) }
    }

    /// Formats the header if nobody has, waits for a concurrent formatter, and returns the
    /// device identity.
    fn attach(&self) -> Result<String> {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let state = self.word(STATE_AT).load(Ordering::Acquire);
            if state == READY && self.word(MAGIC_AT).load(Ordering::Acquire) == MAGIC {
                let id = [
                    self.word(ID_AT).load(Ordering::Acquire),
                    self.word(ID_AT + 8).load(Ordering::Acquire),
                ];
                return Ok(format!("{:016x}{:016x}", id[0], id[1]));
            }
            if state != FORMATTING
                && self
                    .word(STATE_AT)
                    .compare_exchange(state, FORMATTING, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
            {
                let secret = te_core::segment::SegmentSecret::random()?.to_bytes();
                let (a, b) = secret.split_at(8);
                let word = |s: &[u8]| u64::from_le_bytes(s.try_into().unwrap_or([0; 8]));
                self.word(ID_AT).store(word(a), Ordering::Relaxed);
                self.word(ID_AT + 8).store(word(b), Ordering::Relaxed);
                self.word(SIZE_AT).store(self.len, Ordering::Relaxed);
                self.word(NEXT_AT).store(HEADER_LEN, Ordering::Relaxed);
                self.word(MAGIC_AT).store(MAGIC, Ordering::Relaxed);
                self.word(STATE_AT).store(READY, Ordering::Release);
                tracing::info!(path = %self.path.display(), len = self.len, "formatted the CXL device header");
                continue;
            }
            if Instant::now() > deadline {
                return Err(fail(
                    &self.path,
                    "the header stays half-formatted (a formatter died?)",
                ));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Carves `len` bytes (rounded up to 4 KiB) out of the device for this process.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for zero; [`Error::Transport`] when the device is full.
    pub fn allocate(&self, len: u64) -> Result<u64> {
        if len == 0 {
            return Err(Error::InvalidArgument("zero-length allocation".into()));
        }
        let rounded = len
            .checked_add(ALIGN - 1)
            .map(|l| l & !(ALIGN - 1))
            .ok_or_else(|| Error::InvalidArgument(format!("allocation of {len} bytes")))?;
        let end_limit = self.len.min(self.word(SIZE_AT).load(Ordering::Acquire));
        let next = self.word(NEXT_AT);
        let mut at = next.load(Ordering::Acquire);
        loop {
            let end = at
                .checked_add(rounded)
                .filter(|e| *e <= end_limit)
                .ok_or_else(|| {
                    fail(
                        &self.path,
                        format!(
                            "full: {len} bytes asked, {} left",
                            end_limit.saturating_sub(at)
                        ),
                    )
                })?;
            match next.compare_exchange(at, end, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Ok(at),
                Err(now) => at = now,
            }
        }
    }

    /// The device identity every process mapping this device sees.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The identity of the device file on this host.
    pub fn file_id(&self) -> te_sys::holder::FileId {
        self.file
    }

    /// The mapping's first byte in this process.
    pub fn base(&self) -> u64 {
        self.base as u64
    }

    /// Mapped bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Always false (a device smaller than its header is refused).
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The device offset of local address `addr`, if `[addr, addr+len)` lies past the header
    /// inside the mapping.
    pub fn offset_of(&self, addr: u64, len: u64) -> Option<u64> {
        let offset = addr.checked_sub(self.base())?;
        self.check(offset, len).ok().map(|_| offset)
    }

    fn check(&self, offset: u64, len: u64) -> std::result::Result<(), String> {
        match offset.checked_add(len) {
            Some(end) if offset >= HEADER_LEN && len > 0 && end <= self.len => Ok(()),
            _ => Err(format!(
                "device range {offset}+{len} is outside {HEADER_LEN}..{}",
                self.len
            )),
        }
    }

    /// Copies `len` bytes from `local` into the device at `offset`, then fences the stores.
    ///
    /// # Safety
    /// `[local, local+len)` must be readable memory of this process, valid for the call.
    ///
    /// # Errors
    /// The device range is outside the mapping (nothing copied).
    pub unsafe fn write(
        &self,
        offset: u64,
        local: u64,
        len: u64,
    ) -> std::result::Result<(), String> {
        self.check(offset, len)?;
        // SAFETY: the device range is inside the mapping (checked); the caller vouches for the
        // source; `copy` tolerates overlap.
        unsafe {
            std::ptr::copy(
                local as *const u8,
                self.base.add(offset as usize),
                len as usize,
            )
        };
        store_fence();
        Ok(())
    }

    /// Copies `len` bytes at device `offset` out to `local`.
    ///
    /// # Safety
    /// `[local, local+len)` must be writable memory of this process, valid for the call.
    ///
    /// # Errors
    /// The device range is outside the mapping (nothing copied).
    pub unsafe fn read(
        &self,
        offset: u64,
        local: u64,
        len: u64,
    ) -> std::result::Result<(), String> {
        self.check(offset, len)?;
        // SAFETY: as `write`, in the other direction.
        unsafe {
            std::ptr::copy(
                self.base.add(offset as usize),
                local as *mut u8,
                len as usize,
            )
        };
        Ok(())
    }
}

/// Orders the copy's stores before anything that follows (the completion a peer may act on).
fn store_fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: SFENCE has no preconditions; SSE is part of the x86_64 baseline.
    unsafe {
        std::arch::x86_64::_mm_sfence()
    };
    #[cfg(not(target_arch = "x86_64"))]
    std::sync::atomic::fence(Ordering::SeqCst);
}

impl Drop for CxlDevice {
    fn drop(&mut self) {
        // SAFETY: exactly the mapping made in `open`, unmapped once; buffers over it hold an
        // `Arc` to this device, so none outlives it.
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.len as usize) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stand_in(name: &str, len: u64) -> PathBuf {
        let p = std::env::temp_dir().join(format!("te-cxl-unit-{name}-{}", std::process::id()));
        std::fs::File::create(&p).unwrap().set_len(len).unwrap();
        p
    }

    #[test]
    fn two_mappings_share_the_header_and_never_overlap() {
        let p = stand_in("share", 1 << 20);
        let a = CxlDevice::open(&p, None).unwrap();
        let b = CxlDevice::open(&p, None).unwrap();
        assert_eq!(a.id(), b.id());
        assert_eq!(a.id().len(), 32);
        let x = a.allocate(5000).unwrap();
        let y = b.allocate(1).unwrap();
        assert_eq!((x, y), (HEADER_LEN, HEADER_LEN + 8192));
        assert!(a.allocate(1 << 20).is_err(), "full");
        std::fs::remove_file(p).unwrap();
    }

    #[test]
    fn copies_are_checked_against_the_mapping() {
        let p = stand_in("bounds", 64 << 10);
        let d = CxlDevice::open(&p, None).unwrap();
        let src = [7u8; 16];
        let mut dst = [0u8; 16];
        // SAFETY: local arrays valid for the calls.
        unsafe {
            assert!(
                d.write(0, src.as_ptr() as u64, 16).is_err(),
                "the header is not data"
            );
            assert!(
                d.write((64 << 10) - 8, src.as_ptr() as u64, 16).is_err(),
                "past the end"
            );
            assert!(
                d.write(u64::MAX - 4, src.as_ptr() as u64, 16).is_err(),
                "overflow"
            );
            d.write(HEADER_LEN, src.as_ptr() as u64, 16).unwrap();
            d.read(HEADER_LEN, dst.as_mut_ptr() as u64, 16).unwrap();
        }
        assert_eq!(dst, src);
        assert_eq!(d.offset_of(d.base() + HEADER_LEN, 16), Some(HEADER_LEN));
        assert_eq!(d.offset_of(d.base() + 8, 16), None);
        assert_eq!(d.offset_of(d.base() - 1, 1), None);
        std::fs::remove_file(p).unwrap();
    }

    #[test]
    fn bad_devices_are_refused_with_the_path_named() {
        let missing = CxlDevice::open(Path::new("/dev/dax-te-missing"), Some(1 << 20)).unwrap_err();
        assert!(
            missing.to_string().contains("/dev/dax-te-missing"),
            "{missing}"
        );
        let chr = CxlDevice::open(Path::new("/dev/zero"), None).unwrap_err();
        assert!(
            chr.to_string().contains("MC_CXL_DEV_SIZE is required"),
            "{chr}"
        );
        let p = stand_in("small", 8192);
        let big = CxlDevice::open(&p, Some(1 << 20)).unwrap_err();
        assert!(big.to_string().contains("exceeds the file"), "{big}");
        std::fs::File::create(&p).unwrap().set_len(100).unwrap();
        assert!(
            CxlDevice::open(&p, None)
                .unwrap_err()
                .to_string()
                .contains("too small")
        );
        std::fs::remove_file(p).unwrap();
    }
}
