//! READ and WRITE between two OS processes: this test binary re-runs itself as the target.

mod common;

use std::process::Command;
use std::time::Duration;

use common::*;
use te_core::{Opcode, Permission, TransferEngine, TransferState};
use te_testkit::{self_test_args, spawn_ready};

const SIZES: [usize; 6] = [1, 4095, 65536, 65537, 1 << 20, 64 << 20];
const READ_SEED: u64 = 77;
const LEN: usize = 160 << 20;
const WRITE_BASE: usize = 72 << 20;

/// Where size `i` goes inside a region: packed, each start shifted off alignment.
fn slot(i: usize) -> usize {
    SIZES[..i].iter().map(|s| s + 4093).sum::<usize>() + 3
}

#[test]
#[ignore = "helper: started by two_processes as the target process"]
fn child_target() {
    if std::env::var("TE_CHILD_TARGET").is_err() {
        return;
    }
    let e = engine();
    let buf = buffer(LEN);
    buf.write_at(0, &pattern(READ_SEED, WRITE_BASE)).unwrap();
    register(&e, &buf, Permission::RemoteReadWrite);
    println!("READY {} {}", e.segment_name(), buf.addr());
    let n = e
        .next_notify(Duration::from_secs(120))
        .map(|r| r.notification)
        .expect("verify request");
    assert_eq!(n.notify_msg, "verify");
    for (i, &len) in SIZES.iter().enumerate() {
        let got = buf.to_vec(WRITE_BASE + slot(i), len).unwrap();
        if got != pattern(100 + i as u64, len) {
            eprintln!("write of {len} bytes did not land intact");
            std::process::exit(3);
        }
    }
    std::process::exit(0);
}

#[test]
fn two_processes() {
    let (mut child, ready) = spawn_ready(
        Command::new(std::env::current_exe().unwrap())
            .args(self_test_args("child_target"))
            .env("TE_CHILD_TARGET", "1"),
    );
    let mut parts = ready.split_whitespace();
    let name = parts.next().unwrap().to_string();
    let remote: u64 = parts.next().unwrap().parse().unwrap();

    let e = engine();
    let local = buffer(LEN);
    register(&e, &local, Permission::LocalOnly);
    let seg = e.open_segment(&name).unwrap();
    let expected = pattern(READ_SEED, WRITE_BASE);
    for (i, &len) in SIZES.iter().enumerate() {
        let at = slot(i);
        let r = request(
            Opcode::Read,
            local.addr() + at as u64 + 1,
            seg,
            remote + at as u64,
            len as u64,
        );
        assert_eq!(run(&e, &[r]), TransferState::Completed, "read {len}");
        assert!(
            local.to_vec(at + 1, len).unwrap() == expected[at..at + len],
            "read {len} across processes"
        );
    }
    for (i, &len) in SIZES.iter().enumerate() {
        let at = slot(i);
        let data = pattern(100 + i as u64, len);
        local.write_at(at, &data).unwrap();
        let w = request(
            Opcode::Write,
            local.addr() + at as u64,
            seg,
            remote + (WRITE_BASE + at) as u64,
            len as u64,
        );
        assert_eq!(run(&e, &[w]), TransferState::Completed, "write {len}");
    }
    let n = te_core::Notification {
        name: e.segment_name().into(),
        notify_msg: "verify".into(),
    };
    e.send_notify(&name, &n).unwrap();
    let status = child.wait().unwrap();
    assert!(
        status.success(),
        "the target process found its memory wrong: {status}"
    );
}

#[test]
#[ignore = "helper: started by a_killed_peer_fails_fast_and_a_restarted_one_serves_again"]
fn child_idle_target() {
    let Ok(name) = std::env::var("TE_CHILD_IDLE_TARGET") else {
        return;
    };
    let e = TransferEngine::init(config(), "P2PHANDSHAKE", &name).unwrap();
    e.install_transport(std::sync::Arc::new(te_tcp::TcpTransport::new()))
        .unwrap();
    let buf = buffer(64 << 20);
    register(&e, &buf, Permission::RemoteReadWrite);
    println!("READY {} {}", e.segment_name(), buf.addr());
    std::thread::sleep(Duration::from_secs(120));
}

