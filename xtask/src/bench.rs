//! `cargo xtask bench tcp`: te-bench and iperf3 on loopback in one run, printed as ratios.
//!
//! The reference is iperf3 with one stream, measured right before and right after te; te-bench
//! runs as two processes (target, initiator) like iperf3's server and client. iperf3 runs with
//! the congestion control te gives its connections on loopback ([`te_congestion`]: reno by
//! default), so the two compare like for like; iperf3 with the host's default is printed
//! beside it (a host defaulting to bbr paces loopback streams, at a third of the rate here).

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::{cargo, run};

pub(crate) struct KillOnDrop(pub(crate) Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Installs Debian's `package` with apt-get unless `bin` already runs.
pub(crate) fn ensure_tool(bin: &str, version_arg: &str, package: &str) -> Result<(), String> {
    if Command::new(bin).arg(version_arg).output().is_ok() {
        return Ok(());
    }
    eprintln!("xtask: {bin} missing; installing {package} with apt-get");
    run(
        "apt-get update",
        Command::new("apt-get").args(["update", "-qq"]),
    )?;
    run(
        &format!("apt-get install {package}"),
        Command::new("apt-get")
            .args(["install", "-y", "-qq", package])
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )
}

/// Makes the virtual environment `venv` and installs `packages` into it from PyPI (pip's
/// arguments: requirements, and options such as `--no-deps`), as `.ci/setup` does.
pub(crate) fn install_into_venv(venv: &std::path::Path, packages: &[&str]) -> Result<(), String> {
    eprintln!(
        "xtask: installing {} into {}",
        packages.join(" "),
        venv.display()
    );
    run(
        "python3 -m venv",
        Command::new("python3").arg("-m").arg("venv").arg(venv),
    )
    .map_err(|e| format!("making {}: {e}", venv.display()))?;
    run(
        "pip install",
        Command::new(venv.join("bin/pip"))
            .args(["install", "-q", "--disable-pip-version-check"])
            .args(packages),
    )
    .map_err(|e| format!("installing {}: {e}", packages.join(" ")))
}

fn ensure_iperf3() -> Result<(), String> {
    ensure_tool("iperf3", "--version", "iperf3")
}

/// The median of some runs' figures (the mean of the two middle ones for an even count); NaN
/// for none.
pub(crate) fn median(mut runs: Vec<f64>) -> f64 {
    runs.sort_by(|a, b| a.total_cmp(b));
    let half = runs.len() / 2;
    match runs.len() % 2 {
        1 => runs[half],
        _ if runs.is_empty() => f64::NAN,
        _ => (runs[half - 1] + runs[half]) / 2.0,
    }
}

/// The medians of each side of `pairs`.
pub(crate) fn medians(pairs: &[(f64, f64)]) -> (f64, f64) {
    let side = |pick: fn(&(f64, f64)) -> f64| median(pairs.iter().map(pick).collect());
    (side(|p| p.0), side(|p| p.1))
}

/// The median of `te[i] / reference[i]`: each run against the reference run made beside it
/// (the machine drifts between pairs more than within one).
pub(crate) fn paired_share(te: &[f64], reference: &[f64]) -> f64 {
    median(te.iter().zip(reference).map(|(t, r)| t / r).collect())
}

/// The order in which round `round` runs its `points` (bench points, or the legs of a case):
/// forward in even rounds, backward in odd ones. This host speeds up and slows down by tens of
/// percent over minutes; with one fixed order the point run last in every round would always
/// meet the host at its fastest (or slowest) and the comparison would lean its way, while
/// alternating the direction cancels a steady drift. It cancels only over an even number of
/// rounds: over an odd number the forward order runs once more than the backward one, and a
/// point's median meets the host at a different time from another's (with three rounds of
/// three legs, the first leg's median run is the sixth of nine, the middle leg's the fifth and
/// the last leg's the fourth). Over an even number, every point runs as often in each place and
/// follows the point before it as often as the point after it, and the mean of its two middle
/// runs sits at the same time for all.
pub(crate) fn round_order(round: usize, points: usize) -> Vec<usize> {
    match round % 2 {
        0 => (0..points).collect(),
        _ => (0..points).rev().collect(),
    }
}

/// µs per batch of `backend` over the instant transport (`--mode=engine`), `batch` tasks of
/// `block` bytes.
pub(crate) fn engine_cost(
    bin: &str,
    backend: &str,
    seconds: u64,
    (batch, block): (usize, u64),
) -> Result<f64, String> {
    let mut cmd = Command::new(bin);
    cmd.args(["--mode=engine", "--threads=1"])
        .arg(format!("--batch_size={batch}"))
        .arg(format!("--block_size={block}"))
        .arg(format!("--backend={backend}"))
        .arg(format!("--duration={seconds}"));
    let text = run_json(cmd, &format!("engine {backend}"))?;
    let us = json_number(&text, "batch_us").ok_or_else(|| format!("no batch_us in: {text}"))?;
    eprintln!("  engine cost {backend} {batch} x {block} B: {us:.3} us per batch");
    Ok(us)
}

/// `a` and `b` alternating `runs` times: the medians of a's figures, of b's, and of the paired
/// differences (b's run minus the a run just before it; the machine drifts between pairs).
pub(crate) fn paired(
    runs: usize,
    mut a: impl FnMut() -> Result<f64, String>,
    mut b: impl FnMut() -> Result<f64, String>,
) -> Result<(f64, f64, f64), String> {
    let (mut firsts, mut seconds, mut differences) = (vec![], vec![], vec![]);
    for _ in 0..runs {
        let (x, y) = (a()?, b()?);
        firsts.push(x);
        seconds.push(y);
        differences.push(y - x);
    }
    Ok((median(firsts), median(seconds), median(differences)))
}

pub(crate) fn json_number(json: &str, key: &str) -> Option<f64> {
    let at = json.find(&format!("\"{key}\""))? + key.len() + 2;
    let rest = json[at..].trim_start().strip_prefix(':')?.trim_start();
    let end =
        rest.find(|c: char| !(c.is_ascii_digit() || matches!(c, '.' | 'e' | 'E' | '-' | '+')))?;
    rest[..end].parse().ok()
}

/// The congestion control te's loopback connections get, as `MC_TE_TCP_CONGESTION` says
/// (te_reactor::congestion: `auto`, the default, is reno on loopback; `host` is the host's
/// default, `None` here).
fn te_congestion() -> Option<String> {
    match std::env::var("MC_TE_TCP_CONGESTION").map(|v| v.trim().to_ascii_lowercase()) {
        Err(_) => Some("reno".into()),
        Ok(v) if v == "auto" => Some("reno".into()),
        Ok(v) if v == "host" => None,
        Ok(v) => Some(v),
    }
}

/// The host's default congestion control (`net.ipv4.tcp_congestion_control`).
fn host_congestion() -> String {
    std::fs::read_to_string("/proc/sys/net/ipv4/tcp_congestion_control")
        .map_or_else(|_| "unknown".into(), |s| s.trim().to_string())
}

/// iperf3 loopback throughput in GB/s with `streams` parallel streams, with congestion control
/// `cc` (`None`: the host's default).
fn iperf3(seconds: u64, streams: usize, cc: Option<&str>) -> Result<f64, String> {
    let port = "5299";
    let _server = KillOnDrop(
        Command::new("iperf3")
            .args(["-s", "-1", "-p", port])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("iperf3 -s: {e}"))?,
    );
    std::thread::sleep(Duration::from_millis(500));
    let out = Command::new("iperf3")
        .args([
            "-c",
            "127.0.0.1",
            "-p",
            port,
            "-t",
            &seconds.to_string(),
            "-P",
            &streams.to_string(),
            "-J",
        ])
        .args(cc.iter().flat_map(|c| ["-C", c]))
        .output()
        .map_err(|e| format!("iperf3 -c: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let received = text
        .find("\"sum_received\"")
        .ok_or("iperf3 printed no sum_received")?;
    let bits =
        json_number(&text[received..], "bits_per_second").ok_or("iperf3: no bits_per_second")?;
    Ok(bits / 8e9)
}

/// Starts a te-bench target (`cmd` already holds its flags) and returns it with its segment name.
pub(crate) fn start_target(mut cmd: Command) -> Result<(KillOnDrop, String), String> {
    cmd.env("MC_LOG_LEVEL", "WARNING");
    start_announcing(cmd, "segment name:", "te-bench target")
}

/// Starts `cmd` (`what`, for errors) and waits for the line of its standard output holding
/// `marker`; returns the process and that line's last word (a segment name, an address).
pub(crate) fn start_announcing(
    mut cmd: Command,
    marker: &str,
    what: &str,
) -> Result<(KillOnDrop, String), String> {
    let mut child = KillOnDrop(
        cmd.stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("{what}: {e}"))?,
    );
    let stdout = child.0.stdout.take().ok_or(format!("{what}: no stdout"))?;
    let line = BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .find(|l| l.contains(marker))
        .ok_or(format!("{what} printed no {marker:?} line"))?;
    let word = line.rsplit(' ').next().unwrap_or_default().to_string();
    Ok((child, word))
}

/// A block size as the benches print it: `64 KiB`, `1 MiB`.
pub(crate) fn block_label(block: u64) -> String {
    match block >= 1 << 20 {
        true => format!("{} MiB", block >> 20),
        false => format!("{} KiB", block >> 10),
    }
}

/// Runs a te-bench initiator (`cmd` holds its flags; `--json` is added) and returns its GB/s.
fn run_initiator(cmd: Command, label: &str) -> Result<f64, String> {
    let text = run_json(cmd, label)?;
    json_number(&text, "throughput_gb_s").ok_or_else(|| format!("no JSON figures in: {text}"))
}

/// Runs a te-bench initiator with `--json`, echoes its summary line, returns its output.
pub(crate) fn run_json(mut cmd: Command, label: &str) -> Result<String, String> {
    let out = cmd
        .arg("--json")
        .env("MC_LOG_LEVEL", "WARNING")
        .output()
        .map_err(|e| format!("te-bench initiator: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(format!(
            "te-bench {label} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    if let Some(line) = text.lines().find(|l| l.starts_with("Test completed")) {
        eprintln!("  {label}: {line}");
    }
    Ok(text.into_owned())
}

/// One te-bench case with the target in its own process; returns GB/s. With `gaps` the
/// batch's blocks are two blocks apart (`--block_stride`), so nothing merges.
pub(crate) fn te_bench(
    bin: &str,
    op: &str,
    block: u64,
    gaps: bool,
    seconds: u64,
) -> Result<f64, String> {
    let mut target = Command::new(bin);
    let buffer = (block * 256).max(64 << 20);
    target.args([
        "--mode=target",
        "--local_server_name=127.0.0.1:0",
        &format!("--buffer_size={buffer}"),
    ]);
    let (_target, segment) = start_target(target)?;
    let mut initiator = Command::new(bin);
    initiator
        .args([
            "--mode=initiator",
            &format!("--segment_id={segment}"),
            "--local_server_name=127.0.0.1",
        ])
        .args([
            &format!("--operation={op}"),
            "--protocol=tcp",
            &format!("--block_size={block}"),
        ])
        .args([
            "--batch_size=128",
            "--threads=1",
            &format!("--duration={seconds}"),
        ]);
    if gaps {
        initiator.arg(format!("--block_stride={}", 2 * block));
    }
    let shape = if gaps { ", gaps" } else { "" };
    run_initiator(initiator, &format!("te-bench {op:5} {block:>8} B{shape}"))
}

/// TCP cases: operation, block, gaps between blocks (nothing merges), goal against iperf3's
/// single stream. The goals' cases first, then the chart's other block sizes.
const TCP_CASES: [(&str, u64, bool, Option<f64>); 14] = [
    ("write", 1 << 20, false, Some(0.90)),
    ("read", 1 << 20, false, Some(0.90)),
    ("write", 64 << 10, false, Some(0.60)),
    ("read", 64 << 10, false, Some(0.60)),
    ("write", 4 << 10, false, Some(0.60)),
    ("read", 4 << 10, false, Some(0.60)),
    ("write", 4 << 10, true, Some(0.40)),
    ("read", 4 << 10, true, Some(0.40)),
    ("write", 16 << 10, true, Some(0.90)),
    ("read", 16 << 10, true, Some(0.90)),
    ("write", 16 << 10, false, None),
    ("write", 256 << 10, false, None),
    ("read", 16 << 10, false, None),
    ("read", 256 << 10, false, None),
];

/// Pairs of runs behind each TCP goal's verdict.
const TCP_PAIRS: usize = 3;

/// te's share of iperf3's single stream at `case` (operation, block, gaps): the median over
/// [`TCP_PAIRS`] pairs (iperf3, then te, side by side in time; the machine drifts between
/// cases more than within a pair).
fn tcp_paired_share(
    bin: &str,
    (op, block, gaps): (&str, u64, bool),
    seconds: u64,
    cc: Option<&str>,
) -> Result<f64, String> {
    let mut shares = Vec::new();
    for _ in 0..TCP_PAIRS {
        let reference = iperf3(seconds, 1, cc)?;
        shares.push(te_bench(bin, op, block, gaps, seconds)? / reference);
    }
    Ok(median(shares))
}

/// te's goal against Mooncake's own bench on the same TCP case.
const MOONCAKE_GOAL: f64 = 1.4;

/// Mooncake's `transfer_engine_bench` (the wheel) as target and initiator, for the cases it
/// has (no gaps: its bench lays blocks back to back); `None` with the reason when the wheel
/// cannot run here.
struct MooncakeReference {
    bin: std::path::PathBuf,
    _target: KillOnDrop,
    segment: String,
}

impl MooncakeReference {
    fn start() -> Result<Self, String> {
        let bin = crate::interop_bench::mooncake_bench()?;
        let (target, segment) = crate::interop_bench::mooncake_target(&bin)?;
        Ok(MooncakeReference {
            bin,
            _target: target,
            segment,
        })
    }

    fn run(&self, op: &str, block: u64, seconds: u64) -> Result<f64, String> {
        crate::interop_bench::mooncake_initiator(&self.bin, &self.segment, (op, block), seconds)
    }
}

pub(crate) fn duration_arg(args: &[&str], usage: &str) -> Result<u64, String> {
    match args {
        [] => Ok(5),
        ["--duration", s] => s
            .parse()
            .map_err(|_| format!("--duration {s}: not a number")),
        _ => Err(usage.to_string()),
    }
}

pub(crate) fn build_te_bench() -> Result<String, String> {
    run(
        "build te-bench",
        cargo().args(["build", "--release", "-p", "te-bench"]),
    )?;
    let target_dir = std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| "target".into());
    let bin = std::path::Path::new(&target_dir).join("release/te-bench");
    let bin = bin
        .canonicalize()
        .map_err(|e| format!("{}: {e}", bin.display()))?;
    Ok(bin.display().to_string())
}

pub(crate) fn tcp(args: &[&str]) -> Result<(), String> {
    let seconds = duration_arg(args, "usage: cargo xtask bench tcp [--duration SECONDS]")?;
    ensure_iperf3()?;
    let bin = build_te_bench()?;
    let lanes: usize = std::env::var("MC_TCP_LANES_PER_PEER")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4);
    let mooncake = match MooncakeReference::start() {
        Ok(m) => Some(m),
        Err(why) => {
            eprintln!("  Mooncake's bench cannot run: {why}");
            crate::report::note(format!(
                "tcp: no Mooncake column (Mooncake's wheel could not run: {why}); the rest ran"
            ));
            None
        }
    };
    let cc = te_congestion();
    let cc_name = cc.clone().unwrap_or_else(host_congestion);
    let before = iperf3(seconds, 1, cc.as_deref())?;
    eprintln!("  iperf3 1 stream, {cc_name} (before): {before:.2} GB/s");
    let mut results = Vec::new();
    for (op, block, gaps, goal) in TCP_CASES {
        let te = te_bench(&bin, op, block, gaps, seconds)?;
        let mc = match (&mooncake, gaps) {
            (Some(m), false) => Some(m.run(op, block, seconds)?),
            _ => None,
        };
        let paired = match goal {
            Some(_) => Some(tcp_paired_share(
                &bin,
                (op, block, gaps),
                seconds,
                cc.as_deref(),
            )?),
            None => None,
        };
        results.push((op, block, gaps, goal.zip(paired), te, mc));
    }
    // UCX over its TCP transport, the other reference, for the write sweep.
    crate::bench::ensure_tool("ucx_perftest", "-h", "ucx-utils")?;
    let mut ucx = Vec::new();
    for (op, block, _, _, gbps, _) in results.iter().filter(|r| r.0 == "write" && !r.2) {
        let reference = crate::local::ucx_tcp_put_bw(*block)?;
        ucx.push((*op, *block, *gbps, reference));
    }
    let after = iperf3(seconds, 1, cc.as_deref())?;
    eprintln!("  iperf3 1 stream, {cc_name} (after):  {after:.2} GB/s");
    let same_streams = iperf3(seconds, lanes, cc.as_deref())?;
    eprintln!("  iperf3 {lanes} streams (te's lanes per peer): {same_streams:.2} GB/s");
    let host_cc = host_congestion();
    let host_stream = iperf3(seconds, 1, None)?;
    eprintln!("  iperf3 1 stream, the host's default ({host_cc}): {host_stream:.2} GB/s");
    crate::report::note(format!(
        "tcp: te's loopback connections use {cc_name} (MC_TE_TCP_CONGESTION), and iperf3 runs with it too: {:.2} GB/s for one stream; with the host's default ({host_cc}) iperf3 moved {host_stream:.2} GB/s. Mooncake's bench keeps the host's default.",
        (before + after) / 2.0
    ));
    let reference = (before + after) / 2.0;
    println!(
        "te TCP loopback vs iperf3 single stream with {cc_name}, as te's loopback connections ({reference:.2} GB/s, mean of before and after; {host_stream:.2} GB/s with the host's default, {host_cc}) and Mooncake's transfer_engine_bench (wheel, the host's default), 1 thread, batch 128; gaps: blocks two apart (--block_stride), so nothing merges"
    );
    println!(
        "{:<6} {:>14} {:>8} {:>7} {:>6} {:>9} {:>9} {:<10} {:>8}",
        "op",
        "block",
        "te GB/s",
        "ratio",
        "goal",
        "Mooncake",
        "te/MC",
        "verdict",
        format!("vs -P {lanes}")
    );
    let mut all_met = true;
    for (op, block, gaps, goal, gbps, mc) in results {
        let ratio = gbps / reference;
        let beats_mooncake = mc.is_none_or(|m| gbps >= MOONCAKE_GOAL * m);
        let met = goal.is_none_or(|(g, paired)| paired >= g) && beats_mooncake;
        let judged = goal.is_some() || mc.is_some();
        all_met &= met;
        let shape = if gaps { ", gaps" } else { "" };
        let share = |(g, paired): (f64, f64)| {
            format!(">= {:.0}% (paired runs: {:.0}%)", g * 100.0, paired * 100.0)
        };
        let goal_text = match (goal, mc) {
            (Some(g), Some(_)) => Some(format!("{}, >= {MOONCAKE_GOAL}× Mooncake", share(g))),
            (Some(g), None) => Some(share(g)),
            (None, Some(_)) => Some(format!(">= {MOONCAKE_GOAL}× Mooncake")),
            (None, None) => None,
        };
        crate::report::record(crate::report::Record {
            bench: "tcp",
            case: format!("{op} {}{shape}, batch 128", block_label(block)),
            series: Some((format!("{op}{shape}"), block)),
            te: gbps,
            unit: "GB/s",
            reference: Some((format!("iperf3 1 stream ({cc_name})"), reference)),
            mooncake: mc,
            goal: goal_text,
            met: judged.then_some(met),
        });
        let block = format!("{}{shape}", block_label(block));
        println!(
            "{op:<6} {block:>14} {gbps:>8.2} {:>6.0}% {:>5.0}% {:>9} {:>9} {:<10} {:>7.0}%",
            ratio * 100.0,
            goal.map_or(0.0, |g| g.0) * 100.0,
            mc.map_or("-".into(), |m| format!("{m:.2}")),
            mc.map_or("-".into(), |m| format!("{:.2}×", gbps / m)),
            if !judged {
                "info"
            } else if met {
                "met"
            } else {
                "BELOW GOAL"
            },
            gbps / same_streams * 100.0
        );
    }
    for (op, block, te, reference) in ucx {
        println!(
            "{op:<6} {:>7} KiB: te {te:.2} GB/s, ucx_perftest put_bw over UCX tcp {reference:.2} GB/s ({:.0}%)",
            block >> 10,
            te / reference * 100.0
        );
        crate::report::record(crate::report::Record {
            bench: "tcp",
            case: format!("{op} {} KiB vs UCX", block >> 10),
            series: Some((op.to_string(), block)),
            te,
            unit: "GB/s",
            reference: Some(("ucx_perftest tcp".into(), reference)),
            mooncake: None,
            goal: None,
            met: None,
        });
    }
    if all_met {
        Ok(())
    } else {
        Err("a ratio is below its goal".into())
    }
}

