//! Byte-verified READ and WRITE between real engines over loopback TCP.

mod common;

use common::*;
use te_core::{Opcode, Permission, TransferState};

const SIZES: [usize; 6] = [1, 4095, 65536, 65537, 1 << 20, 64 << 20];
const OFFSETS: [usize; 3] = [0, 1, 4093];

/// Moves `len` pattern bytes from the source side to the destination side with `op`, then checks
/// every byte and the sentinel bytes right before and after the destination range.
fn check_transfer(
    p: &Pair,
    op: Opcode,
    local_off: usize,
    remote_off: usize,
    len: usize,
    seed: u64,
) {
    let (src, src_off, dst, dst_off) = match op {
        Opcode::Write => (&p.local, local_off, &p.remote, remote_off),
        _ => (&p.remote, remote_off, &p.local, local_off),
    };
    let data = pattern(seed, len);
    src.write_at(src_off, &data).unwrap();
    if dst_off > 0 {
        dst.write_at(dst_off - 1, &[0xee]).unwrap();
    }
    dst.write_at(dst_off + len, &[0xee]).unwrap();
    let req = request(
        op,
        p.local.addr() + local_off as u64,
        p.segment,
        p.remote.addr() + remote_off as u64,
        len as u64,
    );
    assert_eq!(
        run(&p.initiator, &[req]),
        TransferState::Completed,
        "{op:?} {len}@{local_off}"
    );
    // Completed means the bytes are at the destination now (for a WRITE: in the target's memory).
    assert!(
        dst.to_vec(dst_off, len).unwrap() == data,
        "{op:?} {len}@{local_off} corrupted"
    );
    if dst_off > 0 {
        assert_eq!(
            dst.to_vec(dst_off - 1, 1).unwrap(),
            [0xee],
            "{op:?}: byte before clobbered"
        );
    }
    assert_eq!(
        dst.to_vec(dst_off + len, 1).unwrap(),
        [0xee],
        "{op:?}: byte after clobbered"
    );
}

