//! `cargo xtask bench python [--duration S]`: one script of Mooncake's Python API
//! (`crates/te-py/bench/mooncake_api.py`) run against te's `te.mooncake` (built and installed
//! into `target/te-py-venv`) and against Mooncake's wheel (`target/mooncake-venv`, or
//! `$TE_MOONCAKE_VENV`), TCP loopback, P2PHANDSHAKE, in one run. Each engine's initiator talks
//! to a target of the same engine. Figures: `transfer_sync_write` of 4 KiB (p50, p99), of 1 MiB
//! (GB/s, and the CPU the calling thread uses while it waits), and ten threads each calling
//! `batch_transfer_sync_write` with 32 × 64 KiB (aggregate GB/s). The script checks every byte
//! written by reading it back. Runs alternate between the engines; medians are compared.
//!
//! Goals (issue 17): te's 4 KiB p50 at most half of Mooncake's; te's 1 MiB and ten-thread
//! figures at least 1.5× Mooncake's; te's waiting thread under 10 % of a core. Then the
//! same-host rows ([`crate::same_host_bench`]).

use std::path::PathBuf;
use std::process::Command;

use crate::bench::{duration_arg, json_number, median};

const SCRIPT: &str = "crates/te-py/bench/mooncake_api.py";
/// Runs of each engine; the median is compared.
const RUNS: usize = 3;

fn mooncake_python() -> PathBuf {
    std::env::var_os("TE_MOONCAKE_VENV")
        .map_or_else(|| PathBuf::from("target/mooncake-venv"), PathBuf::from)
        .join("bin/python3")
}

/// The figures of one run of the script, in `KEYS` order.
const KEYS: [&str; 5] = [
    "p50_us_4k",
    "p99_us_4k",
    "gb_s_1m",
    "gb_s_ten_threads",
    "wait_cpu_pct",
];

fn one_run(python: &PathBuf, engine: &str, seconds: u64) -> Result<Vec<f64>, String> {
    let out = Command::new(python)
        .args([SCRIPT, engine, &format!("--seconds={seconds}")])
        .output()
        .map_err(|e| format!("{}: {e}", python.display()))?;
    if !out.status.success() {
        return Err(format!(
            "the {engine} run failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    eprintln!("  {engine}: {}", text.trim());
    if !text.contains("\"verified\": true") {
        return Err(format!(
            "{engine}: the script did not verify its bytes: {text}"
        ));
    }
    KEYS.iter()
        .map(|k| json_number(&text, k).ok_or_else(|| format!("no {k} in: {text}")))
        .collect()
}

/// One row of the table and the report: te's and Mooncake's medians and whether te met `goal`.
struct Row {
    case: &'static str,
    unit: &'static str,
    te: f64,
    mooncake: f64,
    goal: &'static str,
    met: bool,
}

pub(crate) fn python(args: &[&str]) -> Result<(), String> {
    let seconds = duration_arg(args, "usage: cargo xtask bench python [--duration SECONDS]")?;
    let mc = mooncake_python();
    if !mc.exists() {
        return Err(format!(
            "{} missing: .ci/setup installs Mooncake's wheel there",
            mc.display()
        ));
    }
    crate::ci::install_te_py()?;
    let te = PathBuf::from(crate::ci::TE_PYTHON);
    let (mut te_runs, mut mc_runs) = (Vec::new(), Vec::new());
    for _ in 0..RUNS {
        mc_runs.push(one_run(&mc, "mooncake", seconds)?);
        te_runs.push(one_run(&te, "te", seconds)?);
    }
    let med = |runs: &[Vec<f64>], i: usize| median(runs.iter().map(|r| r[i]).collect());
    let (t, m): (Vec<f64>, Vec<f64>) = (0..KEYS.len())
        .map(|i| (med(&te_runs, i), med(&mc_runs, i)))
        .unzip();
    let rows = [
        Row {
            case: "transfer_sync_write 4 KiB p50",
            unit: "us",
            te: t[0],
            mooncake: m[0],
            goal: "<= 50% of Mooncake",
            met: t[0] <= m[0] / 2.0,
        },
        Row {
            case: "transfer_sync_write 4 KiB p99",
            unit: "us",
            te: t[1],
            mooncake: m[1],
            goal: "(reported)",
            met: true,
        },
        Row {
            case: "transfer_sync_write 1 MiB",
            unit: "GB/s",
            te: t[2],
            mooncake: m[2],
            goal: ">= 150% of Mooncake",
            met: t[2] >= m[2] * 1.5,
        },
        Row {
            case: "10 threads × batch_transfer_sync_write 32 × 64 KiB",
            unit: "GB/s",
            te: t[3],
            mooncake: m[3],
            goal: ">= 150% of Mooncake",
            met: t[3] >= m[3] * 1.5,
        },
        Row {
            case: "CPU of a thread waiting in a 1 MiB call",
            unit: "% core",
            te: t[4],
            mooncake: m[4],
            goal: "< 10%",
            met: t[4] < 10.0,
        },
    ];
    println!(
        "te.mooncake and Mooncake's wheel (0.3.13.post1) from one Python script, TCP loopback, P2PHANDSHAKE, median of {RUNS} alternating runs"
    );
    println!(
        "{:<52} {:>10} {:>10} {:>7}  goal",
        "case", "te", "Mooncake", "te/MC"
    );
    let mut missed = Vec::new();
    for r in &rows {
        println!(
            "{:<52} {:>10.2} {:>10.2} {:>6.0}%  {} {}",
            format!("{} ({})", r.case, r.unit),
            r.te,
            r.mooncake,
            r.te / r.mooncake * 100.0,
            r.goal,
            if r.met { "met" } else { "MISSED" }
        );
        crate::report::record(crate::report::Record {
            bench: "python",
            case: r.case.to_string(),
            series: None,
            te: r.te,
            unit: r.unit,
            reference: Some(("Mooncake (Python wheel)".into(), r.mooncake)),
            goal: Some(r.goal.into()),
            met: Some(r.met),
            mooncake: None,
        });
        if !r.met {
            missed.push(format!(
                "{}: te {:.2} {}, Mooncake {:.2}",
                r.case, r.te, r.unit, r.mooncake
            ));
        }
    }
    missed.extend(crate::same_host_bench::same_host(&te, seconds)?);
    match missed.is_empty() {
        true => Ok(()),
        false => Err(format!("missed: {}", missed.join("; "))),
    }
}
