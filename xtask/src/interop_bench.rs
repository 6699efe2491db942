//! `cargo xtask bench interop [--duration S]`: te and Mooncake's own engine (the PyPI wheel in
//! `target/mooncake-venv`, or `$TE_MOONCAKE_VENV`, installed by `.ci/setup`) moving bytes to
//! each other over TCP loopback with P2PHANDSHAKE, in one run: te → Mooncake (te-bench against
//! Mooncake's `transfer_engine_bench` target), Mooncake → te (Mooncake's initiator against a
//! te-bench target with `MC_TE_MOONCAKE_COMPAT=1`) and Mooncake → Mooncake, WRITE and READ at
//! 64 KiB and 1 MiB, batch 128, one thread. Each case runs the three legs in turn, four times
//! (every other time backward, so steady drift favours no leg); each leg's median is shown, and
//! each te leg is judged on the median of its ratios to the Mooncake → Mooncake run of the same
//! round (this machine drifts more between runs than the legs differ). WRITE cases run first, so both
//! targets' pages are touched before they are read (an untouched Mooncake buffer reads as the
//! kernel's zero page, which flatters it). Goal: te → Mooncake no slower than Mooncake →
//! Mooncake in the same case, and Mooncake → te level with it (within 10 %: Mooncake's
//! initiator sets the rate of both).

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use crate::bench::{
    KillOnDrop, build_te_bench, duration_arg, json_number, median, paired_share, run_json,
    start_target,
};

/// WRITEs first: Mooncake's target never touches its buffer, so until something writes them
/// its pages are the kernel's zero page, and READs from a fresh target copy one page that is
/// always in cache (seen by hand: 26 MB resident for a 256 MiB buffer). The WRITE cases fault in
/// every page the READ cases then read, on both targets.
const CASES: [(&str, u64); 4] = [
    ("write", 64 << 10),
    ("write", 1 << 20),
    ("read", 64 << 10),
    ("read", 1 << 20),
];
/// Every buffer of the run: 128 blocks of 1 MiB, twice over.
const BUFFER: &str = "--buffer_size=268435456";
/// Runs of each leg per case; the median is compared. Even, so that alternating the order
/// balances it ([`crate::bench::round_order`]): every leg runs as often in its forward place
/// as in its backward one, the first and the last leg each follow the middle one in half the
/// runs, and a steady drift gives every leg's median the same moment.
const RUNS: usize = 4;
const _: () = assert!(
    RUNS % 2 == 0,
    "an odd count leaves the alternation unbalanced"
);

/// Each te leg's least share of Mooncake → Mooncake: te's initiator at least Mooncake's; te's
/// target, fed by Mooncake's initiator as Mooncake's own target is, level with it within this
/// machine's spread between runs (that initiator sets both legs' rate, and its median over
/// four rounds wanders by ±10 % from one run to the next).
const LEAST: [f64; 2] = [1.0, 0.9];

/// Mooncake's native `transfer_engine_bench` inside the wheel's package, not the `bin/`
/// wrapper: the wrapper runs the binary as a child, and killing the wrapper at the end of the
/// run would leave the target running.
pub(crate) fn mooncake_bench() -> Result<PathBuf, String> {
    find_bench(&mooncake_venv()?)
}

/// The virtual environment holding Mooncake's wheel (`$TE_MOONCAKE_VENV`, else
/// `target/mooncake-venv`), the wheel installed there first if it is missing.
pub(crate) fn mooncake_venv() -> Result<PathBuf, String> {
    let venv = std::env::var_os("TE_MOONCAKE_VENV")
        .map_or_else(|| PathBuf::from("target/mooncake-venv"), PathBuf::from);
    if find_bench(&venv).is_err() {
        crate::bench::install_into_venv(&venv, &[WHEEL])?;
    }
    Ok(venv)
}

/// The wheel `.ci/setup` pins.
const WHEEL: &str = "mooncake-transfer-engine-non-cuda==0.3.13.post1";

fn find_bench(venv: &std::path::Path) -> Result<PathBuf, String> {
    std::fs::read_dir(venv.join("lib"))
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .map(|python| {
            python
                .path()
                .join("site-packages/mooncake/transfer_engine_bench")
        })
        .find(|p| p.is_file())
        .ok_or_else(|| {
            format!(
                "no transfer_engine_bench under {}/lib (Mooncake's wheel)",
                venv.display()
            )
        })
}

/// Mooncake's bench with the flags every leg shares (TCP only, P2PHANDSHAKE, loopback).
fn mooncake(bin: &PathBuf, mode: &str) -> Command {
    let mut cmd = Command::new(bin);
    cmd.args([mode, "--protocol=tcp", "--metadata_server=P2PHANDSHAKE"])
        .args(["--local_server_name=127.0.0.1", BUFFER])
        .env("MC_FORCE_TCP", "1");
    cmd
}

/// A Mooncake target and the segment name it logs (`listening on 127.0.0.1:PORT`).
pub(crate) fn mooncake_target(bin: &PathBuf) -> Result<(KillOnDrop, String), String> {
    let mut target = KillOnDrop(
        mooncake(bin, "--mode=target")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("Mooncake target: {e}"))?,
    );
    let stderr = target.0.stderr.take().ok_or("no Mooncake target stderr")?;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(stderr).lines().map_while(Result::ok);
        if let Some(line) = lines.find(|l| l.contains("listening on ")) {
            let name = line.rsplit(' ').next().unwrap_or_default().to_string();
            let _ = tx.send(name);
        }
        lines.for_each(drop);
    });
    let name = rx
        .recv_timeout(Duration::from_secs(30))
        .map_err(|_| "the Mooncake target logged no address".to_string())?;
    Ok((target, name))
}

