//! `cargo xtask bench metrics`: what counting costs. The engine's slices per second
//! (`--mode=engine`, the instant transport) and te-bench WRITEs of 4 KiB and 64 KiB over TCP
//! loopback, each with metrics off and on (`--metrics_port=0`: counting and the endpoint),
//! in alternating pairs; the figure is the median of the pairs' on/off ratios.

use std::process::Command;

use crate::bench::{
    block_label, build_te_bench, duration_arg, json_number, median, round_order, run_json,
    start_target,
};

/// Rounds of each pair.
const ROUNDS: usize = 6;

/// Goals, on/off at least: the engine alone, and a te-bench WRITE.
const ENGINE_GOAL: f64 = 0.95;
const WRITE_GOAL: f64 = 0.97;

/// Slices per second of the engine alone, 1 thread, batch 128 of 64 KiB.
fn engine(bin: &str, seconds: u64, metrics: bool) -> Result<f64, String> {
    let mut cmd = Command::new(bin);
    cmd.args([
        "--mode=engine",
        "--threads=1",
        "--batch_size=128",
        "--block_size=65536",
        "--buffer_size=1",
    ])
    .arg(format!("--duration={seconds}"));
    if metrics {
        cmd.arg("--metrics_port=0");
    }
    let text = run_json(cmd, &format!("engine, metrics {}", on_off(metrics)))?;
    json_number(&text, "slices_per_s").ok_or_else(|| format!("no slices_per_s in: {text}"))
}

/// GB/s of a te-bench WRITE of `block` over TCP loopback, batch 128, 1 thread.
fn write(bin: &str, segment: &str, block: u64, seconds: u64, metrics: bool) -> Result<f64, String> {
    let mut cmd = Command::new(bin);
    cmd.args([
        "--mode=initiator",
        "--local_server_name=127.0.0.1",
        "--operation=write",
        "--protocol=tcp",
        "--batch_size=128",
        "--threads=1",
    ])
    .arg(format!("--segment_id={segment}"))
    .arg(format!("--block_size={block}"))
    .arg(format!("--duration={seconds}"));
    if metrics {
        cmd.arg("--metrics_port=0");
    }
    let label = format!("write {}, metrics {}", block_label(block), on_off(metrics));
    let text = run_json(cmd, &label)?;
    json_number(&text, "throughput_gb_s").ok_or_else(|| format!("no throughput in: {text}"))
}

fn on_off(metrics: bool) -> &'static str {
    if metrics { "on" } else { "off" }
}

/// `run(metrics)` off and on, alternating which goes first: (median off, median on, median of
/// the pairs' on/off ratios).
fn pairs(mut run: impl FnMut(bool) -> Result<f64, String>) -> Result<(f64, f64, f64), String> {
    let (mut off, mut on, mut ratios) = (vec![], vec![], vec![]);
    for round in 0..ROUNDS {
        let mut pair = [0.0; 2];
        for leg in round_order(round, 2) {
            pair[leg] = run(leg == 1)?;
        }
        off.push(pair[0]);
        on.push(pair[1]);
        ratios.push(pair[1] / pair[0]);
    }
    Ok((median(off), median(on), median(ratios)))
}

pub(crate) fn metrics(args: &[&str]) -> Result<(), String> {
    let seconds = duration_arg(
        args,
        "usage: cargo xtask bench metrics [--duration SECONDS]",
    )?;
    let bin = build_te_bench()?;
    println!(
        "te metrics cost: off vs on (counting and the endpoint), {ROUNDS} alternating pairs of {seconds} s, median of the pairs' ratios"
    );
    println!(
        "{:<38} {:>21} {:>21} {:>8} {:>7}",
        "case", "off", "on", "on/off", "goal"
    );
    let mut missed = Vec::new();
    let mut row =
        |case: String, unit: &'static str, (off, on, ratio): (f64, f64, f64), goal: f64| {
            let met = ratio >= goal;
            println!(
                "{case:<38} {off:>12.2} {unit:<8} {on:>12.2} {unit:<8} {:>7.1}% {:>6.0}%{}",
                ratio * 100.0,
                goal * 100.0,
                if met { "" } else { "  BELOW GOAL" }
            );
            crate::report::record(crate::report::Record {
                bench: "metrics",
                case: case.clone(),
                series: None,
                te: on,
                unit,
                reference: Some(("metrics off".into(), off)),
                mooncake: None,
                goal: Some(format!(
                    "on/off >= {:.0}% (paired median {:.1}%)",
                    goal * 100.0,
                    ratio * 100.0
                )),
                met: Some(met),
            });
            if !met {
                missed.push(case);
            }
        };
    let figures = pairs(|on| engine(&bin, seconds, on))?;
    row(
        "engine, 1 thread, 64 KiB, batch 128".into(),
        "slices/s",
        figures,
        ENGINE_GOAL,
    );
    for block in [4u64 << 10, 64 << 10] {
        let mut target = Command::new(&bin);
        target.args([
            "--mode=target",
            "--local_server_name=127.0.0.1:0",
            "--buffer_size=67108864",
        ]);
        let (_target, segment) = start_target(target)?;
        let figures = pairs(|on| write(&bin, &segment, block, seconds, on))?;
        row(
            format!("te-bench WRITE {}, TCP, batch 128", block_label(block)),
            "GB/s",
            figures,
            WRITE_GOAL,
        );
    }
    match missed.is_empty() {
        true => Ok(()),
        false => Err(format!(
            "metrics cost above its goal: {}",
            missed.join(", ")
        )),
    }
}
