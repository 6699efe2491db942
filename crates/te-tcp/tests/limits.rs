//! The data listener's connection cap (`MC_TE_MAX_DATA_CONNECTIONS`): a peer over it is told
//! why, its task fails with an error that names the cap, the target keeps serving the peers it
//! holds, and a place freed is a place taken.

mod common;

use common::*;
use te_core::transport::SliceError;
use te_core::{Opcode, Permission, TransferState};

/// Held by each test here: the thread count is the process's, so the other test's engines
/// starting or ending beside it would move the count it compares.
static ALONE: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn a_peer_over_the_connection_cap_fails_naming_it_and_the_others_are_served() {
    let _alone = ALONE.lock().unwrap_or_else(|e| e.into_inner());
    let mut target_config = config();
    target_config.limits.max_data_connections = 1;
    let target = engine_with(target_config);
    let remote = buffer(1 << 20);
    register(&target, &remote, Permission::RemoteReadWrite);
    let one_lane = || {
        let mut c = config();
        c.retry_cnt = 1;
        engine_with_tcp(c, tcp(|t| t.lanes_per_peer = 1))
    };
    // The first peer takes the only place, and keeps it (its lane stays connected).
    let first = one_lane();
    let src = buffer(64 << 10);
    src.write_at(0, &pattern(7, 64 << 10)).unwrap();
    register(&first, &src, Permission::LocalOnly);
    let seg = first.open_segment(target.segment_name()).unwrap();
    let write = request(Opcode::Write, src.addr(), seg, remote.addr(), 64 << 10);
    assert_eq!(run(&first, &[write]), TransferState::Completed);
    assert_eq!(
        &remote.to_vec(0, 64 << 10).unwrap()[..],
        &pattern(7, 64 << 10)[..]
    );

    // The second is refused, and says why.
    let second = one_lane();
    let other = buffer(64 << 10);
    register(&second, &other, Permission::LocalOnly);
    let seg2 = second.open_segment(target.segment_name()).unwrap();
    let b = second.allocate_batch(1).unwrap();
    second
        .submit(
            b,
            &[request(
                Opcode::Write,
                other.addr(),
                seg2,
                remote.addr() + (64 << 10),
                64 << 10,
            )],
        )
        .unwrap();
    let status = second.wait(b, WAIT).unwrap();
    assert_eq!(status.state, TransferState::Failed);
    match second.task_error(b, 0).unwrap() {
        Some(SliceError::Busy(why)) => {
            assert!(why.contains("MC_TE_MAX_DATA_CONNECTIONS"), "{why}");
        }
        other => panic!("expected the target's refusal naming the cap, got {other:?}"),
    }
    second.free_batch(b).unwrap();
    assert!(
        remote
            .to_vec(64 << 10, 64 << 10)
            .unwrap()
            .iter()
            .all(|&b| b == 0),
        "nothing of the refused peer's landed"
    );

    // The first peer is still served.
    src.write_at(0, &pattern(8, 64 << 10)).unwrap();
    assert_eq!(run(&first, &[write]), TransferState::Completed);
    assert_eq!(
        &remote.to_vec(0, 64 << 10).unwrap()[..],
        &pattern(8, 64 << 10)[..]
    );

    // Once it goes, its place is the second peer's.
    drop(first);
    let deadline = std::time::Instant::now() + WAIT;
    let again = request(
        Opcode::Write,
        other.addr(),
        seg2,
        remote.addr() + (64 << 10),
        64 << 10,
    );
    other.write_at(0, &pattern(9, 64 << 10)).unwrap();
    while run(&second, &[again]) != TransferState::Completed {
        assert!(
            std::time::Instant::now() < deadline,
            "the freed place was never taken"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert_eq!(
        &remote.to_vec(64 << 10, 64 << 10).unwrap()[..],
        &pattern(9, 64 << 10)[..]
    );
}

fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").unwrap().count()
}

#[test]
fn an_initiator_reaching_many_peers_adds_no_threads() {
    let _alone = ALONE.lock().unwrap_or_else(|e| e.into_inner());
    let targets: Vec<_> = (0..8)
        .map(|_| {
            let t = engine();
            let b = buffer(1 << 20);
            register(&t, &b, Permission::RemoteReadWrite);
            (t, b)
        })
        .collect();
    let initiator = engine();
    let src = buffer(1 << 20);
    src.write_at(0, &pattern(3, 1 << 20)).unwrap();
    register(&initiator, &src, Permission::LocalOnly);
    let segments: Vec<u64> = targets
        .iter()
        .map(|(t, _)| initiator.open_segment(t.segment_name()).unwrap())
        .collect();
    let before = threads();
    // 1 MiB to each peer: 16 slices over its 4 lanes, so every lane connects.
    let writes: Vec<_> = targets
        .iter()
        .zip(&segments)
        .map(|((_, b), seg)| request(Opcode::Write, src.addr(), *seg, b.addr(), 1 << 20))
        .collect();
    assert_eq!(run(&initiator, &writes), TransferState::Completed);
    for (_, b) in &targets {
        assert_eq!(b.to_vec(0, 1 << 20).unwrap(), pattern(3, 1 << 20));
    }
    let connected = threads();
    assert_eq!(
        connected, before,
        "32 lanes to 8 peers (and the targets' 32 connections) added threads"
    );
}
