//! `--backend=tent`: the same workload through te-tent's runtime, with tebench's power-of-two
//! sweeps of block size, batch size and threads. One row per case: block size, batch,
//! threads, GB/s, average, p99 and p999 batch latency (a batch's tasks, from allocate to
//! free). The target is a classic te segment (any te segment serves a tent initiator).

use std::sync::Arc;
use std::time::{Duration, Instant};

use te_core::{Config, HostBuffer, Opcode, Permission, TransferState};
use te_tent::{MemoryOptions, Request, TentConfig, TentEngine, TentFile};

use crate::flags::{Flags, powers};
use crate::{BenchResult, pattern};

const WAIT: Duration = Duration::from_secs(120);

/// The tent initiator for `flags`: the protocol's transport (TCP alone for `tcp`, shared memory
/// for `shm`, RDMA for `rdma`), under `MC_TENT_CONF` when set.
fn initiator(config: &Config, flags: &Flags) -> BenchResult<TentEngine> {
    let mut file = match std::env::var("MC_TENT_CONF") {
        Ok(v) if !v.trim().is_empty() => TentFile::parse_source(&v).map_err(|e| e.to_string())?,
        _ => TentFile::default(),
    };
    let enable = |on: bool| te_tent::config::TransportConf {
        enable: Some(on),
        ..Default::default()
    };
    let p = flags.protocol.as_str();
    for (name, tent_name) in [("shm", "shm"), ("uring", "io_uring")] {
        if !file.transports.contains_key(tent_name) {
            file.transports
                .entry(name.to_string())
                .or_insert_with(|| enable(p == name));
        }
    }
    if p == "rdma" {
        let mut rdma = enable(true);
        let devices = flags.devices();
        rdma.devices = (!devices.is_empty()).then_some(devices);
        file.transports.insert("rdma".into(), rdma);
    }
    let mut tent =
        TentConfig::from_file(file, |n| std::env::var(n).ok()).map_err(|e| e.to_string())?;
    // The file's settings stay (slice size, retries, ...); the bench's flags name the rails,
    // the topology and the address, as they do for the classic engine.
    if config.rails.is_some() {
        tent.core.rails = config.rails.clone();
    }
    if config.custom_topo_json.is_some() {
        tent.core.custom_topo_json = config.custom_topo_json.clone();
    }
    if let Some(ip) = config.tcp_bind_address {
        tent.core.tcp_bind_address = Some(ip);
        tent.local_segment_name = ip.to_string();
    }
    tent.metadata_conn = flags.metadata_server.clone();
    TentEngine::new(tent).map_err(|e| format!("tent engine: {e}"))
}

/// One case's figures.
struct Case {
    block: u64,
    batch: usize,
    threads: usize,
    /// What the threads did.
    run: crate::Driven,
}

fn run_case(
    t: &TentEngine,
    f: &Flags,
    (block, batch, threads): (u64, usize, usize),
    local: u64,
    (segment, remote): (u64, u64),
) -> BenchResult<Case> {
    let op = match f.operation.as_str() {
        "write" => Opcode::Write,
        _ => Opcode::Read,
    };
    let driven = crate::fan_out(threads, f.duration, |tid, end| {
        let requests: Vec<Request> = (0..batch)
            .map(|i| {
                let off = f.block_offset(block, i, tid, threads);
                Request::new(op, local + off, segment, remote + off, block)
            })
            .collect();
        let mut done = 0;
        let mut lat = crate::latency::Latencies::default();
        // One clock read per batch, as the classic engine's loop: the moment a batch is freed
        // ends its latency and starts the next.
        let mut t0 = Instant::now();
        while crate::running_at(t0, end) {
            let b = t.allocate_batch(batch).map_err(|e| e.to_string())?;
            t.submit(b, &requests).map_err(|e| format!("submit: {e}"))?;
            let s = t.wait(b, WAIT).map_err(|e| format!("wait: {e}"))?;
            if s.state != TransferState::Completed {
                let why = t.task_errors(b, 0).unwrap_or_default();
                return Err(format!("batch ended {:?}: {why:?}", s.state));
            }
            t.free_batch(b).map_err(|e| e.to_string())?;
            let now = Instant::now();
            lat.record(now - t0);
            t0 = now;
            done += 1;
        }
        Ok((done, lat))
    })?;
    Ok(Case {
        block,
        batch,
        threads,
        run: driven,
    })
}

