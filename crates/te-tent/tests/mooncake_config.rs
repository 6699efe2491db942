//! A TENT configuration written for Mooncake's TENT (`tests/data/mooncake-keys.json`: te's
//! own file with every key of Mooncake's sample `transfer-engine.json`) starts te-tent
//! unchanged: what te has a meaning for is applied, the rest is reported, and two engines
//! configured by it move bytes to each other (every byte compared).

use std::sync::Arc;
use std::time::Duration;

use te_core::{HostBuffer, Opcode, TransferState};
use te_tent::{MemoryOptions, Request, TentConfig, TentEngine, TentFile};
use te_testkit::pattern;

fn sample_path() -> String {
    format!(
        "{}/tests/data/mooncake-keys.json",
        env!("CARGO_MANIFEST_DIR")
    )
}

fn config() -> TentConfig {
    let file = TentFile::parse_source(&sample_path()).expect("the file parses");
    TentConfig::from_file(file, |_| None).expect("te-tent takes it")
}

#[test]
fn every_key_of_mooncakes_sample_is_applied_or_reported() {
    let file = TentFile::parse_source(&sample_path()).unwrap();
    let reported: Vec<&str> = file.ignored.iter().map(|(k, _)| k.as_str()).collect();
    for key in [
        "enable_progress_worker",
        "metrics.http_server_threads",
        "transports.tcp.max_concurrent_tasks",
        "transports.rdma.shared_quota_shm_path",
        "transports.rdma.device.max_cqe",
        "transports.rdma.endpoint.max_sge",
        "transports.rdma.workers.grace_period_ns",
        "transports.gds.enable",
        "transports.ub",
        "policy[0].devices",
    ] {
        assert!(reported.contains(&key), "{key} not reported: {reported:?}");
    }
    assert!(
        file.ignored.iter().all(|(_, why)| !why.contains("neither")),
        "every key is one TENT reads: {:?}",
        file.ignored
    );
    let c = config();
    // Applied: RPC address, failover, lanes, timeouts, verbs attributes, slice size, retries.
    assert_eq!(c.segment_name(), "127.0.0.1");
    assert_eq!(c.metadata_conn, "P2PHANDSHAKE");
    assert_eq!(c.max_failover_attempts, 2);
    assert!(c.auto_failover);
    assert_eq!(c.core.slice_size, 131072);
    assert_eq!(c.core.retry_cnt, 4);
    assert_eq!(c.core.slice_timeout, Some(Duration::from_secs(5)));
    assert_eq!(c.core.num_qp_per_ep, 2);
    assert_eq!(c.core.workers_per_ctx, 2);
    assert_eq!(c.core.max_ep_per_ctx, 128);
    for (var, value) in [
        ("MC_IB_PORT", "1"),
        ("MC_GID_INDEX", "3"),
        ("MC_MTU", "1024"),
        ("MC_MAX_WR", "512"),
        ("MC_IB_SL", "3"),
        ("MC_IB_TC", "106"),
        ("MC_IB_TIMEOUT", "16"),
        ("MC_NUM_CQ_PER_CTX", "2"),
    ] {
        assert_eq!(c.lookup(var).as_deref(), Some(value), "{var}");
    }
    assert_eq!(
        c.transports["rdma"].devices,
        Some(vec!["mlx5_1".to_string()])
    );
    assert!(!c.enabled("rdma") && c.enabled("tcp") && c.enabled("shm"));
    assert_eq!(c.policy[0].transports, ["shm", "rdma", "tcp"]);
    assert_eq!(c.policy[1].transports, ["uring", "gds"]);
}

#[test]
fn two_engines_configured_by_it_move_bytes() {
    const LEN: usize = 8 << 20;
    let a = TentEngine::new(config()).expect("engine a");
    let b = TentEngine::new(config()).expect("engine b");
    let installed: Vec<&str> = a
        .core()
        .transport_capabilities()
        .iter()
        .map(|(n, _)| *n)
        .collect();
    assert!(
        installed.contains(&"tcp") && installed.contains(&"shm"),
        "{installed:?}"
    );
    assert!(!installed.contains(&"rdma"), "disabled in the file");
    let src = Arc::new(HostBuffer::new(LEN).unwrap());
    src.write_at(0, &pattern(5, LEN)).unwrap();
    a.register_memory(&src, &MemoryOptions::default()).unwrap();
    let dst = Arc::new(HostBuffer::new(LEN).unwrap());
    b.register_memory(&dst, &MemoryOptions::default()).unwrap();
    let seg = a.open_segment(b.segment_name()).unwrap();
    let batch = a.allocate_batch(2).unwrap();
    let half = (LEN / 2) as u64;
    let reqs = [
        Request::new(Opcode::Write, src.addr(), seg, dst.addr(), half),
        Request::new(
            Opcode::Write,
            src.addr() + half,
            seg,
            dst.addr() + half,
            half,
        ),
    ];
    a.submit(batch, &reqs).unwrap();
    let status = a.wait(batch, Duration::from_secs(60)).unwrap();
    assert_eq!(status.state, TransferState::Completed);
    // Plain memory on this host: shm (the rule's first choice) cannot reach it, TCP can.
    assert_eq!(a.task_transport(batch, 0).unwrap(), "tcp");
    a.free_batch(batch).unwrap();
    assert_eq!(dst.to_vec(0, LEN).unwrap(), pattern(5, LEN));
}
