//! Real metadata services for the tests: the te-metadata binary and Debian's redis-server,
//! each started on a free loopback port and killed when dropped.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use te_core::{Config, HostBuffer, Permission, TransferEngine};
use te_tcp::TcpTransport;

/// A service process; killed on drop.
pub struct Service {
    child: Child,
    /// The connection string engines use.
    pub url: String,
    /// The port it listens on.
    pub port: u16,
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Service {
    /// Kills the process now (a crash: no goodbye).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("te-metadata");
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(format!("{name}-{}", std::process::id()))
}

/// The te-metadata binary on `port` (0: any), persisting to `persist` if given.
pub fn http_server(port: u16, persist: Option<&Path>) -> Service {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_te-metadata"));
    cmd.args(["--addr", &format!("127.0.0.1:{port}")]);
    if let Some(p) = persist {
        cmd.arg("--persist").arg(p);
    }
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("te-metadata starts");
    let line = BufReader::new(child.stdout.take().unwrap())
        .lines()
        .map_while(Result::ok)
        .find(|l| l.contains("listening on"))
        .expect("te-metadata prints its address");
    let addr = line.rsplit(' ').next().unwrap().to_string();
    let port = addr.rsplit(':').next().unwrap().parse().unwrap();
    Service {
        child,
        url: format!("http://{addr}/metadata"),
        port,
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Debian's redis-server on `port` (0: a free one), with `password` if given.
pub fn redis_server(port: u16, password: Option<&str>) -> Service {
    let port = if port == 0 { free_port() } else { port };
    let dir = scratch(&format!("redis-{port}"));
    std::fs::create_dir_all(&dir).unwrap();
    let mut cmd = Command::new("redis-server");
    cmd.args([
        "--port",
        &port.to_string(),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
    ])
    .arg("--dir")
    .arg(&dir);
    if let Some(p) = password {
        cmd.args(["--requirepass", p]);
    }
    let child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server is installed (.ci/setup installs it)");
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "redis-server did not start on {port}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    Service {
        child,
        url: format!("redis://127.0.0.1:{port}"),
        port,
    }
}

/// A single-member etcd on free loopback ports, with a fresh data directory (so a restart on the
/// same `port` starts empty).
pub fn etcd_server(port: u16) -> Service {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static STARTS: AtomicUsize = AtomicUsize::new(0);
    let port = if port == 0 { free_port() } else { port };
    let peer = free_port();
    let dir = scratch(&format!(
        "etcd-{port}-{}",
        STARTS.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    let client = format!("http://127.0.0.1:{port}");
    let peer_url = format!("http://127.0.0.1:{peer}");
    let child = Command::new("etcd")
        .arg("--data-dir")
        .arg(&dir)
        .args([
            "--name",
            "te",
            "--listen-client-urls",
            &client,
            "--advertise-client-urls",
            &client,
        ])
        .args([
            "--listen-peer-urls",
            &peer_url,
            "--initial-advertise-peer-urls",
            &peer_url,
        ])
        .args(["--initial-cluster", &format!("te={peer_url}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("etcd is installed (.ci/setup installs etcd-server)");
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "etcd did not start on {port}");
        std::thread::sleep(Duration::from_millis(50));
    }
    Service {
        child,
        url: format!("etcd://127.0.0.1:{port}"),
        port,
    }
}

/// An engine with TCP named `name` in the service at `url`, re-reading the service every second.
pub fn engine(
    url: &str,
    name: &str,
    tweak: impl FnOnce(&mut Config),
) -> te_core::Result<TransferEngine> {
    let mut c = Config::default();
    c.tcp_bind_address = Some("127.0.0.1".parse().unwrap());
    c.metadata_refresh = Duration::from_secs(1);
    c.handshake_connect_timeout = Duration::from_secs(2);
    tweak(&mut c);
    let e = TransferEngine::init(c, url, name)?;
    e.install_transport(Arc::new(TcpTransport::new()))?;
    Ok(e)
}

/// Registers a remotely writable buffer filled with `fill`.
pub fn buffer(e: &TransferEngine, len: usize, fill: u8) -> Arc<HostBuffer> {
    let b = Arc::new(HostBuffer::new(len).unwrap());
    b.write_at(0, &vec![fill; len]).unwrap();
    e.register_buffer(&b, "*", Permission::RemoteReadWrite)
        .unwrap();
    b
}

/// Waits up to 10 s for `cond`.
pub fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}
