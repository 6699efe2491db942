//! `cargo xtask bench rpc [--duration S]`: Mooncake's RPC communicator API under load
//! (`crates/te-py/bench/rpc.py`), te's `te.mooncake` and Mooncake's wheel in every pairing of
//! server and client, in one run: eight client threads sending 1 MiB and 4 KiB messages, and
//! one thread's 4 KiB round trips, to a server whose Python receive callback checks every
//! message. Each run's server counts are compared with its client's. te's TCP WRITE of 1 MiB
//! (te-bench, batch 128) runs in the same session as the ceiling of one engine's bytes over
//! loopback. Pairings alternate; medians of [`RUNS`] are compared.
//!
//! Goals (issue 75): te↔te 1 MiB × 8 at least 2× Mooncake↔Mooncake and at least 80 % of te's
//! TCP WRITE at 1 MiB; te↔te 4 KiB round trip p50 at most half of Mooncake↔Mooncake's; the
//! mixed pairs no slower than Mooncake↔Mooncake.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};

use crate::bench::{duration_arg, json_number, median};

const SCRIPT: &str = "crates/te-py/bench/rpc.py";
/// Runs of each pairing; medians are compared.
const RUNS: usize = 3;
/// Server, client.
const PAIRS: [(&str, &str); 4] = [
    ("te", "te"),
    ("mooncake", "mooncake"),
    ("te", "mooncake"),
    ("mooncake", "te"),
];
/// The figures of one client run, in this order.
const KEYS: [&str; 4] = ["gb_s_1m", "gb_s_4k", "p50_us_4k", "p99_us_4k"];

fn python(engine: &str) -> PathBuf {
    match engine {
        "te" => PathBuf::from(crate::ci::TE_PYTHON),
        _ => std::env::var_os("TE_MOONCAKE_VENV")
            .map_or_else(|| PathBuf::from("target/mooncake-venv"), PathBuf::from)
            .join("bin/python3"),
    }
}

/// One pairing's run: the client's figures, after checking the server took every message
/// the client says it delivered, each of the right length.
fn one_run((server, client): (&str, &str), seconds: u64) -> Result<Vec<f64>, String> {
    let mut srv = Command::new(python(server))
        .args([SCRIPT, "serve", server])
        // Mooncake's server logs every message at INFO otherwise.
        .env("GLOG_minloglevel", "2")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("starting the {server} server: {e}"))?;
    let mut out = BufReader::new(srv.stdout.take().ok_or("no server stdout")?);
    let mut line = String::new();
    out.read_line(&mut line).map_err(|e| e.to_string())?;
    let port = line
        .trim()
        .strip_prefix("port ")
        .ok_or(format!("server said {line:?}"))?;
    let sent = Command::new(python(client))
        .args([SCRIPT, "send", client, &format!("127.0.0.1:{port}")])
        .arg(format!("--seconds={seconds}"))
        .env("GLOG_minloglevel", "2")
        .output()
        .map_err(|e| format!("the {client} client: {e}"))?;
    drop(srv.stdin.take());
    let mut counts = String::new();
    out.read_line(&mut counts).map_err(|e| e.to_string())?;
    let _ = srv.wait();
    let text = String::from_utf8_lossy(&sent.stdout).into_owned();
    eprintln!("  {server} server, {client} client: {}", text.trim());
    let number = |json: &str, k: &str| json_number(json, k).ok_or(format!("no {k} in {json}"));
    let (messages, bytes) = (number(&text, "messages")?, number(&text, "bytes")?);
    if number(&text, "failed")? != 0.0
        || number(&counts, "messages")? != messages
        || number(&counts, "bytes")? != bytes
        || number(&counts, "bad")? != 0.0
    {
        return Err(format!(
            "{server} server, {client} client: sent {text}, received {counts}"
        ));
    }
    KEYS.iter().map(|k| number(&text, k)).collect()
}

/// The rows: case, unit, and the index of its figure in [`KEYS`].
const ROWS: [(&str, &str, usize); 4] = [
    ("8 threads × send_data 1 MiB", "GB/s", 0),
    ("8 threads × send_data 4 KiB", "GB/s", 1),
    ("send_data 4 KiB round trip p50", "us", 2),
    ("send_data 4 KiB round trip p99", "us", 3),
];

