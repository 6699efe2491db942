//! The GPU benchmark of `cargo xtask gpu`: CUDA IPC copies between two processes on one GPU
//! through te-nvlink (64 MiB WRITEs), next to `cuMemcpy` device-to-device in one process, in
//! the same run. Both wait for every copy to finish (te reports a slice when its stream has
//! finished it; the reference waits on its stream after each copy). te runs two ways: one block
//! per batch (latency-bound), and `DEPTH` blocks per batch (the copy workers' streams side by
//! side). The bytes written are read back and compared. Prints the figures and the ratio
//! against the goal (>= 80 %).

#![allow(unsafe_code)] // registers device memory by address, as a GPU program does

use std::process::Command;
use std::time::{Duration, Instant};

use te_core::{Config, Opcode, Permission, TransferEngine, TransferRequest, TransferState};
use te_cuda::DeviceBuffer;
use te_testkit::{pattern, spawn_ready};

const BLOCK: usize = 64 << 20;
const DEPTH: usize = 4;
const ROUNDS: usize = 40;

type Res<T> = Result<T, String>;

fn engine() -> Res<TransferEngine> {
    let mut c = Config::default();
    c.tcp_bind_address = Some("127.0.0.1".parse().unwrap());
    let e = TransferEngine::init(c, "P2PHANDSHAKE", "127.0.0.1").map_err(|e| e.to_string())?;
    e.install_transport(std::sync::Arc::new(te_tcp::TcpTransport::new()))
        .map_err(|e| e.to_string())?;
    e.install_transport(std::sync::Arc::new(te_nvlink::NvlinkTransport::new()))
        .map_err(|e| e.to_string())?;
    Ok(e)
}

fn register(e: &TransferEngine, d: &DeviceBuffer, p: Permission) -> Res<()> {
    // SAFETY: `d` lives until the process exits, after the engine's last use of it.
    unsafe { e.register_memory(d.addr() as *mut u8, d.len(), "*", p) }.map_err(|e| e.to_string())
}

fn owner() -> Res<()> {
    let e = engine()?;
    let d = DeviceBuffer::new(0, DEPTH * BLOCK).map_err(|e| e.to_string())?;
    register(&e, &d, Permission::RemoteReadWrite)?;
    println!("READY {} {}", e.segment_name(), d.addr());
    e.next_notify(Duration::from_secs(600));
    Ok(())
}

/// Runs `requests` as one batch to its end.
fn batch(e: &TransferEngine, requests: &[TransferRequest]) -> Res<()> {
    let b = e
        .allocate_batch(requests.len())
        .map_err(|e| e.to_string())?;
    e.submit(b, requests).map_err(|e| e.to_string())?;
    let s = e
        .wait(b, Duration::from_secs(60))
        .map_err(|e| e.to_string())?;
    e.free_batch(b).map_err(|e| e.to_string())?;
    match s.state {
        TransferState::Completed => Ok(()),
        other => Err(format!("transfer ended {other:?}")),
    }
}

/// GB/s of `rounds` runs of `f`, each moving `bytes`.
fn rate(rounds: usize, bytes: usize, mut f: impl FnMut() -> Res<()>) -> Res<f64> {
    let t = Instant::now();
    for _ in 0..rounds {
        f()?;
    }
    Ok((rounds * bytes) as f64 / t.elapsed().as_secs_f64() / 1e9)
}

fn main() -> Res<()> {
    if std::env::args().any(|a| a == "--owner") {
        return owner();
    }
    let cuda = te_cuda::driver().map_err(|e| e.to_string())?;
    let src = DeviceBuffer::new(0, DEPTH * BLOCK).map_err(|e| e.to_string())?;
    let scratch = DeviceBuffer::new(0, BLOCK).map_err(|e| e.to_string())?;
    src.write_at(0, &pattern(11, DEPTH * BLOCK))
        .map_err(|e| e.to_string())?;
    // The reference: cuMemcpy device to device in this process, each copy waited for.
    let reference = rate(ROUNDS, BLOCK, || {
        // SAFETY: both are live device allocations of at least BLOCK bytes.
        unsafe { cuda.copy(0, scratch.addr(), src.addr(), BLOCK) }.map_err(|e| e.to_string())
    })?;
    // te-nvlink between two processes.
    let (_child, ready) = spawn_ready(
        Command::new(std::env::current_exe().map_err(|e| e.to_string())?).arg("--owner"),
    );
    let (name, remote) = ready.split_once(' ').ok_or("bad READY line")?;
    let remote: u64 = remote.parse().map_err(|_| "bad address")?;
    let e = engine()?;
    register(&e, &src, Permission::LocalOnly)?;
    register(&e, &scratch, Permission::LocalOnly)?;
    let seg = e.open_segment(name).map_err(|e| e.to_string())?;
    let write = |i: usize| TransferRequest {
        opcode: Opcode::Write,
        source: src.addr() + (i * BLOCK) as u64,
        target_id: seg,
        target_offset: remote + (i * BLOCK) as u64,
        length: BLOCK as u64,
    };
    let deep: Vec<_> = (0..DEPTH).map(write).collect();
    batch(&e, &deep)?; // opens the IPC handle, and writes every block once
    let single = rate(ROUNDS, BLOCK, || batch(&e, &[write(0)]))?;
    let pipelined = rate(ROUNDS / DEPTH, DEPTH * BLOCK, || batch(&e, &deep))?;
    // The owner's bytes, read back block by block, are the source's.
    for i in 0..DEPTH {
        let read = TransferRequest {
            opcode: Opcode::Read,
            source: scratch.addr(),
            ..write(i)
        };
        batch(&e, &[read])?;
        let back = scratch.to_vec(0, BLOCK).map_err(|e| e.to_string())?;
        if back != src.to_vec(i * BLOCK, BLOCK).map_err(|e| e.to_string())? {
            return Err(format!("block {i} read back differs from what was written"));
        }
    }
    let best = single.max(pipelined);
    let ratio = best / reference;
    println!(
        "cuMemcpy D2D 64 MiB (waited): {reference:.1} GB/s\n\
         te-nvlink IPC WRITE 64 MiB, 1 per batch: {single:.1} GB/s ({:.0}%)\n\
         te-nvlink IPC WRITE 64 MiB, {DEPTH} per batch: {pipelined:.1} GB/s ({:.0}%)\n\
         verified {DEPTH} x 64 MiB read back; best ratio {:.0}% (goal >= 80%): {}",
        single / reference * 100.0,
        pipelined / reference * 100.0,
        ratio * 100.0,
        if ratio >= 0.8 { "met" } else { "MISSED" }
    );
    e.send_notify(
        name,
        &te_core::Notification {
            name: "bench".into(),
            notify_msg: "done".into(),
        },
    )
    .map_err(|e| e.to_string())?;
    match ratio >= 0.8 {
        true => Ok(()),
        false => Err("IPC copies below 80% of cuMemcpy".into()),
    }
}
