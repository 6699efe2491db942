//! te-rdma against a real verbs stack: Soft-RoCE in the qemu guest of `cargo xtask softroce`
//! (rxe0 on eth0 198.18.0.1, rxe1 on eth1 198.18.1.1). These tests are ignored on the host
//! (no RDMA device there); the lane runs them with `--ignored` inside the guest:
//! `cargo xtask softroce -- cargo test -p te-rdma --test rdma -- --ignored --test-threads=1`.

#![allow(unsafe_code)] // registers memory with the NIC and posts work requests by address

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{eventually, made_since, memory_regions, queue_pairs, sent_packets};

use te_core::transport::SliceError;
use te_core::{
    Config, Error, HostBuffer, Opcode, Permission, TransferEngine, TransferRequest, TransferState,
};
use te_rdma::verbs::{Nic, VerbsOptions, WcError, WorkRequest};
use te_rdma::{RdmaOptions, RdmaTransport};
use te_testkit::pattern;

const SIZES: [usize; 7] = [1, 4095, 4096, 65537, 1 << 20, (3 << 20) + 7, 64 << 20];

fn options(device: &str) -> RdmaOptions {
    RdmaOptions {
        devices: Some(vec![device.to_string()]),
        // Soft-RoCE under emulation acknowledges slowly: a long local ACK timeout.
        verbs: VerbsOptions {
            timeout: 18,
            ..VerbsOptions::default()
        },
        ..RdmaOptions::default()
    }
}

fn engine(device: &str) -> TransferEngine {
    engine_with(device).0
}

fn engine_with(device: &str) -> (TransferEngine, Arc<RdmaTransport>) {
    engine_from(config(), "198.18.0.1", options(device))
}

/// The engines' configuration: listeners on eth0's address in the guest.
fn config() -> Config {
    let mut c = Config::default();
    c.tcp_bind_address = Some("198.18.0.1".parse().unwrap());
    c
}

/// An engine from `c` serving as `name`, with an RDMA transport of options `o`.
fn engine_from(c: Config, name: &str, o: RdmaOptions) -> (TransferEngine, Arc<RdmaTransport>) {
    let e = TransferEngine::init(c, "P2PHANDSHAKE", name).unwrap();
    let t = Arc::new(RdmaTransport::new(o));
    e.install_transport(t.clone()).unwrap();
    (e, t)
}

fn run(e: &TransferEngine, r: TransferRequest) -> (TransferState, Option<SliceError>) {
    let b = e.allocate_batch(1).unwrap();
    e.submit(b, &[r]).unwrap();
    let s = e.wait(b, Duration::from_secs(300)).unwrap();
    let err = e.task_error(b, 0).unwrap();
    e.free_batch(b).unwrap();
    (s.state, err)
}

/// Every size, READ then WRITE, between `initiator_dev` and a target on `target_dev`.
fn sweep(initiator_dev: &str, target_dev: &str) {
    let total: usize = SIZES.iter().map(|s| s + 4096).sum();
    let target = engine(target_dev);
    let tbuf = Arc::new(HostBuffer::new(2 * total).unwrap());
    tbuf.write_at(0, &pattern(7, total)).unwrap();
    target
        .register_buffer(&tbuf, "*", Permission::RemoteReadWrite)
        .unwrap();
    let (init, transport) = engine_with(initiator_dev);
    let local = Arc::new(HostBuffer::new(total).unwrap());
    init.register_buffer(&local, "*", Permission::LocalOnly)
        .unwrap();
    let seg = init.open_segment(target.segment_name()).unwrap();
    assert_eq!(
        init.segment(seg).unwrap().desc().devices[0].name,
        target_dev
    );
    let expected = pattern(7, total);
    let mut at = 3usize;
    for (i, &len) in SIZES.iter().enumerate() {
        let r = TransferRequest {
            opcode: Opcode::Read,
            source: local.addr() + at as u64,
            target_id: seg,
            target_offset: tbuf.addr() + at as u64,
            length: len as u64,
        };
        assert_eq!(
            run(&init, r),
            (TransferState::Completed, None),
            "read {len}"
        );
        assert!(
            local.to_vec(at, len).unwrap() == expected[at..at + len],
            "read {len}: bytes differ"
        );
        let data = pattern(100 + i as u64, len);
        local.write_at(at, &data).unwrap();
        let w = TransferRequest {
            opcode: Opcode::Write,
            source: local.addr() + at as u64,
            target_id: seg,
            target_offset: tbuf.addr() + (total + at) as u64,
            length: len as u64,
        };
        assert_eq!(
            run(&init, w),
            (TransferState::Completed, None),
            "write {len}"
        );
        assert!(
            tbuf.to_vec(total + at, len).unwrap() == data,
            "write {len}: bytes differ"
        );
        at += len + 4093;
    }
    // One endpoint of MC_NUM_QP_PER_EP (2) queue pairs per lane (MC_WORKERS_PER_CTX, 2)
    // carried it all: slices are dealt over the lanes.
    assert_eq!(transport.queue_pairs(), 4);
}

