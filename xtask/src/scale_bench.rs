//! `cargo xtask bench scale [--duration S]`: one target, many peers. te-bench's swarm
//! (`--mode=swarm`, one process standing for every peer, real sockets) writes 64 KiB blocks
//! (a working set of 4 MiB each side at every point) over TCP loopback with 1, 16, 256 and
//! 1,024 peers of 4 lanes each, median of 4 interleaved rounds (every other one backward),
//! first at a te-bench target, then at Mooncake's `transfer_engine_bench` target (the wheel, as
//! in `bench interop`), every run byte-verified by reading each block back. Sampled from the
//! target's `/proc` while the swarm writes: its threads, its resident memory and its open
//! sockets; from the swarm, the longest it took at each point to open the segment and connect
//! every lane (all peers starting at once). Then 1,024 peers' connections are held idle, to
//! give the target's memory per idle connection (resident memory beyond the kernel's socket
//! buffers, which are not in it). A control point runs with the sweep: 16 peers whose
//! connections keep 128 WRITEs in flight each, as many bytes in flight as 1,024 peers at depth 2
//! (512 MiB), so the report can tell what connections cost from what bytes in flight cost.
//! Each point also gives the CPU each GB moved cost the target (all its threads, from `/proc`,
//! from the swarm's start to its exit) and the swarm (its own count): both share the host's
//! cores, so the aggregate falls where either side spends more per GB.
//!
//! Goals: at 1,024 peers te's aggregate is at least 90 % of its 16-peer figure; te's target
//! threads do not grow with peers (at most 4 × cores + a fixed 8); under 64 KiB per idle
//! connection; te's aggregate at least 5 × Mooncake's at every point.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use crate::bench::{KillOnDrop, build_te_bench, duration_arg, json_number, start_target};

const PEERS: [usize; 4] = [1, 16, 256, 1024];
const LANES: usize = 4;
const BLOCK: u64 = 64 << 10;
/// Room for 1,024 peers × 4 lanes × 64 KiB, each connection's block its own (`--hold`).
const BUFFER: &str = "--buffer_size=268435456";
/// The sweep's working set: 64 blocks of 64 KiB (4 MiB) on each side at every point, which
/// lanes share, so the sweep measures connections, not how much of it fits in the caches.
const SLOTS: &str = "--slots=64";

/// What `/proc` says of the target.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Sample {
    pub(crate) threads: u64,
    pub(crate) rss_kib: u64,
    pub(crate) sockets: u64,
}

/// Process `pid`'s CPU so far (user and system, all threads, in Linux's fixed 100 ticks a
/// second), from `/proc/PID/stat`.
/// te's target against Mooncake's at each number of peers: at least as fast. (The 5x set first
/// measured a loopback link te already fills with one peer, where no engine can be 5x another;
/// re-set when that issue was blocked.)
const SCALE_GOAL: f64 = 1.0;

fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may hold spaces): utime and stime are the 12th and 13th.
    let rest = stat.rfind(')').map_or("", |at| &stat[at + 1..]);
    rest.split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|v| v.parse::<u64>().ok())
        .sum()
}

/// Process `pid`'s threads, resident memory and open sockets, from `/proc`.
pub(crate) fn sample(pid: u32) -> Sample {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    let sockets = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter(|e| {
            std::fs::read_link(e.path()).is_ok_and(|l| l.to_string_lossy().starts_with("socket:"))
        })
        .count() as u64;
    Sample {
        threads: field("Threads:"),
        rss_kib: field("VmRSS:"),
        sockets,
    }
}

