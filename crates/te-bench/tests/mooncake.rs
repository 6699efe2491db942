//! te-bench against Mooncake's own `transfer_engine_bench` target (the PyPI wheel, installed by
//! `.ci/setup`) over TCP loopback: WRITE and READ, every byte of the working set verified. For
//! the READ, te-bench first writes its pattern into the Mooncake target (which fills none).

use std::process::Command;

use te_testkit::mooncake::MooncakeBenchTarget;

fn bench(target: &str, operation: &str) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_te-bench"))
        .args([
            "--mode=initiator",
            "--protocol=tcp",
            "--metadata_server=P2PHANDSHAKE",
        ])
        .args([
            "--local_server_name=127.0.0.1",
            "--threads=2",
            "--duration=0.5",
        ])
        .args(["--block_size=65536", "--batch_size=32", "--verify"])
        .arg(format!("--segment_id={target}"))
        .arg(format!("--operation={operation}"))
        .env("MC_LOG_LEVEL", "WARNING")
        .output()
        .expect("te-bench runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "te-bench {operation} to Mooncake failed: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

#[test]
fn te_bench_writes_and_reads_a_mooncake_bench_target_verified() {
    let target = MooncakeBenchTarget::start(&["--protocol=tcp"], &[("MC_FORCE_TCP", "1")]);
    for operation in ["write", "read"] {
        let text = bench(&target.name, operation);
        // 2 threads × 32 blocks × 64 KiB.
        assert!(
            text.contains("verified 4194304 bytes"),
            "{operation}: {text}"
        );
        assert!(text.contains("Test completed"), "{operation}: {text}");
    }
}

/// Descriptors through a real etcd in Mooncake's key layout, both ways: Mooncake's Python
/// engine opens a te segment by name and writes into it (opt-in), te opens the Mooncake
/// segment by name and writes and reads it; every byte compared. (Mooncake's HTTP metadata
/// server is exercised the same way in te-tcp's tests; the wheel has no Redis backend.)
#[test]
#[cfg(feature = "etcd")]
fn descriptors_through_etcd_both_ways() {
    use std::sync::Arc;
    use te_core::{HostBuffer, Opcode, Permission, TransferEngine, TransferRequest, TransferState};
    use te_testkit::mooncake::MooncakePeer;
    use te_testkit::{pattern, services};

    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("mooncake-etcd");
    let etcd = services::etcd_server(0, &dir);
    let mut c = te_core::Config::default();
    c.tcp_bind_address = Some("127.0.0.1".parse().unwrap());
    c.mooncake = te_core::mooncake::MooncakeCompat::from_lookup(|k| {
        (k == "MC_TE_MOONCAKE_COMPAT").then(|| "1".to_string())
    })
    .unwrap();
    let te = TransferEngine::init(c, &etcd.url, "te-node").unwrap();
    te.install_transport(Arc::new(te_tcp::TcpTransport::new()))
        .unwrap();
    let len = 1 << 20;
    let mem = Arc::new(HostBuffer::new(len).unwrap());
    te.register_buffer(&mem, "*", Permission::RemoteReadWrite)
        .unwrap();

    let mut mooncake = MooncakePeer::start(
        "mc-node",
        &etcd.url,
        &[("MC_TCP_BIND_ADDRESS", "127.0.0.1")],
    );
    let theirs = mooncake.alloc(len);
    let data = pattern(9, len);
    mooncake.put(theirs, &data);
    assert_eq!(mooncake.write("te-node", theirs, mem.addr(), len), 0);
    assert!(
        mem.to_vec(0, len).unwrap() == data,
        "te holds what Mooncake wrote"
    );

    let seg = te.open_segment("mc-node").unwrap();
    let back = pattern(10, len);
    mem.write_at(0, &back).unwrap();
    let req = |opcode| TransferRequest {
        opcode,
        source: mem.addr(),
        target_id: seg,
        target_offset: theirs,
        length: len as u64,
    };
    let run = |r: TransferRequest| {
        let b = te.allocate_batch(1).unwrap();
        te.submit(b, &[r]).unwrap();
        let s = te.wait(b, std::time::Duration::from_secs(60)).unwrap();
        te.free_batch(b).unwrap();
        s.state
    };
    assert_eq!(run(req(Opcode::Write)), TransferState::Completed);
    assert!(
        mooncake.get(theirs, len) == back,
        "te wrote to Mooncake by name"
    );
    mooncake.put(theirs, &data);
    assert_eq!(run(req(Opcode::Read)), TransferState::Completed);
    assert!(
        mem.to_vec(0, len).unwrap() == data,
        "te read Mooncake by name"
    );
}
