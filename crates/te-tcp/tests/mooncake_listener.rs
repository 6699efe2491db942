//! te's listener for Mooncake initiators (`MC_TE_MOONCAKE_COMPAT=1`) driven with hand-made
//! bytes in Mooncake's framing on real sockets: pipelined requests answered in order, a stalled
//! peer holding up nobody, a large WRITE sharing the loop with small ones, malformed headers
//! refused, and the stall timeout. (The real Mooncake engine drives it in `mooncake.rs`.)

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::*;
use te_core::{Opcode, Permission, TransferEngine};
use te_tcp::wire::mooncake::{HEADER_LEN, STATUS_OK, STATUS_REJECTED, encode_status};

fn target(stall: Duration) -> TransferEngine {
    engine_with_tcp(compat_config(&[]), tcp(|t| t.status_timeout = stall))
}

fn connect(t: &TransferEngine) -> TcpStream {
    connect_compat(t)
}

fn header(opcode: Opcode, addr: u64, size: u64) -> [u8; HEADER_LEN] {
    mooncake_header(opcode, addr, size, true)
}

fn status(s: &mut TcpStream) -> [u8; 8] {
    mooncake_status(s)
}

#[test]
fn pipelined_requests_are_answered_in_order() {
    let t = target(Duration::from_secs(30));
    let mem = buffer(1 << 20);
    register(&t, &mem, Permission::RemoteReadWrite);
    let mut s = connect(&t);
    let a = pattern(1, 4096);
    let b = pattern(2, 100_000);
    // WRITE, WRITE, READ of the first, sent back to back before reading anything.
    let mut wire = header(Opcode::Write, mem.addr(), 4096).to_vec();
    wire.extend_from_slice(&a);
    wire.extend_from_slice(&header(Opcode::Write, mem.addr() + 8192, b.len() as u64));
    wire.extend_from_slice(&b);
    wire.extend_from_slice(&header(Opcode::Read, mem.addr(), 4096));
    s.write_all(&wire).unwrap();
    assert_eq!(status(&mut s), encode_status(STATUS_OK));
    assert_eq!(status(&mut s), encode_status(STATUS_OK));
    assert_eq!(status(&mut s), encode_status(STATUS_OK));
    let mut back = vec![0u8; 4096];
    s.read_exact(&mut back).unwrap();
    assert_eq!(back, a);
    assert_eq!(mem.to_vec(8192, b.len()).unwrap(), b);
}

/// Large requests spread their connections over the listener's loops (all start on the first);
/// a connection moved in the middle of a WRITE's body keeps its request, its pin and its place.
#[test]
fn bulk_writes_moved_between_loops_mid_body_land_whole_and_read_back() {
    let t = target(Duration::from_secs(30));
    const LEN: usize = 1 << 20;
    let mem = buffer(4 * LEN);
    register(&t, &mem, Permission::RemoteReadWrite);
    let (mut a, mut b) = (connect(&t), connect(&t));
    let bytes = [pattern(11, LEN), pattern(12, LEN)];
    let at = [mem.addr(), mem.addr() + 2 * LEN as u64];
    // Each starts a 1 MiB WRITE and sends half its body: the second to turn bulk on the first
    // loop is handed to the other loop while its body is half received.
    for (s, (data, addr)) in [&mut a, &mut b].into_iter().zip(bytes.iter().zip(at)) {
        s.write_all(&header(Opcode::Write, addr, LEN as u64))
            .unwrap();
        s.write_all(&data[..LEN / 2]).unwrap();
        std::thread::sleep(Duration::from_millis(50));
    }
    for (s, data) in [&mut a, &mut b].into_iter().zip(&bytes) {
        s.write_all(&data[LEN / 2..]).unwrap();
        assert_eq!(status(s), encode_status(STATUS_OK));
    }
    for (i, (data, addr)) in bytes.iter().zip(at).enumerate() {
        assert_eq!(
            mem.to_vec((addr - mem.addr()) as usize, LEN).unwrap(),
            *data,
            "write {i}"
        );
    }
    // Then each reads the other's bytes back over the same connections, and a small request
    // after them is served as before.
    for (s, (data, addr)) in [&mut a, &mut b].into_iter().zip(bytes.iter().zip(at).rev()) {
        s.write_all(&header(Opcode::Read, addr, LEN as u64))
            .unwrap();
        expect_mooncake_ok(s, Some(data), "read back over a moved connection");
        s.write_all(&header(Opcode::Read, addr, 16)).unwrap();
        expect_mooncake_ok(s, Some(&data[..16]), "a small READ after it");
    }
}

