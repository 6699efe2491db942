//! te's boundary with the operating system, each function a thin wrapper over one libc call:
//! the NUMA node of a page (`move_pages` in query mode), the host page size (`sysconf`) and
//! the IPv4/IPv6 addresses of the network interfaces (`getifaddrs`), the open-file limit
//! (`getrlimit`/`setrlimit`), a listening socket's accept backlog (`listen` again), a TCP
//! connection's congestion control (`TCP_CONGESTION`), a coarse
//! monotonic clock (`CLOCK_MONOTONIC_COARSE`), and this process's id kept between calls
//! (`getpid`, forgotten in a forked child through `pthread_atfork`). Nothing here decides
//! anything; callers choose.

#![allow(unsafe_code)] // the boundary crate: every system call of te behind safe functions

pub mod cross_memory;
pub mod env;
mod error;
pub mod hashing;
pub mod holder;
mod host_buffer;
mod pinned;
pub mod signals;
pub mod small_list;

pub use error::{Error, Result};
pub use host_buffer::HostBuffer;
pub use pinned::PinnedRange;

use std::ffi::CStr;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};

/// This process's id as last read, 0 when it must be read again (never read, or forgotten in
/// a forked child).
static PROCESS_ID: AtomicU32 = AtomicU32::new(0);
/// Whether a forked child forgets [`PROCESS_ID`] (the fork handler is registered).
static FORK_HANDLER: OnceLock<bool> = OnceLock::new();

extern "C" fn forget_process_id() {
    // Runs in the child right after `fork`, before it returns: an atomic store only.
    PROCESS_ID.store(0, Ordering::Relaxed);
}

/// This process's id, without a system call after the first (glibc no longer caches it, and a
/// `getpid` costs a few hundred nanoseconds in a VM). A child made by `fork` reads it afresh:
/// a handler registered with `pthread_atfork` forgets the parent's. A child made without
/// running fork handlers (a raw `clone` system call) would see the parent's id; where the
/// handler cannot be registered, every call reads the id.
pub fn process_id() -> u32 {
    let hooked = *FORK_HANDLER.get_or_init(|| {
        // SAFETY: registers a child handler that makes one atomic store (async-signal-safe);
        // no memory is passed.
        unsafe { libc::pthread_atfork(None, None, Some(forget_process_id)) == 0 }
    });
    if !hooked {
        return std::process::id();
    }
    match PROCESS_ID.load(Ordering::Relaxed) {
        0 => {
            let id = std::process::id();
            PROCESS_ID.store(id, Ordering::Relaxed);
            id
        }
        id => id,
    }
}

/// The host page size in bytes (4096 where the system does not say).
pub fn page_size() -> u64 {
    // SAFETY: sysconf reads a constant of the system; no memory is passed.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(size).ok().filter(|&s| s > 0).unwrap_or(4096)
}

/// Nanoseconds on the coarse monotonic clock: it moves in ticks (a few milliseconds) and costs
/// a memory read where the precise clock reads the time-stamp counter (slow in a VM). For ages
/// measured in tens of milliseconds, read on every post.
pub fn coarse_monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the call; the clock id is a constant.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    match rc {
        0 => (ts.tv_sec as u64)
            .saturating_mul(1_000_000_000)
            .saturating_add(ts.tv_nsec as u64),
        _ => 0,
    }
}

/// The NUMA node holding the page at `addr`, or `None` when the kernel cannot say
/// (page not yet touched, no NUMA support).
pub fn numa_node_of(addr: u64) -> Option<u32> {
    let mut pages = [(addr & !4095) as *mut libc::c_void];
    let mut status = [-1i32];
    // SAFETY: `move_pages` with a null `nodes` array only queries; `pages` and `status` are
    // valid arrays of length 1 that live across the call, and pid 0 means this process.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_move_pages,
            0,
            1usize,
            pages.as_mut_ptr(),
            std::ptr::null::<i32>(),
            status.as_mut_ptr(),
            0,
        )
    };
    (rc == 0 && status[0] >= 0).then_some(status[0] as u32)
}

/// One interface address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InterfaceAddr {
    /// Interface name (`eth0`).
    pub name: String,
    /// Its address.
    pub ip: IpAddr,
    /// `IFF_UP` is set.
    pub up: bool,
    /// `IFF_UP` and `IFF_RUNNING` are set.
    pub running: bool,
    /// `IFF_LOOPBACK` is set.
    pub loopback: bool,
}