#[test]
#[ignore = "needs an RDMA device: runs in the Soft-RoCE guest (cargo xtask softroce)"]
fn engines_over_one_device() {
    sweep("rxe0", "rxe0");
}

#[test]
#[ignore = "needs an RDMA device: runs in the Soft-RoCE guest (cargo xtask softroce)"]
fn engines_across_two_devices() {
    sweep("rxe1", "rxe0");
}

#[test]
#[ignore = "needs an RDMA device: runs in the Soft-RoCE guest (cargo xtask softroce)"]
fn a_read_only_region_refuses_writes_in_the_memory_region() {
    // Straight on the verbs layer, so nothing but the MR's access flags can refuse.
    let nic = Nic::open("rxe0", &options("rxe0").verbs, &Default::default()).unwrap();
    let src = Arc::new(HostBuffer::new(4096).unwrap());
    src.write_at(0, &[0xee; 4096]).unwrap();
    let dst = Arc::new(HostBuffer::new(4096).unwrap());
    dst.write_at(0, &[0x11; 4096]).unwrap();
    // SAFETY: both buffers outlive their regions (dropped at the end of the test).
    let (smr, dmr) = unsafe {
        (
            nic.register(src.addr(), 4096, Permission::LocalOnly)
                .unwrap(),
            nic.register(dst.addr(), 4096, Permission::RemoteRead)
                .unwrap(),
        )
    };
    let wr = |id, write| WorkRequest {
        id,
        write,
        local: src.addr(),
        lkey: smr.lkey(),
        len: 4096,
        remote: dst.addr(),
        rkey: dmr.rkey(),
    };
    let (a, b) = (nic.endpoint().unwrap(), nic.endpoint().unwrap());
    a.connect(&b.info()).unwrap();
    b.connect(&a.info()).unwrap();
    let wait = |id: u64| {
        let mut out = Vec::new();
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        while out.is_empty() {
            assert!(std::time::Instant::now() < deadline, "no completion");
            nic.poll(&mut out);
        }
        assert_eq!(out[0].0, id);
        out.remove(0).1
    };
    // SAFETY: the ranges lie in the registered regions and outlive the completions.
    unsafe { a.post(&wr(1, true)).unwrap() };
    assert_eq!(
        wait(1),
        Err(WcError::RemoteAccess),
        "the MR refused the write"
    );
    assert_eq!(
        dst.to_vec(0, 4096).unwrap(),
        vec![0x11; 4096],
        "nothing was written"
    );
    // A READ of the same region is allowed (on a fresh pair: the first one is in error now).
    let (c, d) = (nic.endpoint().unwrap(), nic.endpoint().unwrap());
    c.connect(&d.info()).unwrap();
    d.connect(&c.info()).unwrap();
    // SAFETY: as above.
    unsafe { c.post(&wr(2, false)).unwrap() };
    assert_eq!(wait(2), Ok(()));
    assert_eq!(src.to_vec(0, 4096).unwrap(), vec![0x11; 4096]);
}