/// 64 KiB READs make a connection bulk too: a second connection pipelining them is moved to
/// the other loop while its replies are half sent, and every reply still arrives whole, in
/// order, with the right bytes.
#[test]
fn bulk_reads_moved_between_loops_mid_reply_arrive_whole_and_in_order() {
    let t = target(Duration::from_secs(30));
    const LEN: usize = 64 << 10;
    const READS: usize = 64;
    let mem = buffer(READS * LEN);
    register(&t, &mem, Permission::RemoteReadWrite);
    let data = pattern(21, READS * LEN);
    mem.write_at(0, &data).unwrap();
    let (mut a, mut b) = (connect(&t), connect(&t));
    // 4 MiB of READs on each connection before either reads a byte: the replies fill the
    // sockets, so the second connection turns bulk with a reply half sent.
    for s in [&mut a, &mut b] {
        let mut wire = Vec::new();
        for i in 0..READS {
            wire.extend_from_slice(&header(
                Opcode::Read,
                mem.addr() + (i * LEN) as u64,
                LEN as u64,
            ));
        }
        s.write_all(&wire).unwrap();
        std::thread::sleep(Duration::from_millis(50));
    }
    for (c, s) in [&mut a, &mut b].into_iter().enumerate() {
        for i in 0..READS {
            let want = &data[i * LEN..(i + 1) * LEN];
            expect_mooncake_ok(s, Some(want), &format!("connection {c}, read {i}"));
        }
    }
}

#[test]
fn a_stalled_peer_holds_up_nobody_and_is_closed_after_the_stall_timeout() {
    let t = target(Duration::from_secs(2));
    let mem = buffer(64 << 20);
    register(&t, &mem, Permission::RemoteReadWrite);
    // Half a header, then silence.
    let mut stalled = connect(&t);
    stalled
        .write_all(&header(Opcode::Write, mem.addr(), 64)[..10])
        .unwrap();
    // A WRITE that stops after half its body.
    let mut half = connect(&t);
    half.write_all(&header(Opcode::Write, mem.addr(), 8192))
        .unwrap();
    half.write_all(&[7u8; 4096]).unwrap();
    // Meanwhile a 32 MiB WRITE and small READs on other connections go through.
    let big = pattern(3, 32 << 20);
    let mut bulk = connect(&t);
    let sender = {
        let big = big.clone();
        let mut w = bulk.try_clone().unwrap();
        let at = mem.addr() + (16 << 20);
        std::thread::spawn(move || {
            w.write_all(&header(Opcode::Write, at, big.len() as u64))
                .unwrap();
            w.write_all(&big).unwrap();
        })
    };
    let mut small = connect(&t);
    for _ in 0..50 {
        small
            .write_all(&header(Opcode::Read, mem.addr() + (1 << 20), 512))
            .unwrap();
        assert_eq!(status(&mut small), encode_status(STATUS_OK));
        let mut data = [0u8; 512];
        small.read_exact(&mut data).unwrap();
    }
    sender.join().unwrap();
    assert_eq!(status(&mut bulk), encode_status(STATUS_OK));
    assert!(
        mem.to_vec(16 << 20, big.len()).unwrap() == big,
        "the big WRITE landed"
    );
    // Both stalled connections are closed once the stall timeout (2 s) has passed.
    for (what, s) in [("half a header", &mut stalled), ("half a body", &mut half)] {
        let mut sink = [0u8; 8];
        let closed = matches!(s.read(&mut sink), Ok(0) | Err(_));
        assert!(closed, "{what}: closed");
    }
    // And the half-written body never got an acknowledgement.
}