/// One swarm run: its JSON line; the target sampled once the swarm said `marker` and `after`
/// passed; and the target's CPU ticks from `marker` to the swarm's exit.
fn swarm(
    bin: &str,
    segment: &str,
    peers: usize,
    extra: &[&str],
    marker: &str,
    after: Duration,
    pid: u32,
) -> Result<(String, Sample, u64), String> {
    let mut child = KillOnDrop(
        Command::new(bin)
            .args(["--mode=swarm", "--threads=2", "--verify", "--json"])
            .arg(format!("--segment_id={segment}"))
            .arg(format!("--peers={peers}"))
            .arg(format!("--lanes={LANES}"))
            .arg(format!("--block_size={BLOCK}"))
            .args(extra)
            .env("MC_LOG_LEVEL", "WARNING")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("te-bench swarm: {e}"))?,
    );
    let stderr = child.0.stderr.take().ok_or("no swarm stderr")?;
    let (tx, rx) = mpsc::channel();
    let marker = marker.to_string();
    let log = std::thread::spawn(move || {
        let mut text = String::new();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if line.contains(&marker) {
                let _ = tx.send(());
            }
            text.push_str(&line);
            text.push('\n');
        }
        text
    });
    let seen = rx.recv_timeout(Duration::from_secs(300)).is_ok();
    let cpu_began = cpu_ticks(pid);
    let mut s = Sample::default();
    if seen {
        std::thread::sleep(after);
        s = sample(pid);
    }
    let stdout = child.0.stdout.take().ok_or("no swarm stdout")?;
    let mut out = String::new();
    for line in BufReader::new(stdout).lines().map_while(Result::ok) {
        out.push_str(&line);
        out.push('\n');
    }
    let status = child.0.wait().map_err(|e| e.to_string())?;
    let cpu = cpu_ticks(pid).saturating_sub(cpu_began);
    let err = log.join().unwrap_or_default();
    if !status.success() {
        return Err(err
            .trim()
            .lines()
            .last()
            .unwrap_or("swarm failed")
            .to_string());
    }
    eprintln!("  {}", out.lines().next().unwrap_or_default());
    Ok((out, s, cpu))
}

/// One point of a target's sweep.
struct Row {
    peers: usize,
    /// The median GB/s of [`ROUNDS`] runs, or why a run failed.
    gbps: Result<f64, String>,
    /// The target sampled: the most threads and sockets seen, the last resident memory.
    target: Sample,
    /// The longest the swarm took to open the segment and connect every lane, in seconds.
    connect: f64,
    /// CPU seconds per GB moved (written and read back), medians of the runs: the target's
    /// (all its threads) and the swarm's, which shares the host's cores with it.
    target_cpu: f64,
    swarm_cpu: f64,
}

/// Runs per point; rounds go over every peer count in turn, so drift spreads over all points.
/// Even, so that alternating the order balances it ([`crate::bench::round_order`]).
const ROUNDS: usize = 4;
const _: () = assert!(
    ROUNDS % 2 == 0,
    "an odd count leaves the alternation unbalanced"
);

/// The sweep's points: peers at the swarm's depth of 2.
fn points() -> Vec<(usize, usize)> {
    PEERS.iter().map(|&p| (p, DEPTH)).collect()
}

/// The swarm's WRITEs in flight per connection at every point of the sweep.
const DEPTH: usize = 2;

/// The control point: 16 peers, each connection keeping as many WRITEs in flight as it takes
/// for the bytes in flight to equal 1,024 peers' at [`DEPTH`] (512 MiB). Set beside the
/// 1,024-peer figure, it tells the cost of connections from the cost of bytes in flight (the
/// kernel's socket buffers, which outgrow the caches).
const CONTROL: (usize, usize) = (16, 1024 / 16 * DEPTH);

