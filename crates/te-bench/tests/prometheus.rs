//! A real Prometheus (Debian's `prometheus`, which `.ci/setup` installs) scraping te's metrics
//! endpoint every second during a verified te-bench run over TCP loopback: what Prometheus
//! stored is what the bench moved, to the byte, under TENT's series names, and its rate over
//! the run is within 15 % of the bench's own throughput. Everything binds loopback.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use te_testkit::Killed;
use te_testkit::services::free_port;

/// GET `path` from 127.0.0.1:`port`: (status line, body).
fn get(port: u16, path: &str) -> std::io::Result<(String, String)> {
    te_testkit::services::http_get(([127, 0, 0, 1], port).into(), path)
}

/// The result of `promql` asked of Prometheus's HTTP API now.
fn ask(port: u16, promql: &str) -> Vec<serde_json::Value> {
    let encoded: String = promql
        .bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect();
    let (status, body) =
        get(port, &format!("/api/v1/query?query={encoded}")).expect("Prometheus answers");
    assert!(status.contains("200"), "{promql}: {status} {body}");
    let v: serde_json::Value = serde_json::from_str(&body).expect("Prometheus's JSON");
    v["data"]["result"].as_array().cloned().unwrap_or_default()
}

/// An instant query's vector: (labels, value) pairs.
fn query(port: u16, promql: &str) -> Vec<(serde_json::Value, f64)> {
    (ask(port, promql).into_iter())
        .map(|r| {
            let value = r["value"][1]
                .as_str()
                .and_then(|x| x.parse().ok())
                .unwrap_or(f64::NAN);
            (r["metric"].clone(), value)
        })
        .collect()
}

/// A range query's samples of its one series: (seconds, value).
fn range(port: u16, promql: &str) -> Vec<(f64, f64)> {
    let result = ask(port, promql);
    let values = result.first().and_then(|r| r["values"].as_array().cloned());
    (values.unwrap_or_default().iter())
        .filter_map(|p| Some((p[0].as_f64()?, p[1].as_str()?.parse().ok()?)))
        .collect()
}

