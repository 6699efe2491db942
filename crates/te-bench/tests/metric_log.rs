//! `MC_TE_METRIC=1` on a te-bench run over TCP loopback: the log carries Mooncake's periodic
//! line (`[Metrics] Transfer Engine Stats (over last Ns): Throughput: … MB/s | Latency
//! Distribution (count=…): …`), and its throughput agrees with the bytes the bench moved.

use std::process::{Command, Stdio};

use te_testkit::Killed;
use te_testkit::services::free_port;

#[test]
fn mc_te_metric_logs_mooncakes_line_every_interval() {
    let bench = env!("CARGO_BIN_EXE_te-bench");
    let port = free_port();
    let mut target = Command::new(bench)
        .args(["--mode=target", "--buffer_size=16777216"])
        .arg(format!("--local_server_name=127.0.0.1:{port}"))
        .env("MC_LOG_LEVEL", "WARNING")
        .stdout(Stdio::piped())
        .spawn()
        .expect("te-bench target");
    let ready = std::io::BufRead::lines(std::io::BufReader::new(target.stdout.take().unwrap()))
        .map_while(Result::ok)
        .any(|l| l.contains("target ready"));
    let _target = Killed(target);
    assert!(ready, "the te-bench target did not start");
    let out = Command::new(bench)
        .args([
            "--operation=write",
            "--local_server_name=127.0.0.1",
            "--threads=1",
            "--duration=3.5",
            "--block_size=65536",
            "--batch_size=16",
            "--buffer_size=16777216",
            "--json",
        ])
        .arg(format!("--segment_id=127.0.0.1:{port}"))
        .env("MC_TE_METRIC", "1")
        .env("MC_TE_METRIC_INTERVAL_SECONDS", "1")
        .env("MC_LOG_LEVEL", "INFO")
        .output()
        .expect("te-bench runs");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stdout}{stderr}");
    let report: serde_json::Value = (stdout.lines())
        .find_map(|l| serde_json::from_str(l).ok())
        .expect("te-bench's JSON report");
    let lines: Vec<&str> = (stderr.lines())
        .filter_map(|l| {
            l.split_once("[Metrics] Transfer Engine Stats (over last 1s): ")
                .map(|x| x.1)
        })
        .collect();
    assert!(
        lines.len() >= 2,
        "a line a second during the run:\n{stderr}"
    );
    let mut logged = 0.0;
    for line in &lines {
        let (throughput, latency) = line.split_once(" | ").unwrap_or_else(|| panic!("{line}"));
        let mb_s: f64 = (throughput.strip_prefix("Throughput: "))
            .and_then(|t| t.strip_suffix(" MB/s"))
            .and_then(|t| t.parse().ok())
            .unwrap_or_else(|| panic!("{line}"));
        logged += mb_s * 1024.0 * 1024.0;
        assert!(
            latency.starts_with("Latency Distribution (count="),
            "{line}"
        );
        let shares: f64 = (latency.split_once("): ").unwrap().1.split(", "))
            .map(|part| {
                let (range, share) = part.split_once(':').unwrap();
                assert!(range.ends_with("μs"), "{part}");
                share.trim_end_matches('%').parse::<f64>().unwrap()
            })
            .sum();
        assert!((shares - 100.0).abs() < 1.0, "shares add up: {line}");
    }
    // The lines cover the run but for its last part second: what they logged is at most what
    // moved, and most of it.
    let bytes = report["bytes"].as_f64().unwrap();
    assert!(
        logged <= bytes * 1.01 && logged >= bytes * 0.5,
        "logged {logged:.0} B of {bytes:.0} B moved:\n{stderr}"
    );
}
