//! Byte-verified READ and WRITE between real engines over loopback TCP.

mod common;

use common::*;
use te_core::{Opcode, TransferState};

const SIZES: [usize; 6] = [1, 4095, 65536, 65537, 1 << 20, 64 << 20];
const OFFSETS: [usize; 3] = [0, 1, 4093];

#[test]
fn write_and_read_are_byte_exact_across_sizes_and_alignments() {
    let span = (64 << 20) + 8192;
    let p = pair(span);
    let guard = vec![0xeeu8; 8192];
    for (i, &len) in SIZES.iter().enumerate() {
        for &off in &OFFSETS {
            let seed = (i * 10 + off) as u64;
            // WRITE: local pattern → remote, surrounded by guard bytes that must stay.
            p.remote.write_at(0, &guard).unwrap();
            p.remote.write_at(span - guard.len(), &guard).unwrap();
            let data = pattern(seed, len);
            p.local.write_at(off, &data).unwrap();
            let remote_off = (off * 3) % 4096;
            if remote_off > 0 {
                p.remote.write_at(remote_off - 1, &[0xee]).unwrap();
            }
            p.remote.write_at(remote_off + len, &[0xee]).unwrap();
            let req = request(
                Opcode::Write,
                p.local.addr() + off as u64,
                p.segment,
                p.remote.addr() + remote_off as u64,
                len as u64,
            );
            assert_eq!(
                run(&p.initiator, &[req]),
                TransferState::Completed,
                "write {len}@{off}"
            );
            // Completed means the bytes are in the target's memory now.
            assert!(
                p.remote.to_vec(remote_off, len).unwrap() == data,
                "write {len}@{off} corrupted"
            );
            if remote_off > 0 {
                assert_eq!(
                    p.remote.to_vec(remote_off - 1, 1).unwrap(),
                    [0xee],
                    "byte before clobbered"
                );
            }
            assert_eq!(
                p.remote.to_vec(remote_off + len, 1).unwrap(),
                [0xee],
                "byte after clobbered"
            );

            // READ: remote pattern → local.
            let data = pattern(seed + 1000, len);
            p.remote.write_at(remote_off, &data).unwrap();
            p.local.write_at(off + len, &[0x5a]).unwrap();
            let req = request(
                Opcode::Read,
                p.local.addr() + off as u64,
                p.segment,
                p.remote.addr() + remote_off as u64,
                len as u64,
            );
            assert_eq!(
                run(&p.initiator, &[req]),
                TransferState::Completed,
                "read {len}@{off}"
            );
            assert!(
                p.local.to_vec(off, len).unwrap() == data,
                "read {len}@{off} corrupted"
            );
            assert_eq!(
                p.local.to_vec(off + len, 1).unwrap(),
                [0x5a],
                "read overran"
            );
        }
    }
}

#[test]
fn many_tasks_in_one_batch() {
    let p = pair(8 << 20);
    let n = 512;
    let mut reqs = Vec::new();
    let mut expected = Vec::new();
    for i in 0..n {
        let len = 1 + (i * 7919) % 16000;
        let at = i * 16384;
        let data = pattern(i as u64, len);
        p.local.write_at(at, &data).unwrap();
        reqs.push(request(
            Opcode::Write,
            p.local.addr() + at as u64,
            p.segment,
            p.remote.addr() + at as u64,
            len as u64,
        ));
        expected.push((at, data));
    }
    let b = p.initiator.allocate_batch(n).unwrap();
    p.initiator.submit(b, &reqs[..n / 2]).unwrap();
    p.initiator.submit(b, &reqs[n / 2..]).unwrap();
    let status = p.initiator.wait(b, WAIT).unwrap();
    assert_eq!(status.state, TransferState::Completed);
    let total: u64 = reqs.iter().map(|r| r.length).sum();
    assert_eq!(status.transferred_bytes, total);
    for i in 0..n {
        assert_eq!(
            p.initiator.task_status(b, i).unwrap().state,
            TransferState::Completed
        );
    }
    p.initiator.free_batch(b).unwrap();
    for (at, data) in expected {
        assert!(
            p.remote.to_vec(at, data.len()).unwrap() == data,
            "task at {at}"
        );
    }
}

#[test]
fn concurrent_batches_from_several_threads() {
    let p = pair(32 << 20);
    let threads = 4;
    let per = (32 << 20) / threads;
    std::thread::scope(|s| {
        for t in 0..threads {
            let p = &p;
            s.spawn(move || {
                for round in 0..8u64 {
                    let base = t * per;
                    let data = pattern(round * 100 + t as u64, per);
                    p.local.write_at(base, &data).unwrap();
                    let w = request(
                        Opcode::Write,
                        p.local.addr() + base as u64,
                        p.segment,
                        p.remote.addr() + base as u64,
                        per as u64,
                    );
                    assert_eq!(run(&p.initiator, &[w]), TransferState::Completed);
                    p.local.write_at(base, &vec![0u8; per]).unwrap();
                    let r = request(
                        Opcode::Read,
                        p.local.addr() + base as u64,
                        p.segment,
                        p.remote.addr() + base as u64,
                        per as u64,
                    );
                    assert_eq!(run(&p.initiator, &[r]), TransferState::Completed);
                    assert!(
                        p.local.to_vec(base, per).unwrap() == data,
                        "thread {t} round {round}"
                    );
                }
            });
        }
    });
}

#[test]
fn notifications_probes_and_submit_with_notify() {
    let p = pair(1 << 20);
    let n = te_core::Notification {
        name: "init".into(),
        notify_msg: "hello".into(),
    };
    p.initiator
        .send_notify(p.target.segment_name(), &n)
        .unwrap();
    assert_eq!(p.target.recv_notification(WAIT), Some(n));

    let data = pattern(5, 300_000);
    p.local.write_at(0, &data).unwrap();
    let b = p.initiator.allocate_batch(1).unwrap();
    let done = te_core::Notification {
        name: "init".into(),
        notify_msg: "kv ready".into(),
    };
    p.initiator
        .submit_with_notify(
            b,
            &[request(
                Opcode::Write,
                p.local.addr(),
                p.segment,
                p.remote.addr(),
                data.len() as u64,
            )],
            done.clone(),
        )
        .unwrap();
    // Delivered by the engine when the batch completes; nobody polls the batch here.
    let got = p
        .target
        .recv_notification(WAIT)
        .expect("completion notification");
    assert_eq!(got, done);
    // The notification follows the data: the bytes are readable when it arrives.
    assert!(p.remote.to_vec(0, data.len()).unwrap() == data);
    assert_eq!(
        p.initiator.wait(b, WAIT).unwrap().state,
        TransferState::Completed
    );
    p.initiator.free_batch(b).unwrap();

    assert_eq!(
        p.initiator.probe(p.target.segment_name()),
        te_core::PeerLiveness::Alive
    );
    let gone = p.target.segment_name().to_string();
    drop(p.target);
    assert_eq!(p.initiator.probe(&gone), te_core::PeerLiveness::Unreachable);
}
