//! Cross-memory attach between two OS processes on this host, for memory each process
//! allocated itself: byte-verified READ and WRITE across sizes and alignments with nothing
//! through TCP; a peer that exited fails the transfer cleanly; and a process the kernel does
//! not let attach (another user's) reaches the same memory over TCP instead. The test binary
//! re-runs itself as the other process.

use std::os::unix::process::CommandExt;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use te_core::{
    Config, HostBuffer, Opcode, Permission, SegmentId, SubmitOptions, TransferEngine,
    TransferRequest, TransferState,
};
use te_shm::CmaTransport;
use te_tcp::TcpTransport;
use te_testkit::{Killed, SizeSweep, self_test_args, spawn_ready, transfer_one};

const SIZES: [usize; 6] = [1, 4095, 65536, 65537, 1 << 20, 16 << 20];
const LEN: usize = 48 << 20;
const WRITE_BASE: usize = 20 << 20;
const READ_SEED: u64 = 41;

const SWEEP: SizeSweep = SizeSweep {
    sizes: &SIZES,
    write_base: WRITE_BASE,
    read_seed: READ_SEED,
};

/// An engine with TCP (the control path, the fallback) and cross-memory attach.
fn engine() -> TransferEngine {
    let mut c = Config::default();
    c.tcp_bind_address = Some("127.0.0.1".parse().unwrap());
    let e = TransferEngine::init(c, "P2PHANDSHAKE", "127.0.0.1").unwrap();
    e.install_transport(Arc::new(TcpTransport::new())).unwrap();
    e.install_transport(Arc::new(CmaTransport::new())).unwrap();
    e
}

/// The initiator's side against the owner that printed `ready` (`<segment> <address>`): an
/// engine, a registered buffer of `LEN` bytes, the owner's segment opened; and the address.
fn initiator(ready: &str) -> (TransferEngine, Arc<HostBuffer>, SegmentId, u64) {
    let (name, remote) = ready.split_once(' ').unwrap();
    let e = engine();
    let local = Arc::new(HostBuffer::new(LEN).unwrap());
    e.register_buffer(&local, "*", Permission::LocalOnly)
        .unwrap();
    let seg = e.open_segment(name).unwrap();
    (e, local, seg, remote.parse().unwrap())
}

fn tcp_bytes(e: &TransferEngine) -> u64 {
    e.nic_load_stats().iter().map(|s| s.bytes_done).sum()
}

/// Serves a heap buffer (not shared memory) holding the read area, until told to check it.
#[test]
#[ignore = "helper: started by the tests below as the owner"]
fn cma_owner() {
    if std::env::var("TE_CMA_OWNER").is_err() {
        return;
    }
    let e = engine();
    let buf = Arc::new(HostBuffer::new(LEN).unwrap());
    assert!(buf.shared_path().is_none(), "ordinary memory");
    buf.write_at(0, &SWEEP.read_area()).unwrap();
    e.register_buffer(&buf, "*", Permission::RemoteReadWrite)
        .unwrap();
    println!("READY {} {}", e.segment_name(), buf.addr());
    let n = e
        .next_notify(Duration::from_secs(120))
        .map(|r| r.notification)
        .expect("verify request");
    assert_eq!(n.notify_msg, "verify");
    std::process::exit(if SWEEP.writes_landed(&buf) { 0 } else { 3 });
}

fn verify(e: &TransferEngine, name: &str) {
    let verify = te_core::Notification {
        name: "t".into(),
        notify_msg: "verify".into(),
    };
    e.send_notify(name, &verify).unwrap();
}

#[test]
fn cross_memory_attach_between_two_processes() {
    let (mut owner, ready) = spawn_ready(
        Command::new(std::env::current_exe().unwrap())
            .args(self_test_args("cma_owner"))
            .env("TE_CMA_OWNER", "1"),
    );
    let (e, local, seg, remote) = initiator(&ready);
    let name = ready.split_once(' ').unwrap().0;
    let desc = e.segment(seg).unwrap();
    assert!(desc.same_host());
    assert!(
        desc.desc().buffers[0].shm_name.is_none(),
        "not shared memory"
    );

    SWEEP.run(&e, seg, &local, remote);
    assert_eq!(tcp_bytes(&e), 0, "no byte went through TCP");

    verify(&e, name);
    assert!(
        owner.wait().unwrap().success(),
        "the owner found its memory wrong"
    );

    // The owner has exited: a transfer fails, and nothing is written anywhere.
    let w = TransferRequest {
        opcode: Opcode::Write,
        source: local.addr(),
        target_id: seg,
        target_offset: remote,
        length: 4096,
    };
    let (state, _) = transfer_one(&e, w, &SubmitOptions::default());
    assert_eq!(state, TransferState::Failed);
}

/// The initiator of [`another_users_process_is_reached_over_tcp`], as user `nobody`.
#[test]
#[ignore = "helper: started by another_users_process_is_reached_over_tcp"]
fn cma_stranger() {
    let Ok(target) = std::env::var("TE_CMA_STRANGER") else {
        return;
    };
    let (e, local, seg, remote) = initiator(&target);
    SWEEP.run(&e, seg, &local, remote);
    assert!(tcp_bytes(&e) > 0, "the refused attach fell back to TCP");
    verify(&e, target.split_once(' ').unwrap().0);
    println!("STRANGER DONE");
}