fn eventually(what: &str, within: Duration, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !ok() {
        if Instant::now() >= deadline {
            eprintln!("{what}: not within {within:?}");
            return;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn prometheus_scrapes_tents_series_that_match_the_bench() {
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("prometheus-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (metrics_port, prom_port, target_port) = (free_port(), free_port(), free_port());
    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: te\n    static_configs:\n      - targets: ['127.0.0.1:{metrics_port}']\n"
        ),
    )
    .unwrap();
    let prometheus = Command::new("prometheus")
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("data").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{prom_port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("prometheus runs (.ci/setup installs Debian's prometheus package)");
    let _prometheus = Killed(prometheus);
    let bench = env!("CARGO_BIN_EXE_te-bench");
    let mut target = Command::new(bench)
        .args(["--mode=target", "--buffer_size=67108864"])
        .arg(format!("--local_server_name=127.0.0.1:{target_port}"))
        .env("MC_LOG_LEVEL", "WARNING")
        .stdout(Stdio::piped())
        .spawn()
        .expect("te-bench target");
    let said = std::io::BufRead::lines(std::io::BufReader::new(target.stdout.take().unwrap()))
        .map_while(Result::ok)
        .any(|l| l.contains("target ready"));
    let _target = Killed(target);
    assert!(said, "the te-bench target did not start");
    eventually("Prometheus ready", Duration::from_secs(30), || {
        get(prom_port, "/-/ready").is_ok_and(|(s, _)| s.contains("200"))
    });
    // Prometheus loads its targets a few seconds after it is ready: the run starts once it
    // has tried the endpoint (not there yet), so it is scraped from the run's first second.
    eventually("Prometheus scraping", Duration::from_secs(30), || {
        get(prom_port, "/api/v1/targets").is_ok_and(|(_, body)| {
            serde_json::from_str::<serde_json::Value>(&body).is_ok_and(|v| {
                (v["data"]["activeTargets"].as_array().into_iter().flatten())
                    .any(|t| t["lastError"].as_str().is_some_and(|e| !e.is_empty()))
            })
        })
    });
    let mut initiator = Command::new(bench)
        .args([
            "--operation=write",
            "--local_server_name=127.0.0.1",
            "--threads=1",
            "--duration=8",
            "--block_size=65536",
            "--batch_size=32",
            "--buffer_size=67108864",
            "--verify",
            "--json",
            "--metrics_hold=10",
        ])
        .arg(format!("--segment_id=127.0.0.1:{target_port}"))
        .arg(format!("--metrics_port={metrics_port}"))
        .env("MC_LOG_LEVEL", "WARNING")
        .stdout(Stdio::piped())
        .spawn()
        .expect("te-bench initiator");
    // The report comes first; the endpoint then stays up (--metrics_hold) for the last scrapes.
    let mut lines =
        std::io::BufRead::lines(std::io::BufReader::new(initiator.stdout.take().unwrap()));
    let report: serde_json::Value = lines
        .by_ref()
        .map_while(Result::ok)
        .find_map(|l| serde_json::from_str(&l).ok())
        .expect("te-bench's JSON report");
    let initiator = Killed(initiator);
    let bytes = report["bytes"].as_f64().unwrap();
    let requests = report["batch_count"].as_f64().unwrap() * 32.0;
    // A scrape after the report (during --metrics_hold) holds the final counts: exactly the
    // bench's.
    let series = |promql: &str| query(prom_port, promql);
    let wanted = format!(r#"tent_write_bytes_total{{transport="tcp"}} == {bytes}"#);
    eventually(
        "a scrape of the final counts",
        Duration::from_secs(8),
        || !series(&wanted).is_empty(),
    );
    let bytes_total = series(r#"tent_write_bytes_total{transport="tcp"}"#);
    assert_eq!(bytes_total.len(), 1, "{bytes_total:?}");
    assert_eq!(
        bytes_total[0].1, bytes,
        "bytes Prometheus stored vs the bench's"
    );
    let reqs = series(r#"tent_write_requests_total{transport="tcp"}"#);
    assert_eq!(reqs[0].1, requests, "requests: 32 per batch");
    assert_eq!(
        series(r#"tent_write_failures_total{transport="tcp"}"#)[0].1,
        0.0
    );
    // --verify READs what was written back after the run: counted as reads.
    let read = series(r#"tent_read_bytes_total{transport="tcp"}"#);
    let verified = report["verified_bytes"].as_f64().unwrap();
    assert!(
        verified > 0.0 && read[0].1 == verified,
        "{read:?} vs {verified}"
    );
    let p99 = series(r#"histogram_quantile(0.99, tent_write_latency_us_bucket{transport="tcp"})"#);
    assert!(p99[0].1 > 0.0 && p99[0].1 <= 1e6, "{p99:?}");
    let sizes = series(r#"tent_write_size_bytes_bucket{transport="tcp",le="65536"}"#);
    assert_eq!(sizes[0].1, requests, "every request was 64 KiB");
    // Prometheus's rate over the run against the bench's throughput: the slope between the
    // first and last scrapes taken while bytes were moving (neither before the first byte nor
    // after the last), so it spans several whole seconds inside the run.
    let samples = range(prom_port, r#"tent_write_bytes_total{transport="tcp"}[2m]"#);
    let moving: Vec<&(f64, f64)> = (samples.iter())
        .filter(|(_, v)| *v > 0.0 && *v < bytes)
        .collect();
    assert!(
        moving.len() >= 4,
        "scrapes during the run, one a second: {samples:?}"
    );
    let (first, last) = (moving[0], moving[moving.len() - 1]);
    let scraped = (last.1 - first.1) / (last.0 - first.0);
    let bench = bytes / report["duration_s"].as_f64().unwrap();
    eprintln!(
        "Prometheus's rate over the run {:.3} GB/s; the bench's throughput {:.3} GB/s",
        scraped / 1e9,
        bench / 1e9
    );
    assert!(
        (scraped / bench - 1.0).abs() <= 0.15,
        "Prometheus's rate {scraped:.0} B/s vs the bench's {bench:.0} B/s: {samples:?}"
    );
    // The endpoint's other forms agree with it.
    let (status, json) = get(metrics_port, "/metrics/json").unwrap();
    assert!(status.contains("200"), "{status}");
    let json: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(json["tent_write_bytes_total"].as_f64(), Some(bytes));
    let (_, summary) = get(metrics_port, "/metrics/summary").unwrap();
    assert!(
        summary.starts_with("Read: ") && summary.contains("| Write: "),
        "{summary}"
    );
    assert_eq!(get(metrics_port, "/health").unwrap().1, "OK\n");
    drop(initiator);
    let _ = std::fs::remove_dir_all(&dir);
}
