//! READ and WRITE between two OS processes: this test binary re-runs itself as the target.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use te_core::{Opcode, Permission, TransferState};

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
        .recv_notification(Duration::from_secs(120))
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
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_target",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("TE_CHILD_TARGET", "1")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let ready = lines
        .by_ref()
        .map_while(Result::ok)
        .find_map(|l| l.split_once("READY ").map(|(_, rest)| rest.to_string()))
        .expect("child prints READY");
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
