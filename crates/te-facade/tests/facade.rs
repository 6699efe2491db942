//! The facade between two real engines in one process, peer to peer over loopback TCP: bytes
//! compared after every transfer, Mooncake's codes checked for every refusal.

#![allow(unsafe_code)] // registers test buffers by address, as the bindings' callers do

use std::sync::Arc;

use te_core::HostBuffer;
use te_facade::{BatchProgress, FacadeError, MooncakeEngine, Notification, Opcode};
use te_testkit::{assert_same_bytes, pattern};

const LEN: usize = 4 << 20;

/// An initialized engine with one registered buffer of `LEN` bytes filled with `seed`'s pattern.
fn engine(seed: u64) -> (MooncakeEngine, Arc<HostBuffer>) {
    let e = MooncakeEngine::new();
    e.initialize("127.0.0.1:12345", "P2PHANDSHAKE", "tcp", "")
        .expect("initialize");
    let buf = Arc::new(HostBuffer::new(LEN).unwrap());
    buf.write_at(0, &pattern(seed, LEN)).unwrap();
    // SAFETY: `buf` outlives the engine in every test (both are dropped at the test's end, the
    // engine first, as it is declared first in the tuple's use).
    unsafe {
        e.register(buf.addr(), LEN as u64, "cpu:0")
            .expect("register")
    };
    (e, buf)
}

#[test]
fn calls_before_initialize_are_errors_not_crashes() {
    let e = MooncakeEngine::new();
    assert!(matches!(e.rpc_port(), Err(FacadeError::NotInitialized)));
    let err = e
        .transfer_sync("127.0.0.1:1", Opcode::Write, (&[1], &[1], &[1]), None)
        .unwrap_err();
    assert_eq!(err.code(), -1);
    assert!(matches!(e.check(7), Err(FacadeError::NotInitialized)));
    assert!(matches!(
        e.take_notifies(),
        Err(FacadeError::NotInitialized)
    ));
    // SAFETY: refused before any memory is touched.
    let reg = unsafe { e.register(0x1000, 4096, "*") };
    assert!(matches!(reg, Err(FacadeError::NotInitialized)));
    e.close();
    e.close();
}

#[test]
fn p2p_name_ignores_the_given_port() {
    let (e, _buf) = engine(1);
    let name = e.session_name().unwrap();
    let port = e.rpc_port().unwrap();
    assert_eq!(name, format!("127.0.0.1:{port}"));
    assert_ne!(port, 12345);
}

#[test]
fn sync_write_and_read_land_every_byte() {
    let (a, abuf) = engine(1);
    let (b, bbuf) = engine(2);
    let peer = b.session_name().unwrap();
    let (src, dst) = (abuf.addr(), bbuf.addr());
    // Three pieces at different offsets, one call.
    let sources = [src, src + 4096, src + (1 << 20)];
    let targets = [dst + 100, dst + (2 << 20), dst + (3 << 20)];
    let lengths = [4096, 65536, 1 << 20];
    a.transfer_sync(&peer, Opcode::Write, (&sources, &targets, &lengths), None)
        .expect("write");
    let want = pattern(1, LEN);
    for i in 0..3 {
        let (s, t, l) = (
            (sources[i] - src) as usize,
            (targets[i] - dst) as usize,
            lengths[i] as usize,
        );
        assert_same_bytes(
            &bbuf.to_vec(t, l).unwrap(),
            &want[s..s + l],
            "written piece",
        );
    }
    // Read back a range of the peer that holds its own pattern.
    a.transfer_sync(
        &peer,
        Opcode::Read,
        (&[src + 8192], &[dst + (1 << 20)], &[8192]),
        None,
    )
    .expect("read");
    let theirs = pattern(2, LEN);
    assert_same_bytes(
        &abuf.to_vec(8192, 8192).unwrap(),
        &theirs[1 << 20..(1 << 20) + 8192],
        "read piece",
    );
}

