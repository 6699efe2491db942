//! Many engines, real metadata: 32 engine processes, each in a network namespace of its own on
//! a star of veth links (198.19.0.0/24, the hub namespace holding the bridge and the metadata
//! service), all to all, byte-verified, with their descriptors in a real service that fails
//! mid-run:
//!
//! - a 3-member etcd cluster started here (with the `etcd` feature), one member killed;
//! - the te-metadata server, killed and restarted empty on the same address (the engines
//!   publish again every second).
//!
//! Every round each engine registers a new buffer (a new descriptor to publish), waits until
//! every peer's descriptor shows that peer's new buffer (a fresh fetch from the service each
//! time: publishing and opening through the failure), writes a block of its own pattern into
//! it, reads it back and compares; a step that fails while the service is down (a descriptor
//! missing, a segment the empty service no longer lists) is tried again, a wrong byte fails at
//! once. The service fails after every engine finished round 1; the remaining rounds run
//! through the failure. Needs root (network namespaces); says why and
//! passes without it.
//!
//! The engines are this test binary again (`cluster_node`), told their part by environment.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use te_core::{
    Config, HostBuffer, Opcode, Permission, TransferEngine, TransferRequest, TransferState,
};
use te_tcp::TcpTransport;
use te_testkit::Killed;

const NODES: usize = 32;
const ROUNDS: usize = 4;
const BLOCK: usize = 16 << 10;
const HUB_IP: &str = "198.19.0.254";

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip: {e}"))?;
    match out.status.success() {
        true => Ok(()),
        false => Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )),
    }
}

fn unavailable() -> Option<String> {
    let uid = Command::new("id").arg("-u").output().ok()?;
    if String::from_utf8_lossy(&uid.stdout).trim() != "0" {
        return Some("network namespaces need root".into());
    }
    if Command::new("ip").arg("-V").output().is_err() {
        return Some("iproute2 is not installed".into());
    }
    None
}

/// One star at a time in this process: two 32-host stars built side by side left some hosts
/// with no route to their hub, and 64 engines on a small machine test nothing more than 32.
static ONE_STAR: Mutex<()> = Mutex::new(());

/// A hub namespace with a bridge, and `hosts` namespaces each joined to it by a veth pair.
struct Star {
    hub: String,
    hosts: Vec<String>,
    _turn: MutexGuard<'static, ()>,
}

impl Star {
    fn create(tag: &str, hosts: usize) -> Result<Star, String> {
        let id = std::process::id() % 100_000;
        let mut star = Star {
            hub: format!("te-{tag}-{id}-hub"),
            hosts: Vec::new(),
            _turn: ONE_STAR.lock().unwrap_or_else(|e| e.into_inner()),
        };
        ip(&["netns", "add", &star.hub])?;
        ip(&["-n", &star.hub, "link", "set", "lo", "up"])?;
        ip(&["-n", &star.hub, "link", "add", "br0", "type", "bridge"])?;
        ip(&[
            "-n",
            &star.hub,
            "addr",
            "add",
            &format!("{HUB_IP}/24"),
            "dev",
            "br0",
        ])?;
        ip(&["-n", &star.hub, "link", "set", "br0", "up"])?;
        for k in 0..hosts {
            let ns = format!("te-{tag}-{id}-{k}");
            ip(&["netns", "add", &ns])?;
            star.hosts.push(ns.clone());
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
            let (a, b) = (format!("h{k}"), format!("p{k}"));
            ip(&[
                "link", "add", &a, "netns", &ns, "type", "veth", "peer", "name", &b, "netns",
                &star.hub,
            ])?;
            ip(&["-n", &star.hub, "link", "set", &b, "master", "br0", "up"])?;
            ip(&[
                "-n",
                &ns,
                "addr",
                "add",
                &format!("198.19.0.{}/24", k + 1),
                "dev",
                &a,
            ])?;
            ip(&["-n", &ns, "link", "set", &a, "up"])?;
        }
        Ok(star)
    }