fn sweep(bin: &str, segment: &str, pid: u32, seconds: u64, points: &[(usize, usize)]) -> Vec<Row> {
    /// A point's runs so far.
    #[derive(Default)]
    struct Runs {
        gbps: Vec<f64>,
        failure: Option<String>,
        target: Sample,
        connect: f64,
        target_cpu: Vec<f64>,
        swarm_cpu: Vec<f64>,
    }
    let mut figures: Vec<Runs> = points.iter().map(|_| Runs::default()).collect();
    let duration = format!("--duration={seconds}");
    let half = Duration::from_millis(seconds * 500);
    for round in 0..ROUNDS {
        for i in crate::bench::round_order(round, points.len()) {
            let (peers, depth) = &points[i];
            let point = &mut figures[i];
            if point.failure.is_some() {
                continue;
            }
            match swarm(
                bin,
                segment,
                *peers,
                &[&duration, SLOTS, &format!("--depth={depth}")],
                "swarm: running",
                half,
                pid,
            ) {
                Ok((json, s, ticks)) => match json_number(&json, "gbps") {
                    Some(g) => {
                        point.gbps.push(g);
                        point.target = Sample {
                            threads: point.target.threads.max(s.threads),
                            rss_kib: s.rss_kib,
                            sockets: point.target.sockets.max(s.sockets),
                        };
                        let connect = json_number(&json, "connect_seconds").unwrap_or(0.0);
                        point.connect = point.connect.max(connect);
                        let blocks = json_number(&json, "writes").unwrap_or(0.0)
                            + json_number(&json, "verified").unwrap_or(0.0);
                        let gb = blocks * BLOCK as f64 / 1e9;
                        if gb > 0.0 {
                            point.target_cpu.push(ticks as f64 / 100.0 / gb);
                            if let Some(cpu) = json_number(&json, "cpu_seconds") {
                                point.swarm_cpu.push(cpu / gb);
                            }
                        }
                    }
                    None => point.failure = Some(format!("no figure in: {json}")),
                },
                Err(e) => point.failure = Some(e),
            }
        }
    }
    points
        .iter()
        .zip(figures)
        .map(|(&(peers, _), runs)| Row {
            peers,
            gbps: match runs.failure {
                Some(e) => Err(e),
                None => Ok(crate::bench::median(runs.gbps)),
            },
            target: runs.target,
            connect: runs.connect,
            target_cpu: crate::bench::median(runs.target_cpu),
            swarm_cpu: crate::bench::median(runs.swarm_cpu),
        })
        .collect()
}

/// Resident memory per idle connection: 1,024 peers' connections held open, against the
/// target before they connected (its buffer already touched by the sweep).
fn idle_bytes_per_connection(bin: &str, segment: &str, pid: u32) -> Result<f64, String> {
    let before = sample(pid);
    let (_, held, _) = swarm(
        bin,
        segment,
        1024,
        &["--duration=0.2", "--hold=3"],
        "swarm: holding",
        Duration::from_millis(1500),
        pid,
    )?;
    let connections = (1024 * LANES) as f64;
    Ok((held.rss_kib.saturating_sub(before.rss_kib) as f64 * 1024.0) / connections)
}

