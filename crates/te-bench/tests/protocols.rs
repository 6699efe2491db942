//! te-bench end to end for every protocol it offers, each with `--verify` (every byte of the
//! working set compared after the run): TCP and shm and CXL (stand-in device) in loopback, and
//! the io_uring and buffered-I/O file transports against a real file; GPU memory
//! (`--use_vram`) over TCP and nvlink where a GPU is, its clear refusal where none is.

use std::path::PathBuf;
use std::process::Command;

fn bench(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_te-bench"))
        .args(args)
        .args([
            "--threads=1",
            "--duration=0.3",
            "--verify",
            "--buffer_size=8388608",
        ])
        .env("MC_LOG_LEVEL", "WARNING")
        .output()
        .expect("te-bench runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "te-bench {args:?} failed: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("verified"), "{args:?}: {text}");
    assert!(text.contains("Test completed"), "{args:?}: {text}");
    text
}

#[test]
fn memory_protocols_verify_in_loopback() {
    for protocol in ["tcp", "shm", "cxl"] {
        for op in ["write", "read"] {
            bench(&[
                "--loopback",
                &format!("--protocol={protocol}"),
                &format!("--operation={op}"),
                "--block_size=65536",
                "--batch_size=16",
            ]);
        }
    }
}

#[test]
fn file_protocols_verify_against_a_file() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    for protocol in ["uring", "bufio"] {
        let file = dir.join(format!("te-bench-{protocol}.dat"));
        let _ = std::fs::remove_file(&file);
        for op in ["write", "read"] {
            bench(&[
                &format!("--protocol={protocol}"),
                &format!("--operation={op}"),
                &format!("--file_path={}", file.display()),
                "--block_size=1048576",
                "--batch_size=4",
            ]);
        }
        assert!(std::fs::metadata(&file).unwrap().len() >= 4 << 20);
        std::fs::remove_file(&file).unwrap();
    }
}

#[test]
fn gpu_memory_runs_verify_or_say_what_is_missing() {
    for protocol in ["tcp", "nvlink"] {
        for op in ["write", "read"] {
            let args = [
                "--loopback",
                "--use_vram",
                "--gpu_id=0",
                &format!("--protocol={protocol}"),
                &format!("--operation={op}"),
                "--block_size=1048576",
                "--batch_size=4",
            ];
            if te_cuda::driver().is_ok() {
                let text = bench(&args);
                assert!(text.contains("(GPU 0 memory)"), "{text}");
                continue;
            }
            let out = Command::new(env!("CARGO_BIN_EXE_te-bench"))
                .args(args)
                .args(["--duration=0.3", "--verify"])
                .env("MC_LOG_LEVEL", "WARNING")
                .output()
                .unwrap();
            assert!(!out.status.success(), "{protocol} {op} without a GPU");
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(
                err.contains("GPU") && err.contains("libcuda"),
                "{protocol} {op}: names what is missing: {err}"
            );
        }
    }
}

#[test]
fn a_cxl_target_without_a_device_is_explained() {
    let out = Command::new(env!("CARGO_BIN_EXE_te-bench"))
        .args([
            "--mode=target",
            "--protocol=cxl",
            "--local_server_name=127.0.0.1:0",
        ])
        .env("MC_LOG_LEVEL", "WARNING")
        .env_remove("MC_CXL_DEV_PATH")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("MC_CXL_DEV_PATH"), "{err}");
}

#[test]
fn metadata_services_carry_the_handshake() {
    // The te-metadata server (in this process, on a real socket).
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let server = te_metadata::Server::start(listener, te_metadata::Options::default()).unwrap();
    let http = format!("--metadata_server=http://{}/metadata", server.addr());
    bench(&[
        "--loopback",
        &http,
        "--operation=write",
        "--block_size=65536",
        "--batch_size=8",
    ]);
    // Debian's redis-server, and etcd named Mooncake's way: a bare host:port.
    let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let redis = te_testkit::services::redis_server(0, None, &tmp.join("te-bench-redis"));
    let url = format!("--metadata_server={}", redis.url);
    bench(&[
        "--loopback",
        &url,
        "--operation=read",
        "--block_size=65536",
        "--batch_size=8",
    ]);
    drop(redis);
    let etcd = te_testkit::services::etcd_server(0, &tmp.join("te-bench-etcd"));
    let url = format!("--metadata_server=127.0.0.1:{}", etcd.port);
    bench(&[
        "--loopback",
        &url,
        "--operation=write",
        "--block_size=65536",
        "--batch_size=8",
    ]);
}

#[test]
fn the_tent_backend_sweeps_block_sizes_and_verifies() {
    for (protocol, op) in [("tcp", "write"), ("shm", "write"), ("shm", "read")] {
        let out = Command::new(env!("CARGO_BIN_EXE_te-bench"))
            .args([
                "--loopback",
                "--backend=tent",
                &format!("--protocol={protocol}"),
                &format!("--operation={op}"),
                "--start_block_size=4096",
                "--max_block_size=16384",
                "--batch_size=8",
                "--threads=1",
                "--duration=0.2",
                "--verify",
            ])
            .env("MC_LOG_LEVEL", "WARNING")
            .output()
            .expect("te-bench runs");
        let (text, err) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert!(out.status.success(), "{protocol} {op}: {text}{err}");
        assert!(text.contains("BlkSize (B)"), "{text}");
        let rows: Vec<u64> = text
            .lines()
            .filter_map(|l| l.split('|').next()?.trim().parse().ok())
            .collect();
        assert_eq!(rows, [4096, 8192, 16384], "one row per block size: {text}");
        assert!(err.contains("verified"), "{protocol} {op}: {err}");
    }
}

#[test]
fn the_tent_backend_runs_under_a_configuration_written_for_mooncakes_tent() {
    let conf = format!(
        "{}/../te-tent/tests/data/mooncake-keys.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let run = |conf: &str| {
        Command::new(env!("CARGO_BIN_EXE_te-bench"))
            .args([
                "--loopback",
                "--backend=tent",
                "--protocol=tcp",
                "--operation=write",
                "--start_block_size=65536",
                "--max_block_size=65536",
                "--batch_size=8",
                "--threads=1",
                "--duration=0.2",
                "--verify",
            ])
            .env("MC_TENT_CONF", conf)
            .env("MC_LOG_LEVEL", "WARNING")
            .output()
            .expect("te-bench runs")
    };
    let out = run(&conf);
    let (text, err) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{text}{err}");
    assert!(err.contains("verified"), "{err}");
    // The keys te does not use are named, each once.
    for key in [
        "metrics.http_server_threads",
        "transports.ub",
        "enable_progress_worker",
    ] {
        assert_eq!(
            err.matches(&format!(" {key} ignored")).count(),
            1,
            "{key}: {err}"
        );
    }
    // A malformed value stops it, naming the key.
    let bad = r#"{"transports": {"rdma": {"endpoint": {"path_mtu": "big"}}}}"#;
    let out = run(bad);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("transports.rdma.endpoint.path_mtu"), "{err}");
}
