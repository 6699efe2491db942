//! [`HostBuffer`]: page-aligned host memory owned by te, safe to register and to share with peers.
//!
//! Remote peers write into registered memory from transport threads while the application may
//! look at it, so this type never hands out `&[u8]` / `&mut [u8]` views of its bytes: reads and
//! writes are explicit copies through raw pointers. It does not register itself; pass it to
//! `TransferEngine::register_buffer` (te-core).
//!
//! A buffer lives on the heap, or in a shared-memory file ([`HostBuffer::new_shared`]: created
//! owner-only (0600) under a random name, in `/dev/shm` or any tmpfs/CXL mount) that a process
//! on the same host maps with [`HostBuffer::open_shared`].

use std::alloc::{self, Layout};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;

use crate::error::{Error, Result};

const PAGE: usize = 4096;

#[derive(Debug)]
enum Backing {
    Heap,
    /// A mapping of a shared-memory file; the creator removes the file when dropped.
    Shared {
        path: PathBuf,
        creator: bool,
        /// The creator's descriptor, holding a shared `flock` for as long as the buffer lives:
        /// a file nobody holds it on was left by a process that died.
        #[allow(dead_code)]
        lock: Option<std::fs::File>,
        /// Set once [`HostBuffer::unshare`] put private memory in the mapping's place.
        private: std::sync::atomic::AtomicBool,
    },
    /// A view of memory someone else maps (a CXL device); `owner` keeps the mapping alive.
    Borrowed {
        #[allow(dead_code)]
        owner: std::sync::Arc<dyn std::any::Any + Send + Sync>,
    },
}

/// A zeroed, page-aligned allocation of host memory.
#[derive(Debug)]
pub struct HostBuffer {
    ptr: NonNull<u8>,
    len: usize,
    backing: Backing,
}

// SAFETY: the buffer is a plain heap allocation with no thread affinity; all access goes
// through raw-pointer copies, which the owner synchronises like any shared DMA target.
unsafe impl Send for HostBuffer {}
// SAFETY: no method hands out references to the bytes, so shared use cannot create aliasing
// references; concurrent copies are the same contract as memory a NIC writes into.
unsafe impl Sync for HostBuffer {}

/// Why a shared-memory file opened for a peer's buffer is not one to map, if it is not: it must
/// be a regular file of this user on the shared-memory filesystem (`dir_dev`), linked once and
/// open to no one else.
fn foreign_file(meta: &std::fs::Metadata, dir_dev: u64) -> Option<&'static str> {
    use std::os::unix::fs::MetadataExt;
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    if !meta.is_file() {
        Some("not a regular file")
    } else if meta.uid() != uid {
        Some("owned by another user")
    } else if meta.dev() != dir_dev {
        Some("not on the shared-memory filesystem")
    } else if meta.nlink() != 1 || meta.mode() & 0o077 != 0 {
        Some("linked elsewhere or open to other users")
    } else {
        None
    }
}

