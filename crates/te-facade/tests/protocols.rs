//! Protocol names, runtimes and transport hints through the facade, between real engines over
//! loopback: a name te cannot serve is an error naming it on both runtimes, a hint picks the
//! transport or fails the call, and batch ids stay in Mooncake's range on both.

#![allow(unsafe_code)] // registers test buffers by address, as the bindings' callers do

use std::sync::Arc;

use te_core::HostBuffer;
use te_facade::{FacadeError, MooncakeEngine, Opcode, Protocol, RuntimeKind, TransferOptions};
use te_testkit::{assert_same_bytes, pattern};

const LEN: usize = 1 << 20;

fn started(kind: RuntimeKind, protocol: &str) -> Result<MooncakeEngine, FacadeError> {
    let e = MooncakeEngine::new();
    e.initialize_on(kind, "127.0.0.1", "P2PHANDSHAKE", protocol, "")?;
    Ok(e)
}

/// An engine on `kind` with one registered buffer holding `seed`'s pattern.
fn engine(kind: RuntimeKind, seed: u64) -> (MooncakeEngine, Arc<HostBuffer>) {
    let e = started(kind, "tcp").expect("initialize");
    let buf = Arc::new(HostBuffer::new(LEN).unwrap());
    buf.write_at(0, &pattern(seed, LEN)).unwrap();
    // SAFETY: `buf` is returned with the engine and outlives its use in every test.
    unsafe { e.register(buf.addr(), LEN as u64, "cpu:0").unwrap() };
    (e, buf)
}

fn transport_error(e: &FacadeError) -> bool {
    matches!(
        e,
        FacadeError::Engine(te_core::Error::NotSupportedTransport(_))
    )
}

#[test]
fn names_te_cannot_serve_fail_initialize_on_both_runtimes() {
    for kind in [RuntimeKind::Classic, RuntimeKind::Tent] {
        for name in ["bogus", "efa", "hip", "ascend", "barex", "ub", "nvlnk"] {
            let e = started(kind, name).map(|_| ()).unwrap_err();
            assert!(transport_error(&e), "{kind:?} {name}: {e}");
            assert!(e.to_string().contains(&format!("{name:?}")), "{e}");
            assert!(e.code() < 0);
        }
        // te has these transports, but they cannot start here (no GPU, no CXL device, no
        // GPUDirect Storage): the error names the protocol and says why.
        for name in ["nvlink", "nvlink_intra", "mnnvl", "cxl", "gds"] {
            let e = started(kind, name).map(|_| ()).unwrap_err();
            assert!(transport_error(&e), "{kind:?} {name}: {e}");
            assert!(e.to_string().contains(name), "{e}");
        }
    }
    // shm and io_uring start on both runtimes, and the name selects that transport.
    for kind in [RuntimeKind::Classic, RuntimeKind::Tent] {
        for name in ["shm", "io_uring"] {
            let e = started(kind, name).expect(name);
            let live = e.live().unwrap();
            assert_eq!(live.runtime_kind(), kind);
            let installed = live.engine().transport_capabilities();
            let want = Protocol::parse(name).unwrap().transports();
            assert!(
                installed.iter().any(|(n, _)| want.contains(n)),
                "{kind:?} {name}: {installed:?}"
            );
            if kind == RuntimeKind::Classic {
                assert_eq!(installed.len(), 1, "{name} alone: {installed:?}");
            }
        }
    }
}

