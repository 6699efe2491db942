//! `cargo xtask bench capi [--duration S]`: te's C library (`libtransfer_engine.so`, built in
//! release) driven by a C program through Mooncake's C API (`crates/te-capi/bench/capi_bench.c`,
//! compiled with the system C compiler), next to te-bench's Rust path, in one run: two engines
//! in one process over TCP loopback, one thread, batches of 128, WRITE at 4 KiB and 1 MiB. The
//! C program polls each task's status as Mooncake's callers do (hot for 1 ms, then backing
//! off to a sixteenth of the time waited); te-bench waits. Runs alternate; medians are compared.
//!
//! Goal (issue 18): the C path within 5 % of the Rust path's throughput and within 1 µs of its
//! per-batch latency (p50).

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

/// One C run: (GB/s, p50 batch latency in µs).
fn c_run(bin: &Path, block: u64, seconds: u64) -> Result<(f64, f64), String> {
    let out = Command::new(bin)
        .args(["write", &block.to_string(), BATCH, &seconds.to_string()])
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
    eprintln!("  C API   write {block:>8} B: {}", text.trim());
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
        "te's C API (libtransfer_engine.so, a C program polling task status) and te-bench's Rust path, TCP loopback, 2 engines in 1 process, batch {BATCH}, 1 thread, median of {RUNS} alternating runs"
    );
    println!(
        "{:>8} {:>12} {:>12} {:>7} {:>14} {:>14} {:>9}",
        "block", "C GB/s", "Rust GB/s", "ratio", "C p50 us", "Rust p50 us", "Δ us"
    );
    for block in CASES {
        let (mut cr, mut rr) = (Vec::new(), Vec::new());
        for _ in 0..RUNS {
            cr.push(c_run(&c, block, seconds)?);
            rr.push(rust_run(&rust, block, seconds)?);
        }
        let (c_gbs, c_p50) = (
            median(cr.iter().map(|r| r.0).collect()),
            median(cr.iter().map(|r| r.1).collect()),
        );
        let (r_gbs, r_p50) = (
            median(rr.iter().map(|r| r.0).collect()),
            median(rr.iter().map(|r| r.1).collect()),
        );
        let size = crate::bench::block_label(block);
        let ratio = c_gbs / r_gbs;
        let delta = c_p50 - r_p50;
        println!(
            "{size:>8} {c_gbs:>12.2} {r_gbs:>12.2} {:>6.0}% {c_p50:>14.1} {r_p50:>14.1} {delta:>9.1}",
            ratio * 100.0
        );
        for (case, te, reference, unit, goal, met) in [
            (
                format!("write {size}: C API throughput"),
                c_gbs,
                r_gbs,
                "GB/s",
                ">= 95% of Rust",
                ratio >= 0.95,
            ),
            (
                format!("write {size}: C API batch latency p50"),
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
                goal: Some(goal.into()),
                met: Some(met),
                mooncake: None,
            });
            if !met {
                missed.push(format!("{case}: {te:.2} vs {reference:.2} {unit}"));
            }
        }
    }
    println!(
        "goal: the C path within 5% of the Rust path's throughput and 1 us of its batch latency"
    );
    match missed.is_empty() {
        true => Ok(()),
        false => Err(format!("missed: {}", missed.join("; "))),
    }
}
