//! te-bench against Mooncake's own `transfer_engine_bench` target (the PyPI wheel, installed by
//! `.ci/setup`) over TCP loopback: WRITE and READ, every byte of the working set verified. For
//! the READ, te-bench first writes its pattern into the Mooncake target (which fills none).

use std::process::Command;

use te_core::testing::mooncake::MooncakeBenchTarget;

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