#[test]
fn malformed_and_refused_requests_get_mooncakes_refusal_and_a_close() {
    let t = target(Duration::from_secs(30));
    let mem = buffer(1 << 20);
    register(&t, &mem, Permission::RemoteRead);
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("opcode 2", {
            let mut h = header(Opcode::Read, mem.addr(), 64);
            h[16] = 0x82;
            h.to_vec()
        }),
        ("size 0", header(Opcode::Read, mem.addr(), 0).to_vec()),
        ("read-only region written", {
            let mut v = header(Opcode::Write, mem.addr(), 64).to_vec();
            v.extend_from_slice(&[1u8; 64]);
            v
        }),
        (
            "outside every region",
            header(Opcode::Read, mem.addr() + (2 << 20), 64).to_vec(),
        ),
        (
            "across the region's end",
            header(Opcode::Read, mem.addr() + (1 << 20) - 8, 64).to_vec(),
        ),
    ];
    for (what, bytes) in cases {
        let mut s = connect(&t);
        s.write_all(&bytes).unwrap();
        let mut answer = Vec::new();
        let _ = s.read_to_end(&mut answer);
        assert_eq!(answer, encode_status(STATUS_REJECTED), "{what}");
        assert_eq!(
            mem.to_vec(0, 64).unwrap(),
            vec![0u8; 64],
            "{what}: untouched"
        );
    }
    // Still serving.
    let mut s = connect(&t);
    s.write_all(&header(Opcode::Read, mem.addr(), 64)).unwrap();
    assert_eq!(status(&mut s), encode_status(STATUS_OK));
}

/// A peer that goes away in the middle of a request (a WRITE's body half sent, or a large
/// READ's reply half read) takes its pin with it: both regions unregister long before the stall
/// timeout, and the listener serves the next connection.
#[test]
fn a_peer_gone_mid_body_or_mid_reply_leaves_no_pin() {
    let t = target(Duration::from_secs(60));
    let written = buffer(1 << 20);
    let read = buffer(64 << 20);
    register(&t, &written, Permission::RemoteReadWrite);
    register(&t, &read, Permission::RemoteReadWrite);

    let mut half_body = connect(&t);
    half_body
        .write_all(&header(Opcode::Write, written.addr(), 8192))
        .unwrap();
    half_body.write_all(&[7u8; 4096]).unwrap();
    // 64 MiB asked for, a little read: the rest fills the sockets and te's send waits.
    let mut half_reply = connect(&t);
    half_reply
        .write_all(&header(Opcode::Read, read.addr(), 64 << 20))
        .unwrap();
    assert_eq!(status(&mut half_reply), encode_status(STATUS_OK));
    let mut some = vec![0u8; 1 << 20];
    half_reply.read_exact(&mut some).unwrap();
    // Both regions are pinned while their requests are under way.
    for (what, b) in [("mid-body", &written), ("mid-reply", &read)] {
        assert_pinned(&t, b.addr(), what);
    }
    drop(half_body);
    drop(half_reply);

    for (what, b) in [("mid-body", &written), ("mid-reply", &read)] {
        unregister_once_unpinned(&t, b.addr(), Duration::from_secs(10), what);
    }

    register(&t, &written, Permission::RemoteReadWrite);
    let data = pattern(9, 4096);
    let mut next = connect(&t);
    next.write_all(&header(Opcode::Write, written.addr(), 4096))
        .unwrap();
    next.write_all(&data).unwrap();
    assert_eq!(status(&mut next), encode_status(STATUS_OK));
    assert_eq!(
        written.to_vec(0, 4096).unwrap(),
        data,
        "the next WRITE landed"
    );
}
