//! The outbox's order and accounting: what it sends, however the socket cuts its sends, is the
//! replies in order with each READ's data right after its reply.
#![allow(unsafe_code)] // reads the parts the outbox offers, as the kernel would

use std::io::Read;

use te_core::memory::{Region, RegionTable};
use te_core::transport::Rejection;
use te_core::{Location, Permission};

use super::*;

/// A registered region over `data` (kept alive by the test), to pin READs in.
fn regions(data: &[u8]) -> RegionTable {
    let table = RegionTable::new();
    let region = Region::new(
        data.as_ptr() as u64,
        data.len() as u64,
        Location::Cpu(0),
        Permission::RemoteReadWrite,
        None,
    );
    table.insert_all(vec![region]).expect("register");
    table
}

/// `n` bytes that differ from their neighbours.
fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 7 + i / 251) as u8).collect()
}

/// Queues `reads` (id, offset in `data`, length) in `outbox`, every id that is 4 modulo 5 as a
/// refusal instead, and returns the stream a peer must then receive.
fn fill(
    outbox: &mut Outbox,
    table: &RegionTable,
    data: &[u8],
    reads: &[(u64, usize, usize)],
) -> Vec<u8> {
    let mut expected = Vec::new();
    for &(id, at, len) in reads {
        match id % 5 {
            // A refusal between READs.
            4 => {
                let status = Status::Rejected(Rejection::OutOfBounds);
                outbox.reply(id, status);
                expected.extend_from_slice(
                    &Reply {
                        status,
                        request_id: id,
                    }
                    .encode(),
                );
            }
            _ => {
                let addr = data.as_ptr() as u64 + at as u64;
                // A READ of no bytes holds the region as any other (a pin needs a byte).
                let pin = table.pin_local(addr, len.max(1) as u64).expect("pin");
                outbox.read(id, pin, addr, len);
                expected.extend_from_slice(
                    &Reply {
                        status: Status::Ok,
                        request_id: id,
                    }
                    .encode(),
                );
                expected.extend_from_slice(&data[at..at + len]);
            }
        }
    }
    expected
}

/// Takes what the outbox offers, `cuts` bytes at a time in turn (as a socket that takes only
/// part of each send would), until it has nothing left; what was taken, in order.
fn take_all(outbox: &mut Outbox, cuts: &[usize]) -> Vec<u8> {
    let mut taken = Vec::new();
    for cut in cuts.iter().cycle() {
        let mut parts = [SendPart::EMPTY; MAX_PARTS + 1];
        let n = outbox
            .next_parts(&mut parts)
            .expect("every READ inside its region");
        if n == 0 {
            outbox.advance(0);
            if outbox.reads.is_empty() {
                return taken;
            }
            continue;
        }
        let mut room = *cut;
        let mut took = 0;
        for part in &parts[..n] {
            let k = part.len().min(room);
            // SAFETY: every part lies in the outbox's replies or in the test's `data`, both
            // alive and unchanged while the outbox holds them.
            taken.extend_from_slice(unsafe {
                std::slice::from_raw_parts(part.addr() as *const u8, k)
            });
            room -= k;
            took += k;
            if room == 0 {
                break;
            }
        }
        outbox.advance(took);
    }
    unreachable!("cycle() never ends")
}

#[test]
fn replies_and_read_data_go_out_in_order_however_the_sends_are_cut() {
    let data = pattern(1 << 20);
    let table = regions(&data);
    // READs of 0, 1, a few and many bytes, refusals among them, more than one send's parts.
    let reads: Vec<(u64, usize, usize)> = (1..=600u64)
        .map(|id| {
            let len = [0, 1, 17, 4096, 70_000, 3][id as usize % 6];
            (id, (id as usize * 1_237) % (data.len() - 70_000), len)
        })
        .collect();
    // Whole sends; a byte less than a reply; pieces that end inside replies and data alike.
    for cuts in [
        &[usize::MAX][..],
        &[15],
        &[7, 100_000, 3],
        &[24, 25, 65_536],
    ] {
        let mut outbox = Outbox::default();
        let expected = fill(&mut outbox, &table, &data, &reads);
        assert!(
            outbox.reads() > MAX_PARTS,
            "more READs than one send carries"
        );
        let queued: usize = reads.iter().filter(|r| r.0 % 5 != 4).map(|r| r.2).sum();
        assert_eq!(outbox.read_bytes(), queued);
        let taken = take_all(&mut outbox, cuts);
        assert!(taken == expected, "the stream differs with cuts {cuts:?}");
        assert_eq!(
            (outbox.waiting(), outbox.reads(), outbox.read_bytes()),
            (0, 0, 0),
            "everything accounted as sent"
        );
    }
}

#[test]
fn a_read_is_let_go_once_its_data_is_out_and_not_before() {
    let data = pattern(4096);
    let table = regions(&data);
    let mut outbox = Outbox::default();
    let addr = data.as_ptr() as u64;
    outbox.read(9, table.pin_local(addr, 100).expect("pin"), addr, 100);
    outbox.read(10, table.pin_local(addr, 1).expect("pin"), addr, 0);
    let region = table.snapshot().pop().expect("region");
    assert_eq!(region.pins(), 2, "both READs hold the region");
    // The first reply and all but the last byte of its data.
    outbox.advance(crate::wire::REPLY_LEN + 99);
    assert_eq!((outbox.reads(), outbox.read_bytes()), (2, 1));
    assert_eq!(
        region.pins(),
        2,
        "a byte of the first READ's data is still to go"
    );
    outbox.advance(1);
    assert_eq!(outbox.reads(), 1, "the first READ is out");
    assert_eq!(region.pins(), 1, "and its pin let go");
    // The empty READ is out as soon as its reply is.
    outbox.advance(crate::wire::REPLY_LEN);
    assert_eq!((outbox.reads(), outbox.waiting()), (0, 0));
    assert_eq!(region.pins(), 0);
}

#[test]
fn a_flush_over_a_socket_delivers_every_byte_in_order() {
    let data = pattern(8 << 20);
    let table = regions(&data);
    let reads: Vec<(u64, usize, usize)> = (1..=400u64)
        .map(|id| {
            (
                id,
                (id as usize * 4_099) % (data.len() - 65_536),
                [65_536, 0, 48, 9_000][id as usize % 4],
            )
        })
        .collect();
    let mut outbox = Outbox::default();
    let expected = fill(&mut outbox, &table, &data, &reads);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let peer = std::net::TcpStream::connect(listener.local_addr().expect("addr")).expect("connect");
    let (sender, _) = listener.accept().expect("accept");
    sender.set_nonblocking(true).expect("nonblocking");
    let sender = mio::net::TcpStream::from_std(sender);
    let want = expected.len();
    let reader = std::thread::spawn(move || {
        let mut got = vec![0u8; want];
        let mut peer = peer;
        // Slowly at first, so the sends find the socket full.
        std::thread::sleep(std::time::Duration::from_millis(50));
        peer.read_exact(&mut got).expect("read");
        got
    });
    let mut sends = 0;
    let mut blocked = 0;
    loop {
        match outbox.flush(&sender, || sends += 1) {
            Flush::Done => break,
            Flush::Blocked => {
                blocked += 1;
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            Flush::Failed => panic!("the socket failed"),
        }
    }
    let got = reader.join().expect("reader");
    assert!(got == expected, "the peer received the stream in order");
    assert!(
        blocked > 0,
        "the socket filled at least once ({sends} sends)"
    );
    assert_eq!(
        (outbox.waiting(), outbox.reads(), outbox.read_bytes()),
        (0, 0, 0)
    );
}