#[test]
#[ignore = "needs an RDMA device: runs in the Soft-RoCE guest (cargo xtask softroce)"]
fn the_engine_refuses_before_the_wire_and_a_bad_secret_gets_no_queue_pair() {
    let target = engine("rxe0");
    let ro = Arc::new(HostBuffer::new(1 << 16).unwrap());
    target
        .register_buffer(&ro, "*", Permission::RemoteRead)
        .unwrap();
    let init = engine("rxe0");
    let local = Arc::new(HostBuffer::new(1 << 16).unwrap());
    init.register_buffer(&local, "*", Permission::LocalOnly)
        .unwrap();
    let seg = init.open_segment(target.segment_name()).unwrap();
    let b = init.allocate_batch(1).unwrap();
    let w = TransferRequest {
        opcode: Opcode::Write,
        source: local.addr(),
        target_id: seg,
        target_offset: ro.addr(),
        length: 4096,
    };
    assert!(matches!(
        init.submit(b, &[w]),
        Err(Error::PermissionDenied { .. })
    ));
    init.free_batch(b).unwrap();
    // A handshake with a wrong proof of the segment secret is refused before any queue pair is
    // made.
    let (host, port) = te_core::control::split_host_port(target.segment_name()).unwrap();
    let forged = serde_json::json!({
        "local_nic_path": "intruder@rxe0",
        "peer_nic_path": format!("{}@rxe0", target.segment_name()),
        "qp_num": [1],
        "te_qps": [{"qp_num": 1, "psn": 1, "gid": "0000:0000:0000:0000:0000:ffff:c612:0001", "lid": 0}],
        "te_proof": "00000000000000000000000000000000",
    });
    let reply = te_core::control::request(
        &host,
        port,
        te_core::control::frame::FrameType::Connection,
        forged.to_string().as_bytes(),
        Duration::from_secs(5),
        1 << 20,
        None,
    )
    .unwrap();
    assert!(String::from_utf8_lossy(&reply).contains("bad segment secret proof"));
}

