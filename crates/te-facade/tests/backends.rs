//! The calls te's own bindings (`te.Engine`) make, on both runtimes (the classic engine and TENT),
//! between two real engines over loopback TCP: bytes compared, ids checked, cancellation and
//! abandoned handles, a range the peer registered after it was opened.

#![allow(unsafe_code)] // registers test buffers by address, as the bindings do

use std::sync::Arc;
use std::time::Duration;

use te_core::HostBuffer;
use te_facade::{FacadeError, MooncakeEngine, Notification, Opcode, Permission, RuntimeKind};
use te_testkit::{assert_same_bytes, pattern};

const LEN: usize = 4 << 20;

fn start(tent: bool) -> MooncakeEngine {
    let kind = match tent {
        true => RuntimeKind::Tent,
        false => RuntimeKind::Classic,
    };
    let e = MooncakeEngine::new();
    e.initialize_on(kind, "127.0.0.1", "P2PHANDSHAKE", "tcp", "")
        .unwrap();
    assert_eq!(e.live().unwrap().runtime_kind(), kind);
    e
}

/// A buffer of `len` bytes with `seed`'s pattern, registered on `e`.
fn registered(e: &MooncakeEngine, len: usize, seed: u64) -> Arc<HostBuffer> {
    let buf = Arc::new(HostBuffer::new(len).unwrap());
    buf.write_at(0, &pattern(seed, len)).unwrap();
    // SAFETY: every test keeps its buffers alive past its engines' use of them.
    unsafe {
        e.register_batch_with(
            &[buf.addr()],
            &[len as u64],
            "*",
            Permission::RemoteReadWrite,
        )
        .unwrap()
    };
    buf
}

/// Runs `test` on the classic backend, then on TENT.
///
/// `buffers_outlive_engines`: a test registers its buffers without unregistering them, so it
/// drops its engines (whose threads may still be moving bytes of abandoned transfers) before
/// its buffers, as the registration contract asks: memory stays allocated while registered.
fn both(test: impl Fn(bool)) {
    test(false);
    test(true);
}

#[test]
fn sync_and_async_transfers_land_every_byte() {
    both(|tent| {
        let (a, b) = (start(tent), start(tent));
        let (abuf, bbuf) = (registered(&a, LEN, 1), registered(&b, LEN, 2));
        let peer = b.session_name().unwrap();
        a.connect(&peer).unwrap();
        let lists = ([abuf.addr()], [bbuf.addr()], [LEN as u64]);
        a.transfer_sync(&peer, Opcode::Write, (&lists.0, &lists.1, &lists.2), None)
            .unwrap();
        assert_same_bytes(&bbuf.to_vec(0, LEN).unwrap(), &pattern(1, LEN), "written");
        bbuf.write_at(0, &pattern(3, LEN)).unwrap();
        let id = a
            .submit(&peer, Opcode::Read, (&lists.0, &lists.1, &lists.2), None)
            .unwrap();
        while !a.wait_batch(id, Duration::from_millis(100)).unwrap() {}
        assert_same_bytes(&abuf.to_vec(0, LEN).unwrap(), &pattern(3, LEN), "read");
        // The id is spent: waiting again is an error, as is a made-up one.
        assert!(a.wait_batch(id, Duration::ZERO).is_err(), "tent={tent}");
        assert_eq!(
            a.wait_batch(987_654, Duration::ZERO).unwrap_err().code(),
            -1
        );
        assert!(a.cancel_batch(987_654).is_err());
        drop((a, b)); // see `buffers_outlive_engines`
    });
}

#[test]
fn cancelled_and_abandoned_transfers_end_and_are_freed() {
    both(|tent| {
        let (a, b) = (start(tent), start(tent));
        let (abuf, bbuf) = (registered(&a, LEN, 1), registered(&b, LEN, 2));
        let peer = b.session_name().unwrap();
        let n = 64;
        let srcs = vec![abuf.addr(); n];
        let dsts = vec![bbuf.addr(); n];
        let lens = vec![LEN as u64; n];
        let id = a
            .submit(&peer, Opcode::Write, (&srcs, &dsts, &lens), None)
            .unwrap();
        a.cancel_batch(id).unwrap();
        let ended = loop {
            match a.wait_batch(id, Duration::from_millis(100)) {
                Ok(false) => continue,
                other => break other,
            }
        };
        match ended {
            Ok(true) => {} // everything had gone already
            Err(FacadeError::Transfer { state, .. }) => {
                assert_eq!(state, te_core::TransferState::Canceled, "tent={tent}");
            }
            other => panic!("tent={tent}: a cancelled transfer ended {other:?}"),
        }
        // Handles let go of: their batches run to their end and a later submission frees them.
        let one = ([abuf.addr()], [bbuf.addr()], [4096u64]);
        for _ in 0..50 {
            let id = a
                .submit(&peer, Opcode::Write, (&one.0, &one.1, &one.2), None)
                .unwrap();
            a.abandon(id);
        }
        a.transfer_sync(&peer, Opcode::Write, (&one.0, &one.1, &one.2), None)
            .unwrap();
        let id = a
            .submit(&peer, Opcode::Write, (&one.0, &one.1, &one.2), None)
            .unwrap();
        assert!(a.wait_batch(id, Duration::from_secs(30)).unwrap());
        // Abandoned batches may still be moving bytes into `bbuf`: the engines go first.
        drop((a, b)); // see `buffers_outlive_engines`
    });
}

#[test]
fn memory_the_peer_registers_later_notifications_and_close() {
    both(|tent| {
        let (a, b) = (start(tent), start(tent));
        let abuf = registered(&a, LEN, 1);
        let _first = registered(&b, 4096, 9);
        let peer = b.session_name().unwrap();
        a.connect(&peer).unwrap();
        let later = registered(&b, 65536, 2);
        let lists = ([abuf.addr()], [later.addr()], [65536u64]);
        a.transfer_sync(&peer, Opcode::Write, (&lists.0, &lists.1, &lists.2), None)
            .unwrap();
        assert_same_bytes(
            &later.to_vec(0, 65536).unwrap(),
            &pattern(1, 65536),
            "later",
        );
        let n = Notification {
            name: "a".into(),
            notify_msg: "hello".into(),
        };
        a.send_notify(&peer, &n).unwrap();
        let got = b.next_notify(Duration::from_secs(10)).unwrap();
        let got = got.expect("a notification");
        assert_eq!(got.notification.notify_msg, "hello");
        assert!(got.sender.addr.ip().is_loopback(), "{:?}", got.sender);
        assert!(a.probe(&peer).unwrap());
        b.close();
        b.close();
        assert!(matches!(b.session_name(), Err(FacadeError::NotInitialized)));
        assert!(
            !a.probe(&peer).unwrap(),
            "tent={tent}: a closed engine's port answers"
        );
        b.unregister_batch(&[later.addr()]).unwrap_err();
        drop((a, b)); // see `buffers_outlive_engines`
    });
}
