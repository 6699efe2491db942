//! `cargo xtask`: the project's only script.
//!
//! - `cargo xtask ci`: every lane this machine supports (see `ci.rs`), with a summary that says
//!   which lanes passed, failed, or were skipped and why.
//! - `cargo xtask tidy`: the house rules a machine can check (`tidy.rs`).
//! - `cargo xtask config`: writes `docs/configuration.md` from the crates' settings.
//! - `cargo xtask bench [all] [--duration S]`: every bench below that the machine supports, then
//!   the report (`target/bench-report/`: JSON, Markdown, SVG charts), the charts in `docs/bench/`
//!   and the README's Performance section.
//! - `cargo xtask bench tcp [--duration S]`: te-bench over TCP on loopback (target and initiator
//!   as two processes) next to iperf3 single-stream in the same run, with the ratios.
//! - `cargo xtask bench topo [--duration S]`: te-bench between two network namespaces joined by
//!   two equally rate-limited veth rails, over one rail and over both, with the ratio.
//! - `cargo xtask bench engine [--duration S]`: slices per second through the engine with a
//!   transport that completes at once, on 1 and 2 submitting threads.
//! - `cargo xtask bench local [--duration S]`: te-shm, te-uring, BufIO and te-cxl next to
//!   memcpy, UCX (`ucx_perftest`, posix) and fio (io_uring) in the same run, with the ratios.
//! - `cargo xtask bench rdma [--duration S]`: te-bench RDMA WRITE next to `ib_write_bw` on
//!   Soft-RoCE, in one guest run, with the ratio.
//! - `cargo xtask bench tent [--duration S]`: te-tent next to the classic engine, same transport
//!   and workload, throughput and p99 ratios.
//! - `cargo xtask bench interop [--duration S]`: te → Mooncake, Mooncake → te and Mooncake →
//!   Mooncake over TCP loopback (Mooncake's PyPI wheel), WRITE and READ, with the ratios.
//! - `cargo xtask bench metadata [--duration S]`: te-metadata next to Mooncake's HTTP metadata
//!   server, 16 to 1,024 keep-alive connections each with a GET always in flight, with the ratios.
//! - `cargo xtask bench nixl`: te's NIXL backend next to the wheel's UCX backend, two NIXL
//!   agents in two processes, DRAM to DRAM in 4 KiB and 1 MiB descriptors, with the ratios.
//! - `cargo xtask nixl build [--release] | test`: te's NIXL plugin (`libplugin_TE.so`) built with g++, and
//!   its two-process suite under NIXL's agent from the PyPI wheel.
//! - `cargo xtask consumers`: vLLM's, SGLang's and LMCache's call patterns on te and on
//!   Mooncake's wheel, side by side.
//! - `cargo xtask fuzz <target|all> [--secs N]`: the wire decoders' fuzz targets.
//! - `cargo xtask gpu`: the GPU suite and the IPC benchmark, on a machine with a GPU.
//! - `cargo xtask softroce [--setup] [OPTIONS] -- CMD`: CMD inside a qemu guest with Soft-RoCE
//!   (`rdma_rxe`) on two virtio NICs; exits with CMD's code.
//! - `cargo xtask sim [--seeds N | --seed S]`: the deterministic simulation of the engine.
#![forbid(unsafe_code)]

mod bench;
mod capi_bench;
mod ci;
mod config;
mod consumers;
mod fuzz;
mod gpu;
mod interop_bench;
mod local;
mod metadata_bench;
mod metrics_bench;
mod netns;
mod nixl;
mod python_bench;
mod rdma_bench;
mod report;
mod rpc_bench;
mod same_host_bench;
mod scale_bench;
mod shape;
mod softroce;
mod tent_bench;
mod tidy;

use std::process::{Command, ExitCode};

pub(crate) fn cargo() -> Command {
    Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
}

pub(crate) fn run(step: &str, cmd: &mut Command) -> Result<(), String> {
    eprintln!("xtask: {step}: {cmd:?}");
    let status = cmd
        .status()
        .map_err(|e| format!("{step}: cannot start: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{step} failed ({status})"))
    }
}

/// `cargo clippy ARGS -- -D warnings`: one lint step of `ci`.
fn clippy(step: &str, args: &[&str]) -> Result<(), String> {
    run(
        step,
        cargo()
            .arg("clippy")
            .args(args)
            .args(["--", "-D", "warnings"]),
    )
}

/// One bench's entry point.
type BenchFn = fn(&[&str]) -> Result<(), String>;

/// `cargo xtask bench [all] [--duration S]`: every benchmark this machine supports, each next
/// to its reference, then the report (JSON, Markdown, SVG charts) in `target/bench-report/`, the
/// charts copied to `docs/bench/` and the table into the README's Performance section.
fn bench_all(args: &[&str]) -> Result<(), String> {
    let notes = run_benches(&benches(), args);
    publish()?;
    for n in &notes {
        println!("note: {n}");
    }
    Ok(())
}

