//! Cross-memory attach (`process_vm_writev`, `process_vm_readv`): one copy between this
//! process's memory and another process's on the same host, by the kernel, with no shared
//! mapping. The kernel allows it only where this process may ptrace the other (same user and
//! Yama's `ptrace_scope` 0, or 1 with the other process naming this one through
//! `PR_SET_PTRACER`, or `CAP_SYS_PTRACE`), and checks the other process's addresses itself: a
//! bad one is `EFAULT`, never a write elsewhere in this process.

use std::io;

use crate::PinnedRange;

/// One iovec of this process and one of `pid`'s, `write` choosing the direction: the bytes
/// moved (fewer than asked when the call was cut short).
fn move_bytes(pid: u32, local: PinnedRange<'_>, remote: u64, write: bool) -> io::Result<usize> {
    let pid = libc::pid_t::try_from(pid)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "pid out of range"))?;
    let here = libc::iovec {
        iov_base: local.addr() as *mut libc::c_void,
        iov_len: local.len(),
    };
    let there = libc::iovec {
        iov_base: remote as *mut libc::c_void,
        iov_len: local.len(),
    };
    loop {
        // SAFETY: `here` is a pinned range, valid for reads and writes for its lifetime, which
        // spans the call; `there` names the other process's memory, which the kernel checks
        // (this process's memory is not touched through it); both iovecs outlive the call.
        let n = unsafe {
            match write {
                true => libc::process_vm_writev(pid, &here, 1, &there, 1, 0),
                false => libc::process_vm_readv(pid, &here, 1, &there, 1, 0),
            }
        };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Copies all of `local` to `remote` in process `pid`.
///
/// # Errors
/// `EPERM` where this process may not attach to `pid`, `ESRCH` when it is gone, `EFAULT` for
/// an address `pid` has not mapped.
pub fn write_to_process(pid: u32, local: PinnedRange<'_>, remote: u64) -> io::Result<()> {
    move_all(pid, local, remote, true)
}

/// Fills all of `local` from `remote` in process `pid`.
///
/// # Errors
/// As [`write_to_process`].
pub fn read_from_process(pid: u32, local: PinnedRange<'_>, remote: u64) -> io::Result<()> {
    move_all(pid, local, remote, false)
}

/// [`move_bytes`] until all of `local` has moved; a call that moves nothing ends it.
fn move_all(pid: u32, mut local: PinnedRange<'_>, mut remote: u64, write: bool) -> io::Result<()> {
    while !local.is_empty() {
        match move_bytes(pid, local, remote, write)? {
            0 if write => return Err(io::ErrorKind::WriteZero.into()),
            0 => return Err(io::ErrorKind::UnexpectedEof.into()),
            n => {
                local.advance(n);
                remote += n as u64;
            }
        }
    }
    Ok(())
}

/// Yama's `ptrace_scope` (0 classic, 1 restricted to descendants and declared tracers, 2
/// administrators only, 3 none), or `None` without Yama.
pub fn ptrace_scope() -> Option<u32> {
    std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope")
        .ok()?
        .trim()
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_writes_and_reads_its_own_memory_through_the_kernel() {
        let mut there = vec![0u8; 100_000];
        let remote = there.as_mut_ptr() as u64;
        let mut source: Vec<u8> = (0..there.len()).map(|i| (i % 251) as u8).collect();
        write_to_process(std::process::id(), PinnedRange::of_mut(&mut source), remote).unwrap();
        assert!(there == source, "written");
        let mut back = vec![0u8; 4096];
        read_from_process(
            std::process::id(),
            PinnedRange::of_mut(&mut back),
            remote + 7,
        )
        .unwrap();
        assert_eq!(back[..], source[7..7 + 4096]);
        // An address the process has not mapped: refused by the kernel, nothing moved.
        let e =
            write_to_process(std::process::id(), PinnedRange::of_mut(&mut back), 8).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EFAULT), "{e}");
        // No such process.
        let e =
            read_from_process(u32::MAX >> 1, PinnedRange::of_mut(&mut back), remote).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ESRCH), "{e}");
    }
}