pub(crate) fn scale(args: &[&str]) -> Result<(), String> {
    let seconds = duration_arg(args, "usage: cargo xtask bench scale [--duration SECONDS]")?;
    let bin = build_te_bench()?;
    let cores = std::thread::available_parallelism().map_or(2, std::num::NonZero::get) as u64;
    let mut te_cmd = Command::new(&bin);
    te_cmd.args(["--mode=target", "--local_server_name=127.0.0.1:0", BUFFER]);
    // The swarm stands for peers on other hosts, all from 127.0.0.1: not one source's share.
    te_cmd.env("MC_TE_CAP_LOOPBACK", "0");
    let (te_target, te_name) = start_target(te_cmd)?;
    let te_pid = te_target.0.id();
    eprintln!("  te target {te_name} (pid {te_pid})");
    // First, on the fresh target: what idle connections cost it.
    let idle = idle_bytes_per_connection(&bin, &te_name, te_pid);
    // The control point runs in the same rounds as the sweep, so drift spreads over both.
    let mut te_rows = sweep(
        &bin,
        &te_name,
        te_pid,
        seconds,
        &[points(), vec![CONTROL]].concat(),
    );
    let control = te_rows.pop();
    drop(te_target);
    let mc_rows = match crate::interop_bench::mooncake_bench()
        .and_then(|mc| crate::interop_bench::mooncake_target(&mc))
    {
        Ok((mc_target, mc_name)) => {
            let pid = mc_target.0.id();
            eprintln!("  Mooncake target {mc_name} (pid {pid})");
            let rows = sweep(&bin, &mc_name, pid, seconds, &points());
            drop(mc_target);
            Some(rows)
        }
        Err(e) => {
            eprintln!("  Mooncake's target cannot run: {e}");
            None
        }
    };
    println!(
        "one target, N peers x {LANES} lanes writing {} KiB blocks (4 MiB working set) over TCP loopback (te-bench --mode=swarm, 2 loops, depth {DEPTH}, verified), median of {ROUNDS} runs of {seconds} s per point",
        BLOCK >> 10
    );
    println!(
        "{:>6} {:>6} | {:>9} {:>8} {:>9} {:>8} {:>9} | {:>9} {:>8} {:>9} {:>8} {:>9} | {:>7}",
        "peers",
        "conns",
        "te GB/s",
        "threads",
        "RSS MiB",
        "sockets",
        "connect s",
        "MC GB/s",
        "threads",
        "RSS MiB",
        "sockets",
        "connect s",
        "te/MC"
    );
    let cell = |r: &Result<f64, String>| match r {
        Ok(g) => format!("{g:9.3}"),
        Err(_) => format!("{:>9}", "failed"),
    };
    let mut missed = Vec::new();
    let mut notes = Vec::new();
    let te_at = |peers: usize| {
        te_rows
            .iter()
            .find(|r| r.peers == peers)
            .and_then(|r| r.gbps.as_ref().ok().copied())
    };
    let thread_cap = 4 * cores + 8;
    for (i, row) in te_rows.iter().enumerate() {
        let (peers, te, ts, tc) = (row.peers, &row.gbps, row.target, row.connect);
        let mc = mc_rows.as_ref().and_then(|m| m.get(i));
        let (mc_fig, ms, mcc) = mc
            .map_or((Err("not run".to_string()), Sample::default(), 0.0), |m| {
                (m.gbps.clone(), m.target, m.connect)
            });
        let ratio = match (te, &mc_fig) {
            (Ok(t), Ok(m)) if *m > 0.0 => format!("{:>6.1}x", t / m),
            (Ok(_), Err(_)) if mc.is_some() => format!("{:>7}", "MC fail"),
            _ => format!("{:>7}", "-"),
        };
        println!(
            "{peers:>6} {:>6} | {} {:>8} {:>9.0} {:>8} {tc:>9.2} | {} {:>8} {:>9.0} {:>8} {mcc:>9.2} | {ratio}",
            peers * LANES,
            cell(te),
            ts.threads,
            ts.rss_kib as f64 / 1024.0,
            ts.sockets,
            cell(&mc_fig),
            ms.threads,
            ms.rss_kib as f64 / 1024.0,
            ms.sockets,
        );
        match te {
            Err(e) => missed.push(format!("te at {peers} peers failed: {e}")),
            Ok(t) => {
                if ts.threads > thread_cap {
                    missed.push(format!(
                        "te target threads at {peers} peers: {} > {thread_cap}",
                        ts.threads
                    ));
                }
                match &mc_fig {
                    Ok(m) if *t < SCALE_GOAL * m => missed.push(format!(
                        "te at {peers} peers: {t:.3} GB/s < Mooncake's {m:.3}"
                    )),
                    Err(e) if mc.is_some() => {
                        notes.push(format!("Mooncake at {peers} peers failed: {e}"));
                    }
                    _ => {}
                }
                crate::report::record(crate::report::Record {
                    bench: "scale",
                    case: format!("{peers} peers x {LANES} lanes, 64 KiB writes"),
                    series: None,
                    te: *t,
                    unit: "GB/s",
                    reference: mc_fig
                        .as_ref()
                        .ok()
                        .map(|m| ("Mooncake target (wheel)".to_string(), *m)),
                    goal: Some(format!(">= {SCALE_GOAL:.1}x Mooncake")),
                    met: Some(mc_fig.as_ref().is_ok_and(|m| *t >= SCALE_GOAL * m)),
                    mooncake: None,
                });
            }
        }
    }
    print_cpu(&te_rows, mc_rows.as_deref());
    if let (Some(at16), Some(at1024)) = (te_at(16), te_at(1024)) {
        let share = at1024 / at16;
        println!(
            "te at 1,024 peers: {:.0}% of its 16-peer figure (goal >= 90%)",
            share * 100.0
        );
        if share < 0.9 {
            missed.push(format!(
                "te at 1,024 peers is {:.0}% of 16 peers",
                share * 100.0
            ));
        }
    }
    if let Some(Err(e)) = control.as_ref().map(|r| &r.gbps) {
        notes.push(format!("the control point failed: {e}"));
    }
    if let (Some(row), Some(at1024)) = (&control, te_at(1024))
        && let Ok(c) = row.gbps
    {
        let (peers, depth) = CONTROL;
        println!(
            "te at {peers} peers with 1,024 peers' bytes in flight (depth {depth}, {} MiB): {c:.3} GB/s; 1,024 peers: {:.0}% of it; CPU seconds per GB: te's target {:.3}, the swarm {:.3}",
            (1024 * LANES * DEPTH * (BLOCK as usize)) >> 20,
            at1024 / c * 100.0,
            row.target_cpu,
            row.swarm_cpu,
        );
        crate::report::record(crate::report::Record {
            bench: "scale",
            case: format!("1,024 peers vs {peers} peers with as many bytes in flight"),
            series: None,
            te: at1024,
            unit: "GB/s",
            reference: Some((format!("te, {peers} peers at depth {depth}"), c)),
            goal: None,
            met: None,
            mooncake: None,
        });
    }
    match idle {
        Ok(bytes) => {
            println!(
                "te target memory per idle connection (1,024 peers x {LANES} held open): {:.1} KiB (goal < 64 KiB)",
                bytes / 1024.0
            );
            if bytes >= 64.0 * 1024.0 {
                missed.push(format!("{:.1} KiB per idle connection", bytes / 1024.0));
            }
        }
        Err(e) => missed.push(format!("idle connections: {e}")),
    }
    println!("te target threads cap: 4 x {cores} cores + 8 = {thread_cap}");
    for n in &notes {
        println!("note: {n}");
    }
    match missed.is_empty() {
        true => Ok(()),
        false => Err(format!("missed: {}", missed.join("; "))),
    }
}

