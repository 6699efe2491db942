use crate::counters::{FailureKind, Metrics, Operation, Stages, TransportLabel};

use super::*;

fn sample() -> Snapshot {
    let m = Metrics::default();
    let stages = Stages {
        queue_wait_us: 30,
        dispatch_us: 70,
        transport_us: 600,
    };
    let (tcp, write) = (TransportLabel::Tcp, Operation::Write);
    m.request_ended(tcp, write, 1 << 20, Ok(()), 700, stages);
    m.request_ended(tcp, write, 4096, Ok(()), 80, Stages::default());
    m.request_ended(tcp, write, 4096, Err(FailureKind::Refused), 5, stages);
    m.request_ended(
        TransportLabel::Rdma,
        Operation::Read,
        65536,
        Ok(()),
        20,
        stages,
    );
    m.slice_retried(tcp, write);
    // One request failed over from RDMA to TCP: a failed RDMA attempt, a TCP one that worked.
    m.attempt_ended(TransportLabel::Rdma, write, false, 40);
    m.failover(TransportLabel::Rdma, tcp);
    m.attempt_ended(tcp, write, true, 650);
    m.deadline_infeasible(tcp);
    m.snapshot()
}

#[test]
fn prometheus_text_carries_tents_series_with_their_labels() {
    let text = prometheus_text(&sample());
    for line in [
        "# TYPE tent_write_bytes_total counter",
        r#"tent_write_bytes_total{transport="tcp"} 1052672"#,
        r#"tent_write_requests_total{transport="tcp"} 3"#,
        r#"tent_write_failures_total{transport="tcp"} 1"#,
        r#"tent_read_bytes_total{transport="rdma"} 65536"#,
        "# TYPE tent_write_latency_us histogram",
        r#"tent_write_latency_us_bucket{transport="tcp",le="100"} 1"#,
        r#"tent_write_latency_us_bucket{transport="tcp",le="1000"} 2"#,
        r#"tent_write_latency_us_bucket{transport="tcp",le="+Inf"} 2"#,
        r#"tent_write_latency_us_count{transport="tcp"} 2"#,
        r#"tent_write_size_bytes_sum{transport="tcp"} 1052672"#,
        r#"tent_transport_failover_total{from="rdma",to="tcp"} 1"#,
        r#"te_request_failures_total{transport="tcp",operation="write",kind="refused"} 1"#,
        r#"te_slice_retries_total{transport="tcp",operation="write"} 1"#,
        r#"tent_transport_attempts_total{transport="tcp",operation="write"} 1"#,
        r#"tent_transport_attempts_total{transport="rdma",operation="write"} 1"#,
        r#"tent_transport_attempt_failures_total{transport="rdma",operation="write"} 1"#,
        r#"tent_transport_attempt_failures_total{transport="tcp",operation="write"} 0"#,
        r#"tent_transport_attempt_latency_us_bucket{transport="tcp",operation="write",le="1000"} 1"#,
        "# TYPE tent_stage_queue_wait_us histogram",
        // Completed requests only: two on TCP (30 and 0 µs), one on RDMA.
        r#"tent_stage_queue_wait_us_count{transport="tcp"} 2"#,
        r#"tent_stage_queue_wait_us_bucket{transport="tcp",le="10"} 1"#,
        r#"tent_stage_dispatch_us_sum{transport="tcp"} 70"#,
        r#"tent_stage_transport_us_sum{transport="rdma"} 600"#,
        r#"tent_deadline_infeasible_total{transport="tcp"} 1"#,
        r#"te_task_latency_seconds_count 3"#,
        r#"te_task_latency_seconds_bucket{le="0.00002"} 1"#,
    ] {
        assert!(text.lines().any(|l| l == line), "no {line:?} in:\n{text}");
    }
    // Series never observed are left out, as TENT leaves them out.
    assert!(
        !text.contains("tent_read_bytes_total{transport=\"tcp\"}"),
        "{text}"
    );
    assert!(!text.contains("te_rail_pauses"), "{text}");
}

#[test]
fn json_and_summary_give_the_same_totals() {
    let s = sample();
    let j = json(&s);
    assert_eq!(j["tent_write_bytes_total"], 1052672);
    assert_eq!(j["tent_write_requests_total"], 3);
    assert_eq!(j["tent_write_failures_total"], 1);
    assert_eq!(j["tent_read_requests_total"], 1);
    assert_eq!(j["failovers"][0]["from"], "rdma");
    let tcp = (j["series"].as_array().unwrap().iter())
        .find(|x| x["transport"] == "tcp")
        .unwrap();
    assert_eq!(tcp["failures"]["refused"], 1);
    assert_eq!(tcp["latency_us"]["count"], 2);
    assert_eq!(tcp["attempts"], 1);
    assert_eq!(tcp["stage_dispatch_us"]["sum"], 70);
    assert_eq!(j["deadline_infeasible"]["tcp"], 1);
    assert_eq!(
        summary(&s),
        "Read: 64.00 KB (1 reqs, 0 fails) | Write: 1.00 MB (3 reqs, 1 fails)"
    );
    assert_eq!(
        summary(&Snapshot::default()),
        "Read: 0.00 B (0 reqs, 0 fails) | Write: 0.00 B (0 reqs, 0 fails)"
    );
}

