//! GPU paths. Without CUDA (CI), the clear-error paths run: te-nvlink will not install, GPU
//! locations are refused, and TCP declares no GPU capability. The GPU suite is `#[ignore]`d and
//! runs with `cargo xtask gpu` on a machine with a GPU: IPC between two processes on one GPU,
//! fabric handles between two processes (or, on a GPU without them, the fallback of
//! `MC_USE_FABRIC` to IPC memory), host ↔ GPU copies in one process, and GPU memory over TCP staged through host memory, all
//! byte-verified.

#![allow(unsafe_code)] // registers device memory by address, as a GPU program does

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use te_core::transport::{Capabilities, Transport};
use te_core::{
    Config, HostBuffer, Opcode, Permission, SegmentId, SubmitOptions, TransferEngine,
    TransferRequest, TransferState,
};
use te_cuda::DeviceBuffer;
use te_nvlink::NvlinkTransport;
use te_tcp::TcpTransport;
use te_testkit::{pattern, self_test_args, spawn_ready, transfer_one};

const LEN: usize = 8 << 20;

fn engine(nvlink: bool) -> TransferEngine {
    let mut c = Config::default();
    c.tcp_bind_address = Some("127.0.0.1".parse().unwrap());
    let e = TransferEngine::init(c, "P2PHANDSHAKE", "127.0.0.1").unwrap();
    e.install_transport(Arc::new(TcpTransport::new())).unwrap();
    if nvlink {
        e.install_transport(Arc::new(NvlinkTransport::new()))
            .unwrap();
    }
    e
}

/// Registers device memory ("*": the engine finds its GPU from the pointer).
fn register_gpu(e: &TransferEngine, d: &DeviceBuffer, permission: Permission) {
    // SAFETY: `d` outlives its registration in every test (unregistered or dropped after the
    // engine is done with it).
    unsafe { e.register_memory(d.addr() as *mut u8, d.len(), "*", permission) }.unwrap();
}

fn run(e: &TransferEngine, r: TransferRequest) {
    let (state, error) = transfer_one(e, r, &SubmitOptions::default());
    assert_eq!(state, TransferState::Completed, "{error:?}");
}

#[test]
fn without_cuda_gpu_paths_are_clear_errors() {
    if te_cuda::driver().is_ok() {
        // A GPU machine: the transport installs and says what it moves.
        let e = engine(true);
        let caps = NvlinkTransport::new().capabilities();
        assert!(caps.contains(Capabilities::GPU_SAME_HOST));
        drop(e);
        return;
    }
    let e = engine(false);
    let err = e
        .install_transport(Arc::new(NvlinkTransport::new()))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("nvlink") && err.contains("libcuda"),
        "install names what is missing: {err}"
    );
    let host = Arc::new(HostBuffer::new(4096).unwrap());
    let err = e
        .register_buffer(&host, "cuda:0", Permission::RemoteReadWrite)
        .unwrap_err()
        .to_string();
    assert!(err.contains("GPU"), "{err}");
    assert!(
        !TcpTransport::new()
            .capabilities()
            .contains(Capabilities::GPU_REMOTE_HOST),
        "without CUDA, TCP stages no GPU memory"
    );
    assert!(DeviceBuffer::new(0, 16).is_err());
}

#[test]
#[ignore = "helper: started by the two-process tests as the owner"]
fn gpu_owner() {
    if std::env::var("TE_GPU_OWNER").is_err() {
        return;
    }
    let e = engine(true);
    // With MC_USE_FABRIC set (by the fabric test), a fabric allocation where the GPU has them.
    let d = NvlinkTransport::new().allocate(0, LEN).unwrap();
    d.write_at(0, &pattern(3, LEN)).unwrap();
    register_gpu(&e, &d, Permission::RemoteReadWrite);
    println!("READY {} {}", e.segment_name(), d.addr());
    let n = e
        .next_notify(Duration::from_secs(120))
        .map(|r| r.notification)
        .expect("the initiator's notification");
    let intact =
        n.notify_msg == "check" && d.to_vec(LEN / 2, LEN / 2).unwrap() == pattern(4, LEN / 2);
    std::process::exit(if intact { 0 } else { 3 });
}

fn request(
    opcode: Opcode,
    source: u64,
    seg: SegmentId,
    target: u64,
    len: usize,
) -> TransferRequest {
    TransferRequest {
        opcode,
        source,
        target_id: seg,
        target_offset: target,
        length: len as u64,
    }
}