#[test]
fn auto_installs_what_starts_here_and_moves_ordinary_memory() {
    let a = started(RuntimeKind::Classic, "auto").expect("auto");
    let b = started(RuntimeKind::Classic, "AUTO").expect("auto");
    let names = |e: &MooncakeEngine| -> Vec<&'static str> {
        let live = e.live().unwrap();
        let caps = live.engine().transport_capabilities();
        caps.iter().map(|(n, _)| *n).collect()
    };
    let installed = names(&a);
    // No RDMA device, GPU or CXL device here: the network transport first (the protocol the
    // descriptor publishes), then shared memory and files.
    assert_eq!(installed[0], "tcp", "{installed:?}");
    assert!(
        installed.contains(&"shm") && installed.contains(&"cma"),
        "{installed:?}"
    );
    assert!(
        installed.contains(&"uring") || installed.contains(&"bufio"),
        "{installed:?}"
    );
    for absent in ["rdma", "nvlink", "cxl", "gds"] {
        assert!(!installed.contains(&absent), "{absent}: {installed:?}");
    }
    // Installing it again, or any of its transports, changes nothing.
    a.install_transport("auto", "").unwrap();
    a.install_transport("shm", "").unwrap();
    assert_eq!(names(&a), installed);
    // Memory the application allocated is not in a shared-memory file: on this host it goes by
    // cross-memory attach, not TCP, and every byte lands.
    let src = Arc::new(HostBuffer::new(LEN).unwrap());
    let dst = Arc::new(HostBuffer::new(LEN).unwrap());
    src.write_at(0, &pattern(7, LEN)).unwrap();
    // SAFETY: both buffers outlive the engines' use of them in this test.
    unsafe {
        a.register(src.addr(), LEN as u64, "cpu:0").unwrap();
        b.register(dst.addr(), LEN as u64, "cpu:0").unwrap();
    }
    let peer = b.session_name().unwrap();
    let lists = ([src.addr()], [dst.addr()], [LEN as u64]);
    a.transfer_sync(
        &peer,
        Opcode::Write,
        (&lists.0[..], &lists.1[..], &lists.2[..]),
        None,
    )
    .expect("write");
    assert_same_bytes(&dst.to_vec(0, LEN).unwrap(), &pattern(7, LEN), "auto write");
    let over_tcp: u64 = a
        .live()
        .unwrap()
        .engine()
        .nic_load_stats()
        .iter()
        .map(|s| s.bytes_done)
        .sum();
    assert_eq!(over_tcp, 0, "the same host's memory did not go through TCP");
}

#[test]
fn the_c_apis_install_transport_names_what_it_cannot_install() {
    let (e, _buf) = engine(RuntimeKind::Classic, 1);
    e.install_transport("tcp", "")
        .expect("already there: a warning");
    for (name, says) in [
        ("bogus", "not a transport name"),
        ("gds", "cannot start here"),
    ] {
        let err = e.install_transport(name, "").unwrap_err();
        assert!(err.to_string().contains(says), "{name}: {err}");
    }
    e.install_transport("shm", "")
        .expect("the classic engine runs shm too");
    let installed = e.live().unwrap().engine().transport_capabilities();
    assert!(installed.iter().any(|(n, _)| *n == "shm"), "{installed:?}");
    let (t, _tbuf) = engine(RuntimeKind::Tent, 2);
    t.install_transport("shm", "").expect("TENT runs shm");
    let err = t.install_transport("gds", "").unwrap_err();
    assert!(err.to_string().contains("TENT"), "{err}");
}

