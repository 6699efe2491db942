//! te-cxl between two OS processes mapping one device (a file standing in for a DAX device):
//! byte-verified READ and WRITE across sizes and alignments straight through the device (not
//! TCP), a read-only buffer refused a WRITE, ranges past a buffer refused, a missing device path
//! named, and an owner that exited refused. The test binary re-runs itself as the owner.

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use te_core::{
    Config, Error, HostBuffer, Notification, Opcode, Permission, TransferEngine, TransferRequest,
    TransferState,
};
use te_cxl::CxlTransport;
use te_tcp::TcpTransport;
use te_testkit::{SizeSweep, self_test_args, spawn_ready};

const SIZES: [usize; 6] = [1, 4095, 65536, 65537, 1 << 20, 4 << 20];
const LEN: usize = 24 << 20;
const WRITE_BASE: usize = 12 << 20;
const READ_SEED: u64 = 41;

const SWEEP: SizeSweep = SizeSweep {
    sizes: &SIZES,
    write_base: WRITE_BASE,
    read_seed: READ_SEED,
};

fn device_path() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("te-cxl-device")
}

fn config(device: &std::path::Path) -> Config {
    let mut c = Config::default();
    c.tcp_bind_address = Some("127.0.0.1".parse().unwrap());
    c.cxl_dev_path = Some(device.to_path_buf());
    c
}

/// An engine with TCP (control path, other hosts) and the CXL device.
fn engine(device: &std::path::Path) -> (TransferEngine, Arc<CxlTransport>) {
    let c = config(device);
    let cxl = Arc::new(CxlTransport::open(&c).unwrap());
    let e = TransferEngine::init(c, "P2PHANDSHAKE", "127.0.0.1").unwrap();
    e.install_transport(Arc::new(TcpTransport::new())).unwrap();
    e.install_transport(cxl.clone()).unwrap();
    (e, cxl)
}

#[test]
#[ignore = "helper: started by cxl_between_two_processes as the owner"]
fn cxl_owner() {
    let Ok(device) = std::env::var("TE_CXL_OWNER") else {
        return;
    };
    let (e, cxl) = engine(std::path::Path::new(&device));
    let buf = cxl.allocate(LEN).unwrap();
    buf.write_at(0, &SWEEP.read_area()).unwrap();
    e.register_buffer(&buf, "*", Permission::RemoteReadWrite)
        .unwrap();
    let ro = cxl.allocate(1 << 20).unwrap();
    e.register_buffer(&ro, "*", Permission::RemoteRead).unwrap();
    println!("READY {} {} {}", e.segment_name(), buf.addr(), ro.addr());
    let n = e
        .next_notify(Duration::from_secs(120))
        .map(|r| r.notification)
        .expect("verify request");
    assert_eq!(n.notify_msg, "verify");
    let intact = SWEEP.writes_landed(&buf);
    let untouched = ro.to_vec(0, 1 << 20).unwrap().iter().all(|&b| b == 0);
    std::process::exit(if intact && untouched { 0 } else { 3 });
}

#[test]
fn cxl_between_two_processes() {
    let device = device_path();
    std::fs::File::create(&device)
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
    let (mut owner, ready) = spawn_ready(
        Command::new(std::env::current_exe().unwrap())
            .args(self_test_args("cxl_owner"))
            .env("TE_CXL_OWNER", &device),
    );
    let mut words = ready.split(' ');
    let name = words.next().unwrap().to_string();
    let remote: u64 = words.next().unwrap().parse().unwrap();
    let read_only: u64 = words.next().unwrap().parse().unwrap();

    let (e, cxl) = engine(&device);
    let local = Arc::new(HostBuffer::new(LEN).unwrap());
    e.register_buffer(&local, "*", Permission::LocalOnly)
        .unwrap();
    let seg = e.open_segment(&name).unwrap();
    let desc = e.segment(seg).unwrap();
    assert_eq!(
        desc.desc().te_cxl_device.as_deref(),
        Some(cxl.device().id()),
        "same device"
    );
    assert!(desc.desc().buffers.iter().all(|b| b.cxl_offset.is_some()));

    SWEEP.run(&e, seg, &local, remote);
    let tcp_bytes: u64 = e.nic_load_stats().iter().map(|s| s.bytes_done).sum();
    assert_eq!(tcp_bytes, 0, "no byte went through TCP");

    // A WRITE to the read-only buffer, and a range past the end, are refused before anything
    // moves.
    let b = e.allocate_batch(1).unwrap();
    let write_ro = TransferRequest {
        opcode: Opcode::Write,
        source: local.addr(),
        target_id: seg,
        target_offset: read_only,
        length: 4096,
    };
    assert!(matches!(
        e.submit(b, &[write_ro]),
        Err(Error::PermissionDenied { .. })
    ));
    let past = TransferRequest {
        target_offset: remote + LEN as u64 - 8,
        length: 16,
        ..write_ro
    };
    assert!(matches!(
        e.submit(b, &[past]),
        Err(Error::RemoteAddressNotRegistered { .. })
    ));
    e.free_batch(b).unwrap();
    // The range past the end had the descriptor fetched again: the device is chosen for the
    // fresh one while its (proven) owner runs and maps the device.
    let read = TransferRequest {
        opcode: Opcode::Read,
        ..write_ro
    };
    let b = e.allocate_batch(1).unwrap();
    e.submit(
        b,
        &[TransferRequest {
            target_offset: remote,
            ..read
        }],
    )
    .unwrap();
    assert_eq!(
        e.wait(b, Duration::from_secs(10)).unwrap().state,
        TransferState::Completed
    );
    e.free_batch(b).unwrap();

    e.send_notify(
        &name,
        &Notification {
            name: "t".into(),
            notify_msg: "verify".into(),
        },
    )
    .unwrap();
    assert!(
        owner.wait().unwrap().success(),
        "the owner found its memory wrong"
    );

    // The owner has exited: its device memory is still mapped here, but nothing is written for
    // a dead process.
    let w = TransferRequest {
        opcode: Opcode::Write,
        source: local.addr(),
        target_id: seg,
        target_offset: remote,
        length: 4096,
    };
    let b = e.allocate_batch(1).unwrap();
    e.submit(b, &[w]).unwrap();
    let status = e.wait(b, Duration::from_secs(10)).unwrap();
    assert_eq!(status.state, TransferState::Failed);
    let err = e.task_error(b, 0).unwrap().unwrap();
    assert!(err.to_string().contains("has exited"), "{err}");
    e.free_batch(b).unwrap();
    // The descriptor is distrusted now; re-opening says the peer is gone.
    assert!(matches!(e.open_segment(&name), Err(Error::Metadata(_))));
}