impl HostBuffer {
    /// Allocates `len` zeroed bytes aligned to 4096.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for zero or absurd lengths; [`Error::Memory`] if the
    /// allocator fails.
    pub fn new(len: usize) -> Result<Self> {
        if len == 0 {
            return Err(Error::InvalidArgument("zero-length buffer".into()));
        }
        let layout = Layout::from_size_align(len, PAGE)
            .map_err(|_| Error::InvalidArgument(format!("buffer of {len} bytes")))?;
        // SAFETY: the layout has a non-zero size (checked above).
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).ok_or(Error::Memory {
            owner: "host",
            reason: format!("allocation of {len} bytes failed"),
        })?;
        Ok(HostBuffer {
            ptr,
            len,
            backing: Backing::Heap,
        })
    }

    /// Creates `len` zeroed bytes of shared memory: a new file in `dir` (`/dev/shm`, or a tmpfs
    /// or CXL mount) with a random, unguessable name, readable and writable by its owner only.
    /// The file is removed when this buffer is dropped.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for zero length; [`Error::Memory`] when the file cannot be
    /// created, sized or mapped.
    pub fn new_shared(len: usize, dir: &Path) -> Result<Self> {
        use std::os::unix::fs::OpenOptionsExt;
        if len == 0 {
            return Err(Error::InvalidArgument("zero-length buffer".into()));
        }
        let random: String = crate::random_bytes::<16>()?
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let path = dir.join(format!("te-{random}"));
        let fail = |what: &str, e: std::io::Error| Error::Memory {
            owner: "shm",
            reason: format!("{what} {}: {e}", path.display()),
        };
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| fail("creating", e))?;
        let mapped = lock_file(&file, libc::LOCK_SH)
            .map_err(|e| fail("locking", e))
            .and_then(|()| file.set_len(len as u64).map_err(|e| fail("sizing", e)))
            .and_then(|()| map_shared(&file, len).map_err(|e| fail("mapping", e)));
        match mapped {
            Ok(ptr) => Ok(HostBuffer {
                ptr,
                len,
                backing: Backing::Shared {
                    path,
                    creator: true,
                    lock: Some(file),
                    private: Default::default(),
                },
            }),
            Err(e) => {
                let _ = std::fs::remove_file(&path);
                Err(e)
            }
        }
    }

    /// The name a shared-memory file of this process would have in `dir` if `published`
    /// (a peer's `shm_name`) is one: `dir/te-` and 32 lowercase hex digits, exactly.
    pub fn shared_name_in(dir: &Path, published: &str) -> Option<String> {
        let name = Path::new(published)
            .strip_prefix(dir)
            .ok()?
            .to_str()?
            .strip_prefix("te-")?;
        let ours = name.len() == 32 && name.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        (ours && dir.join(format!("te-{name}")).as_os_str() == published)
            .then(|| format!("te-{name}"))
    }

    /// Maps the first `len` bytes of the shared-memory file a peer on this host published as
    /// `published` (its `shm_name`). The name comes from the wire, so it is trusted for nothing:
    /// it must be te's own form in `dir` (the transport's directory), and the file opened
    /// without following links must be a regular file of this user, on `dir`'s filesystem, with
    /// one link and no access for others, as te makes them; and process `owner` (the one proven
    /// to have served the descriptor) must map that very file (device and inode), so a peer
    /// cannot name another process's memory.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming `shm_name` when the name or the file is not te's, or
    /// `owner` does not map it; [`Error::Memory`] when the file is gone (its owner exited),
    /// shorter than `len`, or cannot be mapped.
    pub fn open_shared(dir: &Path, published: &str, len: usize, owner: u32) -> Result<Self> {
        use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
        let refuse =
            |why: &str| Error::InvalidArgument(format!("shm_name {published:?}: {why}; refused"));
        if Self::shared_name_in(dir, published).is_none() {
            return Err(refuse(&format!(
                "not a te shared-memory file in {}",
                dir.display()
            )));
        }
        let path = Path::new(published);
        let fail = |what: String| Error::Memory {
            owner: "shm",
            reason: format!("{what} {}", path.display()),
        };
        if len == 0 {
            return Err(Error::InvalidArgument("zero-length mapping".into()));
        }
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NOCTTY | libc::O_NONBLOCK)
            .open(path)
            .map_err(|e| match e.raw_os_error() {
                Some(libc::ELOOP) => refuse("a symbolic link"),
                Some(libc::EISDIR) => refuse("not a regular file"),
                _ => fail(format!("opening ({e})")),
            })?;
        let meta = file
            .metadata()
            .map_err(|e| fail(format!("reading the size of ({e})")))?;
        let dir_dev = std::fs::metadata(dir)
            .map_err(|e| fail(format!("reading {} ({e}) for", dir.display())))?
            .dev();
        if let Some(why) = foreign_file(&meta, dir_dev) {
            return Err(refuse(why));
        }
        let id = crate::holder::FileId::of(&file)
            .map_err(|e| fail(format!("reading the identity of ({e})")))?;
        if !crate::holder::maps_file(owner, id).unwrap_or(false) {
            return Err(refuse(&format!(
                "process {owner}, which served the descriptor, does not map it"
            )));
        }
        let size = meta.len();
        if size < len as u64 {
            return Err(fail(format!("{size} bytes, {len} expected, in")));
        }
        let ptr = map_shared(&file, len).map_err(|e| fail(format!("mapping ({e})")))?;
        Ok(HostBuffer {
            ptr,
            len,
            backing: Backing::Shared {
                path: path.to_path_buf(),
                creator: false,
                lock: None,
                private: Default::default(),
            },
        })
    }

    /// A buffer over `len` bytes at `ptr` that `owner` maps and keeps alive (te-cxl's device
    /// memory). Dropping the buffer releases `owner`, nothing else.
    ///
    /// # Safety
    /// `[ptr, ptr+len)` must stay mapped, readable and writable while `owner` lives, and no
    /// one else may hand out references to those bytes.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a null pointer or zero length.
    pub unsafe fn from_parts(
        ptr: *mut u8,
        len: usize,
        owner: std::sync::Arc<dyn std::any::Any + Send + Sync>,
    ) -> Result<Self> {
        let ptr = NonNull::new(ptr).ok_or(Error::InvalidArgument("null buffer".into()))?;
        if len == 0 {
            return Err(Error::InvalidArgument("zero-length buffer".into()));
        }
        Ok(HostBuffer {
            ptr,
            len,
            backing: Backing::Borrowed { owner },
        })
    }

    /// The shared-memory file behind this buffer, if it is shared.
    pub fn shared_path(&self) -> Option<&Path> {
        match &self.backing {
            Backing::Shared { path, .. } => Some(path),
            Backing::Heap | Backing::Borrowed { .. } => None,
        }
    }

    /// Ends sharing: the bytes move, at the same address, into memory private to this process,
    /// and the file is removed. A process that mapped the file keeps its own mapping, which no
    /// longer reaches this buffer. Heap buffers, a peer's mapping (from
    /// [`open_shared`](Self::open_shared)), views and a second call do nothing.
    /// Bytes written into the buffer during the call (by this process or a peer) may be lost.
    ///
    /// # Errors
    /// [`Error::Memory`] when the private memory cannot be mapped (the buffer stays shared).
    pub fn unshare(&self) -> Result<()> {
        use std::sync::atomic::Ordering;
        let Backing::Shared {
            path,
            private,
            creator: true,
            ..
        } = &self.backing
        else {
            return Ok(());
        };
        if private.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        let fail = |what: &str| Error::Memory {
            owner: "shm",
            reason: format!(
                "{what} {}: {}",
                path.display(),
                std::io::Error::last_os_error()
            ),
        };
        // SAFETY: a fresh private anonymous mapping; the kernel picks the address.
        let copy = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                self.len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if copy == libc::MAP_FAILED {
            private.store(false, Ordering::Release);
            return Err(fail("unsharing"));
        }
        // SAFETY: `copy` is a new mapping of `len` bytes and `ptr` this buffer's mapping of
        // `len` bytes; they do not overlap. `mremap` with MREMAP_FIXED then atomically puts
        // `copy` where the shared mapping was (the range stays mapped throughout, same length
        // and protection, so no reader of this buffer sees a hole), consuming `copy`.
        let moved = unsafe {
            std::ptr::copy_nonoverlapping(self.ptr.as_ptr(), copy as *mut u8, self.len);
            libc::mremap(
                copy,
                self.len,
                self.len,
                libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
                self.ptr.as_ptr() as *mut libc::c_void,
            )
        };
        if moved == libc::MAP_FAILED {
            let e = fail("unsharing");
            // SAFETY: `copy` is still the mapping made above, unmapped once.
            unsafe { libc::munmap(copy, self.len) };
            private.store(false, Ordering::Release);
            return Err(e);
        }
        let _ = std::fs::remove_file(path);
        Ok(())
    }

    /// Copies `len` bytes at `src_offset` of `src` into this buffer at `offset` (one memcpy;
    /// the benchmarks' reference for same-host copies).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if either range leaves its buffer.
    pub fn copy_from(
        &self,
        offset: usize,
        src: &HostBuffer,
        src_offset: usize,
        len: usize,
    ) -> Result<()> {
        src.check(src_offset, len)?;
        // SAFETY: the source range is inside `src` (checked here) and the destination range is
        // checked by `copy_in_raw`; `src` is borrowed for the whole call.
        unsafe { self.copy_in_raw(offset, src.addr() + src_offset as u64, len) }
    }

    /// Copies `len` bytes from raw memory at `src` into the buffer at `offset`.
    ///
    /// # Safety
    /// `[src, src+len)` must be readable memory of this process that stays valid for the call
    /// (registered and pinned, for a transport).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if the range leaves the buffer.
    pub unsafe fn copy_in_raw(&self, offset: usize, src: u64, len: usize) -> Result<()> {
        self.check(offset, len)?;
        // SAFETY: the destination range is inside the mapping (checked); the caller vouches for
        // the source; raw copies form no references.
        unsafe { std::ptr::copy(src as *const u8, self.ptr.as_ptr().add(offset), len) };
        Ok(())
    }

    /// Copies `len` bytes at `offset` out to raw memory at `dst`.
    ///
    /// # Safety
    /// `[dst, dst+len)` must be writable memory of this process that stays valid for the call.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if the range leaves the buffer.
    pub unsafe fn copy_out_raw(&self, offset: usize, dst: u64, len: usize) -> Result<()> {
        self.check(offset, len)?;
        // SAFETY: as `copy_in_raw`, in the other direction.
        unsafe { std::ptr::copy(self.ptr.as_ptr().add(offset), dst as *mut u8, len) };
        Ok(())
    }

    /// The first byte's address, as used in transfer requests.
    pub fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// The whole buffer as a range for the kernel or a copy to move bytes through.
    pub fn range(&self) -> crate::PinnedRange<'_> {
        // SAFETY: the allocation lives while `self` is borrowed, and no method hands out
        // references to its bytes.
        unsafe { crate::PinnedRange::new(self.addr(), self.len) }
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