#[test]
fn refusals_carry_mooncakes_codes() {
    let (a, abuf) = engine(3);
    let (b, bbuf) = engine(4);
    let peer = b.session_name().unwrap();
    // SAFETY: refused (overlap) before anything is registered.
    let again = unsafe { a.register(abuf.addr() + 4096, 4096, "*") };
    assert_eq!(again.unwrap_err().code(), -7);
    assert_eq!(
        a.unregister_batch(&[abuf.addr() + 1]).unwrap_err().code(),
        -3
    );
    // Lists of different lengths.
    let uneven = a.transfer_sync(
        &peer,
        Opcode::Write,
        (&[abuf.addr()], &[bbuf.addr(), bbuf.addr()], &[8]),
        None,
    );
    assert_eq!(uneven.unwrap_err().code(), -1);
    // SAFETY: refused before anything is registered (uneven lists).
    let uneven = unsafe { a.register_batch(&[1, 2], &[1], "*") };
    assert_eq!(uneven.unwrap_err().code(), -1);
    // A local range outside any region, then a remote one.
    let local = a.transfer_sync(&peer, Opcode::Write, (&[8], &[bbuf.addr()], &[8]), None);
    assert_eq!(local.unwrap_err().code(), -3);
    let remote = a.transfer_sync(
        &peer,
        Opcode::Write,
        (&[abuf.addr()], &[bbuf.addr() + LEN as u64 - 4], &[8]),
        None,
    );
    assert_eq!(remote.unwrap_err().code(), -3);
    // Nothing landed at the peer's buffer end.
    assert_same_bytes(
        &bbuf.to_vec(LEN - 4, 4).unwrap(),
        &pattern(4, LEN)[LEN - 4..],
        "the refused write's target",
    );
    // An unknown peer: an error for sync and for async submission.
    let nobody = free_port_name();
    let sync = a.transfer_sync(&nobody, Opcode::Write, (&[abuf.addr()], &[0], &[8]), None);
    assert!(sync.is_err());
    assert!(
        a.submit(&nobody, Opcode::Write, (&[abuf.addr()], &[0], &[8]), None)
            .is_err()
    );
    // The engine still serves.
    a.transfer_sync(
        &peer,
        Opcode::Write,
        (&[abuf.addr()], &[bbuf.addr()], &[64]),
        None,
    )
    .expect("a good write after the refusals");
}

/// `127.0.0.1:<a port nobody listens on>`.
fn free_port_name() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    drop(l);
    format!("127.0.0.1:{port}")
}

#[test]
fn async_batches_have_checked_ids() {
    let (a, abuf) = engine(5);
    let (b, bbuf) = engine(6);
    let peer = b.session_name().unwrap();
    let one = a
        .submit(
            &peer,
            Opcode::Write,
            (&[abuf.addr()], &[bbuf.addr()], &[1 << 20]),
            None,
        )
        .unwrap();
    let two = a
        .submit(
            &peer,
            Opcode::Write,
            (
                &[abuf.addr() + (1 << 20)],
                &[bbuf.addr() + (1 << 20)],
                &[1 << 20],
            ),
            None,
        )
        .unwrap();
    assert!(one != 0 && two != 0 && one != two);
    a.wait_all(&[one]).expect("first batch");
    // Polled until it is no longer running (the loop ends because the batch has a deadline).
    let progress = loop {
        match a.check(two).unwrap() {
            BatchProgress::Running => std::thread::sleep(std::time::Duration::from_millis(1)),
            done => break done,
        }
    };
    assert_eq!(progress, BatchProgress::Done);
    assert_same_bytes(
        &bbuf.to_vec(0, 2 << 20).unwrap(),
        &pattern(5, LEN)[..2 << 20],
        "async writes",
    );
    // Freed ids, made-up ids and another engine's ids are refused, not used.
    assert_eq!(a.check(one).unwrap_err().code(), -1);
    assert_eq!(a.check(two).unwrap_err().code(), -1);
    assert!(a.check(0xdead_beef).is_err());
    assert!(a.wait_all(&[0x1234_5678_9abc]).is_err());
    let theirs = b
        .submit(
            &a.session_name().unwrap(),
            Opcode::Read,
            (&[bbuf.addr()], &[abuf.addr()], &[8]),
            None,
        )
        .unwrap();
    assert!(a.check(theirs).is_err());
    b.wait_all(&[theirs]).unwrap();
}