#[test]
#[ignore = "needs an RDMA device: runs in the Soft-RoCE guest (cargo xtask softroce)"]
fn a_device_taken_down_mid_transfer_fails_over() {
    let target = engine("rxe0");
    let len = 32usize << 20;
    let tbuf = Arc::new(HostBuffer::new(len).unwrap());
    target
        .register_buffer(&tbuf, "*", Permission::RemoteReadWrite)
        .unwrap();
    // The initiator's rails are eth1 and eth0; its priority matrix prefers eth1 (served by
    // rxe1) and keeps eth0 (rxe0) for when eth1 is not usable.
    let topo = std::env::temp_dir().join(format!("te-failover-topo-{}.json", std::process::id()));
    std::fs::write(&topo, r#"{"*": [["eth1"], ["eth0"]]}"#).unwrap();
    let mut c = config();
    c.rails = Some(vec!["eth1".into(), "eth0".into()]);
    c.custom_topo_json = Some(topo.display().to_string());
    let mut o = options("rxe1");
    o.devices = Some(vec!["rxe1".into(), "rxe0".into()]);
    let (init, transport) = engine_from(c, "198.18.0.1", o);
    let _ = std::fs::remove_file(&topo);
    assert_eq!(transport.active_devices(), ["rxe1", "rxe0"]);
    let local = Arc::new(HostBuffer::new(len).unwrap());
    let data = pattern(77, len);
    local.write_at(0, &data).unwrap();
    init.register_buffer(&local, "*", Permission::LocalOnly)
        .unwrap();
    let seg = init.open_segment(target.segment_name()).unwrap();
    // Warm up on rxe1.
    let before = sent_packets("rxe1");
    let small = TransferRequest {
        opcode: Opcode::Write,
        source: local.addr(),
        target_id: seg,
        target_offset: tbuf.addr(),
        length: 4096,
    };
    assert_eq!(run(&init, small), (TransferState::Completed, None));
    assert!(
        sent_packets("rxe1") > before,
        "the first transfer went over rxe1"
    );
    // A large WRITE; eth1 (under rxe1) goes down while it runs.
    let b = init.allocate_batch(1).unwrap();
    let big = TransferRequest {
        length: len as u64,
        ..small
    };
    init.submit(b, &[big]).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    // eth1 comes back up whatever happens, so later tests find both rails.
    struct Up;
    impl Drop for Up {
        fn drop(&mut self) {
            let _ = std::process::Command::new("ip")
                .args(["link", "set", "eth1", "up"])
                .status();
        }
    }
    let _up = Up;
    let down = std::process::Command::new("ip")
        .args(["link", "set", "eth1", "down"])
        .status()
        .unwrap();
    assert!(down.success());
    let rxe0_before = sent_packets("rxe0");
    // The port-down event marks rxe1 inactive (new slices skip it at once).
    assert!(
        eventually(|| !transport.active_devices().contains(&"rxe1".to_string())),
        "rxe1 reported down: {:?}",
        transport.active_devices()
    );
    let status = init.wait(b, Duration::from_secs(600)).unwrap();
    let err = init.task_error(b, 0).unwrap();
    init.free_batch(b).unwrap();
    assert_eq!(
        (status.state, err),
        (TransferState::Completed, None),
        "the transfer completed"
    );
    assert!(
        sent_packets("rxe0") > rxe0_before,
        "the rest went over rxe0"
    );
    assert!(tbuf.to_vec(0, len).unwrap() == data, "every byte arrived");
    // The port coming back reactivates rxe1. The guest's kernel may still be handling the
    // port-down event and refuse the first request ("Protodown not supported"): asked again.
    let up = (0..10).any(|_| {
        let ok = std::process::Command::new("ip")
            .args(["link", "set", "eth1", "up"])
            .status()
            .unwrap()
            .success();
        if !ok {
            std::thread::sleep(Duration::from_millis(300));
        }
        ok
    });
    assert!(up, "eth1 came back up");
    assert!(
        eventually(|| transport.active_devices().len() == 2),
        "rxe1 active again: {:?}",
        transport.active_devices()
    );
}

#[test]
#[ignore = "needs an RDMA device: runs in the Soft-RoCE guest (cargo xtask softroce)"]
fn regions_split_at_the_memory_region_limit_still_move_every_byte() {
    // Both sides register in 1 MiB memory regions; slices of 3 MiB + 7 at odd offsets cross
    // piece boundaries on both sides, at different places.
    let split = |device: &str| {
        let mut c = config();
        c.slice_size = 3 << 20;
        let mut o = options(device);
        o.max_mr_size = 1 << 20;
        engine_from(c, "198.18.0.1", o)
    };
    let len = (8 << 20) + 5;
    let (target, tt) = split("rxe0");
    let tbuf = Arc::new(HostBuffer::new(len + 4096).unwrap());
    target
        .register_buffer(&tbuf, "*", Permission::RemoteReadWrite)
        .unwrap();
    assert_eq!(tt.memory_regions(tbuf.addr()), 9);
    let (init, it) = split("rxe1");
    let local = Arc::new(HostBuffer::new(len + 4096).unwrap());
    init.register_buffer(&local, "*", Permission::LocalOnly)
        .unwrap();
    assert_eq!(it.memory_regions(local.addr()), 9);
    let seg = init.open_segment(target.segment_name()).unwrap();
    let published = init.segment(seg).unwrap().desc().buffers[0].clone();
    assert_eq!(published.te_mr_chunk, Some(1 << 20));
    assert_eq!(published.rkey.len(), 9, "nine pieces on one device");
    let data = pattern(31, len);
    local.write_at(1000, &data).unwrap();
    let w = TransferRequest {
        opcode: Opcode::Write,
        source: local.addr() + 1000,
        target_id: seg,
        target_offset: tbuf.addr() + 3333,
        length: len as u64,
    };
    assert_eq!(run(&init, w), (TransferState::Completed, None));
    assert!(
        tbuf.to_vec(3333, len).unwrap() == data,
        "write: bytes differ"
    );
    local.write_at(0, &vec![0; len + 4096]).unwrap();
    let r = TransferRequest {
        opcode: Opcode::Read,
        source: local.addr() + 7,
        ..w
    };
    assert_eq!(run(&init, r), (TransferState::Completed, None));
    assert!(local.to_vec(7, len).unwrap() == data, "read: bytes differ");
}

#[test]
#[ignore = "needs an RDMA device: runs in the Soft-RoCE guest (cargo xtask softroce)"]
fn with_a_cluster_secret_the_queue_pair_handshake_is_authenticated() {
    let secured = |secret: &str| {
        let mut c = config();
        c.cluster_secret = Some(te_core::config::Redacted(secret.into()));
        engine_from(c, "198.18.0.1", options("rxe0")).0
    };
    let target = secured("rdma-cluster-0b6e6a1c5d7f");
    let tbuf = Arc::new(HostBuffer::new(1 << 16).unwrap());
    target
        .register_buffer(&tbuf, "*", Permission::RemoteReadWrite)
        .unwrap();
    let init = secured("rdma-cluster-0b6e6a1c5d7f");
    let local = Arc::new(HostBuffer::new(1 << 16).unwrap());
    local.write_at(0, &pattern(5, 1 << 16)).unwrap();
    init.register_buffer(&local, "*", Permission::LocalOnly)
        .unwrap();
    let seg = init.open_segment(target.segment_name()).unwrap();
    let w = TransferRequest {
        opcode: Opcode::Write,
        source: local.addr(),
        target_id: seg,
        target_offset: tbuf.addr(),
        length: 1 << 16,
    };
    assert_eq!(run(&init, w), (TransferState::Completed, None));
    assert_eq!(tbuf.to_vec(0, 1 << 16).unwrap(), pattern(5, 1 << 16));
    // An endpoint request without the proof gets a refusal and no queue pair.
    let (host, port) = te_core::control::split_host_port(target.segment_name()).unwrap();
    let refused = te_core::control::request(
        &host,
        port,
        te_core::control::frame::FrameType::Connection,
        b"{}",
        Duration::from_secs(5),
        1 << 20,
        None,
    )
    .unwrap_err();
    assert!(
        refused.to_string().contains("authentication required"),
        "{refused}"
    );
}

#[test]
#[ignore = "helper: started by a_killed_target_fails_the_batch_and_a_restarted_one_serves_again"]
fn child_rdma_target() {
    let Ok(name) = std::env::var("TE_CHILD_RDMA_TARGET") else {
        return;
    };
    let (e, _) = engine_from(config(), &name, options("rxe0"));
    let buf = Arc::new(HostBuffer::new(RESTART_LEN).unwrap());
    e.register_buffer(&buf, "*", Permission::RemoteReadWrite)
        .unwrap();
    println!("READY {} {}", e.segment_name(), buf.addr());
    std::thread::sleep(Duration::from_secs(600));
}

/// The region of [`child_rdma_target`].
const RESTART_LEN: usize = 64 << 20;

/// Starts a target process on rxe0 serving as `name`; returns it and its region's address.
fn rdma_target(name: &str) -> (std::process::Child, u64) {
    let (child, ready) = te_testkit::spawn_ready(
        std::process::Command::new(std::env::current_exe().unwrap())
            .args(te_testkit::self_test_args("child_rdma_target"))
            .env("TE_CHILD_RDMA_TARGET", name),
    );
    let (got, addr) = ready.split_once(' ').unwrap();
    assert_eq!(got, name);
    (child, addr.parse().unwrap())
}

#[test]
#[ignore = "needs an RDMA device: runs in the Soft-RoCE guest (cargo xtask softroce)"]
fn a_killed_target_fails_the_batch_and_a_restarted_one_serves_again() {
    // The target restarts on the same control port: one below the ephemeral range.
    let port = te_testkit::services::free_port_on("198.18.0.1");
    let name = format!("198.18.0.1:{port}");
    let (mut peer, remote) = rdma_target(&name);
    let mut c = config();
    c.retry_cnt = 1;
    let mut o = options("rxe1");
    o.verbs.retry_cnt = 2;
    let (init, _) = engine_from(c, "198.18.0.1", o);
    let local = Arc::new(HostBuffer::new(RESTART_LEN).unwrap());
    local.write_at(0, &pattern(41, RESTART_LEN)).unwrap();
    init.register_buffer(&local, "*", Permission::LocalOnly)
        .unwrap();
    let seg = init.open_segment(&name).unwrap();
    let req = |opcode, remote, length| TransferRequest {
        opcode,
        source: local.addr(),
        target_id: seg,
        target_offset: remote,
        length,
    };
    assert_eq!(
        run(&init, req(Opcode::Write, remote, 1 << 20)),
        (TransferState::Completed, None)
    );

    // SIGKILL right after a 1 GiB batch (16,384 slices) is submitted. The killed target's
    // control port then answers every handshake by closing it, and counts them.
    let rounds = 16;
    let b = init.allocate_batch(rounds * 4).unwrap();
    let big: Vec<_> = (0..rounds * 4)
        .map(|i| {
            let off = (i % 4) as u64 * (16 << 20);
            TransferRequest {
                source: local.addr() + off,
                ..req(Opcode::Write, remote + off, 16 << 20)
            }
        })
        .collect();
    init.submit(b, &big).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    peer.kill().unwrap();
    peer.wait().unwrap();
    let listener = std::net::TcpListener::bind(("198.18.0.1", port)).unwrap();
    listener.set_nonblocking(true).unwrap();
    let handshakes = std::sync::atomic::AtomicUsize::new(0);
    let done = std::sync::atomic::AtomicBool::new(false);
    let status = std::thread::scope(|s| {
        s.spawn(|| {
            while !done.load(std::sync::atomic::Ordering::Acquire) {
                match listener.accept() {
                    Ok(_) => {
                        handshakes.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(1)),
                }
            }
        });
        let status = init.wait(b, Duration::from_secs(300));
        done.store(true, std::sync::atomic::Ordering::Release);
        status
    });
    drop(listener);
    // The batch ends FAILED, every task terminal, with no hang.
    assert_eq!(status.expect("no hang").state, TransferState::Failed);
    for t in 0..big.len() {
        let st = init.task_status(b, t).unwrap().state;
        assert!(
            matches!(st, TransferState::Failed | TransferState::Completed),
            "task {t}: {st:?}"
        );
    }
    init.free_batch(b).unwrap();
    // Each attempt asked the gone peer about once per lane (a refusal lapses after 1 s on a
    // slow machine, so a few more): not once per slice, which was tens of thousands of
    // handshakes and a minute and a half of queue pairs made for nothing.
    let handshakes = handshakes.into_inner();
    assert!(
        handshakes <= 64,
        "{handshakes} handshakes with a dead target"
    );

    // A new process serves under the same name (new secret, new queue pairs, new keys, new
    // region address): the same segment id reaches it, written and read back byte-exact.
    let (mut peer, remote) = rdma_target(&name);
    let data = pattern(43, 1 << 20);
    local.write_at(0, &data).unwrap();
    assert_eq!(
        run(&init, req(Opcode::Write, remote, 1 << 20)),
        (TransferState::Completed, None),
        "write after the restart"
    );
    local.write_at(0, &vec![0u8; 1 << 20]).unwrap();
    assert_eq!(
        run(&init, req(Opcode::Read, remote, 1 << 20)),
        (TransferState::Completed, None)
    );
    assert!(
        local.to_vec(0, 1 << 20).unwrap() == data,
        "read back from the restarted target"
    );
    peer.kill().unwrap();
    peer.wait().unwrap();
}

#[test]
#[ignore = "helper: started by a_target_lets_go_of_the_queue_pairs_of_an_initiator_that_is_gone"]
fn child_rdma_initiator() {
    let Ok(target) = std::env::var("TE_CHILD_RDMA_INITIATOR") else {
        return;
    };
    let (name, remote) = target.split_once(',').unwrap();
    let init = engine("rxe1");
    let local = Arc::new(HostBuffer::new(1 << 20).unwrap());
    local.write_at(0, &pattern(51, 1 << 20)).unwrap();
    init.register_buffer(&local, "*", Permission::LocalOnly)
        .unwrap();
    let seg = init.open_segment(name).unwrap();
    let w = TransferRequest {
        opcode: Opcode::Write,
        source: local.addr(),
        target_id: seg,
        target_offset: remote.parse().unwrap(),
        length: 1 << 20,
    };
    assert_eq!(run(&init, w), (TransferState::Completed, None));
    println!("READY written");
    std::thread::sleep(Duration::from_secs(600));
}

#[test]
#[ignore = "needs an RDMA device: runs in the Soft-RoCE guest (cargo xtask softroce)"]
fn a_target_lets_go_of_the_queue_pairs_of_an_initiator_that_is_gone() {
    let mut o = options("rxe0");
    o.peer_sweep = Duration::from_secs(1);
    let (target, _) = engine_from(config(), "198.18.0.1", o);
    let tbuf = Arc::new(HostBuffer::new(2 << 20).unwrap());
    target
        .register_buffer(&tbuf, "*", Permission::RemoteReadWrite)
        .unwrap();
    let before = queue_pairs("rxe0");
    // An initiator that stays: its queue pairs on the target must stay too.
    let live = engine("rxe1");
    let local = Arc::new(HostBuffer::new(1 << 20).unwrap());
    local.write_at(0, &pattern(52, 1 << 20)).unwrap();
    live.register_buffer(&local, "*", Permission::LocalOnly)
        .unwrap();
    let seg = live.open_segment(target.segment_name()).unwrap();
    let w = TransferRequest {
        opcode: Opcode::Write,
        source: local.addr(),
        target_id: seg,
        target_offset: tbuf.addr() + (1 << 20),
        length: 1 << 20,
    };
    assert_eq!(run(&live, w), (TransferState::Completed, None));
    let with_live = queue_pairs("rxe0");
    let live_qps = made_since(&before, &with_live);
    assert!(!live_qps.is_empty(), "the live initiator's queue pairs");

    // An initiator process writes, then is killed: the target lets its queue pairs go.
    let (mut child, _) = te_testkit::spawn_ready(
        std::process::Command::new(std::env::current_exe().unwrap())
            .args(te_testkit::self_test_args("child_rdma_initiator"))
            .env(
                "TE_CHILD_RDMA_INITIATOR",
                format!("{},{}", target.segment_name(), tbuf.addr()),
            ),
    );
    assert!(
        tbuf.to_vec(0, 1 << 20).unwrap() == pattern(51, 1 << 20),
        "the initiator process wrote"
    );
    let gone_qps = made_since(&with_live, &queue_pairs("rxe0"));
    assert!(!gone_qps.is_empty(), "its queue pairs on the target");
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        eventually(|| queue_pairs("rxe0").is_disjoint(&gone_qps)),
        "the gone initiator's queue pairs {gone_qps:?} are destroyed: {:?} open",
        queue_pairs("rxe0")
    );
    // Sweeps later the live initiator keeps its queue pairs, and they still carry its WRITEs.
    std::thread::sleep(Duration::from_secs(4));
    let now = queue_pairs("rxe0");
    assert!(
        now.is_superset(&live_qps),
        "the live initiator's stay: {live_qps:?} of {now:?}"
    );
    local.write_at(0, &pattern(53, 1 << 20)).unwrap();
    assert_eq!(run(&live, w), (TransferState::Completed, None));
    assert!(tbuf.to_vec(1 << 20, 1 << 20).unwrap() == pattern(53, 1 << 20));
}

