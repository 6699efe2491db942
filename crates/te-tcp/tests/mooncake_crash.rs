//! te and the real Mooncake engine (PyPI wheel) when the Mooncake side dies mid-transfer
//! (SIGKILL, as a crash ends it): no task is left hanging or reported done wholesale, no pin
//! outlives the connection, and te goes on moving bytes with the next peer, every byte
//! compared.

mod common;

use std::time::{Duration, Instant};

use common::*;
use te_core::{Opcode, Permission, TransferState};
use te_testkit::assert_same_bytes;
use te_testkit::mooncake::MooncakePeer;

const MIB: usize = 1 << 20;

/// te writes (or reads) a batch to (from) a Mooncake target that is killed right after the
/// submit: the batch ends (no hang) FAILED with every task terminal and not all of them done,
/// te's region is free to unregister once the batch is freed, and a new Mooncake target is
/// written and read back in full.
fn target_killed_mid_batch(opcode: Opcode) {
    let blocks = 64;
    let te = engine();
    let local = buffer(blocks * MIB);
    local.write_at(0, &pattern(61, blocks * MIB)).unwrap();
    register(&te, &local, Permission::LocalOnly);

    let mut doomed = MooncakePeer::start("127.0.0.1", "P2PHANDSHAKE", &[]);
    let remote = doomed.alloc(blocks * MIB);
    let seg = te.open_segment(&doomed.name).unwrap();
    // 1 GiB, 16 times round both buffers: a batch that outlasts a slow kill.
    let tasks = blocks * 16;
    let batch_requests: Vec<_> = (0..tasks)
        .map(|i| {
            let off = ((i % blocks) * MIB) as u64;
            request(opcode, local.addr() + off, seg, remote + off, MIB as u64)
        })
        .collect();
    let batch = te.allocate_batch(tasks).unwrap();
    te.submit(batch, &batch_requests).unwrap();
    doomed.kill();

    let status = te.wait(batch, WAIT).expect("the batch ends, not hangs");
    assert_eq!(
        status.state,
        TransferState::Failed,
        "a batch whose target died cannot have completed"
    );
    let done = (0..tasks)
        .filter(|&i| {
            let task = te.task_status(batch, i).unwrap();
            assert!(
                matches!(task.state, TransferState::Completed | TransferState::Failed),
                "task {i} is {:?} after the batch ended",
                task.state
            );
            task.state == TransferState::Completed
        })
        .count();
    assert!(done < tasks, "every task reported done by a dead target");
    te.free_batch(batch).unwrap();
    te.unregister_memory(local.addr())
        .expect("no failed task keeps te's region pinned");

    // The next Mooncake target: written and read back whole.
    register(&te, &local, Permission::LocalOnly);
    let mut next = MooncakePeer::start("127.0.0.1", "P2PHANDSHAKE", &[]);
    let len = 8 * MIB;
    let remote = next.alloc(len);
    let seg = te.open_segment(&next.name).unwrap();
    let data = pattern(62, len);
    local.write_at(0, &data).unwrap();
    let write = request(Opcode::Write, local.addr(), seg, remote, len as u64);
    assert_eq!(run(&te, &[write]), TransferState::Completed);
    assert_same_bytes(&next.get(remote, len), &data, "the next target's memory");
    let back = pattern(63, len);
    next.put(remote, &back);
    let read = request(Opcode::Read, local.addr(), seg, remote, len as u64);
    assert_eq!(run(&te, &[read]), TransferState::Completed);
    assert_same_bytes(&local.to_vec(0, len).unwrap(), &back, "read back by te");
}

#[test]
fn a_mooncake_target_killed_mid_write_batch_fails_the_batch_and_te_goes_on() {
    target_killed_mid_batch(Opcode::Write);
}

#[test]
fn a_mooncake_target_killed_mid_read_batch_fails_the_batch_and_te_goes_on() {
    target_killed_mid_batch(Opcode::Read);
}

/// A te target with the opt-in (`MC_TE_MOONCAKE_COMPAT=1`) for loopback peers.
fn compat_target() -> te_core::TransferEngine {
    engine_with(compat_config(&[("MC_TE_MOONCAKE_ALLOW", "127.0.0.0/8")]))
}

/// A te target (the opt-in listener) with a 64 MiB region, and a Mooncake peer with 1 MiB of
/// pattern `seed` and a batch's items for it: every block to or from that MiB (a WRITE leaves
/// no byte of te's region zero), 16 times round te's region, 1 GiB, a batch that outlasts a
/// slow kill.
struct Streaming {
    target: te_core::TransferEngine,
    remote: std::sync::Arc<te_core::HostBuffer>,
    te_name: String,
    mooncake: MooncakePeer,
    items: Vec<(u64, u64, usize)>,
}

const STREAM_BLOCKS: usize = 64;

fn streaming(seed: u64) -> Streaming {
    let target = compat_target();
    let remote = buffer(STREAM_BLOCKS * MIB);
    register(&target, &remote, Permission::RemoteReadWrite);
    let te_name = target.segment_name().to_string();
    let mut mooncake = MooncakePeer::start("127.0.0.1", "P2PHANDSHAKE", &[]);
    let local = mooncake.alloc(MIB);
    mooncake.put(local, &pattern(seed, MIB));
    let items = (0..STREAM_BLOCKS * 16)
        .map(|i| {
            (
                local,
                remote.addr() + ((i % STREAM_BLOCKS) * MIB) as u64,
                MIB,
            )
        })
        .collect();
    Streaming {
        target,
        remote,
        te_name,
        mooncake,
        items,
    }
}

