//! te-shm between two OS processes on this host: byte-verified READ and WRITE across sizes and
//! alignments through shared memory (not TCP), owner-only files, and clear errors for bad
//! offsets and an owner that exited. The test binary re-runs itself as the owner process.

use std::os::unix::fs::PermissionsExt;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use te_core::{
    Config, Error, HostBuffer, Opcode, Permission, TransferEngine, TransferRequest, TransferState,
};
use te_shm::ShmTransport;
use te_tcp::TcpTransport;
use te_testkit::{SizeSweep, self_test_args, spawn_ready};

const SIZES: [usize; 6] = [1, 4095, 65536, 65537, 1 << 20, 64 << 20];
const LEN: usize = 160 << 20;
const WRITE_BASE: usize = 72 << 20;
const READ_SEED: u64 = 31;

const SWEEP: SizeSweep = SizeSweep {
    sizes: &SIZES,
    write_base: WRITE_BASE,
    read_seed: READ_SEED,
};

/// An engine with TCP (for the control path and other hosts) and shared memory.
fn engine() -> (TransferEngine, Arc<ShmTransport>) {
    let mut c = Config::default();
    c.tcp_bind_address = Some("127.0.0.1".parse().unwrap());
    let e = TransferEngine::init(c, "P2PHANDSHAKE", "127.0.0.1").unwrap();
    e.install_transport(Arc::new(TcpTransport::new())).unwrap();
    let shm = Arc::new(ShmTransport::default());
    e.install_transport(shm.clone()).unwrap();
    (e, shm)
}

fn run(e: &TransferEngine, r: TransferRequest) -> TransferState {
    let b = e.allocate_batch(1).unwrap();
    e.submit(b, &[r]).unwrap();
    let s = e.wait(b, Duration::from_secs(60)).unwrap();
    e.free_batch(b).unwrap();
    s.state
}

#[test]
#[ignore = "helper: started by shared_memory_between_two_processes as the owner"]
fn shm_owner() {
    if std::env::var("TE_SHM_OWNER").is_err() {
        return;
    }
    let (e, shm) = engine();
    let buf = shm.allocate(LEN).unwrap();
    buf.write_at(0, &SWEEP.read_area()).unwrap();
    e.register_buffer(&buf, "*", Permission::RemoteReadWrite)
        .unwrap();
    println!("READY {} {}", e.segment_name(), buf.addr());
    let n = e
        .next_notify(Duration::from_secs(120))
        .map(|r| r.notification)
        .expect("verify request");
    assert_eq!(n.notify_msg, "verify");
    let intact = SWEEP.writes_landed(&buf);
    // A clean exit: unregister and drop, so the shared file is removed.
    e.unregister_memory(buf.addr()).unwrap();
    drop(buf);
    drop(e);
    std::process::exit(if intact { 0 } else { 3 });
}

#[test]
fn shared_memory_between_two_processes() {
    let (mut owner, ready) = spawn_ready(
        Command::new(std::env::current_exe().unwrap())
            .args(self_test_args("shm_owner"))
            .env("TE_SHM_OWNER", "1"),
    );
    let (name, remote) = ready.split_once(' ').unwrap();
    let remote: u64 = remote.parse().unwrap();

    let (e, _shm) = engine();
    let local = Arc::new(HostBuffer::new(LEN).unwrap());
    e.register_buffer(&local, "*", Permission::LocalOnly)
        .unwrap();
    let seg = e.open_segment(name).unwrap();
    let desc = e.segment(seg).unwrap();
    assert!(desc.same_host());
    let path = desc.desc().buffers[0]
        .shm_name
        .clone()
        .expect("published as shared memory");
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "{path} is owner-only");
    assert!(
        !path.contains(name),
        "the file name does not derive from the segment name"
    );

    SWEEP.run(&e, seg, &local, remote);
    // Shared memory carried it all: the TCP rail moved nothing.
    let tcp_bytes: u64 = e.nic_load_stats().iter().map(|s| s.bytes_done).sum();
    assert_eq!(tcp_bytes, 0, "no byte went through TCP");

    // A range past the end of the owner's buffer is refused before anything moves.
    let bad = TransferRequest {
        opcode: Opcode::Write,
        source: local.addr(),
        target_id: seg,
        target_offset: remote + LEN as u64 - 8,
        length: 16,
    };
    let b = e.allocate_batch(1).unwrap();
    assert!(matches!(
        e.submit(b, &[bad]),
        Err(Error::RemoteAddressNotRegistered { .. })
    ));
    e.free_batch(b).unwrap();

    e.send_notify(
        name,
        &te_core::Notification {
            name: "t".into(),
            notify_msg: "verify".into(),
        },
    )
    .unwrap();
    assert!(
        owner.wait().unwrap().success(),
        "the owner found its memory wrong"
    );
    assert!(
        !std::path::Path::new(&path).exists(),
        "the owner removed its file on exit"
    );

    // The owner has exited: a transfer fails cleanly (nothing lands in dead memory), and
    // re-opening says why.
    let w = TransferRequest {
        opcode: Opcode::Write,
        source: local.addr(),
        target_id: seg,
        target_offset: remote,
        length: 4096,
    };
    assert_eq!(run(&e, w), TransferState::Failed);
    assert!(matches!(e.open_segment(name), Err(Error::Metadata(_))));
}

