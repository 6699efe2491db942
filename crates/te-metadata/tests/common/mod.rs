//! Real metadata services for the tests: the te-metadata binary and Debian's redis-server,
//! each started on a free loopback port and killed when dropped.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use te_core::{Config, HostBuffer, Permission, TransferEngine};
use te_tcp::TcpTransport;

pub use te_testkit::services::Service;

pub fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("te-metadata");
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(format!("{name}-{}", std::process::id()))
}

/// Removes what te-metadata persisted at `file`: the snapshot and its log.
pub fn remove_persisted(file: &Path) {
    let mut log = file.as_os_str().to_owned();
    log.push(".log");
    for p in [file.to_path_buf(), PathBuf::from(log)] {
        let _ = std::fs::remove_file(p);
    }
}

/// The te-metadata binary on `port` (0: any), persisting to `persist` if given.
pub fn http_server(port: u16, persist: Option<&Path>) -> Service {
    http_server_with(port, persist, &[])
}

/// As [`http_server`], with more arguments.
pub fn http_server_with(port: u16, persist: Option<&Path>, args: &[&str]) -> Service {
    // Restarts reuse the port: keep it out of the ephemeral range (see `free_port`).
    let port = if port == 0 {
        te_testkit::services::free_port()
    } else {
        port
    };
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_te-metadata"));
    cmd.args(["--addr", &format!("127.0.0.1:{port}")]);
    if let Some(p) = persist {
        cmd.arg("--persist").arg(p);
    }
    cmd.args(args);
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
    Service::new(child, format!("http://{addr}/metadata"), port)
}

/// Debian's redis-server on `port` (0: a free one), with `password` if given.
pub fn redis_server(port: u16, password: Option<&str>) -> Service {
    let dir = scratch(&format!("redis-{port}"));
    te_testkit::services::redis_server(port, password, &dir)
}

/// A single-member etcd on `port` (0: a free one), starting empty.
pub fn etcd_server(port: u16) -> Service {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static STARTS: AtomicUsize = AtomicUsize::new(0);
    let dir = scratch(&format!(
        "etcd-{port}-{}",
        STARTS.fetch_add(1, Ordering::Relaxed)
    ));
    te_testkit::services::etcd_server(port, &dir)
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