/// Per-rail rate in `bench topo`: low enough that the rails, not the CPUs, are the limit.
const TOPO_RAIL_MBIT: u32 = 500;

/// One te-bench WRITE run from host A to host B using `rails` rails on each side; GB/s.
fn topo_case(
    hosts: &crate::netns::TwoHosts,
    bin: &str,
    rails: usize,
    seconds: u64,
) -> Result<f64, String> {
    let mut target = hosts.command(false, bin);
    target
        .args([
            "--mode=target",
            "--local_server_name=198.18.0.2:15000",
            "--buffer_size=67108864",
        ])
        .env("MC_TE_FILTERS", hosts.interfaces(false, rails));
    let (_target, segment) = start_target(target)?;
    let mut initiator = hosts.command(true, bin);
    initiator
        .args([
            "--mode=initiator",
            &format!("--segment_id={segment}"),
            "--local_server_name=198.18.0.1",
        ])
        .args([
            "--operation=write",
            "--block_size=1048576",
            "--batch_size=32",
            "--threads=1",
        ])
        .arg(format!("--duration={seconds}"))
        .env("MC_TE_FILTERS", hosts.interfaces(true, rails));
    run_initiator(initiator, &format!("{rails} rail(s)"))
}

pub(crate) fn topo(args: &[&str]) -> Result<(), String> {
    let seconds = duration_arg(args, "usage: cargo xtask bench topo [--duration SECONDS]")?;
    if let Some(why) = crate::netns::unavailable() {
        return Err(format!("bench topo needs network namespaces: {why}"));
    }
    let bin = build_te_bench()?;
    let hosts = crate::netns::TwoHosts::create("bench", 2, Some(TOPO_RAIL_MBIT))?;
    let one = topo_case(&hosts, &bin, 1, seconds)?;
    let two = topo_case(&hosts, &bin, 2, seconds)?;
    let ratio = two / one;
    let limit = f64::from(TOPO_RAIL_MBIT) / 8e3;
    for (rails, gbps) in [(1u32, one), (2, two)] {
        crate::report::record(crate::report::Record {
            bench: "topo",
            case: format!("write 1 MiB over {rails} rail(s) of {TOPO_RAIL_MBIT} Mbit/s"),
            series: None,
            te: gbps,
            unit: "GB/s",
            reference: Some(("rail limit".into(), limit * f64::from(rails))),
            goal: (rails == 2).then(|| "two/one >= 1.80".to_string()),
            met: (rails == 2).then_some(ratio >= 1.8),
            mooncake: None,
        });
    }
    println!(
        "te TCP WRITE between two namespaces, each veth rail limited to {TOPO_RAIL_MBIT} Mbit/s ({limit:.4} GB/s), 1 MiB blocks, batch 32, 1 thread"
    );
    println!(
        "one rail:  {one:.4} GB/s ({:.0}% of the rail limit)",
        one / limit * 100.0
    );
    println!(
        "two rails: {two:.4} GB/s ({:.0}% of twice the limit)",
        two / (2.0 * limit) * 100.0
    );
    println!(
        "ratio two/one: {ratio:.2} (goal >= 1.80): {}",
        if ratio >= 1.8 { "met" } else { "BELOW GOAL" }
    );
    if ratio >= 1.8 {
        Ok(())
    } else {
        Err("multi-rail ratio below its goal".into())
    }
}