#[test]
fn hints_pick_the_transport_or_fail_the_call() {
    for kind in [RuntimeKind::Classic, RuntimeKind::Tent] {
        let (a, abuf) = engine(kind, 1);
        let (b, bbuf) = engine(kind, 2);
        let peer = b.session_name().unwrap();
        let lists = ([abuf.addr()], [bbuf.addr() + 64], [4096u64]);
        let view = (&lists.0[..], &lists.1[..], &lists.2[..]);
        a.transfer_sync(
            &peer,
            Opcode::Write,
            view,
            TransferOptions {
                notify: None,
                hint: Some(Protocol::Tcp),
            },
        )
        .expect("tcp hint");
        assert_same_bytes(
            &bbuf.to_vec(64, 4096).unwrap(),
            &pattern(1, 4096),
            "written through the hinted transport",
        );
        // A transport that is not installed: the call fails, and nothing is written. (Under
        // TENT a hinted transport that is installed but fails, as shm does for memory it did
        // not allocate, fails over to the next, as TENT's pinned requests do.)
        let before = bbuf.to_vec(0, LEN).unwrap();
        let missing = match kind {
            RuntimeKind::Classic => [Protocol::Gds, Protocol::Shm],
            _ => [Protocol::Gds, Protocol::Nvlink],
        };
        for hint in missing {
            let via = || TransferOptions {
                notify: None,
                hint: Some(hint),
            };
            let e = a
                .transfer_sync(&peer, Opcode::Write, view, via())
                .unwrap_err();
            assert!(e.to_string().contains(hint.transport()), "{kind:?}: {e}");
            let id = a.submit(&peer, Opcode::Write, view, via());
            assert!(id.is_err(), "{kind:?} async {hint:?}");
        }
        assert_same_bytes(&bbuf.to_vec(0, LEN).unwrap(), &before, "no stray write");
        // An asynchronous call with a good hint completes.
        let id = a
            .submit(
                &peer,
                Opcode::Read,
                view,
                TransferOptions {
                    notify: None,
                    hint: Some(Protocol::Tcp),
                },
            )
            .unwrap();
        a.wait_all(&[id]).expect("read through tcp");
    }
}

#[test]
fn batch_ids_are_non_zero_and_below_2_pow_48_on_both_runtimes() {
    for kind in [RuntimeKind::Classic, RuntimeKind::Tent] {
        let engines: Vec<(MooncakeEngine, Arc<HostBuffer>)> =
            (0..6).map(|i| engine(kind, i)).collect();
        let mut seen = std::collections::HashSet::new();
        for (i, (e, buf)) in engines.iter().enumerate() {
            let (peer, pbuf) = &engines[(i + 1) % engines.len()];
            let name = peer.session_name().unwrap();
            for round in 0..20 {
                let id = e
                    .submit(
                        &name,
                        Opcode::Read,
                        (&[buf.addr()], &[pbuf.addr() + round], &[512]),
                        None,
                    )
                    .unwrap();
                assert!(id != 0 && id < 1 << 48, "{kind:?}: {id:#x}");
                assert!(seen.insert(id), "{kind:?}: {id:#x} handed out twice");
                e.wait_all(&[id]).unwrap();
                // A freed id, and another engine's, are errors.
                assert!(e.check(id).is_err(), "freed");
                assert!(peer.check(id).is_err(), "foreign");
            }
            let c_id = e.allocate_batch_id(4).unwrap();
            assert!(c_id != 0 && c_id < 1 << 48, "{kind:?}: {c_id:#x}");
            e.free_batch_id(c_id).unwrap();
            assert!(e.free_batch_id(c_id).is_err(), "double free");
        }
    }
}

/// A scratch file of `len` bytes holding `seed`'s pattern, removed when dropped.
struct Scratch(std::path::PathBuf);

