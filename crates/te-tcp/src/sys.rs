//! Socket I/O straight from and into registered memory, and a pipe per thread that puts a
//! reply's head into a socket ahead of its payload ([`send_head`]): te-tcp's system calls.
//!
//! Registered memory is shared with the application and with peers, so no Rust reference to it is
//! ever formed; the kernel copies between the socket and [`PinnedRange`]s, whose lifetimes
//! keep the memory pinned for the call. Registered memory is never spliced: the socket would
//! keep referring to its pages after the call, past the pin.
#![allow(unsafe_code)]

use std::cell::RefCell;
use std::io;
use std::marker::PhantomData;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use te_sys::PinnedRange;

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

/// Bytes to send, readable for `'a`: a Rust slice, or a [`PinnedRange`] (registered memory, a
/// staging buffer).
#[derive(Clone, Copy)]
pub struct SendPart<'a> {
    addr: u64,
    len: usize,
    bytes: PhantomData<&'a [u8]>,
}

impl SendPart<'_> {
    /// Nothing to send.
    pub const EMPTY: SendPart<'static> = SendPart {
        addr: 0,
        len: 0,
        bytes: PhantomData,
    };

    /// Start address.
    #[cfg(test)]
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// Length in bytes.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there is nothing to send.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn advance(&mut self, n: usize) {
        let n = n.min(self.len);
        self.addr += n as u64;
        self.len -= n;
    }
}

impl<'a> From<&'a [u8]> for SendPart<'a> {
    fn from(bytes: &'a [u8]) -> Self {
        SendPart {
            addr: bytes.as_ptr() as u64,
            len: bytes.len(),
            bytes: PhantomData,
        }
    }
}

impl<'a> From<PinnedRange<'a>> for SendPart<'a> {
    fn from(range: PinnedRange<'a>) -> Self {
        SendPart {
            addr: range.addr(),
            len: range.len(),
            bytes: PhantomData,
        }
    }
}

/// Sends every byte of `parts` on `sock`, without SIGPIPE.
pub fn send_parts(sock: &impl AsRawFd, parts: &mut [SendPart<'_>]) -> io::Result<()> {
    let mut first = 0;
    while first < parts.len() {
        if parts[first].is_empty() {
            first += 1;
            continue;
        }
        let mut sent = match sendmsg(sock, &parts[first..], libc::MSG_NOSIGNAL) {
            Ok(n) => n,
            // The socket's send timeout.
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Err(last_error_of(e)),
            Err(e) => return Err(e),
        };
        while sent > 0 && first < parts.len() {
            let part = &mut parts[first];
            let step = sent.min(part.len);
            part.advance(step);
            sent -= step;
            if part.is_empty() {
                first += 1;
            }
        }
    }
    Ok(())
}

/// One `sendmsg` of `parts` with `flags` (retried on EINTR): the bytes sent.
fn sendmsg(sock: &impl AsRawFd, parts: &[SendPart<'_>], flags: i32) -> io::Result<usize> {
    let mut iov: Vec<libc::iovec> = parts
        .iter()
        .filter(|p| !p.is_empty())
        .map(|p| libc::iovec {
            iov_base: p.addr as *mut libc::c_void,
            iov_len: p.len,
        })
        .collect();
    // SAFETY: zeroed msghdr is a valid "no name, no control" header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.as_mut_ptr();
    msg.msg_iovlen = iov.len() as _;
    // SAFETY: `iov` describes parts readable for their lifetime, which spans the call; `msg`
    // and `iov` outlive the call; the kernel only reads from them.
    uninterrupted(|| unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, flags) })
}

/// Receives exactly `range.len()` bytes from `sock` into `range`.
pub fn recv_exact(sock: &impl AsRawFd, mut range: PinnedRange<'_>) -> io::Result<()> {
    let fd = sock.as_raw_fd();
    while !range.is_empty() {
        // SAFETY: a pinned range is writable for its lifetime, which spans the call.
        let n = unsafe {
            libc::recv(
                fd,
                range.addr() as *mut libc::c_void,
                range.len(),
                libc::MSG_WAITALL,
            )
        };
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
        range.advance(n as usize);
    }
    Ok(())
}

/// One receive into `range` without waiting: the bytes received (0: the peer closed), or
/// `WouldBlock` when none are waiting.
pub fn recv_some(sock: &impl AsRawFd, range: PinnedRange<'_>) -> io::Result<usize> {
    // SAFETY: a pinned range is writable for its lifetime, which spans the call.
    uninterrupted(|| unsafe {
        libc::recv(
            sock.as_raw_fd(),
            range.addr() as *mut libc::c_void,
            range.len(),
            libc::MSG_DONTWAIT,
        )
    })
}