#[test]
fn notifications_with_and_without_a_transfer() {
    let (a, abuf) = engine(7);
    let (b, bbuf) = engine(8);
    let peer = b.session_name().unwrap();
    let with = Notification {
        name: "from-a".into(),
        notify_msg: "hello".into(),
    };
    a.transfer_sync(
        &peer,
        Opcode::Write,
        (&[abuf.addr()], &[bbuf.addr()], &[4096]),
        Some(with.clone()),
    )
    .unwrap();
    let without = Notification {
        name: "from-a".into(),
        notify_msg: "bare".into(),
    };
    a.send_notify(&peer, &without).unwrap();
    let mut got = Vec::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while got.len() < 2 && std::time::Instant::now() < deadline {
        got.extend(b.take_notifies().unwrap());
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let msgs: Vec<_> = got
        .iter()
        .map(|r| r.notification.notify_msg.as_str())
        .collect();
    assert!(
        msgs.contains(&"hello") && msgs.contains(&"bare"),
        "{msgs:?}"
    );
    assert_same_bytes(
        &bbuf.to_vec(0, 4096).unwrap(),
        &pattern(7, LEN)[..4096],
        "data before its notification",
    );
}

#[test]
fn managed_buffers_and_byte_helpers_stay_inside_registered_memory() {
    let (a, _abuf) = engine(9);
    let (b, bbuf) = engine(10);
    let addr = a.allocate_managed(1 << 16).unwrap();
    assert_ne!(addr, 0);
    a.write_bytes(addr + 10, b"kv-cache").unwrap();
    assert_eq!(a.read_bytes(addr + 10, 8).unwrap(), b"kv-cache");
    // The peer reads it by address.
    b.transfer_sync(
        &a.session_name().unwrap(),
        Opcode::Read,
        (&[bbuf.addr()], &[addr + 10], &[8]),
        None,
    )
    .unwrap();
    assert_eq!(bbuf.to_vec(0, 8).unwrap(), b"kv-cache");
    // Outside registered memory, past the end, and the wrong length to free.
    assert_eq!(a.write_bytes(8, b"x").unwrap_err().code(), -3);
    assert_eq!(
        a.read_bytes(addr + (1 << 16) - 4, 8).unwrap_err().code(),
        -3
    );
    assert_eq!(a.free_managed(addr, 4096).unwrap_err().code(), -3);
    a.free_managed(addr, 1 << 16).unwrap();
    assert_eq!(a.read_bytes(addr, 8).unwrap_err().code(), -3);
    assert!(a.allocate_managed(0).is_err());
}

#[test]
fn probe_and_first_buffer() {
    let (a, _abuf) = engine(11);
    let (b, bbuf) = engine(12);
    let peer = b.session_name().unwrap();
    assert!(a.probe(&peer).unwrap());
    assert!(!a.probe(&free_port_name()).unwrap());
    assert_eq!(a.first_buffer_address(&peer).unwrap(), bbuf.addr());
}

#[test]
fn ten_threads_write_at_once() {
    let (a, abuf) = engine(13);
    let (b, bbuf) = engine(14);
    let peer = b.session_name().unwrap();
    let piece = (LEN / 10) as u64 & !4095;
    std::thread::scope(|s| {
        for t in 0..10u64 {
            let (a, peer) = (&a, &peer);
            let (src, dst) = (abuf.addr() + t * piece, bbuf.addr() + t * piece);
            s.spawn(move || {
                // Eight calls each of the thread's piece, in 8 descriptors.
                for _ in 0..8 {
                    let step = piece / 8;
                    let sources: Vec<u64> = (0..8).map(|i| src + i * step).collect();
                    let targets: Vec<u64> = (0..8).map(|i| dst + i * step).collect();
                    a.transfer_sync(peer, Opcode::Write, (&sources, &targets, &[step; 8]), None)
                        .expect("concurrent write");
                }
            });
        }
    });
    let n = (piece * 10) as usize;
    assert_same_bytes(
        &bbuf.to_vec(0, n).unwrap(),
        &pattern(13, LEN)[..n],
        "ten threads' writes",
    );
}

#[test]
fn a_forked_child_gets_an_error_not_the_parents_engine() {
    let (e, _buf) = engine(15);
    // SAFETY: the child only calls the facade (no allocation-heavy work beyond it) and exits
    // with `_exit`, running no destructors of the parent's state.
    let pid = unsafe { libc_fork() };
    if pid == 0 {
        // A panic must end the child with a failure: left to unwind, it would end the child's
        // only thread, and with it the child, with status 0.
        let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let code = match e.rpc_port() {
                Err(FacadeError::Forked { .. }) => 0,
                _ => 1,
            };
            drop(e); // must neither hang nor touch the parent's listeners
            code
        }))
        .unwrap_or(2);
        // SAFETY: ends the child at once.
        unsafe { libc_exit(code) };
    }
    let status = wait(pid);
    assert_eq!(
        status, 0,
        "the child saw its engine as forked and dropped it cleanly"
    );
    assert!(e.rpc_port().is_ok(), "the parent's engine still works");
}