/// Maps `len` bytes of `file` shared, readable and writable.
/// Takes a `flock` (`LOCK_SH` or `LOCK_EX`) without waiting.
fn lock_file(file: &std::fs::File, kind: i32) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: flock on a descriptor this function borrows; no memory is involved.
    match unsafe { libc::flock(file.as_raw_fd(), kind | libc::LOCK_NB) } {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

impl HostBuffer {
    /// Removes shared-memory files in `dir` that a crashed process left behind: te's names
    /// (`te-` and 32 hex digits), owned by this user, older than `min_age`, and with no live
    /// creator (a creator holds a shared lock on its file until it drops the buffer). Peers
    /// that still map such a file keep their mapping. Returns how many were removed.
    pub fn reap_orphans(dir: &Path, min_age: std::time::Duration) -> usize {
        use std::os::unix::fs::MetadataExt;
        let Ok(entries) = std::fs::read_dir(dir) else {
            return 0;
        };
        // SAFETY: geteuid has no preconditions.
        let uid = unsafe { libc::geteuid() };
        let mut removed = 0;
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(hex) = name.to_str().and_then(|n| n.strip_prefix("te-")) else {
                continue;
            };
            if hex.len() != 32 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                continue;
            }
            let path = entry.path();
            let Ok(meta) = std::fs::symlink_metadata(&path) else {
                continue;
            };
            let old = meta
                .modified()
                .ok()
                .and_then(|m| m.elapsed().ok())
                .is_some_and(|age| age >= min_age);
            if !meta.is_file() || meta.uid() != uid || !old {
                continue;
            }
            let orphan = std::fs::OpenOptions::new()
                .read(true)
                .open(&path)
                .and_then(|f| lock_file(&f, libc::LOCK_EX))
                .is_ok();
            if orphan && std::fs::remove_file(&path).is_ok() {
                tracing::info!(path = %path.display(), "removed a shared-memory file a dead process left");
                removed += 1;
            }
        }
        removed
    }
}

