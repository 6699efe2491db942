//! Socket I/O straight from and into registered memory: the only unsafe code of te-tcp.
//!
//! Registered memory is shared with the application and with peers, so no Rust reference to it is
//! ever formed; the kernel copies between the socket and raw addresses. Callers guarantee that
//! each range lies in a region pinned for the duration of the call.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::AsRawFd;

fn last_error() -> io::Error {
    last_error_of(io::Error::last_os_error())
}

/// A blocking socket's `WouldBlock` is its timeout expiring.
fn last_error_of(e: io::Error) -> io::Error {
    if e.kind() == io::ErrorKind::WouldBlock {
        io::Error::new(io::ErrorKind::TimedOut, "socket timed out")
    } else {
        e
    }
}

/// Runs a socket call until it is not interrupted: its byte count, or the error it set.
fn uninterrupted(mut call: impl FnMut() -> isize) -> io::Result<usize> {
    loop {
        let n = call();
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Sends every byte of `parts` (address, length pairs) on `sock`, without SIGPIPE.
///
/// # Safety
/// Each `(addr, len)` must be readable memory that stays valid for the whole call.
pub unsafe fn send_parts(sock: &impl AsRawFd, parts: &mut [(u64, usize)]) -> io::Result<()> {
    let mut first = 0;
    while first < parts.len() {
        if parts[first].1 == 0 {
            first += 1;
            continue;
        }
        // SAFETY: the caller guarantees every part readable for the call.
        let sent = unsafe { sendmsg(sock, &parts[first..], libc::MSG_NOSIGNAL) };
        let mut sent = match sent {
            Ok(n) => n,
            // The socket's send timeout.
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Err(last_error_of(e)),
            Err(e) => return Err(e),
        };
        while sent > 0 && first < parts.len() {
            let (addr, len) = &mut parts[first];
            let step = sent.min(*len);
            *addr += step as u64;
            *len -= step;
            sent -= step;
            if *len == 0 {
                first += 1;
            }
        }
    }
    Ok(())
}

/// One `sendmsg` of `parts` with `flags` (retried on EINTR): the bytes sent.
///
/// # Safety
/// Each `(addr, len)` must be readable memory that stays valid for the call.
unsafe fn sendmsg(sock: &impl AsRawFd, parts: &[(u64, usize)], flags: i32) -> io::Result<usize> {
    let mut iov: Vec<libc::iovec> = parts
        .iter()
        .filter(|p| p.1 > 0)
        .map(|&(addr, len)| libc::iovec {
            iov_base: addr as *mut libc::c_void,
            iov_len: len,
        })
        .collect();
    // SAFETY: zeroed msghdr is a valid "no name, no control" header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.as_mut_ptr();
    msg.msg_iovlen = iov.len() as _;
    // SAFETY: `iov` describes memory the caller guarantees readable; `msg` and `iov` outlive
    // the call; the kernel only reads from them.
    uninterrupted(|| unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, flags) })
}

/// Receives exactly `len` bytes from `sock` into `[addr, addr+len)`.
///
/// # Safety
/// The range must be writable memory that stays valid for the whole call and that nothing else
/// relies on while the kernel writes into it.
pub unsafe fn recv_exact(sock: &impl AsRawFd, mut addr: u64, mut len: usize) -> io::Result<()> {
    let fd = sock.as_raw_fd();
    while len > 0 {
        // SAFETY: the caller guarantees `[addr, addr+len)` is writable for the call.
        let n = unsafe { libc::recv(fd, addr as *mut libc::c_void, len, libc::MSG_WAITALL) };
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        if n < 0 {
            let e = last_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        addr += n as u64;
        len -= n as usize;
    }
    Ok(())
}

/// One receive into `[addr, addr+len)` without waiting: the bytes received (0: the peer
/// closed), or `WouldBlock` when none are waiting.
///
/// # Safety
/// The range must be writable memory that stays valid for the call and that nothing else relies
/// on while the kernel writes into it.
pub unsafe fn recv_some(sock: &impl AsRawFd, addr: u64, len: usize) -> io::Result<usize> {
    // SAFETY: the caller guarantees `[addr, addr+len)` is writable for the call.
    uninterrupted(|| unsafe {
        libc::recv(
            sock.as_raw_fd(),
            addr as *mut libc::c_void,
            len,
            libc::MSG_DONTWAIT,
        )
    })
}

/// One receive into `[addr, addr+len)` and then `buf`, without waiting: the bytes received
/// (0: the peer closed), the first `len` of them in the range; `WouldBlock` when none are
/// waiting. One call where a receive into each would take two.
///
/// # Safety
/// As [`recv_some`], for `[addr, addr+len)`.
pub unsafe fn recv_then(
    sock: &impl AsRawFd,
    (addr, len): (u64, usize),
    buf: &mut [u8],
) -> io::Result<usize> {
    let mut iov = [
        libc::iovec {
            iov_base: addr as *mut libc::c_void,
            iov_len: len,
        },
        libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        },
    ];
    // SAFETY: zeroed msghdr is a valid "no name, no control" header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.as_mut_ptr();
    msg.msg_iovlen = iov.len() as _;
    // SAFETY: the caller guarantees `[addr, addr+len)` writable for the call; `buf` is an
    // exclusively borrowed Rust slice; `msg` and `iov` outlive the call.
    uninterrupted(|| unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_DONTWAIT) })
}

