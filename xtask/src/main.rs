//! `cargo xtask`: the project's only script.
//!
//! - `cargo xtask ci`: rustfmt check, clippy with warnings denied, every test of the workspace,
//!   and the docs built with warnings denied.
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
//! - `cargo xtask gpu`: the GPU suite and the IPC benchmark, on a machine with a GPU.
//! - `cargo xtask softroce [--setup] [OPTIONS] -- CMD`: CMD inside a qemu guest with Soft-RoCE
//!   (`rdma_rxe`) on two virtio NICs; exits with CMD's code.
//! - `cargo xtask sim [--seeds N | --seed S]`: the deterministic simulation of the engine.
#![forbid(unsafe_code)]

mod bench;
mod gpu;
mod local;
mod netns;
mod rdma_bench;
mod softroce;
mod tent_bench;

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

fn ci() -> Result<(), String> {
    run("fmt", cargo().args(["fmt", "--all", "--check"]))?;
    clippy("clippy", &["--workspace", "--all-targets"])?;
    run(
        "test",
        cargo().args(["test", "--workspace", "--no-fail-fast"]),
    )?;
    clippy(
        "clippy (te-topology with hwloc)",
        &["-p", "te-topology", "--features", "hwloc", "--all-targets"],
    )?;
    run(
        "test (te-topology with hwloc: the two backends agree)",
        cargo().args(["test", "-p", "te-topology", "--features", "hwloc"]),
    )?;
    clippy(
        "clippy (te-uring without io_uring: the buffered-I/O build)",
        &["-p", "te-uring", "--no-default-features", "--lib"],
    )?;
    clippy(
        "clippy (te-metadata's tests with etcd)",
        &["-p", "te-metadata", "--features", "etcd", "--all-targets"],
    )?;
    run(
        "test (engines sharing a real etcd)",
        cargo().args([
            "test",
            "-p",
            "te-metadata",
            "--features",
            "etcd",
            "--test",
            "scenarios",
            "etcd",
        ]),
    )?;
    run(
        "simulation (te-core, 200 seeds)",
        cargo()
            .args([
                "test",
                "-p",
                "te-core",
                "--features",
                "testing",
                "--test",
                "sim",
            ])
            .env("TE_SIM_SEEDS", "200"),
    )?;
    eprintln!("xtask: te-rdma in the Soft-RoCE guest");
    softroce::rdma_lane()?;
    run(
        "doc",
        cargo()
            .args(["doc", "--no-deps", "--workspace"])
            .env("RUSTDOCFLAGS", "-D warnings"),
    )?;
    eprintln!("xtask: ci passed");
    Ok(())
}

/// `cargo xtask sim [--seeds N] [--seed S]`: the deterministic simulation over N seeds, or one.
fn sim(args: &[&str]) -> Result<(), String> {
    let mut cmd = cargo();
    cmd.args([
        "test",
        "-p",
        "te-core",
        "--features",
        "testing",
        "--test",
        "sim",
        "--",
        "--nocapture",
    ]);
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

const USAGE: &str = "usage: cargo xtask ci | cargo xtask bench tcp [--duration SECONDS] | cargo xtask bench topo [--duration SECONDS] | cargo xtask bench engine [--duration SECONDS] | cargo xtask bench local [--duration SECONDS] | cargo xtask bench rdma [--duration SECONDS] | cargo xtask bench tent [--duration SECONDS] | cargo xtask gpu | cargo xtask softroce [--setup] [OPTIONS] -- CMD | cargo xtask sim [--seeds N | --seed S]";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["ci"] => ci(),
        ["bench", "tcp", rest @ ..] => bench::tcp(rest),
        ["bench", "topo", rest @ ..] => bench::topo(rest),
        ["bench", "engine", rest @ ..] => bench::engine(rest),
        ["bench", "local", rest @ ..] => local::local(rest),
        ["bench", "tent", rest @ ..] => tent_bench::tent(rest),
        ["gpu"] => gpu::gpu(),
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
        _ => Err(USAGE.to_string()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e}");
            ExitCode::FAILURE
        }
    }
}