/// One receive into `range` and then `buf`, without waiting: the bytes received (0: the peer
/// closed), the first `range.len()` of them in the range; `WouldBlock` when none are waiting.
/// One call where a receive into each would take two.
pub fn recv_then(sock: &impl AsRawFd, range: PinnedRange<'_>, buf: &mut [u8]) -> io::Result<usize> {
    let mut iov = [
        libc::iovec {
            iov_base: range.addr() as *mut libc::c_void,
            iov_len: range.len(),
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
    // SAFETY: a pinned range is writable for its lifetime, which spans the call; `buf` is an
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
    te_sys::set_socket_int(sock, libc::SOL_SOCKET, libc::SO_RCVLOWAT, v)
}

/// Sends the acknowledgement the kernel is holding back for `sock`, now, and takes the socket
/// out of the kernel's interactive ("pingpong") mode (`TCP_QUICKACK`). A connection that
/// answers every request looks interactive to the kernel, which then delays the ACKs of a
/// request's body until the answer can carry them; a sender bounded by its congestion window
/// (bbr on loopback is) then waits for this end's every read before sending more. The mode
/// comes back with the next answer sent, so a receiver pushes after each read of a body.
///
/// # Errors
/// `setsockopt` refused (not a TCP socket).
pub fn push_ack(sock: &impl AsRawFd) -> io::Result<()> {
    te_sys::set_socket_int(sock, libc::IPPROTO_TCP, libc::TCP_QUICKACK, 1)
}

/// One send of `parts` without waiting and without SIGPIPE: the bytes sent, or `WouldBlock`
/// when the socket buffer is full.
pub fn send_some(sock: &impl AsRawFd, parts: &[SendPart<'_>]) -> io::Result<usize> {
    sendmsg(sock, parts, libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT)
}

/// A pipe of one thread's own that carries a reply's head (a few bytes ahead of a payload) into
/// a socket, so that the head takes no room in the page the kernel copies this thread's sent
/// bytes into. That page is shared by all of a thread's sockets and filled byte after byte, so
/// an 8-byte head sent with a payload puts the payload 8 bytes off the alignment of the memory
/// it is copied from; the kernel's copy (and the peer's, out of the same page) then runs
/// several times slower per byte than between ranges aligned alike. Written into the pipe, the
/// head sits in a page of the pipe's own, which the socket takes by reference, and every
/// payload lands as aligned as its source (`docs/tuning.md`).
///
/// Only the head goes this way: its bytes are the caller's own, copied into the pipe, so
/// nothing of registered memory is ever referenced past the call.
struct HeadPipe {
    read: OwnedFd,
    write: OwnedFd,
}

thread_local! {
    /// This thread's pipe: made at first use, `None` when it could not be (or broke).
    static HEAD_PIPE: RefCell<Option<HeadPipe>> = RefCell::new(HeadPipe::open());
}

impl HeadPipe {
    /// A non-blocking pipe; `None` (heads go the ordinary way) when none can be had.
    ///
    /// It also blocks SIGPIPE for the calling thread, an event loop of te's own: a splice
    /// into a socket whose peer has gone raises it (a send can say `MSG_NOSIGNAL`, a splice
    /// cannot), and the loop learns of the peer from the call's `EPIPE` as it does for sends.
    fn open() -> Option<HeadPipe> {
        let mut fds = [0 as libc::c_int; 2];
        // SAFETY: `fds` is a two-element array the call fills.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) } != 0 {
            tracing::debug!(error = %io::Error::last_os_error(), "no pipe for reply heads");
            return None;
        }
        // SAFETY: `pipe2` returned two fresh descriptors that nothing else owns.
        let pipe = unsafe {
            HeadPipe {
                read: OwnedFd::from_raw_fd(fds[0]),
                write: OwnedFd::from_raw_fd(fds[1]),
            }
        };
        // SAFETY: `set` is a local signal set, initialised by `sigemptyset` before use; the
        // mask changed is the calling thread's only.
        let blocked = unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGPIPE);
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) == 0
        };
        blocked.then_some(pipe)
    }

    /// Moves `head` into `sock` through the pipe: what the socket took (or why it failed),
    /// and whether the pipe is empty and usable again.
    fn send(&self, sock: &impl AsRawFd, head: &[u8]) -> (io::Result<usize>, bool) {
        // SAFETY: `head` is a borrowed Rust slice, readable for the call.
        let put = uninterrupted(|| unsafe {
            libc::write(self.write.as_raw_fd(), head.as_ptr().cast(), head.len())
        });
        let Ok(put) = put else {
            return (Ok(0), false);
        };
        // SAFETY: both descriptors are open for the call; no offsets (a pipe and a socket).
        let moved = uninterrupted(|| unsafe {
            libc::splice(
                self.read.as_raw_fd(),
                std::ptr::null_mut(),
                sock.as_raw_fd(),
                std::ptr::null_mut(),
                put,
                libc::SPLICE_F_NONBLOCK | libc::SPLICE_F_MORE,
            )
        });
        let sent = moved.as_ref().map_or(0, |n| *n);
        let healthy = self.drain(put - sent);
        (moved, healthy)
    }

    /// Reads back the `left` bytes the socket did not take; whether that emptied the pipe.
    fn drain(&self, mut left: usize) -> bool {
        let mut scratch = [0u8; 64];
        while left > 0 {
            let step = left.min(scratch.len());
            // SAFETY: `scratch` is a local array, writable for the call.
            let got = uninterrupted(|| unsafe {
                libc::read(self.read.as_raw_fd(), scratch.as_mut_ptr().cast(), step)
            });
            match got {
                Ok(n) if n > 0 => left -= n,
                _ => return false,
            }
        }
        true
    }
}

