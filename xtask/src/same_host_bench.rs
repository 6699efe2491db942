//! The same-host rows of `cargo xtask bench python` and `bench capi`: two processes on one
//! host, each an engine, WRITE 64 KiB × 64 and 1 MiB × 16 over a 64 MiB working set of memory
//! the program allocated, with `auto` (cross-memory attach here) and `tcp`, next to the
//! one-copy limit (the same blocks copied in one process) and te-bench `--protocol=shm` with
//! the same blocks over the same working set, all in one run, alternating, medians. Every
//! engine run reads its working set back and compares it. Python: `te.Engine`
//! (`crates/te-py/bench/same_host.py`); C: Mooncake's C API with `te_waitBatch`
//! (`crates/te-capi/bench/same_host.c`), with Python's `auto` in the same run.
//!
//! Goals (issue 64): `auto` at least 80 % of the one-copy limit and of te-bench's shm figure,
//! and at least 1.5× `tcp`; C's `auto` within 5 % of Python's or better.

use std::path::Path;
use std::process::Command;

use crate::bench::{json_number, median, run_json, start_target};

const SCRIPT: &str = "crates/te-py/bench/same_host.py";
/// Runs of each leg per case; the medians are compared.
const RUNS: usize = 4;
/// (block, blocks per batch).
type Case = (u64, u64);
const CASES: [Case; 2] = [(64 << 10, 64), (1 << 20, 16)];
/// The working set every leg walks (`same_host.py`'s).
const WORKING_SET: u64 = 64 << 20;

