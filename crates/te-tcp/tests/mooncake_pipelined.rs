//! te's listener for Mooncake initiators (`MC_TE_MOONCAKE_COMPAT=1`) with hand-made requests in
//! Mooncake's framing, written in pieces that end where the target's receives could go wrong:
//! a WRITE body's last piece arrives with the next header, with part of it, or alone; a body
//! arrives in parts. Every status must come in order and every byte must land where it was
//! sent, in the acknowledged framing and the unacknowledged one; and a peer that closes its
//! side right after its last request is answered and let go at once.

mod common;

use std::io::{Read, Write};
use std::net::Shutdown;
use std::time::Duration;

use common::*;
use te_core::{Opcode, Permission, TransferEngine};
use te_tcp::wire::mooncake::HEADER_LEN;

/// One body shorter than the listener's 64 KiB receive piece, one longer (received in pieces,
/// the last with the next header).
const LENS: [usize; 2] = [20_000, 150_000];
/// Where the pieces end, relative to a WRITE's body end, cycling: the next header's first bytes
/// come with the body, all of it, none of it, or the body's last part comes on its own.
const SPLITS: [isize; 4] = [10, HEADER_LEN as isize, 0, -5_000];
/// Bytes between slots.
const SLOT: usize = 256 << 10;

/// A target with the opt-in; with `v1`, Mooncake's unacknowledged framing is taken too.
fn target(v1: bool) -> TransferEngine {
    let v1 = if v1 { "1" } else { "0" };
    engine_with(compat_config(&[("MC_TE_MOONCAKE_ALLOW_V1", v1)]))
}

fn header(opcode: Opcode, addr: u64, size: usize, acked: bool) -> [u8; HEADER_LEN] {
    mooncake_header(opcode, addr, size as u64, acked)
}

/// Requests of the acknowledged framing: even ones WRITE a slot, odd ones READ it back.
#[test]
fn acknowledged_requests_split_around_their_headers_are_answered_in_order() {
    let t = target(false);
    let mem = buffer(24 * SLOT);
    register(&t, &mem, Permission::RemoteReadWrite);
    let mut s = connect_compat(&t);
    let (mut wire, mut cuts, mut expected) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..48usize {
        let (k, len) = (i / 2, LENS[(i / 2) % LENS.len()]);
        let addr = mem.addr() + (k * SLOT) as u64;
        let fill = pattern(k as u64 + 1, len);
        match i % 2 {
            0 => {
                wire.extend_from_slice(&header(Opcode::Write, addr, len, true));
                wire.extend_from_slice(&fill);
                cuts.push(
                    wire.len()
                        .saturating_add_signed(SPLITS[(k / 2) % SPLITS.len()]),
                );
                expected.push(None);
            }
            _ => {
                wire.extend_from_slice(&header(Opcode::Read, addr, len, true));
                expected.push(Some(fill));
            }
        }
    }
    let writer = write_in_pieces(&s, wire, cuts);
    for (i, data) in expected.into_iter().enumerate() {
        expect_mooncake_ok(&mut s, data.as_deref(), &format!("request {i}"));
    }
    writer.join().unwrap();
    for k in 0..24usize {
        let len = LENS[k % LENS.len()];
        let got = mem.to_vec(k * SLOT, len).unwrap();
        assert!(
            got == pattern(k as u64 + 1, len),
            "slot {k} holds its WRITE"
        );
    }
}

/// WRITEs of the unacknowledged framing (allowed) pipelined in pieces, no status between them;
/// an acknowledged READ of each slot afterwards returns what was written.
#[test]
fn unacknowledged_writes_split_around_their_headers_all_land() {
    let t = target(true);
    let mem = buffer(24 * SLOT);
    register(&t, &mem, Permission::RemoteReadWrite);
    let mut s = connect_compat(&t);
    let (mut wire, mut cuts) = (Vec::new(), Vec::new());
    for k in 0..24usize {
        let len = LENS[k % LENS.len()];
        wire.extend_from_slice(&header(
            Opcode::Write,
            mem.addr() + (k * SLOT) as u64,
            len,
            false,
        ));
        wire.extend_from_slice(&pattern(k as u64 + 50, len));
        cuts.push(wire.len().saturating_add_signed(SPLITS[k % SPLITS.len()]));
    }
    write_in_pieces(&s, wire, cuts).join().unwrap();
    for k in 0..24usize {
        let len = LENS[k % LENS.len()];
        s.write_all(&header(
            Opcode::Read,
            mem.addr() + (k * SLOT) as u64,
            len,
            true,
        ))
        .unwrap();
        let written = pattern(k as u64 + 50, len);
        expect_mooncake_ok(&mut s, Some(&written), &format!("READ of slot {k}"));
    }
}

/// Peers that close their sending side right after their last request: each is answered, and
/// the target then closes the connection at once, not after its idle timeout. The request and
/// the end of the stream often arrive together before the target reads either, and a receive
/// returning the request's last bytes stops just short of the end.
#[test]
fn a_peer_closing_right_after_its_last_request_is_answered_and_let_go() {
    let t = target(false);
    let mem = buffer(8 * SLOT);
    register(&t, &mem, Permission::RemoteReadWrite);
    for i in 0..32usize {
        let mut s = connect_compat(&t);
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let len = LENS[i % LENS.len()];
        let fill = pattern(100 + i as u64, len);
        let addr = mem.addr() + ((i % 8) * SLOT) as u64;
        let mut wire = header(Opcode::Write, addr, len, true).to_vec();
        wire.extend_from_slice(&fill);
        s.write_all(&wire).unwrap();
        s.shutdown(Shutdown::Write).unwrap();
        expect_mooncake_ok(&mut s, None, &format!("connection {i}"));
        let mut rest = Vec::new();
        let end = s.read_to_end(&mut rest);
        assert!(
            matches!(end, Ok(0)),
            "connection {i}: the target closes it after the status, not at a timeout: {end:?}"
        );
        assert!(mem.to_vec((i % 8) * SLOT, len).unwrap() == fill);
    }
}
