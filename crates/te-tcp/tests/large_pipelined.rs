//! Large requests pipelined on one data connection, written with hand-made bytes in pieces
//! that end where the target's receives could go wrong: a WRITE's body arrives with the next
//! header, with part of it, or alone; a body arrives in parts. Every reply must come in order
//! and every byte must land where it was sent.

mod common;

use std::io::{Read, Write};
use std::net::Shutdown;

use common::*;
use te_core::Opcode;
use te_core::transport::Rejection;
use te_tcp::wire::{REQUEST_LEN, Request, Status};

/// Over the target's bulk-receive size (16 KiB): each body is received straight into memory.
const LEN: usize = 20_000;

/// Where the pieces end, relative to a WRITE's body end, cycling: the next header's first bytes
/// come with the body, all of it, none of it, or the body's last part comes on its own.
const SPLITS: [isize; 4] = [10, REQUEST_LEN as isize, 0, -5_000];

#[test]
fn large_writes_and_reads_split_around_their_headers_are_answered_in_order() {
    let p = pair(4 << 20);
    let segment = p.initiator.segment(p.segment).unwrap();
    let DataConn(mut conn, proof) =
        DataConn::open(segment.desc().te_rails[0].port, segment.secret());
    conn.set_read_timeout(Some(WAIT)).unwrap();

    // Even requests WRITE a slot, odd ones READ it back; request 12 WRITEs out of bounds (its
    // body is read and dropped), so request 13 READs a slot nothing wrote.
    let mut wire = Vec::new();
    let mut cuts = Vec::new();
    let mut expected: Vec<Expected> = Vec::new();
    for i in 0..48u64 {
        let slot = p.remote.addr() + (i / 2) * LEN as u64;
        let fill = pattern(i / 2 + 1, LEN);
        let (opcode, addr, status, data) = match i {
            12 => (
                Opcode::Write,
                0x10,
                Status::Rejected(Rejection::OutOfBounds),
                None,
            ),
            13 => (Opcode::Read, slot, Status::Ok, Some(vec![0; LEN])),
            i if i % 2 == 0 => (Opcode::Write, slot, Status::Ok, None),
            _ => (Opcode::Read, slot, Status::Ok, Some(fill.clone())),
        };
        let r = Request {
            opcode,
            request_id: 9000 + i,
            addr,
            len: LEN as u64,
            proof,
        };
        wire.extend_from_slice(&r.encode());
        if opcode == Opcode::Write {
            wire.extend_from_slice(&fill);
            let split = SPLITS[(i as usize / 2) % SPLITS.len()];
            cuts.push(wire.len().saturating_add_signed(split));
        }
        expected.push((9000 + i, status, data));
    }

    let writer = write_in_pieces(&conn, wire, cuts);
    expect_replies(&mut conn, expected);
    writer.join().unwrap();
    // Every slot written holds its pattern; the refused WRITE's slot holds nothing.
    for k in 0..24u64 {
        let got = p.remote.to_vec(k as usize * LEN, LEN).unwrap();
        match k {
            6 => assert_eq!(got, vec![0; LEN], "the refused WRITE left no trace"),
            k => assert!(got == pattern(k + 1, LEN), "slot {k} holds its WRITE"),
        }
    }
}

/// Peers that close their sending side right after their last request: each is answered, and
/// the target then closes the connection at once, not after its idle timeout. The request and
/// the end of the stream often arrive together before the target reads either, and a receive
/// returning the request's bytes stops just short of the end.
#[test]
fn a_peer_closing_right_after_its_last_request_is_answered_and_let_go() {
    let p = pair(1 << 20);
    let segment = p.initiator.segment(p.segment).unwrap();
    let port = segment.desc().te_rails[0].port;
    for i in 0..32u64 {
        let DataConn(mut conn, proof) = DataConn::open(port, segment.secret());
        let fill = pattern(100 + i, LEN);
        let r = Request {
            opcode: Opcode::Write,
            request_id: i,
            addr: p.remote.addr() + (i % 8) * LEN as u64,
            len: LEN as u64,
            proof,
        };
        let mut wire = r.encode().to_vec();
        wire.extend_from_slice(&fill);
        conn.write_all(&wire).unwrap();
        conn.shutdown(Shutdown::Write).unwrap();
        expect_replies(&mut conn, vec![(i, Status::Ok, None)]);
        let mut rest = Vec::new();
        let end = conn.read_to_end(&mut rest);
        assert!(
            matches!(end, Ok(0)),
            "connection {i}: the target closes it after the reply, not at a timeout: {end:?}"
        );
        assert!(p.remote.to_vec((i % 8) as usize * LEN, LEN).unwrap() == fill);
    }
}