/// Every interface address the kernel reports.
pub fn interface_addrs() -> Vec<InterfaceAddr> {
    let mut out = Vec::new();
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: `getifaddrs` fills `head` with a list we free below with `freeifaddrs`.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return out;
    }
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list returned by `getifaddrs`, valid until freed.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: `ifa_name` is a NUL-terminated string owned by the list.
        let name = unsafe { CStr::from_ptr(ifa.ifa_name) }
            .to_string_lossy()
            .into_owned();
        // SAFETY: `ifa_addr` is non-null and points to a sockaddr whose family says its real type.
        let family = i32::from(unsafe { (*ifa.ifa_addr).sa_family });
        let ip = match family {
            libc::AF_INET => {
                // SAFETY: the family is AF_INET, so the sockaddr is a sockaddr_in.
                let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
                IpAddr::V4(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)))
            }
            libc::AF_INET6 => {
                // SAFETY: the family is AF_INET6, so the sockaddr is a sockaddr_in6.
                let sin6 = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in6) };
                IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr))
            }
            _ => continue,
        };
        let flags = ifa.ifa_flags as i32;
        out.push(InterfaceAddr {
            name,
            ip,
            up: flags & libc::IFF_UP != 0,
            running: flags & libc::IFF_UP != 0 && flags & libc::IFF_RUNNING != 0,
            loopback: flags & libc::IFF_LOOPBACK != 0,
        });
    }
    // SAFETY: `head` came from a successful `getifaddrs` and is freed once.
    unsafe { libc::freeifaddrs(head) };
    out
}

/// This process's open-file limits: (soft, hard).
///
/// # Errors
/// `getrlimit` failed.
pub fn nofile_limit() -> std::io::Result<(u64, u64)> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid, writable rlimit for the call.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((lim.rlim_cur, lim.rlim_max))
}

