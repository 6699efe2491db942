//! te's NIXL backend plugin (`crates/te-capi/nixl`): `cargo xtask nixl build` compiles
//! `libplugin_TE.so` with the system's g++ against te's C library, `cargo xtask nixl test` runs
//! its two-process suite under NIXL's own agent from the PyPI wheel `nixl-cu12` (over te's
//! same-host choice and over TCP), and `cargo xtask bench nixl` puts it next to the wheel's UCX
//! backend on the same DRAM-to-DRAM work.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::bench::{median, round_order};

/// The wheel the plugin is tested against, and where it is installed (no dependencies: the
/// full install pulls a CUDA torch; numpy is what the tests need).
const WHEEL: &str = "nixl-cu12==1.5.1";
const VENV: &str = "target/nixl-venv";
const SOURCES: [&str; 2] = ["te_backend.cpp", "te_plugin.cpp"];
const DIR: &str = "crates/te-capi/nixl";

/// Rounds of each TE/UCX pair in the bench, and posts of the 64 MiB request per run.
const ROUNDS: usize = 5;
const POSTS: &str = "10";

/// The plugin's folder for a cargo profile, built: te's library and `libplugin_TE.so`, which
/// finds the library beside it.
pub(crate) fn build(release: bool) -> Result<PathBuf, String> {
    let profile = if release { "release" } else { "debug" };
    let mut cargo = crate::cargo();
    cargo.args(["build", "-p", "te-capi"]);
    if release {
        cargo.arg("--release");
    }
    crate::run(&format!("build te-capi ({profile})"), &mut cargo)?;
    let target = std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| "target".into());
    let out = Path::new(&target).join("nixl").join(profile);
    std::fs::create_dir_all(&out).map_err(|e| format!("{}: {e}", out.display()))?;
    let out = std::fs::canonicalize(&out).map_err(|e| format!("{}: {e}", out.display()))?;
    let lib = Path::new(&target)
        .join(profile)
        .join("libtransfer_engine.so");
    std::fs::copy(&lib, out.join("libtransfer_engine.so"))
        .map_err(|e| format!("{}: {e}", lib.display()))?;
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "g++".into());
    let version = format!("-DTE_NIXL_VERSION=\"{}\"", env!("CARGO_PKG_VERSION"));
    crate::run(
        "compile libplugin_TE.so",
        Command::new(cxx)
            .args([
                "-std=c++20",
                "-O2",
                "-g",
                "-fPIC",
                "-shared",
                "-fvisibility=hidden",
                "-fvisibility-inlines-hidden",
                "-Wall",
                "-Wextra",
                "-Werror",
                "-Icrates/te-capi/include",
            ])
            .arg(format!("-I{DIR}"))
            .arg(version)
            .args(SOURCES.map(|s| format!("{DIR}/{s}")))
            .arg("-o")
            .arg(out.join("libplugin_TE.so"))
            .arg(format!("-L{}", out.display()))
            // DT_RPATH, not RUNPATH: te's library beside the plugin wins over LD_LIBRARY_PATH,
            // where Mooncake's library of the same name (or another build of te's) may come first.
            .args([
                "-ltransfer_engine",
                "-Wl,-rpath,$ORIGIN",
                "-Wl,--disable-new-dtags",
                "-Wl,--no-undefined",
            ]),
    )?;
    Ok(out)
}

