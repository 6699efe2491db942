//! te-rdma and the real Mooncake engine (its PyPI wheel, driven through its Python module) over
//! Soft-RoCE in the qemu guest of `cargo xtask softroce`: te on rxe0 (198.18.0.1), Mooncake on
//! rxe1 (198.18.1.1). Ignored on the host (no RDMA device); the Soft-RoCE lane runs them with
//! `--ignored`. Every byte is compared on both sides.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{eventually, made_since, queue_pairs, sent_packets};

use te_core::{
    Config, HostBuffer, Opcode, Permission, TransferEngine, TransferRequest, TransferState,
};
use te_rdma::verbs::VerbsOptions;
use te_rdma::{RdmaOptions, RdmaTransport};
use te_testkit::assert_same_bytes;
use te_testkit::mooncake::MooncakePeer;
use te_testkit::pattern;

const WAIT: Duration = Duration::from_secs(300);

fn te_engine(compat: bool) -> (TransferEngine, Arc<RdmaTransport>) {
    te_engine_sweeping(compat, RdmaOptions::default().peer_sweep)
}

/// As [`te_engine`], dialling the initiators it keeps queue pairs for every `sweep`.
fn te_engine_sweeping(compat: bool, sweep: Duration) -> (TransferEngine, Arc<RdmaTransport>) {
    let mut c = Config::default();
    c.tcp_bind_address = Some("198.18.0.1".parse().unwrap());
    if compat {
        c.mooncake = te_core::mooncake::MooncakeCompat::from_lookup(|k| match k {
            "MC_TE_MOONCAKE_COMPAT" => Some("1".into()),
            "MC_TE_MOONCAKE_ALLOW" => Some("198.18.0.0/15".into()),
            _ => None,
        })
        .unwrap();
    }
    let e = TransferEngine::init(c, "P2PHANDSHAKE", "198.18.0.1").unwrap();
    let t = Arc::new(RdmaTransport::new(RdmaOptions {
        devices: Some(vec!["rxe0".into()]),
        // Soft-RoCE under emulation acknowledges slowly: a long local ACK timeout.
        verbs: VerbsOptions {
            timeout: 18,
            ..VerbsOptions::default()
        },
        peer_sweep: sweep,
        ..RdmaOptions::default()
    }));
    e.install_transport(t.clone()).unwrap();
    (e, t)
}

/// Mooncake's engine on rxe1, using the IPv4 RoCE v2 GID as te does.
fn mooncake_peer() -> MooncakePeer {
    MooncakePeer::start_with(
        "198.18.1.1",
        "P2PHANDSHAKE",
        ("rdma", "rxe1"),
        &[("MC_GID_INDEX", "1"), ("MC_IB_TIMEOUT", "18")],
    )
}

fn run(e: &TransferEngine, requests: &[TransferRequest]) -> TransferState {
    let b = e.allocate_batch(requests.len()).unwrap();
    e.submit(b, requests).unwrap();
    let s = e.wait(b, WAIT).unwrap();
    e.free_batch(b).unwrap();
    s.state
}

/// te → Mooncake: te reads Mooncake's RDMA descriptor (GIDs in its text form, one key per
/// device), handshakes in Mooncake's dialect (PSN 0), WRITEs and READs byte-exact.
#[test]
#[ignore = "needs an RDMA device and Mooncake's wheel: runs in the Soft-RoCE guest"]
fn te_writes_and_reads_a_mooncake_engine_over_rdma() {
    let mut mooncake = mooncake_peer();
    let len = 8 << 20;
    let remote = mooncake.alloc(len);
    let (te, _) = te_engine(false);
    let local = Arc::new(HostBuffer::new(len).unwrap());
    te.register_buffer(&local, "*", Permission::LocalOnly)
        .unwrap();
    let seg = te.open_segment(&mooncake.name).unwrap();
    assert!(te.segment(seg).unwrap().desc().is_mooncake());
    let data = pattern(1, len);
    local.write_at(0, &data).unwrap();
    let pieces = [
        (0u64, 1u64),
        (1, (5 << 20) + 3),
        ((5 << 20) + 4, (3 << 20) - 4),
    ];
    let req = |op, (off, n): (u64, u64)| TransferRequest {
        opcode: op,
        source: local.addr() + off,
        target_id: seg,
        target_offset: remote + off,
        length: n,
    };
    let writes: Vec<_> = pieces.iter().map(|&p| req(Opcode::Write, p)).collect();
    let before = sent_packets("rxe0");
    assert_eq!(run(&te, &writes), TransferState::Completed);
    // 8 MiB in packets of at most 4 KiB left through rxe0.
    assert!(
        sent_packets("rxe0") - before >= (len / 4096) as u64,
        "over RDMA"
    );
    assert_same_bytes(
        &mooncake.get(remote, len),
        &data,
        "Mooncake holds what te wrote",
    );
    let back = pattern(2, len);
    mooncake.put(remote, &back);
    let reads: Vec<_> = pieces.iter().map(|&p| req(Opcode::Read, p)).collect();
    assert_eq!(run(&te, &reads), TransferState::Completed);
    assert_same_bytes(
        &local.to_vec(0, len).unwrap(),
        &back,
        "te read Mooncake's bytes",
    );
}