/// A Mooncake initiator run against `segment`; its GB/s (from its `Test completed` line).
pub(crate) fn mooncake_initiator(
    bin: &PathBuf,
    segment: &str,
    (op, block): (&str, u64),
    seconds: u64,
) -> Result<f64, String> {
    let out = mooncake(bin, "--mode=initiator")
        .arg(format!("--segment_id={segment}"))
        .arg(format!("--operation={op}"))
        .arg(format!("--block_size={block}"))
        .args(["--batch_size=128", "--threads=1"])
        .arg(format!("--duration={seconds}"))
        .output()
        .map_err(|e| format!("Mooncake initiator: {e}"))?;
    let log = String::from_utf8_lossy(&out.stderr);
    let line = log
        .lines()
        .find(|l| l.contains("Test completed"))
        .ok_or_else(|| format!("Mooncake initiator {op} {block} B printed no result: {log}"))?;
    eprintln!("  Mooncake {op:5} {block:>8} B: {}", line.trim());
    let gb = line
        .split("throughput ")
        .nth(1)
        .and_then(|t| t.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| format!("no throughput in: {line}"))?;
    Ok(gb)
}

/// A te-bench initiator run against `segment`, verified; its GB/s.
fn te_initiator(
    bin: &str,
    segment: &str,
    (op, block): (&str, u64),
    seconds: u64,
) -> Result<f64, String> {
    let mut cmd = Command::new(bin);
    cmd.args([
        "--mode=initiator",
        "--protocol=tcp",
        "--local_server_name=127.0.0.1",
    ])
    .arg(format!("--segment_id={segment}"))
    .arg(format!("--operation={op}"))
    .arg(format!("--block_size={block}"))
    .args(["--batch_size=128", "--threads=1", "--verify"])
    .arg(format!("--duration={seconds}"));
    let text = run_json(cmd, &format!("te-bench {op:5} {block:>8} B"))?;
    json_number(&text, "throughput_gb_s").ok_or_else(|| format!("no JSON figures in: {text}"))
}

pub(crate) fn interop(args: &[&str]) -> Result<(), String> {
    let seconds = duration_arg(
        args,
        "usage: cargo xtask bench interop [--duration SECONDS]",
    )?;
    let mc = mooncake_bench()?;
    let te = build_te_bench()?;
    let (_mc_target, mc_name) = mooncake_target(&mc)?;
    let mut te_target = Command::new(&te);
    te_target
        .args(["--mode=target", "--local_server_name=127.0.0.1:0", BUFFER])
        .env("MC_TE_MOONCAKE_COMPAT", "1")
        .env("MC_TE_MOONCAKE_ALLOW", "127.0.0.1");
    let (_te_target, te_name) = start_target(te_target)?;
    let mut rows = Vec::new();
    for case in CASES {
        let (mut base, mut te_to_mc, mut mc_to_te) = (vec![], vec![], vec![]);
        for run in 0..RUNS {
            for leg in crate::bench::round_order(run, 3) {
                match leg {
                    0 => base.push(mooncake_initiator(&mc, &mc_name, case, seconds)?),
                    1 => te_to_mc.push(te_initiator(&te, &mc_name, case, seconds)?),
                    _ => mc_to_te.push(mooncake_initiator(&mc, &te_name, case, seconds)?),
                }
            }
        }
        // Each te leg judged against the Mooncake → Mooncake run of its own round.
        let paired = [
            paired_share(&te_to_mc, &base),
            paired_share(&mc_to_te, &base),
        ];
        let figures = [median(base), median(te_to_mc), median(mc_to_te)];
        rows.push((case, figures, paired));
    }
    println!(
        "te and Mooncake (wheel 0.3.13.post1) over TCP loopback, P2PHANDSHAKE, batch 128, 1 thread, median of {RUNS} alternating runs"
    );
    println!(
        "{:<6} {:>8} {:>14} {:>14} {:>7} {:>14} {:>7}",
        "op", "block", "MC→MC GB/s", "te→MC GB/s", "ratio", "MC→te GB/s", "ratio"
    );
    let mut missed = Vec::new();
    for ((op, block), [base, te_to_mc, mc_to_te], paired) in rows {
        let size = crate::bench::block_label(block);
        let legs = [("te → Mooncake", te_to_mc), ("Mooncake → te", mc_to_te)];
        for (((leg, figure), share), least) in legs.into_iter().zip(paired).zip(LEAST) {
            let met = share >= least;
            crate::report::record(crate::report::Record {
                bench: "interop",
                case: format!("{op} {size}: {leg}"),
                series: None,
                te: figure,
                unit: "GB/s",
                reference: Some(("Mooncake → Mooncake".into(), base)),
                goal: Some(format!(
                    ">= {:.0}% (paired runs: {:.0}%)",
                    least * 100.0,
                    share * 100.0
                )),
                met: Some(met),
                mooncake: None,
            });
            if !met {
                missed.push(format!(
                    "{op} {size} {leg}: {:.0}% in paired runs",
                    share * 100.0
                ));
            }
        }
        println!(
            "{op:<6} {size:>8} {base:>14.2} {te_to_mc:>14.2} {:>6.0}% {mc_to_te:>14.2} {:>6.0}%",
            te_to_mc / base * 100.0,
            mc_to_te / base * 100.0
        );
    }
    println!(
        "goal: te → Mooncake at least the Mooncake → Mooncake figure of the same case, Mooncake → te within 10% of it"
    );
    match missed.is_empty() {
        true => Ok(()),
        false => Err(format!("missed: {}", missed.join("; "))),
    }
}