/// Sets how many bytes must be waiting before the socket reads as readable (`SO_RCVLOWAT`):
/// an event loop receiving a body sleeps until the rest of it is there instead of waking for
/// every segment.
///
/// # Errors
/// `setsockopt` refused.
pub fn set_recv_lowat(sock: &impl AsRawFd, bytes: usize) -> io::Result<()> {
    let v = libc::c_int::try_from(bytes.max(1)).unwrap_or(libc::c_int::MAX);
    te_core::sys::set_socket_int(sock, libc::SOL_SOCKET, libc::SO_RCVLOWAT, v)
}

/// One send of `parts` (address, length pairs) without waiting and without SIGPIPE: the bytes
/// sent, or `WouldBlock` when the socket buffer is full.
///
/// # Safety
/// Each `(addr, len)` must be readable memory that stays valid for the call.
pub unsafe fn send_some(sock: &impl AsRawFd, parts: &[(u64, usize)]) -> io::Result<usize> {
    // SAFETY: the caller guarantees every part readable for the call.
    unsafe { sendmsg(sock, parts, libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT) }
}

/// Receives exactly `buf.len()` bytes into an ordinary buffer.
pub fn recv_buf(sock: &impl AsRawFd, buf: &mut [u8]) -> io::Result<()> {
    // SAFETY: `buf` is an exclusively borrowed, writable Rust slice for the whole call.
    unsafe { recv_exact(sock, buf.as_mut_ptr() as u64, buf.len()) }
}

/// Reads what is available into `buf` without waiting: `WouldBlock` when nothing is.
pub fn recv_now(sock: &impl AsRawFd, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: `buf` is an exclusively borrowed, writable Rust slice for the whole call.
    unsafe { recv_some(sock, buf.as_mut_ptr() as u64, buf.len()) }
}

/// Sends an ordinary buffer.
pub fn send_buf(sock: &impl AsRawFd, buf: &[u8]) -> io::Result<()> {
    // SAFETY: `buf` is a borrowed, readable Rust slice for the whole call.
    unsafe { send_parts(sock, &mut [(buf.as_ptr() as u64, buf.len())]) }
}

/// Reads and discards `len` bytes.
pub fn discard(sock: &impl AsRawFd, mut len: u64) -> io::Result<()> {
    let mut scratch = vec![0u8; 64 * 1024];
    while len > 0 {
        let step = len.min(scratch.len() as u64) as usize;
        recv_buf(sock, &mut scratch[..step])?;
        len -= step as u64;
    }
    Ok(())
}

/// Copies between a staging buffer and GPU memory (see `staging`).
pub fn gpu_copy(
    cuda: &te_core::cuda::Cuda,
    device: u32,
    dst: u64,
    src: u64,
    len: usize,
) -> te_core::Result<()> {
    // SAFETY: `staging` calls this with one range in a pinned staging buffer it holds on loan
    // and the other in a GPU region the engine pinned (initiator) or `pin_remote` pinned
    // (target) for the slice, both valid for the copy.
    unsafe { cuda.copy(device, dst, src, len) }
}

/// Polls `sock` without sleeping (a peek that does not wait) until it has bytes to read, has
/// reached its end or failed, for up to `spin`; whether it did. A thread about to block for a
/// reply that comes within microseconds spares itself the sleep and the wake-up.
pub fn spin_until_readable(sock: &impl AsRawFd, spin: std::time::Duration) -> bool {
    let end = std::time::Instant::now() + spin;
    let mut byte = 0u8;
    // The clock is read every 8 polls: each poll is a system call already.
    for polls in 0u32.. {
        // SAFETY: a one-byte local buffer, written at most once by the peek.
        let n = unsafe {
            libc::recv(
                sock.as_raw_fd(),
                (&raw mut byte).cast(),
                1,
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        if n >= 0 {
            return true;
        }
        if !matches!(
            io::Error::last_os_error().kind(),
            io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
        ) {
            // The blocking read that follows reports it.
            return true;
        }
        if polls % 8 == 7 && std::time::Instant::now() >= end {
            return false;
        }
        std::hint::spin_loop();
    }
    false
}

/// Copies `bytes` to `[addr, addr + bytes.len())`.
///
/// # Safety
/// The range must be writable memory that stays valid for the call, that nothing else relies
/// on meanwhile, and that does not overlap `bytes`.
pub unsafe fn copy_to(addr: u64, bytes: &[u8]) {
    // SAFETY: the caller guarantees the destination writable, valid and disjoint from `bytes`.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), addr as *mut u8, bytes.len()) }
}