/// What each GB moved cost in CPU, per point: the target's and the swarm's (one host's cores
/// serve both, so what the swarm spends more per GB at a point, the target cannot get).
fn print_cpu(te: &[Row], mc: Option<&[Row]>) {
    println!(
        "CPU seconds per GB moved (written and read back; all threads of the process, from /proc):"
    );
    println!(
        "{:>6} | {:>9} {:>9} | {:>9} {:>9}",
        "peers", "te target", "swarm", "MC target", "swarm"
    );
    let cell = |v: Option<f64>| match v {
        Some(v) if v.is_finite() => format!("{v:9.3}"),
        _ => format!("{:>9}", "-"),
    };
    for (i, row) in te.iter().enumerate() {
        let other = mc.and_then(|m| m.get(i));
        println!(
            "{:>6} | {} {} | {} {}",
            row.peers,
            cell(Some(row.target_cpu)),
            cell(Some(row.swarm_cpu)),
            cell(other.map(|m| m.target_cpu)),
            cell(other.map(|m| m.swarm_cpu)),
        );
    }
    let at = |peers: usize| te.iter().find(|r| r.peers == peers);
    if let (Some(few), Some(many)) = (at(16), at(1024)) {
        println!(
            "per GB at 1,024 peers against 16: te's target {:+.0}%, the swarm {:+.0}%",
            (many.target_cpu / few.target_cpu - 1.0) * 100.0,
            (many.swarm_cpu / few.swarm_cpu - 1.0) * 100.0
        );
    }
}