pub(crate) fn rpc(args: &[&str]) -> Result<(), String> {
    let seconds = duration_arg(args, "usage: cargo xtask bench rpc [--duration SECONDS]")?;
    if !python("mooncake").exists() {
        return Err(format!(
            "{} missing: .ci/setup installs Mooncake's wheel",
            python("mooncake").display()
        ));
    }
    crate::ci::install_te_py()?;
    let bin = crate::bench::build_te_bench()?;
    let mut runs: Vec<Vec<Vec<f64>>> = vec![Vec::new(); PAIRS.len()];
    let mut tcp = Vec::new();
    for _ in 0..RUNS {
        for (i, pair) in PAIRS.iter().enumerate() {
            runs[i].push(one_run(*pair, seconds)?);
        }
        tcp.push(crate::bench::te_bench(
            &bin,
            "write",
            1 << 20,
            false,
            seconds,
        )?);
    }
    let med: Vec<Vec<f64>> = runs
        .iter()
        .map(|r| {
            (0..KEYS.len())
                .map(|k| median(r.iter().map(|x| x[k]).collect()))
                .collect()
        })
        .collect();
    let tcp = median(tcp);
    report(&med, tcp)
}

/// Prints and records the rows; the goals missed, as an error.
fn report(med: &[Vec<f64>], tcp: f64) -> Result<(), String> {
    println!(
        "Mooncake's RpcInterface API from one Python script (server with a checking receive callback), loopback, median of {RUNS} alternating runs; te TCP WRITE 1 MiB (te-bench, batch 128) {tcp:.2} GB/s"
    );
    println!(
        "{:<38} {:>9} {:>9} {:>11} {:>11}  goal",
        "case", "te↔te", "MC↔MC", "te srv←MC", "MC srv←te"
    );
    let mut missed = Vec::new();
    for (case, unit, k) in ROWS {
        let (te, mc, te_srv, mc_srv) = (med[0][k], med[1][k], med[2][k], med[3][k]);
        let lower_better = unit == "us";
        let no_slower = |x: f64| if lower_better { x <= mc } else { x >= mc };
        let (goal, met) = match k {
            0 => (
                format!(">= 200% of MC↔MC and >= 80% of te TCP WRITE ({tcp:.2}); mixed >= MC↔MC"),
                te >= 2.0 * mc && te >= 0.8 * tcp && no_slower(te_srv) && no_slower(mc_srv),
            ),
            2 => (
                "<= 50% of MC↔MC; mixed <= MC↔MC".to_string(),
                te <= mc / 2.0 && no_slower(te_srv) && no_slower(mc_srv),
            ),
            _ => (
                "mixed no slower than MC↔MC".to_string(),
                no_slower(te_srv) && no_slower(mc_srv),
            ),
        };
        println!(
            "{:<38} {te:>9.3} {mc:>9.3} {te_srv:>11.3} {mc_srv:>11.3}  {goal} {}",
            format!("{case} ({unit})"),
            if met { "met" } else { "MISSED" }
        );
        for (series, figure) in [
            ("te↔te", te),
            ("te server ← Mooncake client", te_srv),
            ("Mooncake server ← te client", mc_srv),
        ] {
            crate::report::record(crate::report::Record {
                bench: "rpc",
                case: format!("{case}, {series}"),
                series: None,
                te: figure,
                unit,
                reference: Some(("Mooncake↔Mooncake (wheel)".into(), mc)),
                goal: (series == "te↔te").then(|| goal.clone()),
                met: (series == "te↔te").then_some(met),
                mooncake: None,
            });
        }
        if !met {
            missed.push(format!(
                "{case}: te↔te {te:.3}, MC↔MC {mc:.3}, mixed {te_srv:.3} / {mc_srv:.3} {unit}"
            ));
        }
    }
    match missed.is_empty() {
        true => Ok(()),
        false => Err(format!("missed: {}", missed.join("; "))),
    }
}