/// Closing an engine mid-transfer: what was not yet posted fails (as the engine's shutdown
/// says), what was in flight flushes instead of waiting out its retries, the queue pairs are
/// gone by the time the close returns, the task ends failed naming the shutdown rather than
/// hanging, and the memory regions go with the last handle on the transport.
#[test]
#[ignore = "needs an RDMA device: runs in the Soft-RoCE guest (cargo xtask softroce)"]
fn closing_an_engine_mid_transfer_ends_its_task_and_releases_the_device() {
    // Soft-RoCE under emulation moves tens of MB/s: 64 MiB take a second or more.
    let len = 64 << 20;
    let target = engine("rxe0");
    let tbuf = Arc::new(HostBuffer::new(len).unwrap());
    target
        .register_buffer(&tbuf, "*", Permission::RemoteReadWrite)
        .unwrap();
    let (qps, mrs) = (queue_pairs("rxe1"), memory_regions("rxe1"));
    let (init, transport) = engine_with("rxe1");
    let local = Arc::new(HostBuffer::new(len).unwrap());
    init.register_buffer(&local, "*", Permission::LocalOnly)
        .unwrap();
    let made_mrs = made_since(&mrs, &memory_regions("rxe1"));
    assert!(!made_mrs.is_empty(), "the initiator's memory regions");
    let seg = init.open_segment(target.segment_name()).unwrap();
    let w = TransferRequest {
        opcode: Opcode::Write,
        source: local.addr(),
        target_id: seg,
        target_offset: tbuf.addr(),
        length: len as u64,
    };
    let b = init.allocate_batch(1).unwrap();
    init.submit(b, &[w]).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let made_qps = made_since(&qps, &queue_pairs("rxe1"));
    assert!(!made_qps.is_empty(), "the transfer's queue pairs");
    init.shutdown();
    let left_qps = queue_pairs("rxe1");
    assert!(
        left_qps.is_disjoint(&made_qps),
        "queue pairs {made_qps:?} destroyed by the close: {left_qps:?} open"
    );
    let status = init.wait(b, Duration::from_secs(60)).unwrap();
    assert_eq!(status.state, TransferState::Failed, "{status:?}");
    assert!(status.transferred_bytes < len as u64, "{status:?}");
    match init.task_error(b, 0).unwrap() {
        Some(SliceError::Path(why)) => assert!(why.contains("shut down"), "{why}"),
        other => panic!("the task's error names the shutdown: {other:?}"),
    }
    drop(init);
    drop(transport);
    let left_mrs = memory_regions("rxe1");
    assert!(
        left_mrs.is_disjoint(&made_mrs),
        "memory regions {made_mrs:?} released with the transport: {left_mrs:?} registered"
    );
}