/// Mooncake → te, with the opt-in: Mooncake reads te's descriptor (device names in its
/// matrix), te answers Mooncake's handshake in kind, and Mooncake's WRITEs and READs land
/// byte-exact. Then te sends to that Mooncake engine over the same QP set (Mooncake's model:
/// one set per device and peer path, both ways) and Mooncake keeps using it afterwards.
#[test]
#[ignore = "needs an RDMA device and Mooncake's wheel: runs in the Soft-RoCE guest"]
fn a_mooncake_engine_writes_and_reads_te_memory_over_rdma_with_the_opt_in() {
    let (te, transport) = te_engine(true);
    let len = 8 << 20;
    let mem = Arc::new(HostBuffer::new(len).unwrap());
    te.register_buffer(&mem, "*", Permission::RemoteReadWrite)
        .unwrap();
    let mut mooncake = mooncake_peer();
    let local = mooncake.alloc(len);
    let data = pattern(3, len);
    mooncake.put(local, &data);
    let name = te.segment_name().to_string();
    let before = sent_packets("rxe1");
    assert_eq!(
        mooncake.write(&name, local, mem.addr(), len),
        0,
        "Mooncake's WRITE:\n{}",
        mooncake.log()
    );
    assert!(
        sent_packets("rxe1") - before >= (len / 4096) as u64,
        "over RDMA"
    );
    assert_same_bytes(
        &mem.to_vec(0, len).unwrap(),
        &data,
        "te holds what Mooncake wrote",
    );
    let back = pattern(4, len);
    mem.write_at(0, &back).unwrap();
    assert_eq!(mooncake.read(&name, local, mem.addr(), len), 0);
    assert_same_bytes(&mooncake.get(local, len), &back, "Mooncake read te's bytes");

    // te to the same Mooncake engine: the QP set Mooncake's handshake made, no new one.
    let seg = te.open_segment(&mooncake.name).unwrap();
    let w = TransferRequest {
        opcode: Opcode::Write,
        source: mem.addr(),
        target_id: seg,
        target_offset: local,
        length: 1 << 20,
    };
    assert_eq!(run(&te, &[w]), TransferState::Completed);
    assert_same_bytes(
        &mooncake.get(local, 1 << 20),
        &back[..1 << 20],
        "te wrote over the shared set",
    );
    assert_eq!(
        transport.queue_pairs(),
        0,
        "no endpoint of te's own dialect was made"
    );
    // And Mooncake still uses its endpoint (te's use did not make it rebuild anything).
    let again = pattern(5, 1 << 20);
    mooncake.put(local, &again);
    assert_eq!(mooncake.write(&name, local, mem.addr(), 1 << 20), 0);
    assert_same_bytes(&mem.to_vec(0, 1 << 20).unwrap(), &again, "Mooncake again");
}

/// Without the opt-in a Mooncake engine gets no queue pair: its transfer fails, te's memory
/// is untouched.
#[test]
#[ignore = "needs an RDMA device and Mooncake's wheel: runs in the Soft-RoCE guest"]
fn without_the_opt_in_a_mooncake_engine_gets_no_queue_pair() {
    let (te, _) = te_engine(false);
    let mem = Arc::new(HostBuffer::new(1 << 20).unwrap());
    te.register_buffer(&mem, "*", Permission::RemoteReadWrite)
        .unwrap();
    let mut mooncake = mooncake_peer();
    let local = mooncake.alloc(1 << 20);
    mooncake.put(local, &pattern(6, 1 << 20));
    assert_ne!(
        mooncake.write(te.segment_name(), local, mem.addr(), 1 << 20),
        0
    );
    assert_same_bytes(
        &mem.to_vec(0, 1 << 20).unwrap(),
        &vec![0u8; 1 << 20],
        "untouched",
    );
}