/// Starts the idle target serving as `name`; returns it and its buffer address.
fn idle_target(name: &str) -> (std::process::Child, u64) {
    let (child, ready) = spawn_ready(
        Command::new(std::env::current_exe().unwrap())
            .args(self_test_args("child_idle_target"))
            .env("TE_CHILD_IDLE_TARGET", name),
    );
    let (got, addr) = ready.split_once(' ').unwrap();
    assert_eq!(got, name);
    (child, addr.parse().unwrap())
}

#[test]
fn a_killed_peer_fails_fast_and_a_restarted_one_serves_again() {
    // The peer restarts on the same port later: take one below the kernel's ephemeral range
    // (32768 and up), so no outgoing connection of a parallel test can hold it meanwhile.
    let port = te_testkit::services::free_port();
    let name = format!("127.0.0.1:{port}");
    let (mut peer, remote) = idle_target(&name);
    let mut cfg = config();
    cfg.retry_cnt = 2;
    let e = engine_with_tcp(cfg, tcp(|t| t.status_timeout = Duration::from_secs(2)));
    let local = buffer(64 << 20);
    register(&e, &local, Permission::LocalOnly);
    let seg = e.open_segment(&name).unwrap();
    let small = request(Opcode::Write, local.addr(), seg, remote, 1 << 20);
    assert_eq!(run(&e, &[small]), TransferState::Completed);

    // SIGKILL mid-transfer: every task ends FAILED, promptly, with nothing left in flight.
    let b = e.allocate_batch(4).unwrap();
    let big: Vec<_> = (0..4u64)
        .map(|i| {
            request(
                Opcode::Write,
                local.addr() + i * (16 << 20),
                seg,
                remote + i * (16 << 20),
                16 << 20,
            )
        })
        .collect();
    e.submit(b, &big).unwrap();
    peer.kill().unwrap();
    peer.wait().unwrap();
    let started = std::time::Instant::now();
    let s = e.wait(b, Duration::from_secs(60)).expect("no hang");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "failed in {:?}",
        started.elapsed()
    );
    assert_eq!(s.state, TransferState::Failed);
    for t in 0..4 {
        let st = e.task_status(b, t).unwrap().state;
        assert!(
            matches!(st, TransferState::Failed | TransferState::Completed),
            "task {t}: {st:?}"
        );
    }
    e.free_batch(b).unwrap();
    assert_eq!(e.nic_load_stats()[0].inflight_bytes, 0);

    // The engine still serves another peer.
    let other = engine();
    let other_buf = buffer(1 << 20);
    register(&other, &other_buf, Permission::RemoteReadWrite);
    let other_seg = e.open_segment(other.segment_name()).unwrap();
    local.write_at(0, &pattern(9, 1 << 20)).unwrap();
    let w = request(
        Opcode::Write,
        local.addr(),
        other_seg,
        other_buf.addr(),
        1 << 20,
    );
    assert_eq!(run(&e, &[w]), TransferState::Completed);
    assert!(other_buf.to_vec(0, 1 << 20).unwrap() == pattern(9, 1 << 20));

    // The peer restarts under the same name (new secret, new data port, new buffer address):
    // the next transfer to the same segment id fetches the new descriptor and works.
    let (mut peer, remote) = idle_target(&name);
    let w = request(Opcode::Write, local.addr(), seg, remote, 1 << 20);
    assert_eq!(run(&e, &[w]), TransferState::Completed);
    local.write_at(0, &vec![0u8; 1 << 20]).unwrap();
    let r = request(Opcode::Read, local.addr(), seg, remote, 1 << 20);
    assert_eq!(run(&e, &[r]), TransferState::Completed);
    assert!(
        local.to_vec(0, 1 << 20).unwrap() == pattern(9, 1 << 20),
        "read back from the restarted peer"
    );
    peer.kill().unwrap();
    peer.wait().unwrap();
}