/// rxe0's GIDs as sysfs lists them (index, address), the zero ones left out.
fn rxe0_gids() -> Vec<(u32, std::net::Ipv6Addr)> {
    (0..32)
        .filter_map(|i| {
            let text =
                std::fs::read_to_string(format!("/sys/class/infiniband/rxe0/ports/1/gids/{i}"))
                    .ok()?;
            let ip: std::net::Ipv6Addr = text.trim().parse().ok()?;
            (!ip.is_unspecified()).then_some((i, ip))
        })
        .collect()
}

#[test]
#[ignore = "needs an RDMA device: runs in the Soft-RoCE guest (cargo xtask softroce)"]
fn the_gid_is_the_rails_address_not_a_link_local_one_listed_first() {
    use te_rdma::verbs::{GidPlaces, mooncake_gid};
    let v6: std::net::Ipv6Addr = "fd00:18::1".parse().unwrap();
    let added = std::process::Command::new("ip")
        .args(["-6", "addr", "add", "fd00:18::1/64", "dev", "eth0", "nodad"])
        .status()
        .unwrap();
    assert!(added.success(), "an IPv6 address on eth0");
    assert!(
        eventually(|| rxe0_gids().iter().any(|(_, g)| *g == v6)),
        "rxe0 lists the new address: {:?}",
        rxe0_gids()
    );
    let table = rxe0_gids();
    let first = table.first().map(|(_, g)| *g).unwrap();
    assert_eq!(
        first.segments()[0] & 0xffc0,
        0xfe80,
        "a link-local GID comes first: {table:?}"
    );
    let open = |rail: &str| {
        let places = GidPlaces {
            rails: vec![("eth0".to_string(), rail.parse().unwrap())],
            bind: None,
        };
        Nic::open("rxe0", &options("rxe0").verbs, &places)
            .unwrap()
            .gid_string()
    };
    assert_eq!(
        open("fd00:18::1"),
        mooncake_gid(&v6.octets()),
        "an IPv6 rail: {table:?}"
    );
    let v4 = std::net::Ipv4Addr::new(198, 18, 0, 1).to_ipv6_mapped();
    assert_eq!(
        open("198.18.0.1"),
        mooncake_gid(&v4.octets()),
        "an IPv4 rail: {table:?}"
    );
    let _ = std::process::Command::new("ip")
        .args(["-6", "addr", "del", "fd00:18::1/64", "dev", "eth0"])
        .status();
}

