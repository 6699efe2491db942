//! The operating-system queries te-core needs, each a thin wrapper over one libc call:
//! the NUMA node of a page (`move_pages` in query mode), the host page size (`sysconf`) and
//! the IPv4/IPv6 addresses of the network interfaces (`getifaddrs`), the open-file limit
//! (`getrlimit`/`setrlimit`), and a coarse monotonic clock (`CLOCK_MONOTONIC_COARSE`).
//! Nothing here decides anything; callers choose.
#![allow(unsafe_code)]

use std::ffi::CStr;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

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

#[cfg(test)]
mod tests {
    use super::*;

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