fn print_case(f: &Flags, c: &Case) {
    let run = &c.run;
    let bytes = run.batches * c.batch as u64 * c.block;
    let gbps = bytes as f64 / run.elapsed / 1e9;
    let avg = run.latencies.mean_us();
    let p = |q| run.latencies.percentile_us(q);
    if f.json {
        let row = serde_json::json!({
            "backend": "tent", "protocol": f.protocol, "operation": f.operation,
            "block_size": c.block, "batch_size": c.batch, "threads": c.threads,
            "duration_s": run.elapsed, "batch_count": run.batches, "bytes": bytes,
            "throughput_gb_s": gbps,
            "batch_latency_us": {"avg": avg, "p50": p(0.5), "p99": p(0.99), "p999": p(0.999)},
            "includes": "batch allocate/free, policy and queue, held tasks posted per transport, transfer, completion wait",
        });
        println!("{row}");
    } else {
        println!(
            "{:>12} | {:>5} | {:>7} | {:>9.3} | {:>12.1} | {:>12.1} | {:>13.1}",
            c.block,
            c.batch,
            c.threads,
            gbps,
            avg,
            p(0.99),
            p(0.999)
        );
    }
}

/// Runs the sweep against `target` (a segment name) through te-tent.
pub(crate) fn run(config: Config, f: &Flags, target: &str) -> BenchResult<()> {
    let t = initiator(&config, f)?;
    let segment = t
        .open_segment(target)
        .map_err(|e| format!("opening {target}: {e}"))?;
    let desc = t.core().segment(segment).map_err(|e| e.to_string())?;
    let remote = desc
        .desc()
        .buffers
        .first()
        .ok_or_else(|| format!("segment {target} publishes no buffer"))?
        .clone();
    let ws = f.working_set();
    if remote.length < ws {
        return Err(format!(
            "target buffer holds {} bytes; the largest case needs {ws}",
            remote.length
        ));
    }
    let local = Arc::new(HostBuffer::new(ws as usize).map_err(|e| e.to_string())?);
    let view = crate::memory::BenchMemory::Host(local.clone());
    if f.verify && f.operation == "write" {
        pattern::fill(&view, crate::INITIATOR_SEED, 0, ws)?;
    }
    let private = MemoryOptions {
        permission: Permission::LocalOnly,
        ..MemoryOptions::default()
    };
    t.register_memory(&local, &private)
        .map_err(|e| format!("registering: {e}"))?;
    if !f.json {
        println!(
            "te-bench tent: {} {}, {:.1} s per case",
            f.protocol, f.operation, f.duration
        );
        println!(
            "{:>12} | {:>5} | {:>7} | {:>9} | {:>12} | {:>12} | {:>13}",
            "BlkSize (B)",
            "Batch",
            "Threads",
            "BW (GB/S)",
            "Avg Lat (us)",
            "P99 Lat (us)",
            "P999 Lat (us)"
        );
    }
    for threads in powers(f.sweep.threads.0 as u64, f.sweep.threads.1 as u64) {
        for batch in powers(f.sweep.batch.0 as u64, f.sweep.batch.1 as u64) {
            for block in powers(f.sweep.block.0, f.sweep.block.1) {
                let shape = (block, batch as usize, threads as usize);
                let case = run_case(&t, f, shape, local.addr(), (segment, remote.addr))?;
                print_case(f, &case);
            }
        }
    }
    // The last case moved the largest blocks, batches and threads: its blocks hold the pattern.
    let covered = f.covered(f.sweep.block.1, f.sweep.batch.1, f.sweep.threads.1);
    let span: u64 = covered.iter().map(|(_, n)| n).sum();
    if f.verify && f.operation == "write" {
        let back = crate::read_back(t.core(), segment, remote.addr, ws)?;
        if let Some(at) = pattern::first_mismatch_in(&back, crate::INITIATOR_SEED, &covered)? {
            return Err(format!("verification failed at byte {at} of the target"));
        }
        eprintln!("te-bench tent: verified {span} bytes written");
    }
    if f.verify && f.operation == "read" {
        if let Some(at) = pattern::first_mismatch_in(&view, crate::TARGET_SEED, &covered)? {
            return Err(format!("verification failed at byte {at}"));
        }
        eprintln!("te-bench tent: verified {span} bytes read");
    }
    Ok(())
}