#[test]
#[ignore = "needs an RDMA device: runs in the Soft-RoCE guest (cargo xtask softroce)"]
fn engines_bound_to_an_ipv6_address_move_bytes_over_ipv6_gids() {
    let added = std::process::Command::new("ip")
        .args(["-6", "addr", "add", "fd00:18::2/64", "dev", "eth0", "nodad"])
        .status()
        .unwrap();
    assert!(added.success(), "an IPv6 address on eth0");
    let v6: std::net::Ipv6Addr = "fd00:18::2".parse().unwrap();
    assert!(eventually(|| rxe0_gids().iter().any(|(_, g)| *g == v6)));
    let v6_engine = || {
        let mut c = Config::default();
        c.tcp_bind_address = Some(std::net::IpAddr::V6(v6));
        engine_from(c, "fd00:18::2", options("rxe0")).0
    };
    let target = v6_engine();
    let len = 1 << 20;
    let tbuf = Arc::new(HostBuffer::new(len).unwrap());
    tbuf.write_at(0, &pattern(3, len)).unwrap();
    target
        .register_buffer(&tbuf, "*", Permission::RemoteReadWrite)
        .unwrap();
    let init = v6_engine();
    let local = Arc::new(HostBuffer::new(len).unwrap());
    init.register_buffer(&local, "*", Permission::LocalOnly)
        .unwrap();
    let seg = init.open_segment(target.segment_name()).unwrap();
    let gid = init.segment(seg).unwrap().desc().devices[0].gid.clone();
    assert_eq!(
        gid,
        te_rdma::verbs::mooncake_gid(&v6.octets()),
        "the target publishes its IPv6 GID"
    );
    let read = TransferRequest {
        opcode: Opcode::Read,
        source: local.addr(),
        target_id: seg,
        target_offset: tbuf.addr(),
        length: len as u64,
    };
    assert_eq!(run(&init, read), (TransferState::Completed, None));
    assert!(
        local.to_vec(0, len).unwrap() == pattern(3, len),
        "read over IPv6: bytes differ"
    );
    local.write_at(0, &pattern(4, len)).unwrap();
    let write = TransferRequest {
        opcode: Opcode::Write,
        ..read
    };
    assert_eq!(run(&init, write), (TransferState::Completed, None));
    assert!(
        tbuf.to_vec(0, len).unwrap() == pattern(4, len),
        "write over IPv6: bytes differ"
    );
    let _ = std::process::Command::new("ip")
        .args(["-6", "addr", "del", "fd00:18::2/64", "dev", "eth0"])
        .status();
}