/// One run of a same-host program: its GB/s, after checking it verified its bytes.
fn verified_run(mut cmd: Command, what: &str) -> Result<f64, String> {
    let out = cmd.output().map_err(|e| format!("{what}: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() || !text.contains("\"verified\": true") {
        return Err(format!(
            "{what}: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    json_number(&text, "gb_s").ok_or_else(|| format!("no gb_s in: {text}"))
}

/// The Python script in `mode` (`engine --protocol=P`, or `memcpy`) on one case.
fn python_run(
    python: &Path,
    mode: &[&str],
    (block, count): Case,
    secs: u64,
) -> Result<f64, String> {
    let mut cmd = Command::new(python);
    cmd.arg(SCRIPT)
        .args(mode)
        .arg(format!("--block={block}"))
        .arg(format!("--count={count}"))
        .arg(format!("--seconds={secs}"));
    verified_run(cmd, &format!("same_host.py {}", mode.join(" ")))
}

/// The C program in `mode` (`engine P`, or `memcpy`) on one case.
fn c_run(program: &Path, mode: &[&str], (block, count): Case, secs: u64) -> Result<f64, String> {
    let mut cmd = Command::new(program);
    cmd.args(mode)
        .args([block.to_string(), count.to_string(), secs.to_string()])
        .env("MC_LOG_LEVEL", "WARNING")
        // cargo runs xtask with target/debug/deps on LD_LIBRARY_PATH, which outranks the
        // program's rpath: without this the C program would load the debug library.
        .env_remove("LD_LIBRARY_PATH");
    verified_run(cmd, &format!("same_host {}", mode.join(" ")))
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

/// One column of a same-host table: its heading and one measurement of a case (GB/s).
type Leg<'a> = (&'static str, Box<dyn Fn(Case) -> Result<f64, String> + 'a>);

/// A goal of the first column against another: (that column, factor, its name in the report,
/// the goal's words).
type Goal = (usize, f64, &'static str, &'static str);

/// Measures `legs` on every case, alternating, and records the first column against each goal
/// in `bench`'s report; the rows that missed.
fn table(bench: &'static str, title: &str, legs: &[Leg<'_>], goals: &[Goal]) -> Vec<String> {
    let mut missed = Vec::new();
    println!("{title}, WRITE over a 64 MiB working set, median of {RUNS} alternating runs (GB/s)");
    let mut heading = format!("{:<16}", "case");
    for (name, _) in legs {
        heading += &format!(" {name:>10}");
    }
    for (leg, _, _, _) in goals {
        heading += &format!(" {:>12}", format!("/{}", legs[*leg].0));
    }
    println!("{heading}");
    for case in CASES {
        let mut runs = vec![Vec::new(); legs.len()];
        let measured = (0..RUNS).try_for_each(|round| {
            for leg in crate::bench::round_order(round, legs.len()) {
                runs[leg].push((legs[leg].1)(case)?);
            }
            Ok::<_, String>(())
        });
        let label = format!("WRITE {} × {}", crate::bench::block_label(case.0), case.1);
        if let Err(e) = measured {
            missed.push(format!("{label}: {e}"));
            continue;
        }
        let medians: Vec<f64> = runs.into_iter().map(median).collect();
        let mut line = format!("{label:<16}");
        for m in &medians {
            line += &format!(" {m:>10.2}");
        }
        for (leg, _, _, _) in goals {
            line += &format!(" {:>11.0}%", medians[0] / medians[*leg] * 100.0);
        }
        println!("{line}");
        for &(leg, factor, reference, goal) in goals {
            let (te, figure) = (medians[0], medians[leg]);
            let met = te >= figure * factor;
            let name = format!("{label}: {} vs {}", legs[0].0, legs[leg].0);
            crate::report::record(crate::report::Record {
                bench,
                case: name.clone(),
                series: None,
                te,
                unit: "GB/s",
                reference: Some((reference.into(), figure)),
                goal: Some(goal.into()),
                met: Some(met),
                mooncake: None,
            });
            if !met {
                missed.push(format!("{name}: {te:.2} against {figure:.2} GB/s"));
            }
        }
    }
    missed
}

/// `cargo xtask bench python same-host [--duration S]`: these rows alone.
pub(crate) fn bench(args: &[&str]) -> Result<(), String> {
    let seconds = crate::bench::duration_arg(
        args,
        "usage: cargo xtask bench python same-host [--duration SECONDS]",
    )?;
    crate::ci::install_te_py()?;
    let missed = same_host(Path::new(crate::ci::TE_PYTHON), seconds)?;
    match missed.is_empty() {
        true => Ok(()),
        false => Err(format!("missed: {}", missed.join("; "))),
    }
}

/// The Python rows: `te.Engine` auto and tcp, memmove in one process, te-bench shm.
pub(crate) fn same_host(python: &Path, seconds: u64) -> Result<Vec<String>, String> {
    let te = crate::bench::build_te_bench()?;
    let legs: [Leg<'_>; 4] = [
        (
            "auto",
            Box::new(|c| python_run(python, &["engine", "--protocol=auto"], c, seconds)),
        ),
        (
            "tcp",
            Box::new(|c| python_run(python, &["engine", "--protocol=tcp"], c, seconds)),
        ),
        (
            "memcpy",
            Box::new(|c| python_run(python, &["memcpy"], c, seconds)),
        ),
        ("te-bench", Box::new(|c| te_bench_shm(&te, c.0, seconds))),
    ];
    Ok(table(
        "python",
        "te.Engine between two processes on one host",
        &legs,
        &[
            (2, 0.8, "memcpy, one process", ">= 80% of one copy"),
            (3, 0.8, "te-bench --protocol=shm", ">= 80% of te-bench shm"),
            (1, 1.5, "te.Engine protocol=tcp", ">= 150% of tcp"),
        ],
    ))
}

/// The C rows: the C program auto and tcp, its memcpy, te-bench shm, and Python's auto.
pub(crate) fn capi_rows(
    program: &Path,
    python: &Path,
    seconds: u64,
) -> Result<Vec<String>, String> {
    let te = crate::bench::build_te_bench()?;
    let legs: [Leg<'_>; 5] = [
        (
            "C auto",
            Box::new(|c| c_run(program, &["engine", "auto"], c, seconds)),
        ),
        (
            "C tcp",
            Box::new(|c| c_run(program, &["engine", "tcp"], c, seconds)),
        ),
        (
            "memcpy",
            Box::new(|c| c_run(program, &["memcpy"], c, seconds)),
        ),
        ("te-bench", Box::new(|c| te_bench_shm(&te, c.0, seconds))),
        (
            "Py auto",
            Box::new(|c| python_run(python, &["engine", "--protocol=auto"], c, seconds)),
        ),
    ];
    Ok(table(
        "capi",
        "Mooncake's C API (te_waitBatch) between two processes on one host",
        &legs,
        &[
            (2, 0.8, "memcpy, one process (C)", ">= 80% of one copy"),
            (3, 0.8, "te-bench --protocol=shm", ">= 80% of te-bench shm"),
            (1, 1.5, "C API installTransport tcp", ">= 150% of tcp"),
            (
                4,
                0.95,
                "te.Engine protocol=auto (Python)",
                ">= 95% of Python",
            ),
        ],
    ))
}