#[test]
fn a_missing_device_is_named() {
    let c = config(std::path::Path::new("/dev/dax-te-absent.0"));
    let err = CxlTransport::open(&c).unwrap_err();
    assert!(
        matches!(
            &err,
            Error::Transport {
                transport: "cxl",
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("/dev/dax-te-absent.0"), "{err}");
    assert!(err.to_string().contains("No such file"), "{err}");
    let mut unset = Config::default();
    unset.cxl_dev_path = None;
    assert!(
        matches!(CxlTransport::open(&unset), Err(Error::InvalidConfig { name, .. }) if name == "MC_CXL_DEV_PATH")
    );
}

/// A victim on the device: a read-only buffer of device memory full of 0x5a, registered and
/// published; told on stdin, exits 0 when it is intact.
#[test]
#[ignore = "helper: started by a_peer_that_does_not_map_the_device_cannot_name_its_ranges"]
fn cxl_victim() {
    let Ok(device) = std::env::var("TE_CXL_VICTIM") else {
        return;
    };
    let (e, cxl) = engine(std::path::Path::new(&device));
    let buf = cxl.allocate(1 << 20).unwrap();
    buf.write_at(0, &vec![0x5a; 1 << 20]).unwrap();
    e.register_buffer(&buf, "*", Permission::RemoteRead)
        .unwrap();
    let ready = format!("{} {}", e.segment_name(), buf.addr());
    te_testkit::victim_until_checked(&ready, &[&buf], 0x5a);
}

/// A forger that names the victim's device ranges as its own, read-write.
#[test]
#[ignore = "helper: started by a_peer_that_does_not_map_the_device_cannot_name_its_ranges"]
fn cxl_forger() {
    let Ok(from) = std::env::var("TE_CXL_FORGE") else {
        return;
    };
    let how = te_testkit::forger::Forgery {
        claim_self: true,
        widen: true,
    };
    te_testkit::forger::serve_forged(&from, "127.0.0.1:0", how);
}

/// A peer proven to be the process that served its descriptor, but that does not map the
/// device, names another engine's device ranges (read-write, where they were published
/// read-only): its offsets are not used, and the victim's device memory stays as it was.
#[test]
fn a_peer_that_does_not_map_the_device_cannot_name_its_ranges() {
    use std::io::Write;
    let device = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("te-cxl-device-victim");
    std::fs::File::create(&device)
        .unwrap()
        .set_len(16 << 20)
        .unwrap();
    let (mut victim, ready) = spawn_ready(
        Command::new(std::env::current_exe().unwrap())
            .args(self_test_args("cxl_victim"))
            .env("TE_CXL_VICTIM", &device)
            .stdin(std::process::Stdio::piped()),
    );
    let (name, addr) = ready.split_once(' ').unwrap();
    let addr: u64 = addr.parse().unwrap();
    let (forger, forged) = spawn_ready(
        Command::new(std::env::current_exe().unwrap())
            .args(self_test_args("cxl_forger"))
            .env("TE_CXL_FORGE", name),
    );
    let forger = te_testkit::Killed(forger);
    let (e, cxl) = engine(&device);
    let local = Arc::new(HostBuffer::new(1 << 20).unwrap());
    local.write_at(0, &vec![0xee; 1 << 20]).unwrap();
    e.register_buffer(&local, "*", Permission::LocalOnly)
        .unwrap();
    let seg = e.open_segment(&forged).unwrap();
    let desc = e.segment(seg).unwrap();
    assert!(desc.same_host(), "the forger proved the descriptor its own");
    assert_eq!(
        desc.desc().te_cxl_device.as_deref(),
        Some(cxl.device().id())
    );
    te_testkit::assert_neither_way(&e, &local, seg, addr);
    drop(forger);
    victim.stdin.take().unwrap().write_all(b"check\n").unwrap();
    assert!(
        victim.wait().unwrap().success(),
        "the victim's device memory was written"
    );
}
