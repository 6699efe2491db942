//! Multi-rail over real sockets: two network namespaces joined by two rate-limited veth rails.
//! A 64 MiB WRITE and READ verify byte for byte, and each rail carries at least 30 % of the bytes;
//! with one rail taken down mid-transfer, the other carries the rest and the dead one is paused;
//! with 5 % packet loss on one rail, the transfer still completes.
//! Needs root and iproute2 (CI has both); elsewhere it says why and does nothing.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use te_core::{Opcode, Permission, TransferState};

#[path = "../../../xtask/src/netns.rs"]
#[allow(dead_code)]
mod netns;

const LEN: usize = 64 << 20;
const SEED: u64 = 4242;

fn child(hosts: &netns::TwoHosts, on_a: bool, test: &str) -> Command {
    let mut c = hosts.command(on_a, std::env::current_exe().unwrap().to_str().unwrap());
    c.args(te_testkit::self_test_args(test));
    c.env("TE_MULTIRAIL_CHILD", "1")
        .env("MC_TE_FILTERS", hosts.interfaces(on_a, 2));
    c
}

#[test]
#[ignore = "helper: started by two_rails_share_a_transfer inside host B"]
fn multirail_target() {
    if std::env::var("TE_MULTIRAIL_CHILD").is_err() {
        return;
    }
    let e = engine_with(te_core::Config::from_env().unwrap());
    assert_eq!(e.rails().len(), 2, "both veth rails serve: {:?}", e.rails());
    let buf = buffer(LEN);
    register(&e, &buf, Permission::RemoteReadWrite);
    println!("READY {} {}", e.segment_name(), buf.addr());
    let n = e
        .next_notify(Duration::from_secs(300))
        .map(|r| r.notification)
        .expect("verify request");
    assert_eq!(n.notify_msg, "verify");
    let ok = buf.to_vec(0, LEN).unwrap() == pattern(SEED, LEN);
    std::process::exit(if ok { 0 } else { 3 });
}

#[test]
#[ignore = "helper: started by two_rails_share_a_transfer inside host A"]
fn multirail_initiator() {
    let Ok(target) = std::env::var("TE_MULTIRAIL_TARGET") else {
        return;
    };
    let (name, remote) = target.split_once(' ').unwrap();
    let remote: u64 = remote.parse().unwrap();
    let e = engine_with(te_core::Config::from_env().unwrap());
    let local = buffer(LEN);
    register(&e, &local, Permission::LocalOnly);
    let seg = e.open_segment(name).unwrap();
    assert_eq!(e.segment(seg).unwrap().rail_names(), ["tb0", "tb1"]);
    let data = pattern(SEED, LEN);
    local.write_at(0, &data).unwrap();
    let w = request(Opcode::Write, local.addr(), seg, remote, LEN as u64);
    let b = e.allocate_batch(1).unwrap();
    e.submit(b, &[w]).unwrap();
    println!("STARTED");
    let s = e.wait(b, WAIT).unwrap();
    assert_eq!(
        s.state,
        TransferState::Completed,
        "{:?}",
        e.task_error(b, 0)
    );
    e.free_batch(b).unwrap();
    local.write_at(0, &vec![0u8; LEN]).unwrap();
    let r = request(Opcode::Read, local.addr(), seg, remote, LEN as u64);
    assert_eq!(run(&e, &[r]), TransferState::Completed);
    assert!(
        local.to_vec(0, LEN).unwrap() == data,
        "read back across two rails"
    );
    e.send_notify(
        name,
        &te_core::Notification {
            name: "mr".into(),
            notify_msg: "verify".into(),
        },
    )
    .unwrap();
    let stats = e.nic_load_stats();
    let line: Vec<String> = stats
        .iter()
        .map(|s| format!("{}={}/{}/{}", s.name, s.bytes_done, s.errors, s.paused))
        .collect();
    println!("RAILS {}", line.join(" "));
    assert!(stats.iter().all(|s| s.inflight_bytes == 0), "{stats:?}");
}

/// Two namespaces joined by two rails at `rate_mbit`, or `None` (saying why) where this machine
/// cannot make them.
fn two_hosts(tag: &str, rate_mbit: Option<u32>) -> Option<netns::TwoHosts> {
    if let Some(why) = netns::unavailable() {
        eprintln!("skipped: {why}");
        return None;
    }
    Some(netns::TwoHosts::create(tag, 2, rate_mbit).expect("two namespaces with two rails"))
}

/// A child process killed if the test fails before it exits.
struct Reap(std::process::Child);

