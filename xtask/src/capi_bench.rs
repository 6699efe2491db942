//! `cargo xtask bench capi [--duration S]`: te's C library (`libtransfer_engine.so`, built in
//! release) driven by a C program through Mooncake's C API (`crates/te-capi/bench/capi_bench.c`,
//! compiled with the system C compiler), next to te-bench's Rust path, in one run: two engines
//! in one process over TCP loopback, one thread, batches of 128, WRITE at 4 KiB and 1 MiB.
//! te-bench sleeps in `wait` until a batch ends; the C program does the same through te's
//! extension `te_waitBatch` (the compared path), and, for information, polls each task's status
//! as Mooncake's callers must (hot for 1 ms, then backing off to a sixteenth of the time
//! waited). Runs alternate; medians are compared.
//!
//! Goal (issue 18): the C path within 5 % of the Rust path's throughput and within 1 µs of its
//! per-batch latency (p50). A poller's latency is its poll interval's, whatever the library
//! does, so the polling rows carry no goal.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::bench::{build_te_bench, duration_arg, json_number, median, run_json};

const CASES: [u64; 2] = [4 << 10, 1 << 20];
const BATCH: &str = "128";
const RUNS: usize = 5;

/// Builds the library in release and compiles the bench program against it.
fn build_c_bench() -> Result<PathBuf, String> {
    crate::run(
        "build te-capi (release)",
        crate::cargo().args(["build", "--release", "-p", "te-capi"]),
    )?;
    let target = std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| "target".into());
    let lib = std::fs::canonicalize(Path::new(&target).join("release"))
        .map_err(|e| format!("{target}/release: {e}"))?;
    let out = lib.join("capi_bench");
    crate::run(
        "compile crates/te-capi/bench/capi_bench.c",
        Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
            .args([
                "-std=c11",
                "-O2",
                "-Wall",
                "-Werror",
                "-Icrates/te-capi/include",
            ])
            .arg("crates/te-capi/bench/capi_bench.c")
            .arg(format!("-L{}", lib.display()))
            .arg(format!("-Wl,-rpath,{}", lib.display()))
            .args(["-ltransfer_engine", "-o"])
            .arg(&out),
    )?;
    Ok(out)
}

/// How the C program learns that a batch ended.
#[derive(Clone, Copy, PartialEq)]
enum Waiting {
    /// Asleep in `te_waitBatch`.
    Sleep,
    /// Polling `getTransferStatus` task by task.
    Poll,
}

impl Waiting {
    fn arg(self) -> &'static str {
        match self {
            Waiting::Sleep => "wait",
            Waiting::Poll => "poll",
        }
    }
}