#[test]
fn another_users_process_is_reached_over_tcp() {
    use std::os::unix::fs::MetadataExt;
    let root = std::fs::metadata("/proc/self").unwrap().uid() == 0;
    if !root {
        // Only root can start a process as another user; the refusal's wording is unit-tested.
        eprintln!("skipped: not root");
        return;
    }
    let (mut owner, ready) = spawn_ready(
        Command::new(std::env::current_exe().unwrap())
            .args(self_test_args("cma_owner"))
            .env("TE_CMA_OWNER", "1"),
    );
    let out = Command::new(std::env::current_exe().unwrap())
        .args(self_test_args("cma_stranger"))
        .env("TE_CMA_STRANGER", &ready)
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && text.contains("STRANGER DONE"),
        "{text}"
    );
    assert!(
        owner.wait().unwrap().success(),
        "the owner found its memory wrong"
    );
}

/// A process of this user with memory at a known address: what a forged descriptor aims at.
#[test]
#[ignore = "helper: started by a_forged_descriptor_cannot_aim_copies_at_another_process"]
fn cma_victim() {
    if std::env::var("TE_CMA_VICTIM").is_err() {
        return;
    }
    let e = engine();
    let buf = Arc::new(HostBuffer::new(1 << 20).unwrap());
    buf.write_at(0, &vec![0x5a; 1 << 20]).unwrap();
    e.register_buffer(&buf, "*", Permission::RemoteReadWrite)
        .unwrap();
    let me = te_core::segment::process_identity(std::process::id()).unwrap();
    te_testkit::victim_until_checked(&format!("{me} {}", buf.addr()), &[&buf], 0x5a);
}

/// A peer serving, from its own listener, a descriptor that names the victim's process and
/// memory, with a rail nobody listens on.
#[test]
#[ignore = "helper: started by a_forged_descriptor_cannot_aim_copies_at_another_process"]
fn cma_forger() {
    use te_core::control::frame::{FrameType, read_frame, write_frame};
    let Ok(victim) = std::env::var("TE_CMA_FORGER") else {
        return;
    };
    let (owner, addr) = victim.split_once(' ').unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead_port = dead.local_addr().unwrap().port();
    drop(dead);
    let desc = format!(
        r#"{{"name":"127.0.0.1:{port}","protocol":"tcp","buffers":[{{"name":"cpu:0","addr":{addr},"length":1048576,"permission":"remote_read_write"}}],"te_rails":[{{"name":"lo","ip":"127.0.0.1","port":{dead_port}}}],"te_secret":"00112233445566778899aabbccddeeff","te_wire_version":2,"te_host_id":{host:?},"te_owner":{owner:?}}}"#,
        host = te_core::segment::host_id(),
    );
    println!("READY 127.0.0.1:{port}");
    for stream in listener.incoming() {
        let Ok(mut s) = stream else { continue };
        let mut r = s.try_clone().unwrap();
        while read_frame(&mut r, 1 << 20).is_ok() {
            if write_frame(&mut s, FrameType::Metadata, desc.as_bytes()).is_err() {
                break;
            }
        }
    }
}

#[test]
fn a_forged_descriptor_cannot_aim_copies_at_another_process() {
    let (mut victim, ready) = spawn_ready(
        Command::new(std::env::current_exe().unwrap())
            .args(self_test_args("cma_victim"))
            .env("TE_CMA_VICTIM", "1")
            .stdin(std::process::Stdio::piped()),
    );
    let (forger, name) = spawn_ready(
        Command::new(std::env::current_exe().unwrap())
            .args(self_test_args("cma_forger"))
            .env("TE_CMA_FORGER", &ready),
    );
    // Killed however the test ends: it serves until then.
    let forger = Killed(forger);
    let (_, addr) = ready.split_once(' ').unwrap();
    let addr: u64 = addr.parse().unwrap();
    let e = engine();
    let local = Arc::new(HostBuffer::new(1 << 20).unwrap());
    local.write_at(0, &vec![0xee; 1 << 20]).unwrap();
    e.register_buffer(&local, "*", Permission::LocalOnly)
        .unwrap();
    let seg = e.open_segment(&name).expect("a well-formed descriptor");
    let desc = e.segment(seg).unwrap();
    assert_eq!(
        desc.desc().te_owner,
        te_core::segment::process_identity(victim.id()),
        "it names the live victim"
    );
    assert!(
        !desc.same_host(),
        "but the forger served it: the victim's process is not proven its owner"
    );
    te_testkit::assert_neither_way(&e, &local, seg, addr);
    drop(forger);
    use std::io::Write;
    victim.stdin.take().unwrap().write_all(b"check\n").unwrap();
    assert!(
        victim.wait().unwrap().success(),
        "the victim's memory was written"
    );
}
