//! File segments against real files on this machine's disk: byte-verified READ and WRITE across
//! sizes and alignments through io_uring (O_DIRECT where aligned, registered buffers) and
//! through buffered I/O; clear errors for bad offsets, a read-only segment written, a missing
//! file and a file cut short; and the automatic fallback to buffered I/O when a seccomp profile
//! forbids io_uring (in a helper process, so the filter stays there).

#![allow(unsafe_code)] // forbids io_uring with a seccomp filter (prctl), to test the fallback

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use te_core::transport::{Rejection, SliceError, Transport};
use te_core::{
    Config, Error, FileAccess, HostBuffer, Opcode, Permission, TransferEngine, TransferRequest,
    TransferState,
};
use te_testkit::{pattern, self_test_args, spawn_ready};
use te_uring::{BufIoTransport, FileOptions, UringTransport};

/// (length, file offset, offset in local memory)
const CASES: [(u64, u64, u64); 9] = [
    (1, 0, 0),
    (4095, 1, 7),
    (4096, 4096, 4096),
    (65536 + 17, 12345, 3),
    (1 << 20, 1 << 20, 0),
    (1 << 20, 4096, 1),
    ((3 << 20) + 123, 77, 4096),
    (4 << 20, 8 << 20, 8192),
    (200 << 10, (16 << 20) - (200 << 10), 0),
];
const FILE_LEN: u64 = 16 << 20;

fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("te-uring");
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(format!("{name}-{}", std::process::id()))
}

fn engine(transport: Arc<dyn Transport>) -> TransferEngine {
    let mut c = Config::default();
    c.tcp_bind_address = Some("127.0.0.1".parse().unwrap());
    let e = TransferEngine::init(c, "P2PHANDSHAKE", "127.0.0.1").unwrap();
    e.install_transport(transport).unwrap();
    e
}

fn run(e: &TransferEngine, reqs: &[TransferRequest]) -> (TransferState, Option<SliceError>) {
    let b = e.allocate_batch(reqs.len()).unwrap();
    e.submit(b, reqs).unwrap();
    let s = e.wait(b, Duration::from_secs(60)).unwrap();
    let err = (0..reqs.len()).find_map(|t| e.task_error(b, t).unwrap());
    e.free_batch(b).unwrap();
    (s.state, err)
}