impl Scratch {
    fn new(tag: &str, len: usize, seed: u64) -> Self {
        let path = std::env::temp_dir().join(format!("te-facade-{tag}-{}", std::process::id()));
        std::fs::write(&path, pattern(seed, len)).unwrap();
        Scratch(path)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[test]
fn files_open_as_segments_and_move_through_the_same_calls() {
    for kind in [RuntimeKind::Classic, RuntimeKind::Tent] {
        let file = Scratch::new(&format!("{kind:?}"), 4 << 20, 9);
        let path = file.0.to_str().unwrap();
        let e = started(kind, "auto").expect("auto");
        let buf = Arc::new(HostBuffer::new(LEN).unwrap());
        buf.write_at(0, &pattern(3, LEN)).unwrap();
        // SAFETY: `buf` outlives the engine's use of it in this loop.
        unsafe { e.register(buf.addr(), LEN as u64, "cpu:0").unwrap() };
        let (name, id) = e.open_file(path, true).expect("open");
        assert!(name.starts_with("file:") && id >= 0, "{name} {id}");
        // READ 256 KiB from offset 4096 of the file; WRITE 512 KiB at offset 2 MiB.
        let read = ([buf.addr()], [4096u64], [256u64 << 10]);
        e.transfer_sync(
            &name,
            Opcode::Read,
            (&read.0[..], &read.1[..], &read.2[..]),
            None,
        )
        .expect("read");
        let want = pattern(9, 4 << 20);
        assert_same_bytes(
            &buf.to_vec(0, 256 << 10).unwrap(),
            &want[4096..4096 + (256 << 10)],
            "read",
        );
        let write = ([buf.addr() + (1 << 19)], [2u64 << 20], [512u64 << 10]);
        e.transfer_sync(
            &name,
            Opcode::Write,
            (&write.0[..], &write.1[..], &write.2[..]),
            None,
        )
        .expect("write");
        let on_disk = std::fs::read(&file.0).unwrap();
        let wrote = &pattern(3, LEN)[1 << 19..(1 << 19) + (512 << 10)];
        assert_same_bytes(
            &on_disk[2 << 20..(2 << 20) + (512 << 10)],
            wrote,
            "{kind:?} write",
        );
        assert_same_bytes(&on_disk[..2 << 20], &want[..2 << 20], "the rest untouched");
        // Read-only: a WRITE is refused and the file stays as it was.
        let (ro, _) = e.open_file(path, false).expect("open read-only");
        let refused = e.transfer_sync(
            &ro,
            Opcode::Write,
            (&write.0[..], &write.1[..], &write.2[..]),
            None,
        );
        assert!(refused.is_err(), "{kind:?}: a WRITE to a read-only file");
        assert_eq!(std::fs::read(&file.0).unwrap(), on_disk);
        // A path that is no file.
        let missing = e.open_file("/nonexistent/te-file", false).unwrap_err();
        assert!(
            missing.to_string().contains("/nonexistent/te-file"),
            "{missing}"
        );
    }
    // An engine without a file transport says which to install.
    let tcp = started(RuntimeKind::Classic, "tcp").unwrap();
    let file = Scratch::new("tcp", 4096, 1);
    let err = tcp.open_file(file.0.to_str().unwrap(), false).unwrap_err();
    assert!(err.to_string().contains("file segments"), "{err}");
}

#[test]
fn managed_buffers_are_shared_memory_where_shm_runs() {
    let a = started(RuntimeKind::Classic, "auto").unwrap();
    let b = started(RuntimeKind::Classic, "auto").unwrap();
    let len = 1u64 << 20;
    let (src, dst) = (
        a.allocate_managed(len).unwrap(),
        b.allocate_managed(len).unwrap(),
    );
    a.write_bytes(src, &pattern(5, len as usize)).unwrap();
    let peer = b.session_name().unwrap();
    a.transfer_sync(&peer, Opcode::Write, (&[src], &[dst], &[len]), None)
        .expect("write");
    assert_same_bytes(
        &b.read_bytes(dst, len).unwrap(),
        &pattern(5, len as usize),
        "landed",
    );
    // b published its managed buffer as a shared-memory file, which a's shm transport maps.
    let live = a.live().unwrap();
    let seg = live.engine().open_segment(&peer).unwrap();
    let desc = live.engine().segment(seg).unwrap();
    let published = desc
        .desc()
        .buffers
        .iter()
        .find(|x| x.addr == dst)
        .expect("published");
    assert!(published.shm_name.is_some(), "{published:?}");
    // A TCP engine's managed buffers are ordinary memory.
    let c = started(RuntimeKind::Classic, "tcp").unwrap();
    let plain = c.allocate_managed(4096).unwrap();
    let own = c.live().unwrap().engine().local_descriptor();
    let mine = own
        .buffers
        .iter()
        .find(|x| x.addr == plain)
        .expect("registered");
    assert!(mine.shm_name.is_none());
    for (e, addr, n) in [(&a, src, len), (&b, dst, len), (&c, plain, 4096)] {
        e.free_managed(addr, n).unwrap();
    }
}
