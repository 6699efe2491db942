//! `--mode=engine`: the engine's own cost per slice, with a transport that completes every slice
//! the moment it is posted (te-instant's `InstantTransport`). Each thread loops allocate batch →
//! submit `batch_size` tasks of `block_size` → wait → free, like the transfer modes; the figure
//! is slices (and tasks) per second through validation, slicing, routing, bookkeeping,
//! completion and waking. No byte moves.

use std::sync::Arc;
use std::time::{Duration, Instant};

use te_core::{Config, HostBuffer, Permission, TransferEngine};
use te_instant::InstantTransport;

use crate::BenchResult;
use crate::flags::Flags;

pub fn run(config: Config, f: &Flags) -> BenchResult<()> {
    let slice_size = config.slice_size;
    let fragment_limit = config.fragment_limit;
    let merge = config.merge_requests;
    let engine =
        TransferEngine::init(config, "P2PHANDSHAKE", "127.0.0.1").map_err(|e| e.to_string())?;
    crate::transports::meter(&engine, f)?;
    engine
        .install_transport(Arc::new(InstantTransport::new()))
        .map_err(|e| e.to_string())?;
    let ws = f.working_set();
    let buffer = Arc::new(HostBuffer::new(ws as usize).map_err(|e| e.to_string())?);
    engine
        .register_buffer(&buffer, "*", Permission::RemoteReadWrite)
        .map_err(|e| e.to_string())?;
    let own = engine
        .open_segment(engine.segment_name())
        .map_err(|e| e.to_string())?;
    let crate::Driven {
        elapsed, batches, ..
    } = crate::drive(&engine, f, buffer.addr(), (own, buffer.addr()))?;
    let tasks = batches * f.batch_size as u64;
    // A batch of one thread with no gaps is one contiguous range: merged, it is sliced whole.
    let merged = merge && f.threads == 1 && f.stride(f.block_size) == f.block_size;
    let per_batch = match merged {
        true => te_core::slicer::count(
            f.block_size * f.batch_size as u64,
            slice_size,
            fragment_limit,
        ),
        false => {
            f.batch_size as u64 * te_core::slicer::count(f.block_size, slice_size, fragment_limit)
        }
    };
    let slices = batches * per_batch;
    let slices_per_sec = slices as f64 / elapsed;
    println!(
        "te-bench engine: {} thread(s), {} tasks of {} B per batch: {:.0} slices/s, {:.0} tasks/s ({} slices in {:.2} s)",
        f.threads,
        f.batch_size,
        f.block_size,
        slices_per_sec,
        tasks as f64 / elapsed,
        slices,
        elapsed
    );
    if f.json {
        let json = serde_json::json!({
            "mode": "engine", "threads": f.threads, "batch_size": f.batch_size, "block_size": f.block_size,
            "duration_s": elapsed, "batch_count": batches, "tasks": tasks, "slices": slices,
            "slices_per_s": slices_per_sec, "tasks_per_s": tasks as f64 / elapsed,
            "batch_us": elapsed * 1e6 / batches.max(1) as f64 * f.threads as f64,
            "includes": "batch allocate/free, validation, slicing, routing, posting, completion, wait",
            "excludes": "any data movement (the transport completes each slice at once)",
        });
        println!("{json}");
    }
    Ok(())
}