/// READs the owner's first half and WRITEs its second half from another process, over the
/// handle the owner publishes (its name starts with `prefix`); the owner allocates under
/// `MC_USE_FABRIC` when `use_fabric`, and checks the second half after the notification.
fn between_two_processes(use_fabric: bool, prefix: &str) {
    let mut owner_cmd = Command::new(std::env::current_exe().unwrap());
    owner_cmd
        .args(self_test_args("gpu_owner"))
        .env("TE_GPU_OWNER", "1")
        .env("MC_USE_FABRIC", if use_fabric { "1" } else { "0" });
    let (mut owner, ready) = spawn_ready(&mut owner_cmd);
    let (name, remote) = ready.split_once(' ').unwrap();
    let remote: u64 = remote.parse().unwrap();
    let e = engine(true);
    let d = DeviceBuffer::new(0, LEN).unwrap();
    register_gpu(&e, &d, Permission::LocalOnly);
    let seg = e.open_segment(name).unwrap();
    assert!(
        e.segment(seg).unwrap().desc().buffers[0]
            .shm_name
            .as_deref()
            .is_some_and(|n| n.starts_with(prefix)),
        "published as {prefix}"
    );
    // READ the owner's first half, WRITE its second half.
    run(&e, request(Opcode::Read, d.addr(), seg, remote, LEN / 2));
    assert!(d.to_vec(0, LEN / 2).unwrap() == pattern(3, LEN)[..LEN / 2]);
    d.write_at(LEN / 2, &pattern(4, LEN / 2)).unwrap();
    run(
        &e,
        request(
            Opcode::Write,
            d.addr() + (LEN / 2) as u64,
            seg,
            remote + (LEN / 2) as u64,
            LEN / 2,
        ),
    );
    let tcp_bytes: u64 = e.nic_load_stats().iter().map(|s| s.bytes_done).sum();
    assert_eq!(tcp_bytes, 0, "NVLink/PCIe carried it, not TCP");
    e.send_notify(
        name,
        &te_core::Notification {
            name: "init".into(),
            notify_msg: "check".into(),
        },
    )
    .unwrap();
    assert!(owner.wait().unwrap().success(), "the owner found the bytes");
}

#[test]
#[ignore = "needs a GPU: cargo xtask gpu"]
fn gpu_ipc_between_two_processes() {
    between_two_processes(false, "cuda-ipc:");
}

#[test]
#[ignore = "needs a GPU: cargo xtask gpu"]
fn gpu_fabric_handles_between_two_processes() {
    let cuda = te_cuda::driver().unwrap();
    if !cuda.fabric_supported(0) {
        // Without fabric handles, MC_USE_FABRIC falls back to legacy IPC memory, and a fabric
        // allocation says why it cannot be made.
        let err = DeviceBuffer::new_fabric(0, LEN).unwrap_err().to_string();
        assert!(err.contains("fabric"), "{err}");
        eprintln!("GPU 0 has no fabric handles: checked the fallback to legacy IPC instead");
        between_two_processes(true, "cuda-ipc:");
        return;
    }
    let d = DeviceBuffer::new_fabric(0, LEN).unwrap();
    assert!(d.is_fabric() && d.len() >= LEN);
    between_two_processes(true, "cuda-fabric:");
}

#[test]
#[ignore = "needs a GPU: cargo xtask gpu"]
fn gpu_and_host_memory_in_one_process() {
    let e = engine(true);
    let d = DeviceBuffer::new(0, LEN).unwrap();
    register_gpu(&e, &d, Permission::RemoteReadWrite);
    let host = Arc::new(HostBuffer::new(LEN).unwrap());
    host.write_at(0, &pattern(5, LEN)).unwrap();
    e.register_buffer(&host, "*", Permission::LocalOnly)
        .unwrap();
    let own = e.open_segment(e.segment_name()).unwrap();
    run(&e, request(Opcode::Write, host.addr(), own, d.addr(), LEN));
    assert!(d.to_vec(0, LEN).unwrap() == pattern(5, LEN), "host → GPU");
    host.write_at(0, &vec![0; LEN]).unwrap();
    run(&e, request(Opcode::Read, host.addr(), own, d.addr(), LEN));
    assert!(
        host.to_vec(0, LEN).unwrap() == pattern(5, LEN),
        "GPU → host"
    );
}

#[test]
#[ignore = "needs a GPU: cargo xtask gpu"]
fn gpu_memory_over_tcp_is_staged_on_both_sides() {
    // TCP alone on both engines: the GPU bytes bounce through pinned host buffers.
    let target = engine(false);
    let td = DeviceBuffer::new(0, LEN).unwrap();
    td.write_at(0, &pattern(6, LEN)).unwrap();
    register_gpu(&target, &td, Permission::RemoteReadWrite);
    let init = engine(false);
    let d = DeviceBuffer::new(0, LEN).unwrap();
    register_gpu(&init, &d, Permission::LocalOnly);
    let seg = init.open_segment(target.segment_name()).unwrap();
    run(&init, request(Opcode::Read, d.addr(), seg, td.addr(), LEN));
    assert!(
        d.to_vec(0, LEN).unwrap() == pattern(6, LEN),
        "GPU → TCP → GPU (read)"
    );
    d.write_at(0, &pattern(7, LEN)).unwrap();
    run(&init, request(Opcode::Write, d.addr(), seg, td.addr(), LEN));
    assert!(
        td.to_vec(0, LEN).unwrap() == pattern(7, LEN),
        "GPU → TCP → GPU (write)"
    );
}