#[test]
#[ignore = "helper: started by a_crashed_owner_leaves_nothing_behind"]
fn shm_crasher() {
    if std::env::var("TE_SHM_CRASHER").is_err() {
        return;
    }
    let shm = ShmTransport::default();
    let buf = shm.allocate(1 << 20).unwrap();
    println!("READY {}", buf.shared_path().unwrap().display());
    // Die without dropping anything, as a crash would.
    std::process::exit(0);
}

#[test]
fn a_crashed_owner_leaves_nothing_behind() {
    let (mut child, path) = spawn_ready(
        Command::new(std::env::current_exe().unwrap())
            .args(self_test_args("shm_crasher"))
            .env("TE_SHM_CRASHER", "1"),
    );
    assert!(child.wait().unwrap().success());
    let orphan = std::path::PathBuf::from(path);
    assert!(orphan.exists(), "the crashed process left its file");
    // A live buffer of this process is kept, whatever its age.
    let live = ShmTransport::default().allocate(4096).unwrap();
    std::thread::sleep(Duration::from_millis(1100));
    let dir = std::path::Path::new("/dev/shm");
    assert!(HostBuffer::reap_orphans(dir, Duration::from_secs(1)) >= 1);
    assert!(!orphan.exists(), "the orphan was removed");
    assert!(
        live.shared_path().unwrap().exists(),
        "a live buffer's file stays"
    );
}

/// An engine closed while shared-memory copies are queued: the close fails what is queued and
/// returns only once no copy is under way, so the application may free its buffer at once;
/// nothing lands in it afterwards, and the task ends failed, naming the shutdown.
#[test]
fn a_closed_engine_copies_nothing_more_into_its_memory() {
    let len = 512 << 20;
    let (owner, shm) = engine();
    let shared = shm.allocate(len).unwrap();
    shared.write_at(0, &vec![0xa5; len]).unwrap();
    owner
        .register_buffer(&shared, "*", Permission::RemoteReadWrite)
        .unwrap();
    let (e, _shm) = engine();
    let local = Arc::new(HostBuffer::new(len).unwrap());
    e.register_buffer(&local, "*", Permission::LocalOnly)
        .unwrap();
    let seg = e.open_segment(owner.segment_name()).unwrap();
    assert!(e.segment(seg).unwrap().same_host());
    let r = TransferRequest {
        opcode: Opcode::Read,
        source: local.addr(),
        target_id: seg,
        target_offset: shared.addr(),
        length: len as u64,
    };
    let b = e.allocate_batch(1).unwrap();
    e.submit(b, &[r]).unwrap();
    // 512 copies of 1 MiB, dealt to the workers: most are still queued here.
    e.shutdown();
    te_testkit::assert_nothing_lands(&local, len, "its engine was closed");
    let status = e.wait(b, Duration::from_secs(60)).unwrap();
    assert_eq!(status.state, TransferState::Failed, "{status:?}");
    assert!(status.transferred_bytes < len as u64, "{status:?}");
    match e.task_error(b, 0).unwrap() {
        Some(te_core::transport::SliceError::Path(why)) => {
            assert!(why.contains("shut down"), "{why}")
        }
        other => panic!("the task's error names the shutdown: {other:?}"),
    }
}