/// `cargo xtask bench update NAME... [--duration S]`: the named benches run again and their rows
/// replace theirs in the published report (`docs/bench/report.json`), which is drawn again; the
/// other rows stay as their run left them.
fn bench_update(args: &[&str]) -> Result<(), String> {
    let usage = "usage: cargo xtask bench update NAME... [--duration SECONDS]";
    let split = args.iter().position(|a| *a == "--duration");
    let (names, secs) = args.split_at(split.unwrap_or(args.len()));
    if names.is_empty() {
        return Err(usage.into());
    }
    let all = benches();
    let mut chosen = Vec::new();
    for name in names {
        let bench = all.iter().find(|b| b.0 == *name);
        chosen.push(
            bench
                .cloned()
                .ok_or_else(|| format!("no bench {name:?}; {usage}"))?,
        );
    }
    let notes = run_benches(&chosen, secs);
    // A bench that missed a goal still measured; one that stopped before its rows keeps its old.
    let measured: Vec<&str> = names
        .iter()
        .copied()
        .filter(|name| report::has_rows(name))
        .collect();
    if measured.is_empty() {
        return Err(format!("nothing measured: {}", notes.join("; ")));
    }
    report::merge_into_published(std::path::Path::new(PUBLISHED), &measured)?;
    publish()?;
    for n in &notes {
        println!("note: {n}");
    }
    Ok(())
}

/// The published report's records, from which `bench update` draws it again.
const PUBLISHED: &str = "docs/bench/report.json";

/// Runs `benches` with `secs` (`--duration S` or nothing): a note for each that was skipped or
/// failed.
fn run_benches(benches: &[(&str, BenchFn, Option<String>)], secs: &[&str]) -> Vec<String> {
    let mut notes = Vec::new();
    for (i, (name, run, skip)) in benches.iter().enumerate() {
        eprintln!("\n[{}/{}] bench {name}", i + 1, benches.len());
        match skip {
            Some(why) => notes.push(format!("{name}: skipped ({why})")),
            None => match run(secs) {
                Ok(()) => {}
                Err(e) => notes.push(format!("{name}: {e}")),
            },
        }
    }
    notes
}

