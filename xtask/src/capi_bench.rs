//! `cargo xtask bench capi [--duration S]`: te's C library (`libtransfer_engine.so`, built in
//! release) driven by a C program through Mooncake's C API (`crates/te-capi/bench/capi_bench.c`,
//! compiled with the system C compiler), next to te-bench's Rust path, in one run: two engines
//! in one process over TCP loopback, one thread, batches of 128, WRITE at 4 KiB and 1 MiB.
//! te-bench sleeps in `wait` until a batch ends; the C program does the same through te's
//! extension `te_waitBatch` (the compared path), and, for information, polls each task's status
//! as Mooncake's callers must (hot for 1 ms, then backing off to a sixteenth of the time
//! waited). Runs alternate; medians are compared.
//!
//! Then the C path's own cost per batch: the same C program against a build of the library
//! with te-capi's `instant` feature (te-core's transport that moves no byte and ends each slice
//! as it is posted; copied to `target/release/capi-instant/`, and the plain library is built
//! again after it), next to te-bench `--mode=engine` (the Rust path on the same transport),
//! alternating, one buffer each, the same batches. Over TCP a 1 MiB batch of 128 takes tens of
//! milliseconds and varies by more than a millisecond from run to run, so a microsecond shows
//! only where nothing else is measured.
//!
//! Goals (issue 18): the C path within 5 % of the Rust path's throughput over TCP, and within
//! 1 µs of its per-batch latency, judged on the instant transport (the median of the paired
//! differences); the TCP latencies are reported beside it. A poller's latency is its poll
//! interval's, whatever the library does, so the polling rows carry no goal.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::bench::{
    build_te_bench, duration_arg, engine_cost, json_number, median, medians, paired, run_json,
};

const CASES: [u64; 2] = [4 << 10, 1 << 20];
const BATCH: usize = 128;
const RUNS: usize = 5;

/// Builds the library in release and compiles the bench program against it.
fn build_c_bench() -> Result<PathBuf, String> {
    crate::run(
        "build te-capi (release)",
        crate::cargo().args(["build", "--release", "-p", "te-capi"]),
    )?;
    compile_c(&release_dir()?, "capi_bench")
}

/// Cargo's release directory.
pub(crate) fn release_dir() -> Result<PathBuf, String> {
    let target = std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| "target".into());
    std::fs::canonicalize(Path::new(&target).join("release"))
        .map_err(|e| format!("{target}/release: {e}"))
}

/// Compiles `crates/te-capi/bench/{program}.c` against the library in `lib` (found there at
/// run time too) into `lib/{program}`.
pub(crate) fn compile_c(lib: &Path, program: &str) -> Result<PathBuf, String> {
    let out = lib.join(program);
    let source = format!("crates/te-capi/bench/{program}.c");
    crate::run(
        &format!("compile {source}"),
        Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
            .args([
                "-std=c11",
                "-O2",
                "-Wall",
                "-Werror",
                "-pthread",
                "-Icrates/te-capi/include",
            ])
            .arg(&source)
            .arg(format!("-L{}", lib.display()))
            .arg(format!("-Wl,-rpath,{}", lib.display()))
            .args(["-ltransfer_engine", "-o"])
            .arg(&out),
    )?;
    Ok(out)
}