#[test]
fn write_and_read_are_byte_exact_across_sizes_and_alignments() {
    let p = pair((64 << 20) + 8192);
    for (i, &len) in SIZES.iter().enumerate() {
        for &off in &OFFSETS {
            let seed = (i * 10 + off) as u64;
            let remote_off = (off * 3) % 4096;
            check_transfer(&p, Opcode::Write, off, remote_off, len, seed);
            check_transfer(&p, Opcode::Read, off, remote_off, len, seed + 1000);
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
    // The single loopback rail carried every byte and has nothing left in flight.
    let stats = p.initiator.nic_load_stats();
    assert_eq!(stats.len(), 1, "{stats:?}");
    assert_eq!(
        (
            stats[0].name.as_str(),
            stats[0].inflight_bytes,
            stats[0].errors
        ),
        ("lo", 0, 0)
    );
    assert_eq!(stats[0].bytes_done, total);
    assert!(!stats[0].paused);
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
fn notifications_probes_and_a_submit_that_notifies() {
    let p = pair(1 << 20);
    let n = te_core::Notification {
        name: "init".into(),
        notify_msg: "hello".into(),
    };
    p.initiator
        .send_notify(p.target.segment_name(), &n)
        .unwrap();
    assert_eq!(p.target.next_notify(WAIT).map(|r| r.notification), Some(n));

    let data = pattern(5, 300_000);
    p.local.write_at(0, &data).unwrap();
    let b = p.initiator.allocate_batch(1).unwrap();
    let done = te_core::Notification {
        name: "init".into(),
        notify_msg: "kv ready".into(),
    };
    p.initiator
        .submit_with(
            b,
            &[request(
                Opcode::Write,
                p.local.addr(),
                p.segment,
                p.remote.addr(),
                data.len() as u64,
            )],
            &te_core::SubmitOptions::default().notifying(done.clone()),
        )
        .unwrap();
    // Delivered by the engine when the batch completes; nobody polls the batch here.
    let got = p
        .target
        .next_notify(WAIT)
        .map(|r| r.notification)
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

/// A segment named without a port (as Mooncake users name peers) is found at
/// `MC_HANDSHAKE_PORT`, and bytes move to it.
#[test]
fn a_segment_named_without_a_port_is_found_at_the_handshake_port() {
    let target = engine();
    let remote = buffer(1 << 20);
    register(&target, &remote, Permission::RemoteReadWrite);
    let port = target
        .segment_name()
        .rsplit_once(':')
        .unwrap()
        .1
        .parse()
        .unwrap();
    let mut c = config();
    c.handshake_port = port;
    let initiator = engine_with(c);
    let local = buffer(1 << 20);
    register(&initiator, &local, Permission::LocalOnly);
    let seg = initiator.open_segment("127.0.0.1").unwrap();
    let data = pattern(3, 1 << 20);
    local.write_at(0, &data).unwrap();
    let w = request(Opcode::Write, local.addr(), seg, remote.addr(), 1 << 20);
    assert_eq!(run(&initiator, &[w]), TransferState::Completed);
    assert_eq!(remote.to_vec(0, 1 << 20).unwrap(), data);
}

#[test]
fn memory_the_peer_registers_after_it_was_opened_is_reachable() {
    let p = pair(1 << 20);
    let data = pattern(77, 8192);
    p.local.write_at(0, &data).unwrap();
    // The initiator's descriptor of the target predates this buffer.
    let later = buffer(8192);
    register(&p.target, &later, Permission::RemoteReadWrite);
    let req = request(Opcode::Write, p.local.addr(), p.segment, later.addr(), 8192);
    assert_eq!(run(&p.initiator, &[req]), TransferState::Completed);
    assert!(later.to_vec(0, 8192).unwrap() == data);
    // And the next one, at once (a peer registering buffer after buffer is followed).
    let next = buffer(8192);
    register(&p.target, &next, Permission::RemoteReadWrite);
    let req = request(Opcode::Write, p.local.addr(), p.segment, next.addr(), 8192);
    assert_eq!(run(&p.initiator, &[req]), TransferState::Completed);
    assert!(next.to_vec(0, 8192).unwrap() == data);
    // A range the peer has not registered is still refused, after the fetch.
    let outside = request(
        Opcode::Write,
        p.local.addr(),
        p.segment,
        later.addr() + 8192,
        1,
    );
    let b = p.initiator.allocate_batch(1).unwrap();
    let err = p.initiator.submit(b, &[outside]).unwrap_err();
    assert!(
        matches!(err, te_core::Error::RemoteAddressNotRegistered { .. }),
        "{err}"
    );
    p.initiator.free_batch(b).unwrap();
}

/// A READ's data leaves the target's region before the target lets go of it: unregistering
/// the region right after the READ completed (here, in the same process as the initiator,
/// where the two moments are closest) waits for that instead of failing busy.
#[test]
fn a_region_read_from_unregisters_right_after_the_read_completes() {
    let p = pair(64 << 10);
    let data = pattern(9, 64 << 10);
    p.remote.write_at(0, &data).unwrap();
    // Threads that keep every core busy, so that the target's thread is often preempted
    // between sending a READ's last bytes and letting go of its region.
    let stop = std::sync::atomic::AtomicBool::new(false);
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    std::thread::scope(|s| {
        for _ in 0..cores {
            s.spawn(|| {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            });
        }
        // Stops them on the way out, a failure's too (the scope waits for them first).
        let _stop = StopOnDrop(&stop);
        reads_then_unregisters(&p, 1000);
    });
    assert!(p.local.to_vec(0, 64 << 10).unwrap() == data);
}

struct StopOnDrop<'a>(&'a std::sync::atomic::AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

fn reads_then_unregisters(p: &Pair, rounds: usize) {
    for round in 0..rounds {
        let req = request(
            Opcode::Read,
            p.local.addr(),
            p.segment,
            p.remote.addr(),
            64 << 10,
        );
        assert_eq!(run(&p.initiator, &[req]), TransferState::Completed);
        if let Err(e) = p.target.unregister_memory(p.remote.addr()) {
            panic!("round {round}: unregistering right after a completed READ: {e}");
        }
        register(&p.target, &p.remote, Permission::RemoteReadWrite);
    }
}
