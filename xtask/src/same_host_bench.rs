//! The same-host rows of `cargo xtask bench python`: two processes on one host, each a
//! `te.Engine`, WRITE 64 KiB × 64 and 1 MiB × 16 over a 64 MiB working set
//! (`crates/te-py/bench/same_host.py`), with `protocol="auto"` (cross-memory attach here) and
//! `protocol="tcp"`, next to the one-copy limit (the same blocks `memmove`d in one process) and
//! te-bench `--protocol=shm` with the same blocks over the same working set, all in one run,
//! alternating, medians. Every engine run reads its working set back and compares it.
//!
//! Goals (issue 64): `auto` at least 80 % of the one-copy limit and of te-bench's shm figure,
//! and at least 1.5× `tcp`.

use std::path::Path;
use std::process::Command;

use crate::bench::{json_number, median, run_json, start_target};

const SCRIPT: &str = "crates/te-py/bench/same_host.py";
/// Runs of each leg per case; the medians are compared.
const RUNS: usize = 4;
/// (block, blocks per batch).
const CASES: [(u64, u64); 2] = [(64 << 10, 64), (1 << 20, 16)];
/// The working set every leg walks (`same_host.py`'s).
const WORKING_SET: u64 = 64 << 20;

/// One run of the Python script: its GB/s, after checking it verified its bytes.
fn script(python: &Path, args: &[String], seconds: u64) -> Result<f64, String> {
    let out = Command::new(python)
        .arg(SCRIPT)
        .args(args)
        .arg(format!("--seconds={seconds}"))
        .output()
        .map_err(|e| format!("{}: {e}", python.display()))?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() || !text.contains("\"verified\": true") {
        return Err(format!(
            "same_host.py {}: {text}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    json_number(&text, "gb_s").ok_or_else(|| format!("no gb_s in: {text}"))
}

/// te-bench over shared memory, verified, with the same blocks over the same working set: one
/// batch covers it (te-bench's working set is one batch per thread, and a batch of 64 × 64 KiB
/// would sit in the caches, which the Python rows' 64 MiB do not).
fn te_bench_shm(te: &str, block: u64, seconds: u64) -> Result<f64, String> {
    let mut target = Command::new(te);
    target.args([
        "--mode=target",
        "--protocol=shm",
        "--local_server_name=127.0.0.1:0",
        "--buffer_size=134217728",
    ]);
    let (_target, name) = start_target(target)?;
    let mut cmd = Command::new(te);
    cmd.args([
        "--mode=initiator",
        "--protocol=shm",
        "--operation=write",
        "--local_server_name=127.0.0.1",
        "--threads=1",
        "--verify",
    ])
    .arg(format!("--segment_id={name}"))
    .arg(format!("--block_size={block}"))
    .arg(format!("--batch_size={}", WORKING_SET / block))
    .arg(format!("--duration={seconds}"));
    let text = run_json(cmd, "te-bench shm")?;
    json_number(&text, "throughput_gb_s").ok_or_else(|| format!("no JSON figures in: {text}"))
}

/// `cargo xtask bench python same-host [--duration S]`: these rows alone.
pub(crate) fn bench(args: &[&str]) -> Result<(), String> {
    let seconds = crate::bench::duration_arg(
        args,
        "usage: cargo xtask bench python same-host [--duration SECONDS]",
    )?;
    crate::ci::install_te_py()?;
    let missed = same_host(Path::new("target/te-py-venv/bin/python3"), seconds)?;
    match missed.is_empty() {
        true => Ok(()),
        false => Err(format!("missed: {}", missed.join("; "))),
    }
}

/// Measures the same-host rows and records them; the rows that missed their goal.
pub(crate) fn same_host(python: &Path, seconds: u64) -> Result<Vec<String>, String> {
    let te = crate::bench::build_te_bench()?;
    let mut missed = Vec::new();
    println!(
        "te.Engine between two processes on one host, WRITE over a 64 MiB working set, median of {RUNS} alternating runs (GB/s)"
    );
    println!(
        "{:<16} {:>8} {:>8} {:>9} {:>9}  auto/limit auto/shm auto/tcp",
        "case", "auto", "tcp", "memcpy", "te-bench"
    );
    for (block, count) in CASES {
        let shape = [format!("--block={block}"), format!("--count={count}")];
        let with = |mode: &[&str]| -> Vec<String> {
            mode.iter()
                .map(|s| s.to_string())
                .chain(shape.iter().cloned())
                .collect()
        };
        let legs = [
            with(&["engine", "--protocol=auto"]),
            with(&["engine", "--protocol=tcp"]),
            with(&["memcpy"]),
        ];
        let mut runs = [vec![], vec![], vec![], vec![]];
        for round in 0..RUNS {
            for leg in crate::bench::round_order(round, 4) {
                let gb = match leg {
                    3 => te_bench_shm(&te, block, seconds)?,
                    i => script(python, &legs[i], seconds)?,
                };
                runs[leg].push(gb);
            }
        }
        let [auto, tcp, limit, shm] = runs.map(median);
        let case = format!("WRITE {} × {count}", crate::bench::block_label(block));
        println!(
            "{case:<16} {auto:>8.2} {tcp:>8.2} {limit:>9.2} {shm:>9.2}  {:>9.0}% {:>7.0}% {:>7.2}×",
            auto / limit * 100.0,
            auto / shm * 100.0,
            auto / tcp
        );
        let rows = [
            (
                format!("{case}: auto vs one copy"),
                "memcpy, one process",
                limit,
                0.8,
                ">= 80% of one copy",
            ),
            (
                format!("{case}: auto vs te-bench shm"),
                "te-bench --protocol=shm",
                shm,
                0.8,
                ">= 80% of te-bench shm",
            ),
            (
                format!("{case}: auto vs tcp"),
                "te.Engine protocol=tcp",
                tcp,
                1.5,
                ">= 150% of tcp",
            ),
        ];
        for (name, reference, figure, factor, goal) in rows {
            let met = auto >= figure * factor;
            crate::report::record(crate::report::Record {
                bench: "python",
                case: name.clone(),
                series: None,
                te: auto,
                unit: "GB/s",
                reference: Some((reference.into(), figure)),
                goal: Some(goal.into()),
                met: Some(met),
                mooncake: None,
            });
            if !met {
                missed.push(format!("{name}: {auto:.2} against {figure:.2} GB/s"));
            }
        }
    }
    Ok(missed)
}