/// A Mooncake initiator (P2PHANDSHAKE: named by its handshake listener) that is killed loses
/// its queue pairs on the te target, found gone by the sweep's probes; one that stays keeps
/// its own, and they still carry its WRITEs.
#[test]
#[ignore = "needs an RDMA device and Mooncake's wheel: runs in the Soft-RoCE guest"]
fn a_te_target_lets_go_of_the_queue_pairs_of_a_mooncake_initiator_that_is_gone() {
    let (te, _) = te_engine_sweeping(true, Duration::from_secs(1));
    let len = 1 << 20;
    let mem = Arc::new(HostBuffer::new(2 * len).unwrap());
    te.register_buffer(&mem, "*", Permission::RemoteReadWrite)
        .unwrap();
    let name = te.segment_name().to_string();
    let before = queue_pairs("rxe0");
    let mut stays = mooncake_peer();
    let stays_buf = stays.alloc(len);
    stays.put(stays_buf, &pattern(11, len));
    assert_eq!(stays.write(&name, stays_buf, mem.addr(), len), 0);
    assert_same_bytes(&mem.to_vec(0, len).unwrap(), &pattern(11, len), "first");
    let with_stays = queue_pairs("rxe0");
    let stays_qps = made_since(&before, &with_stays);
    assert!(!stays_qps.is_empty(), "the staying initiator's queue pairs");

    let mut goes = mooncake_peer();
    let goes_buf = goes.alloc(len);
    goes.put(goes_buf, &pattern(12, len));
    let second = mem.addr() + len as u64;
    assert_eq!(goes.write(&name, goes_buf, second, len), 0);
    assert_same_bytes(&mem.to_vec(len, len).unwrap(), &pattern(12, len), "second");
    let goes_qps = made_since(&with_stays, &queue_pairs("rxe0"));
    assert!(!goes_qps.is_empty(), "its queue pairs on te");
    goes.kill();
    assert!(
        eventually(|| queue_pairs("rxe0").is_disjoint(&goes_qps)),
        "the gone initiator's queue pairs {goes_qps:?} are destroyed: {:?} open",
        queue_pairs("rxe0")
    );
    // Sweeps later the staying initiator keeps its queue pairs, and they carry its WRITEs.
    std::thread::sleep(Duration::from_secs(4));
    let now = queue_pairs("rxe0");
    assert!(
        now.is_superset(&stays_qps),
        "the staying initiator's stay: {stays_qps:?} of {now:?}"
    );
    stays.put(stays_buf, &pattern(13, len));
    assert_eq!(stays.write(&name, stays_buf, mem.addr(), len), 0);
    assert_same_bytes(&mem.to_vec(0, len).unwrap(), &pattern(13, len), "again");
    assert!(
        !stays.log().contains("incomplete handshake length"),
        "the sweep asks with a probe frame, which Mooncake answers without a warning"
    );
}

/// Mooncake's `transfer_engine_bench` over RDMA both ways: te writes a pattern into its
/// target's buffer and reads it back byte-exact; its initiator WRITEs into a te target (with
/// the opt-in) for a timed run, completes, and changes te's bytes.
#[test]
#[ignore = "needs an RDMA device and Mooncake's wheel: runs in the Soft-RoCE guest"]
fn mooncakes_bench_over_rdma_both_ways() {
    let env = [("MC_GID_INDEX", "1"), ("MC_IB_TIMEOUT", "18")];
    let rdma = [
        "--protocol=rdma",
        "--device_name=rxe1",
        "--buffer_size=134217728",
    ];
    let target = te_testkit::mooncake::MooncakeBenchTarget::start_at("198.18.1.1", &rdma, &env);
    let (te, _) = te_engine(true);
    let len = 8 << 20;
    let local = Arc::new(HostBuffer::new(2 * len).unwrap());
    te.register_buffer(&local, "*", Permission::LocalOnly)
        .unwrap();
    // The bench target listens before it has registered its buffer (slow under emulation),
    // answering "no descriptor", then one without buffers, until then.
    let deadline = std::time::Instant::now() + WAIT;
    let seg = loop {
        match te.refresh_segment(&target.name) {
            Ok(seg) if !te.segment(seg).unwrap().desc().buffers.is_empty() => break seg,
            Ok(_) | Err(te_core::Error::SegmentNotFound { .. })
                if std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(200));
            }
            other => panic!("opening Mooncake's bench target: {other:?}"),
        }
    };
    let remote = te.segment(seg).unwrap().desc().buffers[0].addr;
    let data = pattern(7, len);
    local.write_at(0, &data).unwrap();
    let req = |opcode, at: u64| TransferRequest {
        opcode,
        source: local.addr() + at,
        target_id: seg,
        target_offset: remote,
        length: len as u64,
    };
    assert_eq!(run(&te, &[req(Opcode::Write, 0)]), TransferState::Completed);
    assert_eq!(
        run(&te, &[req(Opcode::Read, len as u64)]),
        TransferState::Completed
    );
    assert_same_bytes(
        &local.to_vec(len, len).unwrap(),
        &data,
        "read back from Mooncake's bench target",
    );
    drop(target);

    let mem = Arc::new(HostBuffer::new(128 << 20).unwrap());
    let before = pattern(8, 128 << 20);
    mem.write_at(0, &before).unwrap();
    te.register_buffer(&mem, "*", Permission::RemoteReadWrite)
        .unwrap();
    let out = std::process::Command::new(te_testkit::mooncake::program("transfer_engine_bench"))
        .args(["--mode=initiator", "--metadata_server=P2PHANDSHAKE"])
        .args([
            "--local_server_name=198.18.1.1",
            "--operation=write",
            "--duration=2",
        ])
        .args(["--threads=1", "--batch_size=16", "--block_size=65536"])
        .args(rdma)
        .arg(format!("--segment_id={}", te.segment_name()))
        .envs(env)
        .output()
        .expect("transfer_engine_bench runs");
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && log.contains("Test completed"),
        "{log}"
    );
    assert_ne!(
        mem.to_vec(0, 1 << 20).unwrap(),
        before[..1 << 20],
        "Mooncake's WRITEs landed in te's memory"
    );
}