fn map_shared(file: &std::fs::File, len: usize) -> std::io::Result<NonNull<u8>> {
    use std::os::fd::AsRawFd;
    // SAFETY: a fresh shared mapping of an open file descriptor; the kernel picks the address;
    // the mapping outlives the descriptor, which may be closed afterwards.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    NonNull::new(p as *mut u8).ok_or_else(|| std::io::Error::other("null mapping"))
}

impl Drop for HostBuffer {
    fn drop(&mut self) {
        match &self.backing {
            Backing::Heap => {
                // SAFETY: `ptr` came from `alloc_zeroed` with exactly this layout (validated in `new`).
                unsafe {
                    alloc::dealloc(
                        self.ptr.as_ptr(),
                        Layout::from_size_align_unchecked(self.len, PAGE),
                    )
                }
            }
            Backing::Shared { path, creator, .. } => {
                // SAFETY: `ptr`/`len` are exactly the mapping made by `map_shared`, unmapped once.
                unsafe { libc::munmap(self.ptr.as_ptr() as *mut libc::c_void, self.len) };
                if *creator {
                    let _ = std::fs::remove_file(path);
                }
            }
            Backing::Borrowed { .. } => {}
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

    #[test]
    fn shared_buffers_are_owner_only_visible_to_a_second_mapping_and_removed_on_drop() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir();
        let a = HostBuffer::new_shared(8192, &dir).unwrap();
        let path = a.shared_path().unwrap().to_path_buf();
        let published = path.to_str().unwrap().to_string();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "created owner-only");
        let mut other = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        match HostBuffer::open_shared(&dir, &published, 8192, other.id()) {
            Err(Error::InvalidArgument(m)) => assert!(m.contains("does not map it"), "{m}"),
            other => panic!(
                "a process that does not map the file: {:?}",
                other.map(|_| ())
            ),
        }
        other.kill().unwrap();
        other.wait().unwrap();
        let b = HostBuffer::open_shared(&dir, &published, 8192, std::process::id()).unwrap();
        a.write_at(100, b"shared").unwrap();
        assert_eq!(b.to_vec(100, 6).unwrap(), b"shared");
        assert!(
            HostBuffer::open_shared(&dir, &published, 8193, std::process::id()).is_err(),
            "longer than the file"
        );
        let src = [7u8; 16];
        // SAFETY: `src` is a live local array.
        unsafe { b.copy_in_raw(0, src.as_ptr() as u64, 16).unwrap() };
        assert_eq!(a.to_vec(0, 16).unwrap(), [7u8; 16]);
        // SAFETY: as above; the range check refuses before any copy.
        assert!(unsafe { b.copy_in_raw(8190, src.as_ptr() as u64, 16) }.is_err());
        drop(b);
        drop(a);
        assert!(!path.exists(), "the creator removes the file");
        assert!(
            HostBuffer::open_shared(&dir, &published, 8192, std::process::id()).is_err(),
            "owner gone"
        );
    }