#[test]
fn the_classic_report_is_mooncakes_line_over_the_interval() {
    let m = Metrics::default();
    let before = m.snapshot().task_latency_us;
    for latency in [15, 15, 15, 700] {
        m.request_ended(
            TransportLabel::Tcp,
            Operation::Write,
            1 << 20,
            Ok(()),
            latency,
            Stages::default(),
        );
    }
    m.request_ended(
        TransportLabel::Tcp,
        Operation::Write,
        1,
        Ok(()),
        u64::MAX / 2,
        Stages::default(),
    );
    let now = m.snapshot().task_latency_us;
    assert_eq!(
        classic_report(5, 10 << 20, &now.since(&before)).unwrap(),
        "[Metrics] Transfer Engine Stats (over last 5s): Throughput: 2.00 MB/s | \
         Latency Distribution (count=5): 10-20μs:60.0%, 500-1000μs:20.0%, >10000000μs:20.0%"
    );
    // An idle interval logs nothing; bytes alone log the throughput only.
    assert_eq!(classic_report(5, 0, &now.since(&now)), None);
    assert_eq!(
        classic_report(2, 1 << 20, &now.since(&now)).unwrap(),
        "[Metrics] Transfer Engine Stats (over last 2s): Throughput: 0.50 MB/s"
    );
}

/// Prometheus's own checker (Debian's `prometheus` package, which `.ci/setup` installs) finds
/// nothing wrong with the text.
#[test]
fn promtool_accepts_the_text() {
    let Ok(mut child) = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
    else {
        panic!("promtool is missing: .ci/setup installs Debian's prometheus package");
    };
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(prometheus_text(&sample()).as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    // Its one complaint is about TENT's own names (`_us`): kept, for TENT's dashboards.
    let said =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    let problems: Vec<&str> = (said.lines())
        .filter(|l| !l.is_empty())
        .filter(|l| {
            !(l.starts_with("tent_")
                && l.ends_with("metric names should not contain abbreviated units"))
        })
        .collect();
    assert!(problems.is_empty(), "promtool: {said}");
    assert!(
        out.status.success() || said.contains("abbreviated units"),
        "promtool: {said}"
    );
}

/// Every query of the Grafana dashboard in `docs/` is valid PromQL (promtool checks them as
/// recording rules) and reads only series te serves.
#[test]
fn the_grafana_dashboard_asks_for_series_te_serves() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/grafana-te.json");
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let exprs: Vec<String> = (dashboard["panels"].as_array().unwrap().iter())
        .flat_map(|p| p["targets"].as_array().unwrap().iter())
        .map(|t| {
            t["expr"]
                .as_str()
                .unwrap()
                .replace("$__rate_interval", "1m")
        })
        .collect();
    assert!(exprs.len() >= 8, "{exprs:?}");
    // Every series observed once, so every family is in the text.
    let m = Metrics::default();
    for op in Operation::ALL {
        m.request_ended(TransportLabel::Tcp, op, 4096, Ok(()), 9, Stages::default());
        m.request_ended(
            TransportLabel::Tcp,
            op,
            1,
            Err(FailureKind::Path),
            9,
            Stages::default(),
        );
        m.slice_retried(TransportLabel::Tcp, op);
        m.attempt_ended(TransportLabel::Tcp, op, false, 9);
    }
    m.failover(TransportLabel::Rdma, TransportLabel::Tcp);
    m.rail_paused();
    let text = prometheus_text(&m.snapshot());
    let served: Vec<&str> = (text.lines())
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split(' ').next())
        .collect();
    for expr in &exprs {
        let names = expr
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .filter(|w| w.starts_with("tent_") || w.starts_with("te_"));
        for name in names {
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| name.strip_suffix(s))
                .unwrap_or(name);
            assert!(
                served.contains(&family),
                "{name} (in {expr}) is not served: {served:?}"
            );
        }
    }
    let rules: String = exprs
        .iter()
        .enumerate()
        .map(|(i, e)| {
            format!(
                "      - record: te:panel_{i}\n        expr: {}\n",
                serde_json::Value::from(e.as_str())
            )
        })
        .collect();
    let file = std::env::temp_dir().join(format!("te-grafana-rules-{}.yml", std::process::id()));
    std::fs::write(&file, format!("groups:\n  - name: te\n    rules:\n{rules}")).unwrap();
    let out = std::process::Command::new("promtool")
        .args(["check", "rules"])
        .arg(&file)
        .output()
        .expect("promtool: .ci/setup installs Debian's prometheus package");
    let _ = std::fs::remove_file(&file);
    assert!(
        out.status.success(),
        "promtool: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