/// Sends `head`, the first bytes of a reply whose payload the caller sends next, through this
/// thread's [`HeadPipe`], without waiting: the bytes the socket took. `Ok(0)` when the socket
/// is full or the thread has no pipe; the caller then sends the rest of the head the ordinary
/// way.
///
/// # Errors
/// The socket failed (its peer gone, say).
pub fn send_head(sock: &impl AsRawFd, head: &[u8]) -> io::Result<usize> {
    HEAD_PIPE.with(|cell| {
        let mut pipe = cell.borrow_mut();
        let Some(p) = pipe.as_ref() else {
            return Ok(0);
        };
        let (moved, healthy) = p.send(sock, head);
        if !healthy {
            tracing::debug!("reply-head pipe broke; heads go the ordinary way");
            *pipe = None;
        }
        match moved {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(0),
            other => other,
        }
    })
}

/// Receives exactly `buf.len()` bytes into an ordinary buffer.
pub fn recv_buf(sock: &impl AsRawFd, buf: &mut [u8]) -> io::Result<()> {
    recv_exact(sock, PinnedRange::of_mut(buf))
}

/// Reads what is available into `buf` without waiting: `WouldBlock` when nothing is.
pub fn recv_now(sock: &impl AsRawFd, buf: &mut [u8]) -> io::Result<usize> {
    recv_some(sock, PinnedRange::of_mut(buf))
}