/// `--mode=engine --backend=tent`: the same loop through te-tent's runtime (policy, queue,
/// held tasks, progress) over the same instant transport: the runtime's own cost per batch,
/// next to the classic engine's.
pub fn run_tent(config: Config, f: &Flags) -> BenchResult<()> {
    use te_tent::{MemoryOptions, Request, TentConfig, TentEngine, TentFile};
    let mut tent = TentConfig::from_file(TentFile::default(), |n| std::env::var(n).ok())
        .map_err(|e| e.to_string())?;
    tent.core = config;
    tent.metadata_conn = "P2PHANDSHAKE".into();
    tent.local_segment_name = "127.0.0.1".into();
    let t = TentEngine::with_transports(tent, false).map_err(|e| e.to_string())?;
    t.install_transport(Arc::new(InstantTransport::new()))
        .map_err(|e| e.to_string())?;
    let ws = f.working_set();
    let buffer = Arc::new(HostBuffer::new(ws as usize).map_err(|e| e.to_string())?);
    t.register_memory(&buffer, &MemoryOptions::default())
        .map_err(|e| e.to_string())?;
    let own = t
        .open_segment(t.segment_name())
        .map_err(|e| e.to_string())?;
    let op = match f.operation.as_str() {
        "write" => te_core::Opcode::Write,
        _ => te_core::Opcode::Read,
    };
    let base = buffer.addr();
    let driven = crate::fan_out(f.threads, f.duration, |tid, end| {
        let requests: Vec<Request> = (0..f.batch_size)
            .map(|i| {
                let off = f.block_offset(f.block_size, i, tid, f.threads);
                Request::new(op, base + off, own, base + off, f.block_size)
            })
            .collect();
        let mut done = 0;
        while crate::running(end) {
            let b = t.allocate_batch(f.batch_size).map_err(|e| e.to_string())?;
            t.submit(b, &requests).map_err(|e| format!("submit: {e}"))?;
            let s = t
                .wait(b, Duration::from_secs(60))
                .map_err(|e| format!("wait: {e}"))?;
            if s.state != te_core::TransferState::Completed {
                return Err(format!("batch ended {:?}", s.state));
            }
            t.free_batch(b).map_err(|e| e.to_string())?;
            done += 1;
        }
        Ok((done, Default::default()))
    })?;
    let batch_us = driven.elapsed * 1e6 / driven.batches.max(1) as f64 * f.threads as f64;
    let tasks = driven.batches * f.batch_size as u64;
    println!(
        "te-bench engine (tent): {} thread(s), {} tasks of {} B per batch: {batch_us:.3} us per batch, {:.0} tasks/s",
        f.threads,
        f.batch_size,
        f.block_size,
        tasks as f64 / driven.elapsed
    );
    if f.json {
        let json = serde_json::json!({
            "mode": "engine", "backend": "tent", "threads": f.threads, "batch_size": f.batch_size,
            "block_size": f.block_size, "duration_s": driven.elapsed, "batch_count": driven.batches,
            "tasks_per_s": tasks as f64 / driven.elapsed, "batch_us": batch_us,
            "includes": "batch allocate/free, policy, queue, held tasks posted, completion, progress, wait",
            "excludes": "any data movement (the transport completes each slice at once)",
        });
        println!("{json}");
    }
    Ok(())
}

/// `--mode=memcpy`: the same-host reference: one thread copying `block_size` chunks between two
/// buffers over the same working set as a transfer run, for `duration`.
pub fn memcpy(f: &Flags) -> BenchResult<()> {
    let ws = f.working_set() as usize;
    let a = HostBuffer::new(ws).map_err(|e| e.to_string())?;
    let b = HostBuffer::new(ws).map_err(|e| e.to_string())?;
    let block = f.block_size as usize;
    let end = Instant::now() + Duration::from_secs_f64(f.duration);
    let started = Instant::now();
    let mut bytes = 0u64;
    while crate::running(end) {
        for off in (0..ws.saturating_sub(block - 1)).step_by(block) {
            b.copy_from(off, &a, off, block)
                .map_err(|e| e.to_string())?;
            bytes += block as u64;
        }
    }
    if let Some(signal) = crate::interrupted() {
        return Err(crate::stopped_by(signal));
    }
    let rate = bytes as f64 / started.elapsed().as_secs_f64();
    println!(
        "te-bench memcpy: block {block} B over {ws} B: {:.2} GB/s",
        rate / 1e9
    );
    if f.json {
        println!(
            "{}",
            serde_json::json!({"mode": "memcpy", "block_size": block, "working_set": ws, "throughput_gb_s": rate / 1e9})
        );
    }
    Ok(())
}
