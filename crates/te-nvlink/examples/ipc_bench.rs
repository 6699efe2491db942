//! The GPU benchmark of `cargo xtask gpu`: CUDA IPC copies between two processes on one GPU
//! through te-nvlink (64 MiB WRITEs, one per batch), next to `cuMemcpy` device-to-device in
//! one process, in the same run. Prints both and the ratio against the goal (>= 80 %).

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use te_core::cuda::DeviceBuffer;
use te_core::testing::spawn_ready;
use te_core::{Config, Opcode, Permission, TransferEngine, TransferRequest, TransferState};

const BLOCK: usize = 64 << 20;
const ROUNDS: usize = 40;

fn engine() -> Result<TransferEngine, String> {
    let mut c = Config::default();
    c.tcp_bind_address = Some("127.0.0.1".parse().unwrap());
    let e = TransferEngine::init(c, "P2PHANDSHAKE", "127.0.0.1").map_err(|e| e.to_string())?;
    e.install_transport(Arc::new(te_tcp::TcpTransport::new()))
        .map_err(|e| e.to_string())?;
    e.install_transport(Arc::new(te_nvlink::NvlinkTransport::new()))
        .map_err(|e| e.to_string())?;
    Ok(e)
}

fn register(e: &TransferEngine, d: &DeviceBuffer, p: Permission) -> Result<(), String> {
    // SAFETY: `d` lives until the process exits, after the engine's last use of it.
    unsafe { e.register_memory(d.addr() as *mut u8, d.len(), "*", p) }.map_err(|e| e.to_string())
}

fn owner() -> Result<(), String> {
    let e = engine()?;
    let d = DeviceBuffer::new(0, BLOCK).map_err(|e| e.to_string())?;
    register(&e, &d, Permission::RemoteReadWrite)?;
    println!("READY {} {}", e.segment_name(), d.addr());
    e.recv_notification(Duration::from_secs(600));
    Ok(())
}

fn main() -> Result<(), String> {
    if std::env::args().any(|a| a == "--owner") {
        return owner();
    }
    let cuda = te_core::cuda::driver().map_err(|e| e.to_string())?;
    // The reference: cuMemcpy device to device in this process.
    let (a, b) = (
        DeviceBuffer::new(0, BLOCK).map_err(|e| e.to_string())?,
        DeviceBuffer::new(0, BLOCK).map_err(|e| e.to_string())?,
    );
    let t = Instant::now();
    for _ in 0..ROUNDS {
        // SAFETY: both are live device allocations of BLOCK bytes.
        unsafe { cuda.copy(0, b.addr(), a.addr(), BLOCK) }.map_err(|e| e.to_string())?;
    }
    let reference = (ROUNDS * BLOCK) as f64 / t.elapsed().as_secs_f64() / 1e9;
    // te-nvlink between two processes.
    let (_child, ready) = spawn_ready(
        Command::new(std::env::current_exe().map_err(|e| e.to_string())?).arg("--owner"),
    );
    let (name, remote) = ready.split_once(' ').ok_or("bad READY line")?;
    let remote: u64 = remote.parse().map_err(|_| "bad address")?;
    let e = engine()?;
    register(&e, &a, Permission::LocalOnly)?;
    let seg = e.open_segment(name).map_err(|e| e.to_string())?;
    let write = TransferRequest {
        opcode: Opcode::Write,
        source: a.addr(),
        target_id: seg,
        target_offset: remote,
        length: BLOCK as u64,
    };
    let once = || -> Result<(), String> {
        let batch = e.allocate_batch(1).map_err(|e| e.to_string())?;
        e.submit(batch, &[write]).map_err(|e| e.to_string())?;
        let s = e
            .wait(batch, Duration::from_secs(60))
            .map_err(|e| e.to_string())?;
        e.free_batch(batch).map_err(|e| e.to_string())?;
        match s.state {
            TransferState::Completed => Ok(()),
            other => Err(format!("transfer ended {other:?}")),
        }
    };
    once()?; // opens the IPC handle
    let t = Instant::now();
    for _ in 0..ROUNDS {
        once()?;
    }
    let te = (ROUNDS * BLOCK) as f64 / t.elapsed().as_secs_f64() / 1e9;
    let ratio = te / reference;
    println!(
        "te-nvlink IPC WRITE 64 MiB: {te:.1} GB/s   cuMemcpy D2D 64 MiB: {reference:.1} GB/s   ratio {:.0}% (goal >= 80%): {}",
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