/// Every bench `bench all` runs, in order, with why it cannot run here (if it cannot).
fn benches() -> [(&'static str, BenchFn, Option<String>); 14] {
    [
        ("engine", bench::engine, None),
        ("metrics", metrics_bench::metrics, None),
        ("tcp", bench::tcp, None),
        ("local", local::local, None),
        ("tent", tent_bench::tent, None),
        ("interop", interop_bench::interop, None),
        ("python", python_bench::python, None),
        ("rpc", rpc_bench::rpc, None),
        ("capi", capi_bench::capi, None),
        ("scale", scale_bench::scale, None),
        ("metadata", metadata_bench::metadata, None),
        ("nixl", nixl_bench, None),
        ("topo", bench::topo, netns::unavailable()),
        (
            "rdma",
            rdma_bench::rdma,
            (!std::path::Path::new("/usr/bin/qemu-system-x86_64").exists())
                .then(|| "qemu-system-x86_64 missing".to_string()),
        ),
    ]
}

/// `cargo xtask bench nixl` within `bench all` (it takes no duration: its runs are counted).
fn nixl_bench(_: &[&str]) -> Result<(), String> {
    nixl::bench(&[])
}

/// `cargo xtask bench report`: the published report drawn again from its records
/// (`docs/bench/report.json`, which every publishing run writes).
fn redraw() -> Result<(), String> {
    report::load(std::path::Path::new(PUBLISHED))?;
    publish()
}

/// Writes the report (JSON, Markdown, charts) into `target/bench-report/`, the charts into
/// `docs/bench/`, the table into docs/benchmarks.md and its headline rows into the README's
/// Performance section.
fn publish() -> Result<(), String> {
    let dir = report::dir();
    let (md, headline) = report::write(&dir)?;
    let docs = std::path::Path::new("docs/bench");
    std::fs::create_dir_all(docs).map_err(|e| e.to_string())?;
    // Charts of an earlier layout would linger next to the new ones.
    report::remove_charts(docs)?;
    for entry in std::fs::read_dir(&dir)
        .map_err(|e| e.to_string())?
        .flatten()
    {
        if entry.path().extension().is_some_and(|x| x == "svg")
            || entry.file_name() == "report.json"
        {
            std::fs::copy(entry.path(), docs.join(entry.file_name())).map_err(|e| e.to_string())?;
        }
    }
    report::publish_docs(
        std::path::Path::new("README.md"),
        std::path::Path::new("docs/benchmarks.md"),
        &md,
        &headline,
    )?;
    println!(
        "\nreport: {}/report.md (and report.json, charts); README's Performance and docs/benchmarks.md updated",
        dir.display()
    );
    Ok(())
}

/// `cargo test` of te-core's deterministic simulation (seeds come from the environment).
pub(crate) fn sim_command() -> Command {
    let mut cmd = cargo();
    cmd.args(["test", "-p", "te-core", "--test", "sim"]);
    cmd
}

/// `cargo xtask sim [--seeds N] [--seed S]`: the deterministic simulation over N seeds, or one.
fn sim(args: &[&str]) -> Result<(), String> {
    let mut cmd = sim_command();
    cmd.args(["--", "--nocapture"]);
    match args {
        [] => {}
        ["--seeds", n] => {
            n.parse::<u64>()
                .map_err(|_| format!("--seeds {n}: not a number"))?;
            cmd.env("TE_SIM_SEEDS", n);
        }
        ["--seed", s] => {
            s.parse::<u64>()
                .map_err(|_| format!("--seed {s}: not a number"))?;
            cmd.env("TE_SEED", s);
        }
        _ => return Err("usage: cargo xtask sim [--seeds N | --seed S]".into()),
    }
    run("simulation", &mut cmd)
}

const USAGE: &str = "usage: cargo xtask ci | cargo xtask tidy | cargo xtask config | cargo xtask bench [all] [--duration SECONDS] | cargo xtask bench report (redraw the published report) | cargo xtask bench update NAME... [--duration SECONDS] (re-run benches, their rows replaced in the published report) | cargo xtask bench tcp [--duration SECONDS] | cargo xtask bench topo [--duration SECONDS] | cargo xtask bench engine [--duration SECONDS] | cargo xtask bench metrics [--duration SECONDS] | cargo xtask bench local [--duration SECONDS] | cargo xtask bench rdma [--duration SECONDS] | cargo xtask bench tent [--duration SECONDS] | cargo xtask bench interop [--duration SECONDS] | cargo xtask bench python [same-host] [--duration SECONDS] | cargo xtask bench rpc [--duration SECONDS] | cargo xtask bench capi [same-host] [--duration SECONDS] | cargo xtask bench scale [--duration SECONDS] | cargo xtask bench nixl | cargo xtask nixl build [--release] | cargo xtask nixl test | cargo xtask licences | cargo xtask abi3 | cargo xtask consumers | cargo xtask gpu | cargo xtask fuzz <target|all> [--secs N] | cargo xtask softroce [--setup] [OPTIONS] -- CMD | cargo xtask sim [--seeds N | --seed S]";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["ci"] => ci::ci(),
        ["tidy"] => tidy::tidy(),
        ["config"] => config::write(),
        ["licences"] => ci::licences(),
        ["abi3"] => ci::abi3(),
        ["consumers"] => consumers::consumers(),
        ["bench", "tcp", rest @ ..] => bench::tcp(rest),
        ["bench", "topo", rest @ ..] => bench::topo(rest),
        ["bench", "engine", rest @ ..] => bench::engine(rest),
        ["bench", "metrics", rest @ ..] => metrics_bench::metrics(rest),
        ["bench", "local", rest @ ..] => local::local(rest),
        ["bench", "tent", rest @ ..] => tent_bench::tent(rest),
        ["bench", "interop", rest @ ..] => interop_bench::interop(rest),
        ["bench", "python", "same-host", rest @ ..] => same_host_bench::bench(rest),
        ["bench", "python", rest @ ..] => python_bench::python(rest),
        ["bench", "rpc", rest @ ..] => rpc_bench::rpc(rest),
        ["bench", "capi", "same-host", rest @ ..] => capi_bench::same_host(rest),
        ["bench", "capi", rest @ ..] => capi_bench::capi(rest),
        ["bench", "scale", rest @ ..] => scale_bench::scale(rest),
        ["bench", "metadata", rest @ ..] => metadata_bench::metadata(rest),
        ["bench", "nixl", rest @ ..] => nixl::bench(rest),
        ["nixl", rest @ ..] => nixl::nixl(rest),
        ["bench"] => bench_all(&[]),
        ["bench", "--duration", n] => bench_all(&["--duration", n]),
        ["bench", "all", rest @ ..] => bench_all(rest),
        ["bench", "report"] => redraw(),
        ["bench", "update", rest @ ..] => bench_update(rest),
        ["gpu"] => gpu::gpu(),
        ["fuzz", rest @ ..] => fuzz::fuzz(rest),
        ["bench", "rdma", rest @ ..] => rdma_bench::rdma(rest),
        ["softroce", rest @ ..] => {
            return match softroce::softroce(rest) {
                Ok(rc) => ExitCode::from(u8::try_from(rc).unwrap_or(125)),
                Err(e) => {
                    eprintln!("xtask softroce: {e}");
                    ExitCode::from(125)
                }
            };
        }
        ["sim", rest @ ..] => sim(rest),
        ["--help" | "-h" | "help"] => {
            println!("{}", USAGE.replace(" | ", "\n  "));
            return ExitCode::SUCCESS;
        }
        ["--version" | "-V"] => {
            println!("xtask {}", env!("CARGO_PKG_VERSION"));
            return ExitCode::SUCCESS;
        }
        _ => {
            eprintln!(
                "xtask: unknown command {:?}\n{}",
                args.join(" "),
                USAGE.replace(" | ", "\n  ")
            );
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e}");
            ExitCode::FAILURE
        }
    }
}