    fn host_ip(k: usize) -> String {
        format!("198.19.0.{}", k + 1)
    }
}

impl Drop for Star {
    fn drop(&mut self) {
        for ns in self.hosts.iter().chain([&self.hub]) {
            let _ = ip(&["netns", "del", ns]);
        }
    }
}

fn in_ns(ns: &str, program: &str) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns, program]);
    c
}

/// Waits until something in `ns` accepts connections on `HUB_IP:port`.
#[cfg(feature = "etcd")]
fn wait_listening(ns: &str, port: u16) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let probe = in_ns(ns, "bash")
            .args(["-c", &format!("exec 3<>/dev/tcp/{HUB_IP}/{port}")])
            .stderr(Stdio::null())
            .status();
        if probe.is_ok_and(|s| s.success()) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "nothing listens on {HUB_IP}:{port}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The engine processes: started in their namespaces; each line they print comes to `lines`.
fn start_nodes(star: &Star, url: &str) -> (Vec<Child>, mpsc::Receiver<(usize, String)>) {
    let exe = std::env::current_exe().unwrap();
    let (tx, rx) = mpsc::channel();
    let nodes = (0..NODES)
        .map(|k| {
            let mut child = in_ns(&star.hosts[k], exe.to_str().unwrap())
                .args(["--exact", "cluster_node", "--nocapture", "--test-threads=1"])
                .env("TE_CLUSTER_NODE", k.to_string())
                .env("TE_CLUSTER_URL", url)
                .env("TE_CLUSTER_IP", Star::host_ip(k))
                .env("MC_LOG_LEVEL", "ERROR")
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .expect("an engine process starts");
            let out = child.stdout.take().unwrap();
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(out).lines().map_while(Result::ok) {
                    let _ = tx.send((k, line));
                }
            });
            child
        })
        .collect();
    (nodes, rx)
}

/// Waits until every node printed `round {round} ok` (panicking on a node's failure line).
fn wait_round(rx: &mpsc::Receiver<(usize, String)>, seen: &mut [usize], round: usize) {
    let started = Instant::now();
    let deadline = started + Duration::from_secs(240);
    while seen.iter().any(|&r| r < round + 1) {
        let left = deadline.saturating_duration_since(Instant::now());
        let Ok((k, line)) = rx.recv_timeout(left) else {
            panic!("round {round}: nodes behind: {seen:?}");
        };
        if let Some(r) = line
            .strip_prefix(&format!("node {k} round "))
            .and_then(|t| t.strip_suffix(" ok"))
            .and_then(|r| r.parse::<usize>().ok())
        {
            seen[k] = seen[k].max(r + 1);
        }
    }
    eprintln!(
        "every node finished round {round} ({:.1} s)",
        started.elapsed().as_secs_f64()
    );
}

/// Runs the cluster with the service `url` in the hub; `fail` breaks the service after round 1
/// and returns what must live until the end.
fn cluster(star: &Star, url: &str, fail: impl FnOnce()) {
    let (mut nodes, rx) = start_nodes(star, url);
    let mut seen = vec![0usize; NODES];
    wait_round(&rx, &mut seen, 1);
    fail();
    wait_round(&rx, &mut seen, ROUNDS - 1);
    // Every node is done writing: let them go.
    for n in &mut nodes {
        drop(n.stdin.take());
    }
    for (k, mut n) in nodes.into_iter().enumerate() {
        let status = n.wait().unwrap();
        assert!(status.success(), "node {k} failed: {status}");
    }
}