/// Engine overhead goal: slices per second on one submitting thread, one slice per task.
const ENGINE_GOAL: f64 = 1_000_000.0;

pub(crate) fn engine(args: &[&str]) -> Result<(), String> {
    let seconds = duration_arg(args, "usage: cargo xtask bench engine [--duration SECONDS]")?;
    let bin = build_te_bench()?;
    println!(
        "te engine overhead: InstantTransport (completes each slice at once), batch 128, {seconds} s per case"
    );
    println!(
        "{:>7} {:>9} {:>14} {:>12}",
        "threads", "block", "slices/s", "tasks/s"
    );
    let mut one_thread_small = 0.0;
    for (threads, block) in [(1, 65536u64), (2, 65536), (1, 1 << 20), (2, 1 << 20)] {
        let out = Command::new(&bin)
            .args([
                "--mode=engine",
                "--batch_size=128",
                "--buffer_size=1",
                "--json",
            ])
            .args([
                format!("--threads={threads}"),
                format!("--block_size={block}"),
                format!("--duration={seconds}"),
            ])
            .env("MC_LOG_LEVEL", "WARNING")
            .output()
            .map_err(|e| format!("te-bench --mode=engine: {e}"))?;
        let text = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() {
            return Err(format!(
                "te-bench --mode=engine failed: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let slices = json_number(&text, "slices_per_s").ok_or("no slices_per_s")?;
        let tasks = json_number(&text, "tasks_per_s").ok_or("no tasks_per_s")?;
        if threads == 1 && block == 65536 {
            one_thread_small = slices;
        }
        crate::report::record(crate::report::Record {
            bench: "engine",
            case: format!("{threads} thread(s), {} KiB slices, batch 128", block >> 10),
            series: None,
            te: slices,
            unit: "slices/s",
            reference: None,
            goal: (threads == 1 && block == 65536).then(|| format!(">= {ENGINE_GOAL:.0}")),
            met: (threads == 1 && block == 65536).then_some(slices >= ENGINE_GOAL),
            mooncake: None,
        });
        println!(
            "{threads:>7} {:>9} {slices:>14.0} {tasks:>12.0}",
            format!("{} KiB", block >> 10)
        );
    }
    let met = one_thread_small >= ENGINE_GOAL;
    println!(
        "1 thread, one slice per task: {one_thread_small:.0} slices/s (goal >= {ENGINE_GOAL:.0}): {}",
        if met { "met" } else { "BELOW GOAL" }
    );
    if met {
        Ok(())
    } else {
        Err("engine overhead below its goal".into())
    }
}

#[cfg(test)]
mod tests {
    use super::{json_number, median, medians, paired_share, round_order};

    #[test]
    fn rounds_alternate_direction_so_each_point_runs_first_and_last() {
        assert_eq!(round_order(0, 3), [0, 1, 2]);
        assert_eq!(round_order(1, 3), [2, 1, 0]);
        assert_eq!(round_order(2, 3), [0, 1, 2]);
        assert!(round_order(5, 0).is_empty());
        // Over two rounds every point has the same mean position.
        let mean = |p| {
            (0..2)
                .map(|r| round_order(r, 5).iter().position(|&x| x == p).unwrap())
                .sum::<usize>()
        };
        assert!((0..5).all(|p| mean(p) == 4));
    }

    #[test]
    fn medians_take_the_middle_and_the_mean_of_two_middles() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(median(vec![7.0]), 7.0);
        assert!(median(vec![]).is_nan());
    }

    #[test]
    fn pairs_are_judged_run_by_run_and_each_side_has_its_median() {
        // The machine slows by half in the second pair: each pair's ratio is still 0.9.
        let (te, reference) = ([9.0, 4.5, 9.9], [10.0, 5.0, 11.0]);
        assert!((paired_share(&te, &reference) - 0.9).abs() < 1e-12);
        let pairs: Vec<(f64, f64)> = te.into_iter().zip(reference).collect();
        assert_eq!(medians(&pairs), (9.0, 10.0));
    }

    /// Each point's figure in a host that drifts steadily: the slot it ran in.
    fn drifted_medians(rounds: usize, points: usize) -> Vec<f64> {
        let mut slots = vec![vec![]; points];
        for r in 0..rounds {
            for (i, p) in round_order(r, points).into_iter().enumerate() {
                slots[p].push((r * points + i) as f64);
            }
        }
        slots.into_iter().map(median).collect()
    }

    #[test]
    fn an_even_number_of_alternating_rounds_cancels_a_steady_drift() {
        for points in [2, 3, 4, 5] {
            for rounds in [2, 4, 6] {
                let m = drifted_medians(rounds, points);
                assert!(
                    m.iter().all(|&x| x == m[0]),
                    "{rounds} rounds of {points}: {m:?}"
                );
            }
        }
        // With three rounds the first and last legs of three meet the host at different times.
        assert_eq!(drifted_medians(3, 3), [5.0, 4.0, 3.0]);
    }

    #[test]
    fn reads_numbers_from_json_text() {
        let j = r#"{"a": 1, "throughput_gb_s":2.5e0,"bits_per_second": 123.5}"#;
        assert_eq!(json_number(j, "throughput_gb_s"), Some(2.5));
        assert_eq!(json_number(j, "bits_per_second"), Some(123.5));
        assert_eq!(json_number(j, "missing"), None);
    }
}
