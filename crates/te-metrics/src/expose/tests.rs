use crate::counters::{FailureKind, Metrics, Operation, TransportLabel};

use super::*;

fn sample() -> Snapshot {
    let m = Metrics::default();
    m.request_ended(TransportLabel::Tcp, Operation::Write, 1 << 20, Ok(()), 700);
    m.request_ended(TransportLabel::Tcp, Operation::Write, 4096, Ok(()), 80);
    m.request_ended(
        TransportLabel::Tcp,
        Operation::Write,
        4096,
        Err(FailureKind::Refused),
        5,
    );
    m.request_ended(TransportLabel::Rdma, Operation::Read, 65536, Ok(()), 20);
    m.slice_retried(TransportLabel::Tcp, Operation::Write);
    m.failover(TransportLabel::Rdma, TransportLabel::Tcp);
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
    assert_eq!(
        summary(&s),
        "Read: 64.00 KB (1 reqs, 0 fails) | Write: 1.00 MB (3 reqs, 1 fails)"
    );
    assert_eq!(
        summary(&Snapshot::default()),
        "Read: 0.00 B (0 reqs, 0 fails) | Write: 0.00 B (0 reqs, 0 fails)"
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