#[cfg(feature = "etcd")]
#[test]
fn thirty_two_engines_all_to_all_through_a_three_member_etcd_losing_one() {
    if let Some(why) = unavailable() {
        return eprintln!("skipped: {why}");
    }
    let star = Star::create("etcd", NODES).expect("the star network");
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("cluster-etcd-{}", std::process::id()));
    let peers: Vec<String> = (1..=3)
        .map(|m| format!("m{m}=http://{HUB_IP}:{}", 23800 + m))
        .collect();
    let mut members: Vec<Option<Killed>> = (1..=3)
        .map(|m| {
            let client = format!("http://{HUB_IP}:{}", 23790 + m);
            let peer = format!("http://{HUB_IP}:{}", 23800 + m);
            let data = dir.join(format!("m{m}"));
            let _ = std::fs::remove_dir_all(&data);
            let child = in_ns(&star.hub, "etcd")
                .args(["--name", &format!("m{m}")])
                .arg("--data-dir")
                .arg(&data)
                .args([
                    "--listen-client-urls",
                    &client,
                    "--advertise-client-urls",
                    &client,
                ])
                .args([
                    "--listen-peer-urls",
                    &peer,
                    "--initial-advertise-peer-urls",
                    &peer,
                ])
                .args(["--initial-cluster", &peers.join(",")])
                .args([
                    "--initial-cluster-state",
                    "new",
                    "--initial-cluster-token",
                    "te",
                ])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("etcd is installed (.ci/setup installs etcd-server)");
            Some(Killed(child))
        })
        .collect();
    for m in 1..=3 {
        wait_listening(&star.hub, 23790 + m);
    }
    let url = format!(
        "etcd://{}",
        (1..=3)
            .map(|m| format!("{HUB_IP}:{}", 23790 + m))
            .collect::<Vec<_>>()
            .join(",")
    );
    cluster(&star, &url, || {
        // A member dies (a crash: no goodbye); two of three keep the quorum.
        drop(members[0].take());
    });
    drop(members);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn thirty_two_engines_all_to_all_through_te_metadata_restarted_mid_run() {
    if let Some(why) = unavailable() {
        return eprintln!("skipped: {why}");
    }
    let star = Star::create("http", NODES).expect("the star network");
    let addr = format!("{HUB_IP}:28080");
    let server = |star: &Star| {
        let mut child = in_ns(&star.hub, env!("CARGO_BIN_EXE_te-metadata"))
            .args(["--addr", &addr])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("te-metadata starts");
        let out = child.stdout.take().unwrap();
        let listening = BufReader::new(out)
            .lines()
            .map_while(Result::ok)
            .any(|l| l.contains("listening on"));
        assert!(listening, "te-metadata printed its address");
        Killed(child)
    };
    let mut running = Some(server(&star));
    let url = format!("http://{addr}/metadata");
    cluster(&star, &url, || {
        // Killed, and back empty a second later: the engines publish again.
        drop(running.take());
        std::thread::sleep(Duration::from_secs(1));
        running = Some(server(&star));
    });
    drop(running);
}

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is set for a cluster node"))
}

fn pattern(node: usize, peer: usize, round: usize) -> Vec<u8> {
    te_testkit::pattern(((node * 1000 + peer) * 100 + round) as u64, BLOCK)
}

/// Runs one one-task batch to its end; the final state, or why it could not be submitted.
fn transfer(e: &TransferEngine, r: TransferRequest) -> Result<TransferState, String> {
    let b = e.allocate_batch(1).map_err(|e| e.to_string())?;
    let submitted = e.submit(b, &[r]);
    let state = submitted
        .map_err(|e| format!("submit: {e}"))
        .and_then(|()| {
            e.wait(b, Duration::from_secs(60))
                .map(|s| s.state)
                .map_err(|e| e.to_string())
        });
    e.free_batch(b).map_err(|e| e.to_string())?;
    state
}

