//! Synchronous calls (`SubmitOptions::waited`): a lone small slice on a connected, idle lane is
//! carried out on the submitting thread, so `submit_with` returns with it done. Bytes are
//! compared, the path is mixed with pipelined traffic from other threads, and a peer that goes
//! away mid-call fails the call instead of hanging it.

mod common;

use std::time::Duration;

use common::*;
use te_core::{Opcode, SubmitOptions, TransferState};

/// Submits `req` as a synchronous call; the state right after `submit_with` returned, and the
/// final one.
fn sync_call(
    e: &te_core::TransferEngine,
    req: te_core::TransferRequest,
) -> (TransferState, TransferState) {
    let b = e.allocate_batch(1).unwrap();
    let options = SubmitOptions::default().waited();
    e.submit_with(b, &[req], &options).unwrap();
    let at_return = e.batch_status(b).unwrap().state;
    let end = e.wait(b, WAIT).unwrap().state;
    e.free_batch(b).unwrap();
    (at_return, end)
}

#[test]
fn a_small_synchronous_call_on_an_idle_lane_is_done_when_submit_returns() {
    let p = pair(1 << 20);
    // The first call connects the lane (on its event loop).
    let warm = request(Opcode::Write, p.local.addr(), p.segment, p.remote.addr(), 8);
    assert_eq!(sync_call(&p.initiator, warm).1, TransferState::Completed);
    for (i, (op, len, off)) in [
        (Opcode::Write, 1usize, 0usize),
        (Opcode::Write, 4096, 17),
        (Opcode::Read, 4095, 3),
        (Opcode::Write, 64 << 10, 4096),
        (Opcode::Read, 64 << 10, 0),
    ]
    .into_iter()
    .enumerate()
    {
        let data = pattern(i as u64 + 40, len);
        let (src, dst) = match op {
            Opcode::Write => (&p.local, &p.remote),
            _ => (&p.remote, &p.local),
        };
        src.write_at(off, &data).unwrap();
        dst.write_at(off, &vec![0u8; len]).unwrap();
        dst.write_at(off + len, &[0xee]).unwrap();
        let req = request(
            op,
            p.local.addr() + off as u64,
            p.segment,
            p.remote.addr() + off as u64,
            len as u64,
        );
        let (at_return, end) = sync_call(&p.initiator, req);
        assert_eq!(
            at_return,
            TransferState::Completed,
            "{op:?} {len}: done on return"
        );
        assert_eq!(end, TransferState::Completed);
        assert!(
            dst.to_vec(off, len).unwrap() == data,
            "{op:?} {len} corrupted"
        );
        assert_eq!(
            dst.to_vec(off + len, 1).unwrap(),
            [0xee],
            "{op:?} {len}: byte after"
        );
    }
    // Larger than a lone small slice: posted to the lanes as usual, and still byte exact.
    let len = (64 << 10) + 1;
    let data = pattern(99, len);
    p.local.write_at(0, &data).unwrap();
    let req = request(
        Opcode::Write,
        p.local.addr(),
        p.segment,
        p.remote.addr(),
        len as u64,
    );
    assert_eq!(sync_call(&p.initiator, req).1, TransferState::Completed);
    assert!(p.remote.to_vec(0, len).unwrap() == data);
}

#[test]
fn synchronous_calls_mix_with_pipelined_batches_from_other_threads() {
    let p = pair(16 << 20);
    let threads = 6;
    let per = (16 << 20) / (threads + 1);
    std::thread::scope(|s| {
        for t in 0..threads {
            let p = &p;
            s.spawn(move || {
                for round in 0..200u64 {
                    let len = 1 + (round as usize * 977 + t * 131) % (16 << 10);
                    let base = t * per;
                    let data = pattern(round * 31 + t as u64, len);
                    p.local.write_at(base, &data).unwrap();
                    let w = request(
                        Opcode::Write,
                        p.local.addr() + base as u64,
                        p.segment,
                        p.remote.addr() + base as u64,
                        len as u64,
                    );
                    assert_eq!(sync_call(&p.initiator, w).1, TransferState::Completed);
                    p.local.write_at(base, &vec![0u8; len]).unwrap();
                    let r = request(
                        Opcode::Read,
                        p.local.addr() + base as u64,
                        p.segment,
                        p.remote.addr() + base as u64,
                        len as u64,
                    );
                    assert_eq!(sync_call(&p.initiator, r).1, TransferState::Completed);
                    assert!(
                        p.local.to_vec(base, len).unwrap() == data,
                        "thread {t} round {round}"
                    );
                }
            });
        }
        // Meanwhile one thread streams large pipelined batches through the same lanes.
        let p = &p;
        s.spawn(move || {
            let base = threads * per;
            for round in 0..10u64 {
                let data = pattern(7000 + round, per);
                p.local.write_at(base, &data).unwrap();
                let reqs: Vec<_> = (0..8)
                    .map(|k| {
                        let chunk = (per / 8) as u64;
                        request(
                            Opcode::Write,
                            p.local.addr() + base as u64 + k * chunk,
                            p.segment,
                            p.remote.addr() + base as u64 + k * chunk,
                            chunk,
                        )
                    })
                    .collect();
                assert_eq!(run(&p.initiator, &reqs), TransferState::Completed);
                let chunk = per / 8 * 8;
                assert!(p.remote.to_vec(base, chunk).unwrap() == data[..chunk]);
            }
        });
    });
}

#[test]
fn a_synchronous_call_to_a_peer_that_went_away_fails_instead_of_hanging() {
    let Pair {
        initiator,
        target,
        local,
        remote,
        segment,
    } = pair(1 << 20);
    let req = request(Opcode::Write, local.addr(), segment, remote.addr(), 4096);
    let e = &initiator;
    let b = e.allocate_batch(1).unwrap();
    e.submit_with(b, &[req], &SubmitOptions::default().waited())
        .unwrap();
    assert_eq!(e.wait(b, WAIT).unwrap().state, TransferState::Completed);
    e.free_batch(b).unwrap();
    // The lane is connected and idle; the target goes away.
    target.shutdown();
    drop(target);
    drop(remote);
    let b = e.allocate_batch(1).unwrap();
    let options = SubmitOptions::default()
        .waited()
        .within(Duration::from_secs(20));
    e.submit_with(b, &[req], &options).unwrap();
    let state = e.wait(b, WAIT).unwrap().state;
    assert!(
        matches!(state, TransferState::Failed | TransferState::Timeout),
        "a write to a closed peer ended {state:?}"
    );
    let detail = e.task_error(b, 0).unwrap();
    assert!(detail.is_some(), "the failed task says why");
    e.free_batch(b).unwrap();
    // The initiator still works, with a new peer.
    let target2 = engine();
    let remote2 = buffer(1 << 20);
    register(&target2, &remote2, te_core::Permission::RemoteReadWrite);
    let segment2 = e.open_segment(target2.segment_name()).unwrap();
    let data = pattern(5, 4096);
    local.write_at(0, &data).unwrap();
    for _ in 0..3 {
        let req = request(Opcode::Write, local.addr(), segment2, remote2.addr(), 4096);
        assert_eq!(sync_call(e, req).1, TransferState::Completed);
    }
    assert!(remote2.to_vec(0, 4096).unwrap() == data);
}