impl Drop for Reap {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One rail's counters as the initiator printed them: (name, bytes, errors, paused).
type RailLine = (String, u64, u64, bool);

/// Runs a target in host B and an initiator in host A; `during` runs once the initiator's WRITE
/// is in flight. Returns the initiator's rail counters.
fn transfer_between(
    hosts: &netns::TwoHosts,
    status_timeout: &str,
    during: impl FnOnce(),
) -> Vec<RailLine> {
    let (target, ready) = te_testkit::spawn_ready(
        child(hosts, false, "multirail_target").env("MC_TCP_BIND_ADDRESS", "198.18.0.2"),
    );
    let mut target = Reap(target);
    let mut initiator = Reap(
        child(hosts, true, "multirail_initiator")
            .env("TE_MULTIRAIL_TARGET", &ready)
            .env("MC_TCP_BIND_ADDRESS", "198.18.0.1")
            .env("MC_TCP_STATUS_TIMEOUT_SEC", status_timeout)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut lines = BufReader::new(initiator.0.stdout.take().unwrap())
        .lines()
        .map_while(Result::ok);
    assert!(
        lines.by_ref().any(|l| l.contains("STARTED")),
        "initiator started its write"
    );
    during();
    let rails = lines.find_map(|l| l.split_once("RAILS ").map(|(_, r)| r.to_string()));
    assert!(
        initiator.0.wait().unwrap().success(),
        "initiator failed (see its output above)"
    );
    assert!(
        target.0.wait().unwrap().success(),
        "target found its memory wrong"
    );
    rails
        .expect("rail counters printed")
        .split_whitespace()
        .map(|kv| {
            let (name, v) = kv.split_once('=').unwrap();
            let f: Vec<&str> = v.split('/').collect();
            (
                name.to_string(),
                f[0].parse().unwrap(),
                f[1].parse().unwrap(),
                f[2] == "true",
            )
        })
        .collect()
}

#[test]
fn two_rails_share_a_transfer() {
    let Some(hosts) = two_hosts("mr", Some(400)) else {
        return;
    };
    let rails = transfer_between(&hosts, "30", || {});
    let total: u64 = rails.iter().map(|r| r.1).sum();
    eprintln!("rails (name, bytes, errors, paused): {rails:?}");
    assert_eq!(
        total,
        2 * LEN as u64,
        "every byte counted on some rail: {rails:?}"
    );
    assert_eq!(rails.len(), 2);
    for (name, bytes, errors, paused) in &rails {
        assert!(
            *bytes * 10 >= total * 3,
            "rail {name} carried {bytes} of {total} bytes"
        );
        assert!(
            *errors == 0 && !paused,
            "rail {name}: {errors} errors, paused {paused}"
        );
    }
}

#[test]
fn a_rail_taken_down_mid_transfer_leaves_the_other_to_finish() {
    let Some(hosts) = two_hosts("down", Some(200)) else {
        return;
    };
    let ns = hosts.a.clone();
    let rails = transfer_between(&hosts, "2", || {
        std::thread::sleep(Duration::from_millis(300));
        let down = Command::new("ip")
            .args(["-n", &ns, "link", "set", "ta1", "down"])
            .status()
            .unwrap();
        assert!(down.success());
    });
    eprintln!("rails (name, bytes, errors, paused): {rails:?}");
    let total: u64 = rails.iter().map(|r| r.1).sum();
    assert_eq!(
        total,
        2 * LEN as u64,
        "every byte landed, verified by both sides"
    );
    let (ta0, ta1) = (&rails[0], &rails[1]);
    assert_eq!((ta0.0.as_str(), ta1.0.as_str()), ("ta0", "ta1"));
    assert!(
        ta1.2 > 0 && ta1.3,
        "the dead rail has errors and is paused: {ta1:?}"
    );
    assert!(
        !ta0.3 && ta0.1 > ta1.1,
        "the live rail carried the rest: {ta0:?}"
    );
}

#[test]
fn five_percent_loss_on_one_rail_still_completes() {
    let Some(hosts) = two_hosts("loss", None) else {
        return;
    };
    hosts.add_loss(1, 5).expect("netem on rail 1");
    let rails = transfer_between(&hosts, "30", || {});
    eprintln!("rails (name, bytes, errors, paused): {rails:?}");
    let total: u64 = rails.iter().map(|r| r.1).sum();
    assert_eq!(
        total,
        2 * LEN as u64,
        "every byte landed, verified by both sides"
    );
}