    #[test]
    fn unsharing_keeps_the_bytes_and_cuts_off_every_other_mapping() {
        let dir = std::env::temp_dir();
        let a = HostBuffer::new_shared(3 * 4096, &dir).unwrap();
        let path = a.shared_path().unwrap().to_path_buf();
        let b = HostBuffer::open_shared(&dir, path.to_str().unwrap(), 3 * 4096, std::process::id())
            .unwrap();
        a.write_at(4000, &[5u8; 200]).unwrap();
        let addr = a.addr();
        b.unshare().unwrap();
        assert!(path.exists(), "a peer's mapping removes nothing");
        a.unshare().unwrap();
        assert!(!path.exists(), "the file is gone");
        assert_eq!(a.addr(), addr, "same address");
        assert_eq!(a.to_vec(4000, 200).unwrap(), [5u8; 200], "same bytes");
        b.write_at(4000, &[9u8; 200]).unwrap();
        assert_eq!(
            a.to_vec(4000, 200).unwrap(),
            [5u8; 200],
            "the peer no longer reaches it"
        );
        a.write_at(0, &[1u8; 16]).unwrap();
        assert_eq!(
            b.to_vec(0, 16).unwrap(),
            [0u8; 16],
            "nor sees what it holds"
        );
        a.unshare().unwrap();
        assert_eq!(
            a.to_vec(4000, 200).unwrap(),
            [5u8; 200],
            "a second call does nothing"
        );
        let heap = HostBuffer::new(4096).unwrap();
        heap.unshare().unwrap();
    }

