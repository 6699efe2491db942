//! The endpoint store on real sockets: 10 000 endpoint creations with capacity 64 leave no file
//! descriptor behind, and every transfer still lands.

mod common;

use std::time::{Duration, Instant};

use common::*;
use te_core::{Opcode, Permission, TransferState};

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count())
        .unwrap_or(0)
}

#[test]
fn ten_thousand_endpoint_creations_with_capacity_64_leak_no_descriptor() {
    const TARGETS: usize = 80;
    const CREATIONS: usize = 10_000;
    let targets: Vec<_> = (0..TARGETS)
        .map(|_| {
            let e = engine();
            let b = buffer(4096);
            register(&e, &b, Permission::RemoteReadWrite);
            (e, b)
        })
        .collect();
    let mut cfg = config();
    cfg.max_ep_per_ctx = 64;
    let before = open_fds();
    let e = engine_with_tcp(cfg, tcp(|t| t.lanes_per_peer = 1));
    let local = buffer(4096);
    register(&e, &local, Permission::LocalOnly);
    let segments: Vec<u64> = targets
        .iter()
        .map(|(t, _)| e.open_segment(t.segment_name()).unwrap())
        .collect();
    for i in 0..CREATIONS {
        // Round robin over more targets than the capacity: every transfer creates an endpoint
        // and evicts another.
        let t = i % TARGETS;
        let word = (i as u64).to_le_bytes();
        local.write_at(0, &word).unwrap();
        let w = request(
            Opcode::Write,
            local.addr(),
            segments[t],
            targets[t].1.addr(),
            8,
        );
        assert_eq!(run(&e, &[w]), TransferState::Completed, "transfer {i}");
        assert_eq!(
            targets[t].1.to_vec(0, 8).unwrap(),
            word,
            "transfer {i} landed"
        );
    }
    // Evicted endpoints close once drained; at most 64 stay open. Each holds four descriptors
    // here: the lane's socket and its receiver's clone, and, since the targets live in this
    // process, the accepted socket and the listener's clone kept to close it at shutdown.
    // The engine adds its two listeners.
    let bound = before + 4 * 64 + 2;
    let deadline = Instant::now() + Duration::from_secs(30);
    while open_fds() > bound && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let after = open_fds();
    assert!(
        after <= bound,
        "{after} descriptors open, {before} before: endpoints leaked"
    );
    drop(e);
    let deadline = Instant::now() + Duration::from_secs(30);
    while open_fds() > before && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        open_fds() <= before,
        "{} open after the engine is gone, {before} before",
        open_fds()
    );
}