/// One node's step with one peer: the peer's descriptor fetched afresh until it shows this
/// round's buffer (`len` bytes), `sent` written into this node's block of it, read back and
/// compared. A mismatch fails the test at once; anything else is for the caller to retry.
fn exchange(
    engine: &TransferEngine,
    local: &HostBuffer,
    name: &str,
    len: usize,
    me: usize,
    sent: &[u8],
) -> Result<(), String> {
    let id = engine.refresh_segment(name).map_err(|e| e.to_string())?;
    let seg = engine.segment(id).map_err(|e| e.to_string())?;
    let base = seg
        .desc()
        .buffers
        .iter()
        .find(|b| b.length == len as u64)
        .map(|b| b.addr)
        .ok_or("this round's buffer is not published yet")?;
    let at = base + (me * BLOCK) as u64;
    let request = |opcode, source| TransferRequest {
        opcode,
        source,
        target_id: id,
        target_offset: at,
        length: BLOCK as u64,
    };
    match transfer(engine, request(Opcode::Write, local.addr()))? {
        TransferState::Completed => {}
        other => return Err(format!("WRITE ended {other:?}")),
    }
    local.write_at(BLOCK, &vec![0u8; BLOCK]).unwrap();
    match transfer(engine, request(Opcode::Read, local.addr() + BLOCK as u64))? {
        TransferState::Completed => {}
        other => return Err(format!("READ ended {other:?}")),
    }
    assert!(
        local.to_vec(BLOCK, BLOCK).unwrap() == sent,
        "node {me}: the block read back from {name} differs from the one written"
    );
    Ok(())
}

/// One engine of the cluster (run by the tests above in a namespace of its own; returns at
/// once when run as a plain test).
#[test]
fn cluster_node() {
    let Ok(me) = std::env::var("TE_CLUSTER_NODE") else {
        return;
    };
    let me: usize = me.parse().unwrap();
    let url = env("TE_CLUSTER_URL");
    let mut config = Config::default();
    config.tcp_bind_address = Some(env("TE_CLUSTER_IP").parse().unwrap());
    config.metadata_refresh = Duration::from_secs(1);
    config.handshake_connect_timeout = Duration::from_secs(2);
    let mut one_lane = te_tcp::TcpSettings::default();
    one_lane.lanes_per_peer = 1;
    // The service may still be electing a leader: starting is retried.
    let deadline = Instant::now() + Duration::from_secs(60);
    let engine = loop {
        match TransferEngine::init(config.clone(), &url, &format!("node-{me}")) {
            Ok(e) => break e,
            Err(e) if Instant::now() < deadline => {
                eprintln!("node {me}: starting: {e}; again");
                std::thread::sleep(Duration::from_millis(500));
            }
            Err(e) => panic!("node {me}: the engine does not start: {e}"),
        }
    };
    engine
        .install_transport(Arc::new(TcpTransport::with_settings(one_lane)))
        .unwrap();
    let local = Arc::new(HostBuffer::new(2 * BLOCK).unwrap());
    engine
        .register_buffer(&local, "*", Permission::LocalOnly)
        .unwrap();
    let mut rounds = Vec::new();
    for round in 0..ROUNDS {
        // A new buffer, so a new descriptor to publish; its length says which round it is.
        let len = NODES * BLOCK + (round + 1) * 4096;
        let buffer = Arc::new(HostBuffer::new(len).unwrap());
        engine
            .register_buffer(&buffer, "*", Permission::RemoteReadWrite)
            .unwrap();
        rounds.push(buffer);
        for peer in (0..NODES).filter(|p| *p != me) {
            let name = format!("node-{peer}");
            let sent = pattern(me, peer, round);
            local.write_at(0, &sent).unwrap();
            // While the service is down or just back empty, a peer's descriptor may be missing
            // (and an open segment the service no longer lists is stale, so a submit to it
            // fails): the whole step (fetch, WRITE, READ back) is tried again until it works.
            let deadline = Instant::now() + Duration::from_secs(120);
            let mut last = String::new();
            loop {
                assert!(
                    Instant::now() < deadline,
                    "node {me}: round {round} with {name} never worked; last: {last}"
                );
                match exchange(&engine, &local, &name, len, me, &sent) {
                    Ok(()) => break,
                    Err(why) => {
                        last = why;
                        std::thread::sleep(Duration::from_millis(100));
                    }
                }
            }
        }
        println!("node {me} round {round} ok");
    }
    // Peers may still be writing into this node's buffers: wait for the word (stdin closing).
    let mut rest = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut rest);
    drop(rounds);
}
