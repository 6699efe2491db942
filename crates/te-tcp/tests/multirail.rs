//! Multi-rail over real sockets: two network namespaces joined by two rate-limited veth rails.
//! A 64 MiB WRITE and READ verify byte for byte, and each rail carries at least 30 % of the bytes.
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
    c.args([
        "--exact",
        test,
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ]);
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
        .recv_notification(Duration::from_secs(300))
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
    assert_eq!(run(&e, &[w]), TransferState::Completed);
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
        .map(|s| format!("{}={}", s.name, s.bytes_done))
        .collect();
    println!("RAILS {}", line.join(" "));
    assert!(
        stats.iter().all(|s| s.inflight_bytes == 0 && s.errors == 0),
        "{stats:?}"
    );
}

#[test]
fn two_rails_share_a_transfer() {
    if let Some(why) = netns::unavailable() {
        eprintln!("skipped: {why}");
        return;
    }
    let hosts = netns::TwoHosts::create("mr", 2, Some(400)).expect("two namespaces with two rails");
    let mut target = child(&hosts, false, "multirail_target")
        .env("MC_TCP_BIND_ADDRESS", "198.18.0.2")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let ready = BufReader::new(target.stdout.take().unwrap())
        .lines()
        .map_while(Result::ok)
        .find_map(|l| l.split_once("READY ").map(|(_, r)| r.to_string()))
        .expect("target ready");
    let out = child(&hosts, true, "multirail_initiator")
        .env("TE_MULTIRAIL_TARGET", &ready)
        .env("MC_TCP_BIND_ADDRESS", "198.18.0.1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "initiator failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        target.wait().unwrap().success(),
        "target found its memory wrong"
    );
    let rails: Vec<(String, u64)> = stdout
        .lines()
        .find_map(|l| l.split_once("RAILS ").map(|(_, r)| r.to_string()))
        .expect("rail counters printed")
        .split_whitespace()
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap();
            (k.to_string(), v.parse().unwrap())
        })
        .collect();
    let total: u64 = rails.iter().map(|r| r.1).sum();
    eprintln!("bytes per rail: {rails:?}");
    assert_eq!(
        total,
        2 * LEN as u64,
        "every byte counted on some rail: {rails:?}"
    );
    assert_eq!(rails.len(), 2);
    for (name, bytes) in &rails {
        assert!(
            *bytes * 10 >= total * 3,
            "rail {name} carried {bytes} of {total} bytes"
        );
    }
}