unsafe extern "C" {
    #[link_name = "fork"]
    fn libc_fork() -> i32;
    #[link_name = "_exit"]
    fn libc_exit(code: i32) -> !;
    fn waitpid(pid: i32, status: *mut i32, options: i32) -> i32;
}

fn wait(pid: i32) -> i32 {
    let mut status = 0;
    // SAFETY: `status` is a valid out-pointer for the call.
    let r = unsafe { waitpid(pid, &mut status, 0) };
    assert_eq!(r, pid);
    match status & 0x7f {
        // A normal exit: WEXITSTATUS.
        0 => (status >> 8) & 0xff,
        // Killed by a signal (an abort included): as a shell reports it.
        signal => 128 + signal,
    }
}

/// A file the application opened is reached by the name `open_file` gave it; the same name
/// from a peer (`connect`, Mooncake's `openSegment`) is refused, so a name a peer or a store
/// master hands over can never alias the local file.
#[test]
fn a_peers_name_spelled_as_a_file_never_reaches_an_open_file() {
    let (a, abuf) = engine(13);
    a.install_transport("io_uring", "")
        .expect("a file transport");
    let path = std::env::temp_dir().join(format!("te-facade-file-{}", std::process::id()));
    std::fs::write(&path, vec![0x33u8; 1 << 20]).unwrap();
    let (name, _) = a.open_file(path.to_str().unwrap(), true).unwrap();
    for refused in [
        a.connect(&name).unwrap_err(),
        a.open_segment_id(&name, false).unwrap_err(),
        a.open_segment_id(&name, true).unwrap_err(),
    ] {
        assert_eq!(refused.code(), -1, "{refused}");
        assert!(refused.to_string().contains("file"), "{refused}");
    }
    // The application's own calls with the name open_file gave still reach the file.
    a.transfer_sync(&name, Opcode::Read, (&[abuf.addr()], &[0], &[4096]), None)
        .unwrap();
    assert_eq!(abuf.to_vec(0, 4096).unwrap(), vec![0x33u8; 4096]);
    assert_eq!(std::fs::read(&path).unwrap(), vec![0x33u8; 1 << 20]);
    std::fs::remove_file(&path).unwrap();
}