/// WRITE every case from memory into a fresh file, check the file with std::fs, then READ every
/// case back into zeroed memory and compare.
fn round_trip(transport: Arc<dyn Transport>, tag: &str) {
    let e = engine(transport);
    let path = scratch(tag);
    std::fs::File::create(&path)
        .unwrap()
        .set_len(FILE_LEN)
        .unwrap();
    let seg = e.open_file_segment(&path, FileAccess::ReadWrite).unwrap();
    let mem = Arc::new(HostBuffer::new(16 << 20).unwrap());
    e.register_buffer(&mem, "cpu:0", Permission::LocalOnly)
        .unwrap();
    let mut expected = vec![0u8; FILE_LEN as usize];
    for (i, &(len, off, local)) in CASES.iter().enumerate() {
        let data = pattern(i as u64 + 1, len as usize);
        mem.write_at(local as usize, &data).unwrap();
        let r = TransferRequest {
            opcode: Opcode::Write,
            source: mem.addr() + local,
            target_id: seg,
            target_offset: off,
            length: len,
        };
        assert_eq!(
            run(&e, &[r]),
            (TransferState::Completed, None),
            "write case {i}"
        );
        expected[off as usize..(off + len) as usize].copy_from_slice(&data);
    }
    assert!(
        std::fs::read(&path).unwrap() == expected,
        "file holds every write"
    );

    let reads: Vec<TransferRequest> = CASES
        .iter()
        .map(|&(len, off, local)| TransferRequest {
            opcode: Opcode::Read,
            source: mem.addr() + local,
            target_id: seg,
            target_offset: off,
            length: len,
        })
        .collect();
    for (i, r) in reads.iter().enumerate() {
        mem.write_at(CASES[i].2 as usize, &vec![0u8; r.length as usize])
            .unwrap();
        assert_eq!(
            run(&e, &[*r]),
            (TransferState::Completed, None),
            "read case {i}"
        );
        let got = mem.to_vec(CASES[i].2 as usize, r.length as usize).unwrap();
        let want = &expected[r.target_offset as usize..(r.target_offset + r.length) as usize];
        assert!(got == want, "read case {i}: bytes differ");
    }
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn uring_round_trips_across_sizes_and_alignments() {
    let t = Arc::new(UringTransport::new(FileOptions::default()).expect("io_uring on this kernel"));
    round_trip(t.clone(), "uring");
    let c = t.counts();
    assert!(c.direct > 0, "aligned requests went O_DIRECT: {c:?}");
    assert!(c.buffered > 0, "unaligned requests went buffered: {c:?}");
    assert!(
        c.fixed > 0,
        "registered memory was used as fixed buffers: {c:?}"
    );
}

#[test]
fn uring_without_direct_io_round_trips() {
    let options = FileOptions {
        direct: false,
        depth: 4,
        ..FileOptions::default()
    };
    let t = Arc::new(UringTransport::new(options).unwrap());
    round_trip(t.clone(), "uring-buffered");
    assert_eq!(t.counts().direct, 0);
}

#[test]
fn bufio_round_trips_across_sizes_and_alignments() {
    let t = Arc::new(BufIoTransport::new(FileOptions::default()));
    round_trip(t.clone(), "bufio");
    let c = t.counts();
    assert!(c.buffered > 0 && c.direct == 0, "{c:?}");
}

/// An engine closed while a large READ from a file is queued: the close fails what no worker
/// took and returns only once the workers are gone, so the application may free its buffer at
/// once; nothing lands in it afterwards, and the task ends failed, naming the shutdown.
fn closed_mid_read(transport: Arc<dyn Transport>, tag: &str) {
    let len: usize = 256 << 20;
    let path = scratch(tag);
    std::fs::write(&path, vec![0xa5; len]).unwrap();
    let e = engine(transport);
    let seg = e.open_file_segment(&path, FileAccess::ReadOnly).unwrap();
    let mem = Arc::new(HostBuffer::new(len).unwrap());
    e.register_buffer(&mem, "cpu:0", Permission::LocalOnly)
        .unwrap();
    let r = TransferRequest {
        opcode: Opcode::Read,
        source: mem.addr(),
        target_id: seg,
        target_offset: 0,
        length: len as u64,
    };
    let b = e.allocate_batch(1).unwrap();
    e.submit(b, &[r]).unwrap();
    e.shutdown();
    te_testkit::assert_nothing_lands(&mem, len, "its engine was closed");
    let status = e.wait(b, Duration::from_secs(60)).unwrap();
    assert_eq!(status.state, TransferState::Failed, "{status:?}");
    assert!(status.transferred_bytes < len as u64, "{status:?}");
    match e.task_error(b, 0).unwrap() {
        Some(SliceError::Path(why)) => assert!(why.contains("shut down"), "{why}"),
        other => panic!("the task's error names the shutdown: {other:?}"),
    }
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn uring_closed_mid_read_writes_nothing_more() {
    let t = UringTransport::new(FileOptions::default()).expect("io_uring on this kernel");
    closed_mid_read(Arc::new(t), "uring-closed");
}

#[test]
fn bufio_closed_mid_read_writes_nothing_more() {
    closed_mid_read(
        Arc::new(BufIoTransport::new(FileOptions::default())),
        "bufio-closed",
    );
}

#[test]
fn many_tasks_in_one_batch_fill_the_ring() {
    let t = Arc::new(
        UringTransport::new(FileOptions {
            depth: 8,
            ..FileOptions::default()
        })
        .unwrap(),
    );
    let e = engine(t);
    let path = scratch("batch");
    let data = pattern(9, FILE_LEN as usize);
    std::fs::write(&path, &data).unwrap();
    let seg = e.open_file_segment(&path, FileAccess::ReadOnly).unwrap();
    let mem = Arc::new(HostBuffer::new(FILE_LEN as usize).unwrap());
    e.register_buffer(&mem, "cpu:0", Permission::LocalOnly)
        .unwrap();
    // 128 tasks of 128 KiB, in reverse file order: nothing coalesces across tasks by accident.
    let reqs: Vec<TransferRequest> = (0..128u64)
        .rev()
        .map(|i| TransferRequest {
            opcode: Opcode::Read,
            source: mem.addr() + i * (128 << 10),
            target_id: seg,
            target_offset: i * (128 << 10),
            length: 128 << 10,
        })
        .collect();
    assert_eq!(run(&e, &reqs), (TransferState::Completed, None));
    assert!(mem.to_vec(0, FILE_LEN as usize).unwrap() == data);
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn bad_file_segments_get_clear_errors() {
    let t = Arc::new(UringTransport::new(FileOptions::default()).unwrap());
    let e = engine(t);
    let mem = Arc::new(HostBuffer::new(1 << 20).unwrap());
    e.register_buffer(&mem, "cpu:0", Permission::LocalOnly)
        .unwrap();

    // A missing file.
    let missing = e.open_file_segment(&scratch("missing"), FileAccess::ReadOnly);
    assert!(
        matches!(&missing, Err(Error::InvalidArgument(m)) if m.contains("No such file")),
        "{missing:?}"
    );

    // An empty one and a directory.
    let empty = scratch("empty");
    std::fs::write(&empty, b"").unwrap();
    assert!(
        matches!(e.open_file_segment(&empty, FileAccess::ReadOnly), Err(Error::InvalidArgument(m)) if m.contains("empty"))
    );
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"));
    assert!(matches!(
        e.open_file_segment(dir, FileAccess::ReadOnly),
        Err(Error::InvalidArgument(_))
    ));

    let path = scratch("bad");
    std::fs::write(&path, pattern(3, 1 << 20)).unwrap();
    let seg = e.open_file_segment(&path, FileAccess::ReadOnly).unwrap();
    let req = |opcode, target_offset, length| TransferRequest {
        opcode,
        source: mem.addr(),
        target_id: seg,
        target_offset,
        length,
    };
    let b = e.allocate_batch(4).unwrap();
    // Out of range, straddling the end, and overflowing: refused at submit, nothing posted.
    for (off, len) in [(1 << 20, 1), ((1 << 20) - 10, 11), (u64::MAX - 3, 8)] {
        let err = e.submit(b, &[req(Opcode::Read, off, len)]).unwrap_err();
        assert!(
            matches!(
                err,
                Error::RemoteAddressNotRegistered { .. } | Error::InvalidArgument(_)
            ),
            "{err:?}"
        );
    }
    // Opened read-only, then written.
    let err = e.submit(b, &[req(Opcode::Write, 0, 4096)]).unwrap_err();
    assert!(
        matches!(
            &err,
            Error::PermissionDenied {
                operation: "write",
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("write"), "{err}");
    e.free_batch(b).unwrap();

    // A file cut short after opening: the transport's own check refuses the range.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(4096)
        .unwrap();
    let seg2 = e.open_file_segment(&path, FileAccess::ReadWrite).unwrap();
    assert_eq!(seg2, seg, "reopening keeps the id");
    // The segment now says 4096 bytes: a read past it is refused at submit.
    let b = e.allocate_batch(1).unwrap();
    assert!(e.submit(b, &[req(Opcode::Read, 8192, 4096)]).is_err());
    e.free_batch(b).unwrap();
    // Cut again behind the engine's back: the transport refuses, the task fails, nothing hangs.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(100)
        .unwrap();
    let other = scratch("other");
    std::fs::write(&other, pattern(4, 8192)).unwrap();
    let seg3 = e.open_file_segment(&other, FileAccess::ReadWrite).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&other)
        .unwrap()
        .set_len(100)
        .unwrap();
    let (state, err) = run(
        &e,
        &[TransferRequest {
            target_id: seg3,
            ..req(Opcode::Read, 4096, 4096)
        }],
    );
    assert_eq!(state, TransferState::Failed);
    assert_eq!(err, Some(SliceError::Rejected(Rejection::OutOfBounds)));
    // The engine keeps serving: a good read of the same segment works.
    let (state, _) = run(
        &e,
        &[TransferRequest {
            target_id: seg3,
            ..req(Opcode::Read, 0, 100)
        }],
    );
    assert_eq!(state, TransferState::Completed);
    assert_eq!(mem.to_vec(0, 100).unwrap(), pattern(4, 100));
    std::fs::remove_file(&path).unwrap();
    std::fs::remove_file(&other).unwrap();
}

#[test]
fn no_file_transport_means_a_clear_error() {
    let mut c = Config::default();
    c.tcp_bind_address = Some("127.0.0.1".parse().unwrap());
    let e = TransferEngine::init(c, "P2PHANDSHAKE", "127.0.0.1").unwrap();
    let path = scratch("nofile");
    std::fs::write(&path, b"abc").unwrap();
    let err = e
        .open_file_segment(&path, FileAccess::ReadOnly)
        .unwrap_err();
    assert!(
        matches!(&err, Error::NotSupportedTransport(m) if m.contains("file")),
        "{err:?}"
    );
    std::fs::remove_file(&path).unwrap();
}

/// Forbids `io_uring_setup` for this thread and the threads it starts, as a container's seccomp
/// profile does.
fn forbid_io_uring() {
    let filter = [
        // A = syscall number
        libc::sock_filter {
            code: (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16,
            jt: 0,
            jf: 0,
            k: 0,
        },
        libc::sock_filter {
            code: (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16,
            jt: 0,
            jf: 1,
            k: libc::SYS_io_uring_setup as u32,
        },
        libc::sock_filter {
            code: (libc::BPF_RET | libc::BPF_K) as u16,
            jt: 0,
            jf: 0,
            k: libc::SECCOMP_RET_ERRNO | libc::EPERM as u32,
        },
        libc::sock_filter {
            code: (libc::BPF_RET | libc::BPF_K) as u16,
            jt: 0,
            jf: 0,
            k: libc::SECCOMP_RET_ALLOW,
        },
    ];
    let prog = libc::sock_fprog {
        len: filter.len() as u16,
        filter: filter.as_ptr() as *mut _,
    };
    // SAFETY: plain prctl calls; `prog` and `filter` outlive them (the kernel copies the filter).
    unsafe {
        assert_eq!(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), 0);
        assert_eq!(
            libc::prctl(
                libc::PR_SET_SECCOMP,
                libc::SECCOMP_MODE_FILTER,
                &prog as *const _
            ),
            0
        );
    }
}

#[test]
#[ignore = "helper: started by seccomp_without_io_uring_falls_back_to_buffered_io"]
fn under_seccomp() {
    let Ok(path) = std::env::var("TE_URING_SECCOMP_FILE") else {
        return;
    };
    forbid_io_uring();
    let probe = te_uring::probe();
    let transport = te_uring::file_transport(FileOptions::default());
    let e = engine(transport);
    let seg = e
        .open_file_segment(Path::new(&path), FileAccess::ReadWrite)
        .unwrap();
    let mem = Arc::new(HostBuffer::new(1 << 20).unwrap());
    e.register_buffer(&mem, "cpu:0", Permission::LocalOnly)
        .unwrap();
    let r = TransferRequest {
        opcode: Opcode::Read,
        source: mem.addr(),
        target_id: seg,
        target_offset: 0,
        length: 1 << 20,
    };
    let (state, _) = run(&e, &[r]);
    let ok =
        state == TransferState::Completed && mem.to_vec(0, 1 << 20).unwrap() == pattern(5, 1 << 20);
    let names: Vec<&str> = e.transport_capabilities().iter().map(|(n, _)| *n).collect();
    println!(
        "READY probe={} transport={} verified={ok}",
        probe.is_ok(),
        names.join(",")
    );
    // Leave before the harness writes to a pipe the parent stopped reading.
    std::process::exit(0);
}

#[test]
fn seccomp_without_io_uring_falls_back_to_buffered_io() {
    let path = scratch("seccomp");
    std::fs::write(&path, pattern(5, 1 << 20)).unwrap();
    let (mut child, ready) = spawn_ready(
        Command::new(std::env::current_exe().unwrap())
            .args(self_test_args("under_seccomp"))
            .env("TE_URING_SECCOMP_FILE", &path),
    );
    assert_eq!(ready, "probe=false transport=bufio verified=true");
    assert!(child.wait().unwrap().success());
    // Outside the filter this process still gets io_uring.
    assert!(te_uring::probe().is_ok());
    std::fs::remove_file(&path).unwrap();
}