/// The Python of `target/nixl-venv`, the wheel installed there first when it is missing.
pub(crate) fn python() -> Result<PathBuf, String> {
    let python = Path::new(VENV).join("bin/python3");
    let ready = |p: &Path| {
        Command::new(p)
            .args(["-c", "import nixl_cu12._api, numpy"])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if !ready(&python) {
        crate::bench::install_into_venv(Path::new(VENV), &["--no-deps", WHEEL, "numpy"])?;
    }
    // Absolute, not resolved: the venv's own interpreter, which knows its site-packages.
    Ok(std::env::current_dir()
        .map_err(|e| e.to_string())?
        .join(python))
}

/// A Python command in the plugin's environment: NIXL finds only te's plugin (`dir`), and te
/// serves on loopback.
fn nixl_python(python: &Path, dir: &Path, script: &str) -> Command {
    let mut cmd = Command::new(python);
    cmd.arg(format!("{DIR}/py/{script}"))
        .env("NIXL_PLUGIN_DIR", dir)
        .env("NIXL_TE_IP_ADDR", "127.0.0.1")
        .env_remove("NIXL_TE_PROTOCOL");
    cmd
}

/// `cargo xtask nixl build [--release]|test`.
pub(crate) fn nixl(args: &[&str]) -> Result<(), String> {
    match args {
        ["build"] => build(false).map(|dir| println!("{}", dir.display())),
        ["build", "--release"] => build(true).map(|dir| println!("{}", dir.display())),
        ["test"] => test(),
        _ => Err("usage: cargo xtask nixl build [--release] | cargo xtask nixl test".into()),
    }
}

/// The two-process suite, over te's own choice of transport ("auto": same-host copies here)
/// and over TCP (what crosses hosts).
pub(crate) fn test() -> Result<(), String> {
    let dir = build(false)?;
    let python = python()?;
    crate::run(
        "NIXL two agents, protocol auto",
        &mut nixl_python(&python, &dir, "two_agents.py"),
    )?;
    crate::run(
        "NIXL two agents, protocol tcp",
        nixl_python(&python, &dir, "two_agents.py").env("NIXL_TE_PROTOCOL", "tcp"),
    )
}

/// GB/s of one bench run of `backend` (TE from `dir`, or the wheel's UCX).
fn run_once(python: &Path, dir: &Path, backend: &str, op: &str, chunk: u64) -> Result<f64, String> {
    let mut cmd = nixl_python(python, dir, "bench.py");
    cmd.args([backend, op, &chunk.to_string(), POSTS]);
    if backend != "TE" {
        cmd.env_remove("NIXL_PLUGIN_DIR");
    }
    let out = cmd
        .output()
        .map_err(|e| format!("bench.py {backend}: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .filter_map(|l| l.strip_prefix("RESULT "))
        .filter_map(|l| l.split_whitespace().nth(3))
        .find_map(|v| v.parse().ok())
        .ok_or_else(|| {
            format!(
                "bench.py {backend} {op} {chunk}: no result ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
                    .lines()
                    .rev()
                    .take(5)
                    .collect::<Vec<_>>()
                    .join(" | ")
            )
        })
}

/// `cargo xtask bench nixl`: TE against UCX, each a two-process DRAM-to-DRAM request of 64
/// MiB in 4 KiB or 1 MiB descriptors posted 10 times, in alternating pairs; the ratio is the
/// median of the pairs'. Goals: 1.5x UCX at 4 KiB, 1.0x at 1 MiB.
pub(crate) fn bench(args: &[&str]) -> Result<(), String> {
    if !args.is_empty() {
        return Err("usage: cargo xtask bench nixl".into());
    }
    let dir = build(true)?;
    let python = python()?;
    println!(
        "NIXL agents in two processes, DRAM to DRAM, 64 MiB per request, {POSTS} posts per run, median of {ROUNDS} alternating TE/UCX pairs (GB/s)"
    );
    println!(
        "{:>6} {:>6} {:>10} {:>10} {:>8} {:>6}",
        "op", "desc", "TE", "UCX", "ratio", "goal"
    );
    let mut missed = Vec::new();
    for op in ["WRITE", "READ"] {
        for (chunk, goal) in [(4096u64, 1.5), (1 << 20, 1.0)] {
            let (mut te, mut ucx, mut ratios) = (vec![], vec![], vec![]);
            for round in 0..ROUNDS {
                let mut pair = [0.0; 2];
                for leg in round_order(round, 2) {
                    let backend = if leg == 0 { "TE" } else { "UCX" };
                    pair[leg] = run_once(&python, &dir, backend, op, chunk)?;
                }
                te.push(pair[0]);
                ucx.push(pair[1]);
                ratios.push(pair[0] / pair[1]);
            }
            let (te, ucx, ratio) = (median(te), median(ucx), median(ratios));
            let label = crate::bench::block_label(chunk);
            let met = ratio >= goal;
            println!("{op:>6} {label:>6} {te:>10.3} {ucx:>10.3} {ratio:>7.2}x {goal:>5.1}x");
            let case = format!("NIXL {op} {label} descriptors, two processes");
            crate::report::record(crate::report::Record {
                bench: "nixl",
                case: case.clone(),
                series: Some((op.to_lowercase(), chunk)),
                te,
                unit: "GB/s",
                reference: Some(("NIXL UCX backend (nixl-cu12 1.5.1)".into(), ucx)),
                goal: Some(format!(">= {goal:.1}x UCX (paired median {ratio:.2}x)")),
                met: Some(met),
                mooncake: None,
            });
            if !met {
                missed.push(format!("{case}: {ratio:.2}x UCX"));
            }
        }
    }
    match missed.is_empty() {
        true => Ok(()),
        false => Err(format!("missed: {}", missed.join("; "))),
    }
}
