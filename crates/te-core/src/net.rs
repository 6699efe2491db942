//! A listening socket served by one accept thread and one thread per connection, with a
//! connection limit and a clean shutdown. Used by the control channel and by transports.
//!
//! It knows nothing about what is spoken on the connections; the handler does.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use tracing::{debug, warn};

/// Handles one accepted connection on its own thread; returns when done with it.
pub type ConnectionHandler = Arc<dyn Fn(TcpStream) + Send + Sync>;

struct Shared {
    stop: AtomicBool,
    next_id: AtomicU64,
    live: Mutex<HashMap<u64, TcpStream>>,
}

/// A running listener. Dropping it stops accepting and closes live connections.
pub struct ServiceListener {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept_thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for ServiceListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceListener")
            .field("addr", &self.addr)
            .finish()
    }
}

/// Binds `ip` on the first free port of `ports`, starting from a per-process offset so that
/// processes started together spread over the range.
///
/// # Errors
/// The last bind error when every port is taken.
pub fn bind_in_range(ip: IpAddr, ports: std::ops::RangeInclusive<u16>) -> io::Result<TcpListener> {
    let (lo, hi) = (*ports.start(), *ports.end());
    let span = u32::from(hi - lo) + 1;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let start = (std::process::id().wrapping_mul(7919) ^ nanos) % span;
    let mut last = io::Error::new(io::ErrorKind::AddrInUse, "empty port range");
    for i in 0..span {
        let port = lo + ((start + i) % span) as u16;
        match TcpListener::bind((ip, port)) {
            Ok(l) => return Ok(l),
            Err(e) => last = e,
        }
    }
    Err(last)
}

impl ServiceListener {
    /// Serves `listener`: each accepted connection runs `handler` on a new thread, at most
    /// `max_connections` at once (more are closed at once).
    ///
    /// # Errors
    /// The listener's address cannot be read or the accept thread cannot start.
    pub fn spawn(
        listener: TcpListener,
        name: &str,
        max_connections: usize,
        handler: ConnectionHandler,
    ) -> io::Result<Self> {
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            next_id: AtomicU64::new(0),
            live: Mutex::new(HashMap::new()),
        });
        let s = shared.clone();
        let thread_name = name.to_string();
        let accept_thread = std::thread::Builder::new()
            .name(format!("{name}-accept"))
            .spawn(move || accept_loop(listener, &thread_name, max_connections, handler, s))?;
        Ok(ServiceListener {
            addr,
            shared,
            accept_thread: Some(accept_thread),
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting, closes live connections and joins the accept thread.
    pub fn shutdown(&mut self) {
        if self.shared.stop.swap(true, Ordering::AcqRel) {
            return;
        }
        // Wake the blocking accept with a connection of our own.
        let mut wake = self.addr;
        if wake.ip().is_unspecified() {
            wake.set_ip(match wake.ip() {
                IpAddr::V4(_) => IpAddr::V4(std::net::Ipv4Addr::LOCALHOST),
                IpAddr::V6(_) => IpAddr::V6(std::net::Ipv6Addr::LOCALHOST),
            });
        }
        let _ = TcpStream::connect_timeout(&wake, std::time::Duration::from_secs(1));
        if let Some(t) = self.accept_thread.take() {
            let _ = t.join();
        }
        let live = std::mem::take(&mut *self.shared.live.lock().unwrap_or_else(|e| e.into_inner()));
        for stream in live.values() {
            let _ = stream.shutdown(Shutdown::Both);
        }
    }
}

impl Drop for ServiceListener {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn accept_loop(
    listener: TcpListener,
    name: &str,
    max_connections: usize,
    handler: ConnectionHandler,
    shared: Arc<Shared>,
) {
    loop {
        let (stream, peer) = match listener.accept() {
            Ok(pair) => pair,
            Err(e) => {
                if shared.stop.load(Ordering::Acquire) {
                    return;
                }
                warn!(listener = name, error = %e, "accept failed");
                std::thread::sleep(std::time::Duration::from_millis(10));
                continue;
            }
        };
        if shared.stop.load(Ordering::Acquire) {
            return;
        }
        let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
        {
            let mut live = shared.live.lock().unwrap_or_else(|e| e.into_inner());
            if live.len() >= max_connections {
                warn!(listener = name, %peer, max_connections, "too many connections; closing");
                continue;
            }
            match stream.try_clone() {
                Ok(clone) => live.insert(id, clone),
                Err(_) => continue,
            };
        }
        debug!(listener = name, %peer, "accepted");
        let h = handler.clone();
        let s = shared.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("{name}-conn"))
            .spawn(move || {
                h(stream);
                s.live.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
            });
        if spawned.is_err() {
            warn!(listener = name, "cannot spawn a connection thread");
            shared
                .live
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&id);
        }
    }
}