    #[test]
    fn a_published_name_maps_only_a_file_te_made_in_its_directory() {
        use std::os::unix::fs::PermissionsExt;
        let base = std::env::temp_dir().join(format!("te-hb-{}", std::process::id()));
        let dir = base.join("shm");
        std::fs::create_dir_all(&dir).unwrap();
        let te_name = |n: u8| format!("te-{}", format!("{n:02x}").repeat(16));
        let refused = |published: &str| match HostBuffer::open_shared(
            &dir,
            published,
            4096,
            std::process::id(),
        ) {
            Err(Error::InvalidArgument(m)) => {
                assert!(m.contains("shm_name") && m.contains("refused"), "{m}");
                m
            }
            other => panic!("{published}: {:?}", other.map(|_| ())),
        };
        // Names that are not te's, or not in the transport's directory.
        let victim = base.join("victim");
        std::fs::write(&victim, vec![1u8; 8192]).unwrap();
        for published in [
            victim.to_str().unwrap().to_string(),
            format!("{}/../victim", dir.display()),
            format!("{}//{}", dir.display(), te_name(1)),
            format!(
                "{}/{}",
                dir.display(),
                te_name(0xab).to_uppercase().replace("TE-", "te-")
            ),
            format!("{}/te-1234", dir.display()),
            "/etc/passwd".to_string(),
            te_name(1),
        ] {
            refused(&published);
        }
        // te's form, but a link to another file, a second link, or open to other users.
        let link = dir.join(te_name(2));
        std::os::unix::fs::symlink(&victim, &link).unwrap();
        assert!(refused(link.to_str().unwrap()).contains("symbolic link"));
        let hard = dir.join(te_name(3));
        std::fs::write(dir.join("original"), vec![0u8; 8192]).unwrap();
        std::fs::set_permissions(dir.join("original"), std::fs::Permissions::from_mode(0o600))
            .unwrap();
        std::fs::hard_link(dir.join("original"), &hard).unwrap();
        assert!(refused(hard.to_str().unwrap()).contains("linked elsewhere"));
        let open = dir.join(te_name(4));
        std::fs::write(&open, vec![0u8; 8192]).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(refused(open.to_str().unwrap()).contains("other users"));
        let sub = dir.join(te_name(5));
        std::fs::create_dir(&sub).unwrap();
        assert!(refused(sub.to_str().unwrap()).contains("regular file"));
        // Nothing was written to the victim.
        assert_eq!(std::fs::read(&victim).unwrap(), vec![1u8; 8192]);
        std::fs::remove_dir_all(&base).unwrap();
    }
}