/// Whether the first bytes of some block of `remote` were written within `within`.
fn landed_within(remote: &te_core::HostBuffer, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    loop {
        let landed = (0..STREAM_BLOCKS).any(|i| remote.to_vec(i * MIB, 64).unwrap() != [0u8; 64]);
        if landed || Instant::now() >= deadline {
            return landed;
        }
        std::thread::yield_now();
    }
}

/// A Mooncake initiator killed while its batch streams between its memory and a te target's
/// (the opt-in listener), WRITEs or READs: te's connections end with it, so the region is free
/// to unregister within seconds (no pin left behind), and the next Mooncake initiator writes
/// and reads te's memory in full.
fn initiator_killed_mid_batch(write: bool) {
    let Streaming {
        target,
        remote,
        te_name,
        mooncake: doomed,
        items,
    } = streaming(71);
    let ended = doomed.batch_then_kill(write, &te_name, &items, || {
        // Killed once the first bytes are in te's memory (a WRITE), or some milliseconds into
        // the READs (a second at most either way).
        match write {
            true => {
                let _ = landed_within(&remote, Duration::from_secs(1));
            }
            false => std::thread::sleep(Duration::from_millis(30)),
        }
    });
    assert_eq!(
        ended, None,
        "the kill came after the batch: nothing was cut short"
    );

    let what = if write {
        "killed mid-WRITE"
    } else {
        "killed mid-READ"
    };
    unregister_once_unpinned(&target, remote.addr(), Duration::from_secs(30), what);

    register(&target, &remote, Permission::RemoteReadWrite);
    let mut next = MooncakePeer::start("127.0.0.1", "P2PHANDSHAKE", &[]);
    let len = 8 * MIB;
    let local = next.alloc(len);
    let data = pattern(72, len);
    next.put(local, &data);
    assert_eq!(next.write(&te_name, local, remote.addr(), len), 0);
    assert_same_bytes(
        &remote.to_vec(0, len).unwrap(),
        &data,
        "te holds what the next initiator wrote",
    );
    let back = pattern(73, len);
    remote.write_at(0, &back).unwrap();
    assert_eq!(next.read(&te_name, local, remote.addr(), len), 0);
    assert_same_bytes(
        &next.get(local, len),
        &back,
        "the next initiator read te's bytes",
    );
}

#[test]
fn a_mooncake_initiator_killed_mid_write_leaves_no_pin_and_te_goes_on() {
    initiator_killed_mid_batch(true);
}

#[test]
fn a_mooncake_initiator_killed_mid_read_leaves_no_pin_and_te_goes_on() {
    initiator_killed_mid_batch(false);
}

/// A te target shut down (its engine dropped) while a Mooncake initiator's batch of WRITEs
/// streams into it: the shutdown does not wait on the peer, and Mooncake's call returns an
/// error, never success, for a batch te did not finish.
#[test]
fn a_te_target_shut_down_mid_batch_fails_the_mooncake_call() {
    let Streaming {
        target,
        remote,
        te_name,
        mut mooncake,
        items,
    } = streaming(81);
    let caller = std::thread::spawn(move || {
        let rc = mooncake.batch(true, &te_name, &items);
        (rc, mooncake)
    });
    assert!(
        landed_within(&remote, Duration::from_secs(10)),
        "no byte from Mooncake arrived"
    );
    drop(target);

    let (rc, _mooncake) = caller.join().expect("the Mooncake call returns");
    assert_ne!(rc, 0, "a batch te did not finish reported done");
    assert!(
        rc < 0 && rc != i64::MIN,
        "Mooncake's call answers with its error code, got {rc}"
    );
}

fn signal(pid: u32, sig: &str) {
    let ok = std::process::Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill -{sig} {pid}");
}

/// A Mooncake target that stops answering (SIGSTOP) mid-batch: te's batch ends FAILED once the
/// status timeout and its retry have passed, instead of waiting for ever; once the target runs
/// again (SIGCONT), te writes to it and reads back every byte.
#[test]
fn a_stopped_mooncake_target_fails_the_batch_after_the_status_timeout() {
    let blocks = 64;
    let mut cfg = config();
    cfg.retry_cnt = 1;
    let te = engine_with_tcp(cfg, tcp(|t| t.status_timeout = Duration::from_secs(2)));
    let local = buffer(blocks * MIB);
    local.write_at(0, &pattern(91, blocks * MIB)).unwrap();
    register(&te, &local, Permission::LocalOnly);

    let mut stopped = MooncakePeer::start("127.0.0.1", "P2PHANDSHAKE", &[]);
    let remote = stopped.alloc(blocks * MIB);
    let seg = te.open_segment(&stopped.name).unwrap();
    let writes: Vec<_> = (0..blocks)
        .map(|i| {
            let off = (i * MIB) as u64;
            request(
                Opcode::Write,
                local.addr() + off,
                seg,
                remote + off,
                MIB as u64,
            )
        })
        .collect();
    signal(stopped.pid(), "STOP");
    let batch = te.allocate_batch(blocks).unwrap();
    te.submit(batch, &writes).unwrap();
    let status = te.wait(batch, WAIT);
    signal(stopped.pid(), "CONT");
    let status = status.expect("the batch ends, not hangs");
    assert_eq!(status.state, TransferState::Failed);
    te.free_batch(batch).unwrap();

    let len = 8 * MIB;
    let data = pattern(92, len);
    local.write_at(0, &data).unwrap();
    let write = request(Opcode::Write, local.addr(), seg, remote, len as u64);
    assert_eq!(run(&te, &[write]), TransferState::Completed);
    assert_same_bytes(
        &stopped.get(remote, len),
        &data,
        "the resumed target's memory",
    );
}