/// Sets this process's soft open-file limit (at most the hard limit).
///
/// # Errors
/// `setrlimit` refused.
pub fn set_nofile_soft(soft: u64) -> std::io::Result<()> {
    let (_, hard) = nofile_limit()?;
    let lim = libc::rlimit {
        rlim_cur: soft.min(hard),
        rlim_max: hard,
    };
    // SAFETY: `lim` is a valid rlimit, read by the call.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Binds `ip` on the first free port of `ports`, starting from a per-process offset so that
/// processes started together spread over the range.
///
/// # Errors
/// The last bind error when every port is taken.
pub fn bind_in_range(
    ip: std::net::IpAddr,
    ports: std::ops::RangeInclusive<u16>,
) -> std::io::Result<std::net::TcpListener> {
    let (lo, hi) = (*ports.start(), *ports.end());
    let span = u32::from(hi - lo) + 1;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let start = (std::process::id().wrapping_mul(7919) ^ nanos) % span;
    let mut last = std::io::Error::new(std::io::ErrorKind::AddrInUse, "empty port range");
    for i in 0..span {
        let port = lo + ((start + i) % span) as u16;
        match std::net::TcpListener::bind((ip, port)) {
            Ok(l) => return Ok(l),
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// Sets the accept backlog of `listener`, which is already listening: Linux takes a second
/// `listen` on a listening socket as a new backlog, and caps it at `net.core.somaxconn`.
/// (The standard library listens with 128, which a thousand peers connecting at once overflow:
/// their SYNs are dropped and retried after one second, then three.)
///
/// # Errors
/// `listen` refused.
pub fn set_listen_backlog(listener: &std::net::TcpListener, backlog: usize) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let backlog = libc::c_int::try_from(backlog).unwrap_or(libc::c_int::MAX);
    // SAFETY: the descriptor is `listener`'s, open for the duration of the borrow.
    if unsafe { libc::listen(listener.as_raw_fd(), backlog) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Sets the congestion-control algorithm of the TCP connection `sock` (`TCP_CONGESTION`).
///
/// # Errors
/// `setsockopt` refused: the algorithm is not available (`ENOENT`), or not allowed to an
/// unprivileged process (`EPERM`).
pub fn set_tcp_congestion(sock: &impl std::os::fd::AsRawFd, name: &str) -> std::io::Result<()> {
    let len = libc::socklen_t::try_from(name.len()).unwrap_or(libc::socklen_t::MAX);
    // SAFETY: the kernel reads `len` bytes of `name`, a live string; the descriptor is the
    // borrowed socket's.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_CONGESTION,
            name.as_ptr().cast(),
            len,
        )
    };
    match rc {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

/// Sets the integer socket option `name` of `level` on `sock` to `value` (`setsockopt`).
///
/// # Errors
/// `setsockopt` refused.
pub fn set_socket_int(
    sock: &impl std::os::fd::AsRawFd,
    level: libc::c_int,
    name: libc::c_int,
    value: libc::c_int,
) -> std::io::Result<()> {
    // SAFETY: the kernel reads the live `c_int` `value` for its size; the descriptor is the
    // borrowed socket's.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            level,
            name,
            (&raw const value).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    match rc {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

/// The integer socket option `name` of `level` on `sock` (`getsockopt`).
///
/// # Errors
/// `getsockopt` refused.
pub fn socket_int(
    sock: &impl std::os::fd::AsRawFd,
    level: libc::c_int,
    name: libc::c_int,
) -> std::io::Result<libc::c_int> {
    let mut v: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: the kernel writes at most `len` bytes into the live `c_int` `v` and its length
    // into `len`; the descriptor is the borrowed socket's.
    let rc = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            level,
            name,
            (&raw mut v).cast(),
            &raw mut len,
        )
    };
    match rc {
        0 => Ok(v),
        _ => Err(std::io::Error::last_os_error()),
    }
}

/// The congestion-control algorithm of the TCP connection `sock`.
///
/// # Errors
/// `getsockopt` refused (not a TCP socket).
pub fn tcp_congestion(sock: &impl std::os::fd::AsRawFd) -> std::io::Result<String> {
    let mut name = [0u8; 16];
    let mut len = name.len() as libc::socklen_t;
    // SAFETY: the kernel writes at most `len` bytes into `name` and the length into `len`,
    // both live for the call; the descriptor is the borrowed socket's.
    let rc = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_CONGESTION,
            name.as_mut_ptr().cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let got = &name[..(len as usize).min(name.len())];
    let end = got.iter().position(|b| *b == 0).unwrap_or(got.len());
    Ok(String::from_utf8_lossy(&got[..end]).into_owned())
}

/// `N` random bytes from the kernel (`/dev/urandom`), for names and secrets nobody may guess.
///
/// # Errors
/// [`Error::Memory`] naming `/dev/urandom` when it cannot be read.
pub fn random_bytes<const N: usize>() -> Result<[u8; N]> {
    use std::io::Read;
    let mut bytes = [0u8; N];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(|e| Error::Memory {
            owner: "random",
            reason: format!("reading /dev/urandom: {e}"),
        })?;
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wider_backlog_holds_connections_nobody_has_accepted_yet() {
        // The standard library's backlog of 128 would leave connection 130 without an answer
        // to its SYN for as long as nobody accepts, so its connect would time out.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        set_listen_backlog(&listener, 1024).unwrap();
        let addr = listener.local_addr().unwrap();
        let held: Vec<std::net::TcpStream> = (0..300)
            .map(|i| {
                std::net::TcpStream::connect_timeout(&addr, std::time::Duration::from_secs(20))
                    .unwrap_or_else(|e| panic!("connection {i} not taken into the backlog: {e}"))
            })
            .collect();
        assert_eq!(held.len(), 300);
        listener.set_nonblocking(true).unwrap();
        let accepted = std::iter::from_fn(|| listener.accept().ok()).count();
        assert_eq!(
            accepted, 300,
            "every held connection is accepted afterwards"
        );
    }

    #[test]
    fn the_process_id_is_kept_and_a_forked_child_reads_its_own() {
        let parent = process_id();
        assert_eq!(parent, std::process::id());
        assert_eq!(process_id(), parent);
        // SAFETY: the child calls only `process_id` (atomics and `getpid`) and `_exit`, both
        // safe after `fork` in a threaded process.
        let child = unsafe { libc::fork() };
        assert!(child >= 0, "fork failed");
        if child == 0 {
            let own = process_id();
            let ok = own != parent && own == std::process::id();
            // SAFETY: leaves the child at once, running no destructors of the parent's state.
            unsafe { libc::_exit(if ok { 0 } else { 1 }) };
        }
        let mut status = 0;
        // SAFETY: `status` is a valid, writable int; `child` is this process's child.
        let waited = unsafe { libc::waitpid(child, &mut status, 0) };
        assert_eq!(waited, child);
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "the child saw its parent's id"
        );
        assert_eq!(process_id(), parent, "the parent keeps its own");
    }

    #[test]
    fn the_coarse_clock_moves_forward_with_time() {
        let a = coarse_monotonic_ns();
        std::thread::sleep(std::time::Duration::from_millis(30));
        let b = coarse_monotonic_ns();
        assert!(a > 0, "the clock could not be read");
        // It moves in ticks of at most 10 ms (HZ >= 100): 30 ms apart shows at least 20 ms.
        assert!(b >= a + 20_000_000, "{a} -> {b}");
    }

    #[test]
    fn loopback_is_listed() {
        let addrs = interface_addrs();
        assert!(
            addrs
                .iter()
                .any(|a| a.loopback && a.ip == IpAddr::V4(Ipv4Addr::LOCALHOST)),
            "{addrs:?}"
        );
    }

    #[test]
    fn a_touched_page_has_a_node_on_numa_kernels() {
        let v = vec![1u8; 8192];
        // Kernels without NUMA answer None; with NUMA the node exists in sysfs.
        if let Some(node) = numa_node_of(v.as_ptr() as u64) {
            assert!(std::path::Path::new(&format!("/sys/devices/system/node/node{node}")).exists());
        }
    }
}
