//! te-metadata's own metrics (`--metrics-addr`): a client's puts, gets, misses and a put past
//! `--max-stored` are counted by method and status, a connection over `--max-connections` by
//! its reason, the keys and bytes held and the log's syncs are shown; Prometheus's checker
//! accepts the text; a taken address is an error naming the flag.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{http_server_with, scratch};
use te_core::metadata::http::HttpStore;
use te_core::metadata::store::KvStore;

/// The body of `GET path` from `port`.
fn scrape(port: u16, path: &str) -> String {
    let (status, body) =
        te_testkit::services::http_get(([127, 0, 0, 1], port).into(), path).unwrap();
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    body
}

#[test]
fn requests_connections_keys_and_syncs_are_counted() {
    let file = scratch("metrics.json");
    common::remove_persisted(&file);
    let metrics_port = te_testkit::services::free_port();
    // Room for two 1,000-byte values under keys of 6 bytes (64 bytes each of bookkeeping).
    let room = 2 * (6 + 1000 + 64) + 100;
    let svc = http_server_with(
        0,
        Some(&file),
        &[
            "--max-stored",
            &room.to_string(),
            "--max-connections",
            "2",
            "--metrics-addr",
            &format!("127.0.0.1:{metrics_port}"),
        ],
    );
    let kv = HttpStore::new(&svc.url, Duration::from_secs(2), 1 << 20).unwrap();
    kv.put("key-01", &[1; 1000]).unwrap();
    kv.put("key-02", &[2; 1000]).unwrap();
    assert!(kv.put("key-03", &[3; 1000]).is_err(), "past --max-stored");
    assert_eq!(kv.get("key-01").unwrap().unwrap(), vec![1; 1000]);
    assert_eq!(kv.get("key-09").unwrap(), None);
    // The client keeps one connection; one more fills the cap, and a third is turned away.
    let _second = TcpStream::connect(("127.0.0.1", svc.port)).unwrap();
    let mut third = TcpStream::connect(("127.0.0.1", svc.port)).unwrap();
    let mut refused = String::new();
    third.read_to_string(&mut refused).unwrap();
    assert!(refused.starts_with("HTTP/1.1 503"), "{refused}");
    let text = scrape(metrics_port, "/metrics");
    for line in [
        r#"te_metadata_requests_total{method="PUT",status="200"} 2"#,
        r#"te_metadata_requests_total{method="PUT",status="507"} 1"#,
        r#"te_metadata_requests_total{method="GET",status="200"} 1"#,
        r#"te_metadata_requests_total{method="GET",status="404"} 1"#,
        r#"te_metadata_connections_refused_total{reason="capacity"} 1"#,
        "te_metadata_connections 2",
        "te_metadata_keys 2",
        "te_metadata_stored_bytes 2140",
        "# TYPE te_metadata_sync_seconds histogram",
    ] {
        assert!(text.lines().any(|l| l == line), "no {line:?} in:\n{text}");
    }
    let syncs: u64 = (text.lines())
        .find_map(|l| l.strip_prefix("te_metadata_sync_seconds_count "))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no sync count in:\n{text}"));
    assert!(
        (1..=2).contains(&syncs),
        "two changes made durable: {syncs}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&scrape(metrics_port, "/metrics/json")).unwrap();
    assert_eq!(json["keys"], 2);
    assert_eq!(json["connections_refused"]["capacity"], 1);
    assert_eq!(
        scrape(metrics_port, "/metrics/summary"),
        "Requests: 5 (1 turned away) | Connections: 2 | Keys: 2 (2140 bytes)\n"
    );
    assert_eq!(scrape(metrics_port, "/health"), "OK\n");
    let mut promtool = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool: .ci/setup installs Debian's prometheus package");
    promtool
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = promtool.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_taken_metrics_address_is_an_error_naming_the_flag() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let at = taken.local_addr().unwrap().to_string();
    let out = Command::new(env!("CARGO_BIN_EXE_te-metadata"))
        .args(["--addr", "127.0.0.1:0", "--metrics-addr", &at])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains(&format!("--metrics-addr {at}")), "{said}");
    let out = Command::new(env!("CARGO_BIN_EXE_te-metadata"))
        .args(["--metrics-addr", "localhost"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--metrics-addr localhost"));
}
