//! te-bench's swarm against a real te-bench target process: a thousand connections and more
//! served by a fixed pool of threads, every block read back and compared; a target at its
//! connection cap refusing the swarm with a reason, then serving once there is room; and an
//! engine that registers its buffer only after the swarm first asked for its descriptor.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

struct Target(Child, String);

impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn target(env: &[(&str, &str)]) -> Target {
    let mut child = Command::new(env!("CARGO_BIN_EXE_te-bench"))
        .args(["--mode=target", "--local_server_name=127.0.0.1:0"])
        .arg("--buffer_size=67108864")
        .envs(env.iter().copied())
        .env("MC_LOG_LEVEL", "WARNING")
        .stdout(Stdio::piped())
        .spawn()
        .expect("te-bench target starts");
    let stdout = child.stdout.take().unwrap();
    let line = BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .find(|l| l.contains("segment name:"))
        .expect("the target prints its segment name");
    let name = line.rsplit(' ').next().unwrap().to_string();
    Target(child, name)
}

fn proc_status(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap()
}

fn sockets(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| {
            std::fs::read_link(e.path()).is_ok_and(|l| l.to_string_lossy().starts_with("socket:"))
        })
        .count()
}

fn swarm(segment: &str, args: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_te-bench"))
        .args(["--mode=swarm", "--threads=2", "--verify", "--json"])
        .arg(format!("--segment_id={segment}"))
        .args(args)
        .env("MC_LOG_LEVEL", "WARNING")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("swarm starts")
}

fn json_field(out: &str, key: &str) -> u64 {
    let v: serde_json::Value = serde_json::from_str(out.lines().last().expect("a JSON line"))
        .expect("the last line is JSON");
    v[key].as_u64().unwrap_or_else(|| panic!("{key} in {out}"))
}

#[test]
fn a_thousand_connections_on_a_fixed_pool_of_threads_every_block_verified() {
    let t = target(&[("MC_TE_SERVER_THREADS", "2")]);
    let pid = t.0.id();
    let before = proc_status(pid, "Threads:");
    let mut s = swarm(
        &t.1,
        &[
            "--peers=256",
            "--lanes=4",
            "--block_size=16384",
            "--duration=1",
            "--hold=3",
        ],
    );
    // While the swarm holds its connections open: the target has them all, and no more
    // threads than before they came.
    let stderr = s.stderr.take().unwrap();
    let held = BufReader::new(stderr)
        .lines()
        .map_while(Result::ok)
        .any(|l| l.contains("swarm: holding"));
    assert!(held, "the swarm ran and held its connections");
    std::thread::sleep(std::time::Duration::from_millis(500));
    let connected = sockets(pid);
    let threads = proc_status(pid, "Threads:");
    let out = s.wait_with_output().unwrap();
    let out = String::from_utf8_lossy(&out.stdout);
    assert!(connected >= 1024, "{connected} sockets in the target");
    assert_eq!(threads, before, "threads do not grow with connections");
    assert_eq!(json_field(&out, "connections"), 1024);
    assert_eq!(
        json_field(&out, "verified"),
        1024,
        "every block read back equal"
    );
    assert!(json_field(&out, "writes") >= 1024, "{out}");
    // Every connection wrote (its block is the one it verifies), and the per-connection counts
    // add up to no more than the total.
    let (least, most) = (
        json_field(&out, "writes_per_connection_min"),
        json_field(&out, "writes_per_connection_max"),
    );
    assert!(least >= 1 && least <= most, "{out}");
    assert!(least * 1024 <= json_field(&out, "writes"), "{out}");
    assert!(most <= json_field(&out, "writes"), "{out}");
    let v: serde_json::Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
    let connect = v["connect_seconds"].as_f64().expect("connect_seconds");
    assert!(
        connect > 0.0,
        "opening and connecting took some time: {out}"
    );
    // The swarm's own CPU while it ran is reported (the scale bench divides it by the bytes).
    let cpu = v["cpu_seconds"].as_f64().expect("cpu_seconds");
    assert!(cpu >= 0.0, "{out}");
}

#[test]
fn over_its_connection_cap_a_target_refuses_with_a_reason_and_keeps_serving() {
    let t = target(&[("MC_TE_MAX_DATA_CONNECTIONS", "8")]);
    let over = swarm(&t.1, &["--peers=4", "--lanes=4", "--duration=0.5"])
        .wait_with_output()
        .unwrap();
    assert!(!over.status.success());
    let err = String::from_utf8_lossy(&over.stderr);
    assert!(err.contains("MC_TE_MAX_DATA_CONNECTIONS"), "{err}");
    // Within the cap (the refused swarm's connections are gone): served, verified.
    let mut within = None;
    for _ in 0..50 {
        let out = swarm(&t.1, &["--peers=2", "--lanes=4", "--duration=0.5"])
            .wait_with_output()
            .unwrap();
        if out.status.success() {
            within = Some(String::from_utf8_lossy(&out.stdout).to_string());
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let within = within.expect("a swarm within the cap is served");
    assert_eq!(json_field(&within, "verified"), 8);
}

#[test]
fn a_buffer_registered_after_the_first_descriptor_request_is_waited_for() {
    use std::sync::Arc;
    let mut config = te_core::Config::default();
    config.tcp_bind_address = Some("127.0.0.1".parse().unwrap());
    let engine = te_core::TransferEngine::init(config, "P2PHANDSHAKE", "127.0.0.1").unwrap();
    engine
        .install_transport(Arc::new(te_tcp::TcpTransport::new()))
        .unwrap();
    let name = engine.segment_name().to_string();
    let swarm = swarm(
        &name,
        &[
            "--peers=1",
            "--lanes=2",
            "--block_size=4096",
            "--duration=0.2",
        ],
    );
    // The swarm's first request finds no buffer (it starts in milliseconds); then one comes.
    std::thread::sleep(std::time::Duration::from_millis(700));
    let buffer = Arc::new(te_core::HostBuffer::new(1 << 20).unwrap());
    engine
        .register_buffer(&buffer, "*", te_core::Permission::RemoteReadWrite)
        .unwrap();
    let out = swarm.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        json_field(&stdout, "verified"),
        2,
        "both blocks read back equal"
    );
    let written = buffer.to_vec(0, 8192).unwrap();
    assert!(
        written.iter().any(|&b| b != 0),
        "the swarm's blocks are in the buffer"
    );
}
