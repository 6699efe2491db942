//! `cargo xtask bench rdma [--duration S]`: te-bench's RDMA WRITE and perftest's `ib_write_bw`
//! with the same message size (64 KiB) on the same Soft-RoCE device (rxe0), in one guest run
//! of `cargo xtask softroce`, printed with the ratio (goal: te ≥ 80 %).

use crate::bench::{build_te_bench, duration_arg, json_number};

/// The message size compared.
const BLOCK: u64 = 64 << 10;

pub(crate) fn rdma(args: &[&str]) -> Result<(), String> {
    let seconds = duration_arg(args, "usage: cargo xtask bench rdma [--duration SECONDS]")?;
    let bin = build_te_bench()?;
    let dir = std::env::temp_dir().join(format!("te-bench-rdma-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let d = dir.display();
    // perftest first (server in the background, client to the guest's own address), then te.
    let script = format!(
        "ib_write_bw -d rxe0 -s {BLOCK} -D {seconds} -F > {d}/ib_server.txt 2>&1 & sleep 1; \
         ib_write_bw -d rxe0 -s {BLOCK} -D {seconds} -F 198.18.0.1 > {d}/ib.txt 2>&1; wait; \
         MC_LOG_LEVEL=WARNING MC_IB_TIMEOUT=18 {bin} --loopback --protocol=rdma --device_name=rxe0 \
         --operation=write --block_size={BLOCK} --batch_size=64 --threads=1 --duration={seconds} \
         --json > {d}/te.txt 2>&1"
    );
    let share = dir.display().to_string();
    let rc = crate::softroce::softroce(&[
        "--share",
        &share,
        "--timeout",
        "600",
        "--",
        "sh",
        "-c",
        &script,
    ])?;
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap_or_default();
    let (ib, te) = (read("ib.txt"), read("te.txt"));
    let _ = std::fs::remove_dir_all(&dir);
    if rc != 0 {
        return Err(format!("the guest run exited {rc}:\n{ib}\n{te}"));
    }
    // perftest's result line: bytes, iterations, BW peak, BW average (MB/s = 10^6 B/s), rate.
    let ib_mb = ib
        .lines()
        .map(str::split_whitespace)
        .filter_map(|mut w| {
            (w.next() == Some(&BLOCK.to_string()[..]))
                .then(|| w.nth(2))
                .flatten()
        })
        .find_map(|v| v.parse::<f64>().ok())
        .ok_or_else(|| format!("ib_write_bw printed no result:\n{ib}"))?;
    let reference = ib_mb / 1e3;
    let te_rate = json_number(&te, "throughput_gb_s")
        .ok_or_else(|| format!("te-bench printed no figures:\n{te}"))?;
    let ratio = te_rate / reference;
    crate::report::record(crate::report::Record {
        bench: "rdma",
        case: format!("WRITE {} KiB, Soft-RoCE in qemu", BLOCK >> 10),
        series: None,
        te: te_rate * 1e3,
        unit: "MB/s",
        reference: Some(("ib_write_bw".into(), reference * 1e3)),
        goal: Some(">= 80%".into()),
        met: Some(ratio >= 0.8),
        mooncake: None,
    });
    println!(
        "RDMA WRITE, {} KiB messages, Soft-RoCE rxe0 (loopback) in one qemu guest, {seconds} s each",
        BLOCK >> 10
    );
    println!(
        "ib_write_bw: {:.1} MB/s   te-bench (batch 64, 1 thread): {:.1} MB/s   ratio {:.0}% (goal >= 80%): {}",
        reference * 1e3,
        te_rate * 1e3,
        ratio * 100.0,
        if ratio >= 0.8 { "met" } else { "BELOW GOAL" }
    );
    match ratio >= 0.8 {
        true => Ok(()),
        false => Err("te below 80% of ib_write_bw".into()),
    }
}
