//! Real servers for tests: Debian's redis-server and etcd, each started on a free loopback port
//! in a directory of the caller's, and killed when dropped. No mock stands in for them.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A server process; killed on drop.
#[derive(Debug)]
pub struct Service {
    child: Child,
    /// The connection string engines use (`redis://…`, `etcd://…`, `http://…`).
    pub url: String,
    /// The port it listens on.
    pub port: u16,
}

impl Service {
    /// Wraps a started process serving `url` on `port`.
    pub fn new(child: Child, url: String, port: u16) -> Self {
        Service { child, url, port }
    }

    /// Sends `signal` (`TERM`, `INT`) and waits up to 20 s for the process to exit; returns how
    /// it exited (see [`signal`], [`exit_within`]).
    ///
    /// # Panics
    /// When `kill` fails or the process is still running after 20 s (then it is killed).
    pub fn terminate(&mut self, signal_name: &str) -> std::process::ExitStatus {
        signal(&self.child, signal_name);
        exit_within(&mut self.child, Duration::from_secs(20))
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Kills the process now (a crash: no goodbye).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Sends signal `name` (`TERM`, `INT`) to `child` with the system's `kill`.
///
/// # Panics
/// When `kill` cannot run or fails (a test helper).
pub fn signal(child: &Child, name: &str) {
    let sent = Command::new("kill")
        .args([&format!("-{name}"), &child.id().to_string()])
        .status()
        .is_ok_and(|s| s.success());
    assert!(sent, "kill -{name} {}", child.id());
}

/// Waits up to `within` for `child` to exit; returns how it exited.
///
/// # Panics
/// When it is still running after `within` (then it is killed).
pub fn exit_within(child: &mut Child, within: Duration) -> std::process::ExitStatus {
    let end = Instant::now() + within;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return status;
        }
        if Instant::now() > end {
            let _ = child.kill();
            let _ = child.wait();
            panic!("process {} still running after {within:?}", child.id());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A port nobody listens on right now on 127.0.0.1, below the kernel's ephemeral range (32768
/// and up), so a server restarted on it cannot find it taken by some test's outgoing
/// connection.
///
/// # Panics
/// When no port in 20000..32000 can be bound (a test helper).
pub fn free_port() -> u16 {
    free_port_on("127.0.0.1")
}

/// [`free_port`] on address `ip` (a namespace's or a guest's address).
///
/// # Panics
/// When no port in 20000..32000 can be bound there (a test helper).
pub fn free_port_on(ip: &str) -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    (0..12000)
        .map(|_| {
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            20000 + ((std::process::id().wrapping_mul(7919) + n * 104_729) % 12000) as u16
        })
        .find(|p| std::net::TcpListener::bind((ip, *p)).is_ok())
        .expect("a free port in 20000..32000")
}

pub(crate) fn wait_for(port: u16, what: &str, limit: Duration) {
    let deadline = Instant::now() + limit;
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "{what} did not start on port {port}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Debian's redis-server on `port` (0: a free one), with `password` if given, keeping its files
/// in `dir`.
///
/// # Panics
/// When redis-server is missing (`.ci/setup` installs it) or does not start.
pub fn redis_server(port: u16, password: Option<&str>, dir: &Path) -> Service {
    let port = if port == 0 { free_port() } else { port };
    let _ = std::fs::create_dir_all(dir);
    let mut cmd = Command::new("redis-server");
    cmd.args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no", "--dir"])
        .arg(dir);
    if let Some(p) = password {
        cmd.args(["--requirepass", p]);
    }
    let child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server is installed (.ci/setup installs it)");
    let service = Service::new(child, format!("redis://127.0.0.1:{port}"), port);
    wait_for(port, "redis-server", Duration::from_secs(10));
    service
}

/// A single-member etcd on `port` (0: a free one) with its data in `dir` (emptied first, so a
/// restart on the same port starts empty).
///
/// # Panics
/// When etcd is missing (`.ci/setup` installs etcd-server) or does not start.
pub fn etcd_server(port: u16, dir: &Path) -> Service {
    let port = if port == 0 { free_port() } else { port };
    let peer = free_port();
    let _ = std::fs::remove_dir_all(dir);
    let client = format!("http://127.0.0.1:{port}");
    let peer_url = format!("http://127.0.0.1:{peer}");
    let child = Command::new("etcd")
        .arg("--data-dir")
        .arg(dir)
        .args(["--name", "te", "--listen-client-urls", &client])
        .args([
            "--advertise-client-urls",
            &client,
            "--listen-peer-urls",
            &peer_url,
        ])
        .args(["--initial-advertise-peer-urls", &peer_url])
        .args(["--initial-cluster", &format!("te={peer_url}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("etcd is installed (.ci/setup installs etcd-server)");
    let service = Service::new(child, format!("etcd://127.0.0.1:{port}"), port);
    wait_for(port, "etcd", Duration::from_secs(20));
    service
}

/// `GET path` from the server at `addr` (one request, `Connection: close`): its status line
/// and body. For tests of te's HTTP endpoints (`/metrics`) and of servers beside them.
///
/// # Errors
/// The connection or a read or write failed (5 s limit).
pub fn http_get(addr: std::net::SocketAddr, path: &str) -> std::io::Result<(String, String)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut text = String::new();
    s.read_to_string(&mut text)?;
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    Ok((
        head.lines().next().unwrap_or_default().to_string(),
        body.to_string(),
    ))
}