/// Sends an ordinary buffer, without SIGPIPE.
pub fn send_buf(sock: &impl AsRawFd, buf: &[u8]) -> io::Result<()> {
    send_parts(sock, &mut [buf.into()])
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
#[cfg(feature = "cuda")]
pub fn gpu_copy(
    cuda: &te_cuda::Cuda,
    device: u32,
    dst: u64,
    src: u64,
    len: usize,
) -> te_cuda::Result<()> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::unix::net::UnixStream;

    /// Fills `sock` (non-blocking) until it takes no more: the bytes it took.
    fn fill(sock: &UnixStream) -> usize {
        let block = [7u8; 4096];
        let mut total = 0;
        loop {
            match send_some(sock, &[block[..].into()]) {
                Ok(n) => total += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return total,
                Err(e) => panic!("filling: {e}"),
            }
        }
    }

    #[test]
    fn parts_go_out_whole_and_land_in_a_range() {
        let (tx, rx) = UnixStream::pair().unwrap();
        let source = te_sys::HostBuffer::new(1 << 20).unwrap();
        let pattern: Vec<u8> = (0..source.len()).map(|i| (i % 253) as u8).collect();
        source.range().put(&pattern);
        let sink = te_sys::HostBuffer::new(8 + source.len()).unwrap();
        std::thread::scope(|s| {
            // More than the socket buffer holds: the sends are cut, the parts advanced.
            let sender =
                s.spawn(|| send_parts(&tx, &mut [b"HEAD0003"[..].into(), source.range().into()]));
            let (head, body) = (sink.range().head(8), sink.range().part(8, source.len()));
            recv_exact(&rx, head).unwrap();
            recv_exact(&rx, body.unwrap()).unwrap();
            sender.join().unwrap().unwrap();
        });
        let mut got = vec![0u8; sink.len()];
        sink.range().get(&mut got);
        assert_eq!(&got[..8], b"HEAD0003");
        assert!(got[8..] == pattern[..], "the body arrived changed");
        drop(tx);
        // The peer gone: the rest of a range can never come.
        let e = recv_exact(&rx, sink.range().head(1)).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
    }

    #[test]
    fn a_head_through_the_pipe_arrives_whole_before_its_payload() {
        let (tx, mut rx) = UnixStream::pair().unwrap();
        tx.set_nonblocking(true).unwrap();
        let payload: Vec<u8> = (0..65536u32).map(|i| (i % 251) as u8).collect();
        assert_eq!(send_head(&tx, b"HEAD0001").unwrap(), 8);
        tx.set_nonblocking(false).unwrap();
        let sent = std::thread::scope(|s| {
            let reader = s.spawn(|| {
                let mut got = vec![0u8; 8 + payload.len()];
                rx.read_exact(&mut got).unwrap();
                got
            });
            send_buf(&tx, &payload).unwrap();
            reader.join().unwrap()
        });
        assert_eq!(&sent[..8], b"HEAD0001");
        assert_eq!(&sent[8..], payload.as_slice());
    }

    #[test]
    fn a_full_socket_takes_no_head_and_the_pipe_is_left_empty() {
        let (tx, mut rx) = UnixStream::pair().unwrap();
        tx.set_nonblocking(true).unwrap();
        let filled = fill(&tx);
        assert!(filled > 0);
        // The socket takes nothing: the caller is told so and sends the head itself later.
        assert_eq!(send_head(&tx, b"STALE!!!").unwrap(), 0);
        let mut got = vec![0u8; filled];
        rx.read_exact(&mut got).unwrap();
        assert!(got.iter().all(|&b| b == 7));
        // Nothing of the refused head was left in the pipe to come out ahead of the next one.
        assert_eq!(send_head(&tx, b"FRESH!!!").unwrap(), 8);
        tx.shutdown(std::net::Shutdown::Write).unwrap();
        let mut rest = Vec::new();
        rx.read_to_end(&mut rest).unwrap();
        assert_eq!(rest, b"FRESH!!!");
    }

    #[test]
    fn a_gone_peer_fails_the_head_without_a_signal() {
        let (tx, rx) = UnixStream::pair().unwrap();
        tx.set_nonblocking(true).unwrap();
        drop(rx);
        let e = send_head(&tx, b"HEAD0002").unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EPIPE), "{e}");
        // SIGPIPE is blocked on the thread that has a pipe, so even a process that has not
        // ignored it survives a peer gone mid-splice.
        // SAFETY: `set` is a local signal set the call fills with this thread's mask.
        let blocked = unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), &mut set);
            libc::sigismember(&set, libc::SIGPIPE)
        };
        assert_eq!(blocked, 1);
        // The thread's pipe is left empty and serves the next socket.
        let (tx2, mut rx2) = UnixStream::pair().unwrap();
        tx2.set_nonblocking(true).unwrap();
        assert_eq!(send_head(&tx2, b"HEAD0003").unwrap(), 8);
        let mut got = [0u8; 8];
        rx2.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"HEAD0003");
    }

    /// Whether the kernel acknowledges `sock`'s data at once (`TCP_QUICKACK` read back: 0 while
    /// the socket is in interactive mode, whose ACKs wait for an answer to carry them).
    fn acks_at_once(sock: &std::net::TcpStream) -> bool {
        te_sys::socket_int(sock, libc::IPPROTO_TCP, libc::TCP_QUICKACK).unwrap() != 0
    }

    #[test]
    fn an_answering_receiver_delays_its_acks_until_it_pushes_them() {
        use std::io::Write;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (mut server, _) = listener.accept().unwrap();
        assert!(
            acks_at_once(&server),
            "a fresh connection acknowledges at once"
        );
        // Requests answered at once, as a target answers Mooncake's: the kernel takes the
        // connection for an interactive one (within a few exchanges, however slow the host).
        let mut request = [0u8; 1000];
        let mut answer = [0u8; 8];
        let mut exchanges = 0;
        while acks_at_once(&server) && exchanges < 200 {
            client.write_all(&request).unwrap();
            server.read_exact(&mut request).unwrap();
            server.write_all(&answer).unwrap();
            client.read_exact(&mut answer).unwrap();
            exchanges += 1;
        }
        assert!(
            !acks_at_once(&server),
            "no interactive mode after {exchanges} exchanges"
        );
        push_ack(&server).unwrap();
        assert!(
            acks_at_once(&server),
            "pushed, the socket acknowledges at once again"
        );
        // Not a TCP socket: a clear error.
        let (unix, _) = UnixStream::pair().unwrap();
        assert!(push_ack(&unix).is_err());
    }
}