/// Builds the library with te-capi's `instant` feature, keeps it in `capi-instant/` beside the
/// release library and compiles the bench program against that copy. The plain library must
/// be built after this ([`build_c_bench`]): this build leaves its own in `target/release`.
fn build_instant_bench() -> Result<PathBuf, String> {
    crate::run(
        "build te-capi (release, instant transport)",
        crate::cargo().args([
            "build",
            "--release",
            "-p",
            "te-capi",
            "--features",
            "te-capi/instant",
        ]),
    )?;
    let release = release_dir()?;
    let dir = release.join("capi-instant");
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let lib = dir.join("libtransfer_engine.so");
    // A fresh file, not written through: a program may have the old one mapped.
    let _ = std::fs::remove_file(&lib);
    std::fs::copy(release.join("libtransfer_engine.so"), &lib)
        .map_err(|e| format!("{}: {e}", lib.display()))?;
    compile_c(&dir, "capi_bench")
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

/// Runs the C program on `block`-byte WRITEs for `seconds`, with `tail` (how it waits, and
/// `instant`) after the common arguments; its JSON line.
fn c_program(bin: &Path, block: u64, seconds: u64, tail: &[&str]) -> Result<String, String> {
    let out = Command::new(bin)
        .args([
            "write",
            &block.to_string(),
            &BATCH.to_string(),
            &seconds.to_string(),
        ])
        .args(tail)
        .env("MC_FORCE_TCP", "1")
        .env("MC_LOG_LEVEL", "WARNING")
        // cargo runs xtask with target/debug/deps on LD_LIBRARY_PATH, which outranks the
        // program's rpath: without this the C program would load the debug library.
        .env_remove("LD_LIBRARY_PATH")
        .output()
        .map_err(|e| format!("capi_bench: {e}"))?;
    match out.status.success() {
        true => Ok(String::from_utf8_lossy(&out.stdout).into_owned()),
        false => Err(format!(
            "capi_bench {block} B {} failed: {}",
            tail.join(" "),
            String::from_utf8_lossy(&out.stderr)
        )),
    }
}

/// One C run: (GB/s, p50 batch latency in µs).
fn c_run(bin: &Path, block: u64, seconds: u64, waiting: Waiting) -> Result<(f64, f64), String> {
    let text = c_program(bin, block, seconds, &[waiting.arg()])?;
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

/// µs per batch of the C path over the instant transport (`capi_bench … wait instant`).
fn c_cost(bin: &Path, block: u64, seconds: u64) -> Result<f64, String> {
    let text = c_program(bin, block, seconds, &["wait", "instant"])?;
    let us = json_number(&text, "batch_us").ok_or("no batch_us from capi_bench")?;
    eprintln!("  C API cost, instant transport, {block:>8} B: {us:.3} us per batch");
    Ok(us)
}

/// The C path's own cost per batch against the Rust path's, both over the instant transport,
/// alternating [`RUNS`] times per case; the missed goals go to `missed`.
fn costs(c: &Path, rust: &str, seconds: u64, missed: &mut Vec<String>) -> Result<(), String> {
    println!(
        "the C path's own cost per batch: te-capi's `instant` build from the C program (te_waitBatch) and te-bench --mode=engine, te-core's instant transport (no byte moves), batch {BATCH}, median of {RUNS} alternating runs"
    );
    println!(
        "{:>8} {:>14} {:>14} {:>16}",
        "block", "C us/batch", "Rust us/batch", "paired Δ us"
    );
    for block in CASES {
        // The C run first in each pair, then the Rust run.
        let (c_us, r_us, rust_less) = paired(
            RUNS,
            || c_cost(c, block, seconds),
            || engine_cost(rust, "classic", seconds, (BATCH, block)),
        )?;
        let added = -rust_less;
        let size = crate::bench::block_label(block);
        println!("{size:>8} {c_us:>14.2} {r_us:>14.2} {added:>+16.2}");
        let case = format!("write {size}: C API cost per batch, instant transport");
        let met = added <= 1.0;
        crate::report::record(crate::report::Record {
            bench: "capi",
            case: case.clone(),
            series: None,
            te: c_us,
            unit: "us",
            reference: Some(("te-bench --mode=engine (Rust)".into(), r_us)),
            goal: Some(format!("<= Rust + 1 us (paired runs: {added:+.2} us)")),
            met: Some(met),
            mooncake: None,
        });
        if !met {
            missed.push(format!("{case}: the C path adds {added:.2} us"));
        }
    }
    Ok(())
}

/// `cargo xtask bench capi same-host [--duration S]`: the same-host rows alone.
pub(crate) fn same_host(args: &[&str]) -> Result<(), String> {
    let seconds = duration_arg(
        args,
        "usage: cargo xtask bench capi same-host [--duration SECONDS]",
    )?;
    crate::run(
        "build te-capi (release)",
        crate::cargo().args(["build", "--release", "-p", "te-capi"]),
    )?;
    let program = compile_c(&release_dir()?, "same_host")?;
    crate::ci::install_te_py()?;
    let python = Path::new(crate::ci::TE_PYTHON);
    let missed = crate::same_host_bench::capi_rows(&program, python, seconds)?;
    match missed.is_empty() {
        true => Ok(()),
        false => Err(format!("missed: {}", missed.join("; "))),
    }
}

pub(crate) fn capi(args: &[&str]) -> Result<(), String> {
    let seconds = duration_arg(args, "usage: cargo xtask bench capi [--duration SECONDS]")?;
    // The instant build first: the plain library, built next, is what target/release keeps.
    let instant = build_instant_bench()?;
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
    for block in CASES {
        let (mut slept, mut polled, mut rr) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..RUNS {
            slept.push(c_run(&c, block, seconds, Waiting::Sleep)?);
            rr.push(rust_run(&rust, block, seconds)?);
            polled.push(c_run(&c, block, seconds, Waiting::Poll)?);
        }
        let (r_gbs, r_p50) = medians(&rr);
        let size = crate::bench::block_label(block);
        for (waiting, runs) in [(Waiting::Sleep, &slept), (Waiting::Poll, &polled)] {
            let (c_gbs, c_p50) = medians(runs);
            let ratio = c_gbs / r_gbs;
            let delta = c_p50 - r_p50;
            println!(
                "{size:>8} {:>6} {c_gbs:>12.2} {r_gbs:>12.2} {:>6.0}% {c_p50:>14.1} {r_p50:>14.1} {delta:>9.1}",
                waiting.arg(),
                ratio * 100.0
            );
            let how = match waiting {
                Waiting::Sleep => "te_waitBatch",
                Waiting::Poll => "polling getTransferStatus",
            };
            // The throughput goal is the sleeping path's; the latency goal is judged on the
            // instant transport ([`costs`]), where 1 µs shows, so over TCP latencies are
            // reported.
            // Judged on the median of each run's share of the Rust run beside it.
            let pairs = runs.iter().zip(&rr).map(|(c, r)| c.0 / r.0).collect();
            let paired = median(pairs);
            let throughput_goal = (waiting == Waiting::Sleep).then(|| {
                let text = format!(">= 95% of Rust (paired runs: {:.0}%)", paired * 100.0);
                (text, paired >= 0.95)
            });
            for (case, te, reference, unit, goal) in [
                (
                    format!("write {size}: C API throughput, {how}"),
                    c_gbs,
                    r_gbs,
                    "GB/s",
                    throughput_goal,
                ),
                (
                    format!("write {size}: C API batch latency p50, {how}"),
                    c_p50,
                    r_p50,
                    "us",
                    None,
                ),
            ] {
                crate::report::record(crate::report::Record {
                    bench: "capi",
                    case: case.clone(),
                    series: None,
                    te,
                    unit,
                    reference: Some(("te-bench (Rust)".into(), reference)),
                    goal: goal.as_ref().map(|(text, _)| text.clone()),
                    met: goal.as_ref().map(|(_, met)| *met),
                    mooncake: None,
                });
                if goal.is_some_and(|(_, met)| !met) {
                    missed.push(format!("{case}: {te:.2} vs {reference:.2} {unit}"));
                }
            }
        }
    }
    costs(&instant, &rust, seconds, &mut missed)?;
    let same_host = compile_c(&release_dir()?, "same_host")?;
    crate::ci::install_te_py()?;
    missed.extend(crate::same_host_bench::capi_rows(
        &same_host,
        Path::new(crate::ci::TE_PYTHON),
        seconds,
    )?);
    println!(
        "goal: the C path (te_waitBatch) within 5% of the Rust path's throughput over TCP, and within 1 us of its batch latency on the instant transport; the TCP latencies and the polling rows are for information"
    );
    match missed.is_empty() {
        true => Ok(()),
        false => Err(format!("missed: {}", missed.join("; "))),
    }
}