/// One C run: (GB/s, p50 batch latency in µs).
fn c_run(bin: &Path, block: u64, seconds: u64, waiting: Waiting) -> Result<(f64, f64), String> {
    let out = Command::new(bin)
        .args(["write", &block.to_string(), BATCH, &seconds.to_string()])
        .arg(waiting.arg())
        .env("MC_FORCE_TCP", "1")
        // cargo runs xtask with target/debug/deps on LD_LIBRARY_PATH, which outranks the
        // program's rpath: without this the C program would load the debug library.
        .env_remove("LD_LIBRARY_PATH")
        .output()
        .map_err(|e| format!("capi_bench: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        return Err(format!(
            "capi_bench {block} B failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    eprintln!(
        "  C API ({}) write {block:>8} B: {}",
        waiting.arg(),
        text.trim()
    );
    let gbs = json_number(&text, "throughput_gb_s").ok_or("no throughput from capi_bench")?;
    let p50 = json_number(&text, "p50").ok_or("no p50 from capi_bench")?;
    Ok((gbs, p50))
}

/// One te-bench loopback run: (GB/s, p50 batch latency in µs).
fn rust_run(bin: &str, block: u64, seconds: u64) -> Result<(f64, f64), String> {
    let mut cmd = Command::new(bin);
    cmd.args(["--loopback", "--operation=write", "--protocol=tcp"])
        .arg(format!("--block_size={block}"))
        .args([&format!("--batch_size={BATCH}"), "--threads=1"])
        .arg(format!("--duration={seconds}"));
    let text = run_json(cmd, &format!("te-bench write {block:>8} B"))?;
    let gbs = json_number(&text, "throughput_gb_s").ok_or("no throughput from te-bench")?;
    let p50 = json_number(&text, "p50").ok_or("no p50 from te-bench")?;
    Ok((gbs, p50))
}

pub(crate) fn capi(args: &[&str]) -> Result<(), String> {
    let seconds = duration_arg(args, "usage: cargo xtask bench capi [--duration SECONDS]")?;
    let c = build_c_bench()?;
    let rust = build_te_bench()?;
    let mut missed = Vec::new();
    println!(
        "te's C API (libtransfer_engine.so from a C program: asleep in te_waitBatch, or polling task status) and te-bench's Rust path, TCP loopback, 2 engines in 1 process, batch {BATCH}, 1 thread, median of {RUNS} alternating runs"
    );
    println!(
        "{:>8} {:>6} {:>12} {:>12} {:>7} {:>14} {:>14} {:>9}",
        "block", "C", "C GB/s", "Rust GB/s", "ratio", "C p50 us", "Rust p50 us", "Δ us"
    );
    let median_of = |runs: &[(f64, f64)]| {
        (
            median(runs.iter().map(|r| r.0).collect()),
            median(runs.iter().map(|r| r.1).collect()),
        )
    };
    for block in CASES {
        let (mut slept, mut polled, mut rr) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..RUNS {
            slept.push(c_run(&c, block, seconds, Waiting::Sleep)?);
            rr.push(rust_run(&rust, block, seconds)?);
            polled.push(c_run(&c, block, seconds, Waiting::Poll)?);
        }
        let (r_gbs, r_p50) = median_of(&rr);
        let size = crate::bench::block_label(block);
        for (waiting, runs) in [(Waiting::Sleep, &slept), (Waiting::Poll, &polled)] {
            let (c_gbs, c_p50) = median_of(runs);
            let ratio = c_gbs / r_gbs;
            let delta = c_p50 - r_p50;
            println!(
                "{size:>8} {:>6} {c_gbs:>12.2} {r_gbs:>12.2} {:>6.0}% {c_p50:>14.1} {r_p50:>14.1} {delta:>9.1}",
                waiting.arg(),
                ratio * 100.0
            );
            let (how, goals) = match waiting {
                Waiting::Sleep => ("te_waitBatch", true),
                Waiting::Poll => ("polling getTransferStatus", false),
            };
            for (case, te, reference, unit, goal, met) in [
                (
                    format!("write {size}: C API throughput, {how}"),
                    c_gbs,
                    r_gbs,
                    "GB/s",
                    ">= 95% of Rust",
                    ratio >= 0.95,
                ),
                (
                    format!("write {size}: C API batch latency p50, {how}"),
                    c_p50,
                    r_p50,
                    "us",
                    "<= Rust + 1 us",
                    delta <= 1.0,
                ),
            ] {
                crate::report::record(crate::report::Record {
                    bench: "capi",
                    case: case.clone(),
                    series: None,
                    te,
                    unit,
                    reference: Some(("te-bench (Rust)".into(), reference)),
                    goal: goals.then(|| goal.into()),
                    met: goals.then_some(met),
                    mooncake: None,
                });
                if goals && !met {
                    missed.push(format!("{case}: {te:.2} vs {reference:.2} {unit}"));
                }
            }
        }
    }
    println!(
        "goal: the C path (te_waitBatch) within 5% of the Rust path's throughput and 1 us of its batch latency; the polling rows are for information"
    );
    match missed.is_empty() {
        true => Ok(()),
        false => Err(format!("missed: {}", missed.join("; "))),
    }
}