/// Chooses the address listeners bind to: the configured one (`MC_TCP_BIND_ADDRESS`), else the
/// host of the local server name when it is an address, else the first running, non-loopback
/// IPv4 address of an interface that is neither virtual (as sysfs says, `virtual_nics`) nor
/// named like a container bridge or veth, else 127.0.0.1.
pub fn choose_bind_ip(
    configured: Option<IpAddr>,
    name_host: Option<IpAddr>,
    interfaces: &[crate::sys::InterfaceAddr],
    virtual_nics: &[&str],
) -> IpAddr {
    if let Some(ip) = configured.or(name_host) {
        return ip;
    }
    const VIRTUAL: [&str; 7] = ["docker", "br-", "virbr", "veth", "cni", "flannel", "lxcbr"];
    interfaces
        .iter()
        .filter(|a| a.running && !a.loopback && a.ip.is_ipv4())
        .filter(|a| !virtual_nics.contains(&a.name.as_str()))
        .find(|a| !VIRTUAL.iter().any(|p| a.name.starts_with(p)))
        .map(|a| a.ip)
        .unwrap_or(IpAddr::V4(std::net::Ipv4Addr::LOCALHOST))
}

/// [`choose_bind_ip`] over this machine's interfaces, skipping those `topology` calls virtual.
pub fn bind_ip_for(
    configured: Option<IpAddr>,
    name_host: Option<IpAddr>,
    topology: &te_topology::Topology,
    interfaces: &[crate::sys::InterfaceAddr],
) -> IpAddr {
    let virtual_nics: Vec<&str> = topology
        .nics
        .iter()
        .filter(|n| n.is_virtual)
        .map(|n| n.name.as_str())
        .collect();
    choose_bind_ip(configured, name_host, interfaces, &virtual_nics)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::InterfaceAddr;

    fn ifa(name: &str, ip: &str, running: bool, loopback: bool) -> InterfaceAddr {
        InterfaceAddr {
            name: name.into(),
            ip: ip.parse().unwrap(),
            up: running,
            running,
            loopback,
        }
    }

    #[test]
    fn bind_ip_skips_loopback_bridges_and_down_interfaces() {
        let list = [
            ifa("lo", "127.0.0.1", true, true),
            ifa("docker0", "172.17.0.1", true, false),
            ifa("eth1", "10.0.0.9", false, false),
            ifa("eth0", "fe80::1", true, false),
            ifa("eth0", "10.0.0.5", true, false),
        ];
        assert_eq!(
            choose_bind_ip(None, None, &list, &[]),
            "10.0.0.5".parse::<IpAddr>().unwrap()
        );
        let forced: IpAddr = "192.0.2.1".parse().unwrap();
        assert_eq!(
            choose_bind_ip(Some(forced), Some("127.0.0.1".parse().unwrap()), &list, &[]),
            forced
        );
        assert_eq!(
            choose_bind_ip(None, Some("127.0.0.1".parse().unwrap()), &list, &[]),
            "127.0.0.1".parse::<IpAddr>().unwrap()
        );
        assert_eq!(
            choose_bind_ip(None, None, &list[..3], &[]),
            "127.0.0.1".parse::<IpAddr>().unwrap()
        );
    }

    #[test]
    fn interfaces_sysfs_calls_virtual_are_skipped() {
        let list = [
            ifa("br0", "10.1.0.1", true, false),
            ifa("eth0", "10.0.0.5", true, false),
        ];
        assert_eq!(
            choose_bind_ip(None, None, &list, &["br0"]),
            "10.0.0.5".parse::<IpAddr>().unwrap()
        );
        assert_eq!(
            choose_bind_ip(None, None, &list, &[]),
            "10.1.0.1".parse::<IpAddr>().unwrap()
        );
    }

    #[test]
    fn listener_serves_many_and_shuts_down() {
        use std::io::{Read, Write};
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let handler: ConnectionHandler = Arc::new(|mut s: TcpStream| {
            let mut b = [0u8; 1];
            while s.read_exact(&mut b).is_ok() {
                let _ = s.write_all(&b);
            }
        });
        let mut svc = ServiceListener::spawn(l, "echo", 4, handler).unwrap();
        let addr = svc.local_addr();
        let mut silent = TcpStream::connect(addr).unwrap(); // holds a thread, blocks nobody
        let mut c = TcpStream::connect(addr).unwrap();
        c.write_all(b"x").unwrap();
        let mut b = [0u8; 1];
        c.read_exact(&mut b).unwrap();
        assert_eq!(&b, b"x");
        svc.shutdown();
        c.set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .unwrap();
        assert_eq!(c.read(&mut b).unwrap_or(0), 0, "closed on shutdown");
        silent
            .set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .unwrap();
        assert_eq!(silent.read(&mut b).unwrap_or(0), 0);
        assert!(
            TcpStream::connect(addr).is_err() || {
                let mut s = TcpStream::connect(addr).unwrap();
                s.set_read_timeout(Some(std::time::Duration::from_secs(2)))
                    .unwrap();
                s.read(&mut b).unwrap_or(0) == 0
            }
        );
    }
}
