//! Bad inputs, each with its expected error; after each one a valid transfer still succeeds.
//! Wire-level cases talk to the target's real data and control ports with hand-made bytes.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::*;
use te_core::control::frame::FrameType;
use te_core::transport::Rejection;
use te_core::{Error, Opcode, Permission, TransferState};
use te_tcp::wire::{REPLY_LEN, Reply, Request, Status};

/// A valid WRITE then READ of a fresh pattern must succeed, byte-exact.
fn still_serves(p: &Pair) {
    let data = pattern(rand_seed(), 200_000);
    p.local.write_at(0, &data).unwrap();
    let w = request(
        Opcode::Write,
        p.local.addr(),
        p.segment,
        p.remote.addr(),
        data.len() as u64,
    );
    assert_eq!(run(&p.initiator, &[w]), TransferState::Completed);
    assert!(p.remote.to_vec(0, data.len()).unwrap() == data);
    p.local.write_at(0, &vec![0u8; data.len()]).unwrap();
    let r = request(
        Opcode::Read,
        p.local.addr(),
        p.segment,
        p.remote.addr(),
        data.len() as u64,
    );
    assert_eq!(run(&p.initiator, &[r]), TransferState::Completed);
    assert!(p.local.to_vec(0, data.len()).unwrap() == data);
}

fn rand_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos() as u64
}

fn submit_err(p: &Pair, req: te_core::TransferRequest) -> Error {
    let b = p.initiator.allocate_batch(1).unwrap();
    let err = p.initiator.submit(b, &[req]).unwrap_err();
    p.initiator
        .free_batch(b)
        .expect("nothing was posted, so the batch frees");
    err
}

#[test]
fn request_validation_table() {
    let p = pair(1 << 20);
    let len = 1u64 << 20;
    let (l, r, s) = (p.local.addr(), p.remote.addr(), p.segment);
    type Case = (&'static str, te_core::TransferRequest, fn(&Error) -> bool);
    let cases: Vec<Case> = vec![
        (
            "unregistered source",
            request(Opcode::Write, l + len, s, r, 16),
            |e| matches!(e, Error::AddressNotRegistered { .. }),
        ),
        (
            "source runs past its region",
            request(Opcode::Write, l + len - 8, s, r, 16),
            |e| matches!(e, Error::AddressNotRegistered { .. }),
        ),
        (
            "remote range past the end",
            request(Opcode::Write, l, s, r + len - 8, 16),
            |e| matches!(e, Error::RemoteAddressNotRegistered { .. }),
        ),
        (
            "remote address below the buffer",
            request(Opcode::Read, l, s, r - 1, 16),
            |e| matches!(e, Error::RemoteAddressNotRegistered { .. }),
        ),
        (
            "source addr + len overflows",
            request(Opcode::Write, u64::MAX - 4, s, r, 16),
            |e| matches!(e, Error::InvalidArgument(_)),
        ),
        (
            "remote addr + len overflows",
            request(Opcode::Read, l, s, u64::MAX - 4, 16),
            |e| matches!(e, Error::RemoteAddressNotRegistered { .. }),
        ),
        ("zero length", request(Opcode::Write, l, s, r, 0), |e| {
            matches!(e, Error::InvalidArgument(_))
        }),
        (
            "unknown segment",
            request(Opcode::Write, l, 9999, r, 16),
            |e| matches!(e, Error::UnknownSegment(9999)),
        ),
    ];
    for (name, req, expected) in cases {
        let err = submit_err(&p, req);
        assert!(expected(&err), "{name}: got {err:?}");
        still_serves(&p);
    }
    // A batch with one bad request posts nothing at all.
    let b = p.initiator.allocate_batch(2).unwrap();
    let good = request(Opcode::Write, l, s, r, 16);
    let bad = request(Opcode::Write, l, s, r + len, 16);
    assert!(p.initiator.submit(b, &[good, bad]).is_err());
    assert!(matches!(
        p.initiator.task_status(b, 0),
        Err(Error::InvalidTask { .. })
    ));
    p.initiator.free_batch(b).unwrap();
    // Too many requests for the batch.
    let b = p.initiator.allocate_batch(1).unwrap();
    assert!(matches!(
        p.initiator.submit(b, &[good, good]),
        Err(Error::TooManyRequests {
            capacity: 1,
            requested: 2
        })
    ));
    p.initiator.free_batch(b).unwrap();
    // Opening a segment nobody serves.
    assert!(matches!(
        p.initiator.open_segment("127.0.0.1:1"),
        Err(Error::Metadata(_))
    ));
    assert!(matches!(
        p.initiator.open_segment("127.0.0.1:x"),
        Err(Error::InvalidArgument(_))
    ));
    // A name without a port means MC_HANDSHAKE_PORT (12001), as in Mooncake: nobody serves
    // this one.
    assert!(matches!(
        p.initiator.open_segment("no-such-host.invalid"),
        Err(Error::Metadata(_))
    ));
    still_serves(&p);
}

#[test]
fn batch_handle_misuse() {
    let p = pair(1 << 20);
    let b = p.initiator.allocate_batch(1).unwrap();
    p.initiator.free_batch(b).unwrap();
    let req = request(
        Opcode::Write,
        p.local.addr(),
        p.segment,
        p.remote.addr(),
        16,
    );
    assert!(
        matches!(
            p.initiator.submit(b, &[req]),
            Err(Error::InvalidBatch { .. })
        ),
        "stale handle"
    );
    assert!(matches!(
        p.initiator.batch_status(b),
        Err(Error::InvalidBatch { .. })
    ));
    assert!(
        matches!(p.initiator.free_batch(b), Err(Error::InvalidBatch { .. })),
        "double free"
    );
    let foreign = p.target.allocate_batch(1).unwrap();
    assert!(
        matches!(
            p.initiator.free_batch(foreign),
            Err(Error::InvalidBatch { .. })
        ),
        "foreign handle"
    );
    assert!(matches!(
        p.initiator.allocate_batch(0),
        Err(Error::InvalidArgument(_))
    ));
    still_serves(&p);
}

#[test]
fn permissions_are_enforced_on_both_sides() {
    let p = pair(1 << 20);
    let read_only = buffer(1 << 16);
    let local_only = buffer(1 << 16);
    read_only.write_at(0, &[7u8; 64]).unwrap();
    local_only.write_at(0, &[9u8; 64]).unwrap();
    register(&p.target, &read_only, Permission::RemoteRead);
    register(&p.target, &local_only, Permission::LocalOnly);
    p.initiator.close_segment(p.segment).unwrap();
    let seg = p.initiator.open_segment(p.target.segment_name()).unwrap();
    let p = Pair { segment: seg, ..p };
    // Initiator side: the descriptor says what is allowed.
    let w = request(Opcode::Write, p.local.addr(), seg, read_only.addr(), 64);
    assert!(
        matches!(submit_err(&p, w), Error::PermissionDenied { .. }),
        "write to a read-only buffer"
    );
    let r = request(Opcode::Read, p.local.addr(), seg, local_only.addr(), 64);
    assert!(
        matches!(submit_err(&p, r), Error::RemoteAddressNotRegistered { .. }),
        "local-only is not published"
    );
    let r = request(Opcode::Read, p.local.addr(), seg, read_only.addr(), 64);
    assert_eq!(run(&p.initiator, &[r]), TransferState::Completed);
    assert_eq!(p.local.to_vec(0, 64).unwrap(), vec![7u8; 64]);
    still_serves(&p);

    // Target side: hand-made requests with the right secret are still refused.
    let target = p.initiator.segment(seg).unwrap();
    let port = target.desc().te_rails[0].port;
    let mut conn = DataConn::open(port, target.secret());
    let proof = conn.1;
    // The secret itself is no proof; nor is another connection's proof.
    let raw = target.secret().to_bytes();
    let other = DataConn::open(port, target.secret()).1;
    assert_ne!(raw, proof, "the header never carries the secret");
    assert_ne!(other, proof, "each connection has its own proof");
    let cases = [
        (
            Opcode::Write,
            read_only.addr(),
            proof,
            Rejection::PermissionDenied,
        ),
        (
            Opcode::Read,
            local_only.addr(),
            proof,
            Rejection::PermissionDenied,
        ),
        (
            Opcode::Write,
            local_only.addr(),
            proof,
            Rejection::PermissionDenied,
        ),
        (
            Opcode::Read,
            p.remote.addr(),
            [0u8; 16],
            Rejection::BadSecret,
        ),
        (
            Opcode::Write,
            p.remote.addr(),
            [1u8; 16],
            Rejection::BadSecret,
        ),
        (Opcode::Write, p.remote.addr(), raw, Rejection::BadSecret),
        (Opcode::Read, p.remote.addr(), other, Rejection::BadSecret),
        (
            Opcode::Read,
            p.remote.addr() + (1 << 20) - 8,
            proof,
            Rejection::OutOfBounds,
        ),
        (Opcode::Write, 0x1000, proof, Rejection::OutOfBounds),
    ];
    let before_remote = p.remote.to_vec(0, 64).unwrap();
    for (i, (op, addr, proof, want)) in cases.into_iter().enumerate() {
        let reply = conn.call(
            Request {
                opcode: op,
                request_id: i as u64 + 1,
                addr,
                len: 64,
                proof,
            },
            &[0xab; 64],
        );
        assert_eq!(
            reply,
            Reply {
                status: Status::Rejected(want),
                request_id: i as u64 + 1
            },
            "case {i}"
        );
    }
    assert_eq!(
        read_only.to_vec(0, 64).unwrap(),
        vec![7u8; 64],
        "read-only buffer untouched"
    );
    assert_eq!(
        local_only.to_vec(0, 64).unwrap(),
        vec![9u8; 64],
        "local-only buffer untouched"
    );
    assert_eq!(
        p.remote.to_vec(0, 64).unwrap(),
        before_remote,
        "wrong-secret write touched nothing"
    );
    // The same connection still serves a valid request afterwards.
    let ok = conn.call(
        Request {
            opcode: Opcode::Write,
            request_id: 99,
            addr: p.remote.addr(),
            len: 64,
            proof,
        },
        &[0xcd; 64],
    );
    assert_eq!(ok.status, Status::Ok);
    assert_eq!(p.remote.to_vec(0, 64).unwrap(), vec![0xcd; 64]);
    still_serves(&p);
}

#[test]
fn garbage_on_the_data_and_control_ports() {
    let cfg = config();
    let initiator = engine();
    let target = engine_with_tcp(cfg, tcp(|t| t.status_timeout = Duration::from_secs(1)));
    let local = buffer(1 << 20);
    let remote = buffer(1 << 20);
    register(&initiator, &local, Permission::LocalOnly);
    register(&target, &remote, Permission::RemoteReadWrite);
    let segment = initiator.open_segment(target.segment_name()).unwrap();
    let p = Pair {
        initiator,
        target,
        local,
        remote,
        segment,
    };
    let desc = p.initiator.segment(segment).unwrap();
    let port = desc.desc().te_rails[0].port;

    // A peer that connects and goes silent on each port holds nobody up.
    let _silent_data = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let (chost, cport) = te_core::control::split_host_port(p.target.segment_name()).unwrap();
    let _silent_control = TcpStream::connect((chost.as_str(), cport)).unwrap();
    still_serves(&p);

    // Each case on a connection of its own, its headers carrying that connection's proof.
    let header = |len: u64, proof: [u8; 16]| {
        Request {
            opcode: Opcode::Write,
            request_id: 1,
            addr: p.remote.addr(),
            len,
            proof,
        }
        .encode()
    };
    type Case<'a> = (&'a str, Box<dyn Fn([u8; 16]) -> Vec<u8> + 'a>);
    let data_cases: Vec<Case> = vec![
        (
            "garbage",
            Box::new(|_| b"GET / HTTP/1.1\r\nHost: x\r\n\r\n garbage garbage garbage".to_vec()),
        ),
        (
            "bad magic",
            Box::new(|proof| {
                let mut h = header(8, proof);
                h[0] = b'X';
                h.to_vec()
            }),
        ),
        (
            "reserved bytes set",
            Box::new(|proof| {
                let mut h = header(8, proof);
                h[6] = 1;
                h.to_vec()
            }),
        ),
        (
            "oversized length",
            Box::new(|proof| header(u64::MAX, proof).to_vec()),
        ),
        (
            "truncated header, then silence",
            Box::new(|proof| header(8, proof)[..20].to_vec()),
        ),
        (
            "header without its body, then silence",
            Box::new(|proof| header(64, proof).to_vec()),
        ),
    ];
    for (name, bytes) in data_cases {
        let before = p.remote.to_vec(0, 64).unwrap();
        let conn = DataConn::open(port, desc.secret());
        let bytes = bytes(conn.1);
        assert!(conn.closes_after(&bytes), "data port: {name}");
        assert_eq!(
            p.remote.to_vec(0, 64).unwrap(),
            before,
            "{name}: memory untouched"
        );
        still_serves(&p);
    }
    // A Mooncake initiator reaching te's own data port (it takes te's greeting for a failed
    // status): an acknowledged-framing WRITE (header and an 8-byte body, shorter than te's
    // header) is answered at once with Mooncake's refusal
    // status, and nothing is written; an unacknowledged one gets te's Malformed reply and a
    // close. Neither waits for bytes that will never come.
    for acked in [true, false] {
        let mooncake = te_tcp::wire::mooncake::Header {
            opcode: Opcode::Write,
            addr: p.remote.addr(),
            size: 8,
            acked,
        };
        let before = p.remote.to_vec(0, 64).unwrap();
        let mut conn = DataConn::open(port, desc.secret());
        conn.0.write_all(&mooncake.encode()).unwrap();
        conn.0.write_all(&[0xee; 8]).unwrap();
        let mut answer = Vec::new();
        let _ = conn.0.read_to_end(&mut answer);
        if acked {
            assert_eq!(
                answer,
                te_tcp::wire::mooncake::encode_status(te_tcp::wire::mooncake::STATUS_REJECTED)
            );
        } else {
            let reply = Reply::decode(answer[..REPLY_LEN].try_into().unwrap()).unwrap();
            assert_eq!(reply.status, Status::Rejected(Rejection::Malformed));
        }
        assert_eq!(p.remote.to_vec(0, 64).unwrap(), before, "memory untouched");
        still_serves(&p);
    }
    // An oversized write to a bad address is refused, its body not drained: the connection closes.
    let mut conn = DataConn::open(port, desc.secret());
    let proof = conn.1;
    let r = Request {
        opcode: Opcode::Write,
        request_id: 5,
        addr: 0x10,
        len: 1 << 30,
        proof,
    };
    conn.0.write_all(&r.encode()).unwrap();
    let mut head = [0u8; REPLY_LEN];
    conn.0.read_exact(&mut head).unwrap();
    assert_eq!(
        Reply::decode(&head).unwrap().status,
        Status::Rejected(Rejection::OutOfBounds)
    );
    assert!(conn.closes_after(&[]));

    let frame = |len: u64, kind: u8, payload: &[u8]| {
        let mut v = len.to_le_bytes().to_vec();
        v.push(kind);
        v.extend_from_slice(payload);
        v
    };
    let control_cases: Vec<(&str, Vec<u8>)> = vec![
        (
            "garbage",
            b"\xff\xfe garbage that is not a frame at all".to_vec(),
        ),
        ("oversized length", frame(u64::MAX, 1, b"")),
        ("over the handshake limit", frame((1 << 20) + 2, 1, b"")),
        ("unknown type", frame(3, 42, b"{}")),
        ("empty frame", frame(0, 0, b"")),
        ("truncated frame", frame(100, 1, b"{\"a\"")),
    ];
    for (name, bytes) in control_cases {
        let mut s = TcpStream::connect((chost.as_str(), cport)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
        s.write_all(&bytes).unwrap();
        let mut sink = [0u8; 64];
        let closed = matches!(s.read(&mut sink), Ok(0) | Err(_));
        assert!(closed, "control port: {name}");
        assert_eq!(
            p.initiator.probe(p.target.segment_name()),
            te_core::PeerLiveness::Alive,
            "{name}"
        );
        still_serves(&p);
    }
    // An untyped frame (Mooncake before the type byte: length, then JSON) is an endpoint
    // handshake, answered untyped; this TCP-only engine has no endpoint to offer.
    let mut s = TcpStream::connect((chost.as_str(), cport)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    let old = br#"{"local_nic_path":"a@x","peer_nic_path":"b@y","qp_num":[1]}"#;
    s.write_all(&(old.len() as u64).to_le_bytes()).unwrap();
    s.write_all(old).unwrap();
    let mut len = [0u8; 8];
    s.read_exact(&mut len).unwrap();
    let mut answer = vec![0u8; u64::from_le_bytes(len) as usize];
    s.read_exact(&mut answer).unwrap();
    let answer: serde_json::Value = serde_json::from_slice(&answer).expect("JSON, no type byte");
    assert!(
        answer["reply_msg"]
            .as_str()
            .unwrap()
            .contains("no transport")
    );
    // A malformed notification is answered with an error, and the next one is delivered.
    let refused = te_core::control::request(
        &chost,
        cport,
        FrameType::Notify,
        b"{\"nope\":1}",
        Duration::from_secs(5),
        4096,
        None,
    )
    .unwrap_err();
    assert!(
        matches!(&refused, te_core::Error::PeerRefused { reason, .. } if reason.contains("malformed notification")),
        "{refused:?}"
    );
    let n = te_core::Notification {
        name: "a".into(),
        notify_msg: "b".into(),
    };
    p.initiator
        .send_notify(p.target.segment_name(), &n)
        .unwrap();
    assert_eq!(p.target.next_notify(WAIT).map(|r| r.notification), Some(n));
}

#[test]
fn in_flight_batches_and_regions_cannot_be_freed_and_cancel_drains_them() {
    let mut cfg = config();
    cfg.retry_cnt = 1;
    let e = engine_with_tcp(cfg, tcp(|t| t.status_timeout = Duration::from_secs(2)));
    let local = buffer(8 << 20);
    register(&e, &local, Permission::LocalOnly);
    let (_control, name, _blackhole) = silent_segment(8 << 20);
    let seg = e.open_segment(&name).unwrap();

    let b = e.allocate_batch(1).unwrap();
    e.submit(
        b,
        &[request(Opcode::Write, local.addr(), seg, 4096, 8 << 20)],
    )
    .unwrap();
    assert!(
        matches!(e.free_batch(b), Err(Error::BatchBusy(_))),
        "free while in flight"
    );
    assert!(
        matches!(
            e.unregister_memory(local.addr()),
            Err(Error::RegionBusy { .. })
        ),
        "unregister while in flight"
    );
    assert!(matches!(
        e.wait(b, Duration::from_millis(100)),
        Err(Error::WaitTimeout(_))
    ));
    e.cancel(b).unwrap();
    let s = e.wait(b, WAIT).unwrap();
    assert_eq!(
        s.state,
        TransferState::Canceled,
        "nothing can succeed against a silent peer"
    );
    assert_eq!(s.transferred_bytes, 0);
    e.free_batch(b).unwrap();

    // Without cancel, a silent peer fails the task after the status timeout and one retry.
    let b = e.allocate_batch(1).unwrap();
    e.submit(b, &[request(Opcode::Read, local.addr(), seg, 4096, 4096)])
        .unwrap();
    let s = e.wait(b, WAIT).unwrap();
    assert_eq!(s.state, TransferState::Failed);
    assert!(matches!(
        e.task_error(b, 0).unwrap(),
        Some(te_core::transport::SliceError::Path(_))
    ));
    e.free_batch(b).unwrap();
    e.unregister_memory(local.addr())
        .expect("no slice holds the region any more");
}

/// A connection of our own to the target's data port, and the proof its requests carry.
fn raw_data_connection(p: &Pair) -> (DataConn, [u8; 16]) {
    let desc = p.initiator.segment(p.segment).unwrap();
    let port = desc.desc().te_rails[0].port;
    let conn = DataConn::open(port, desc.secret());
    let proof = conn.1;
    (conn, proof)
}

#[test]
fn pipelined_requests_with_a_refusal_among_them_are_answered_in_order() {
    let p = pair(1 << 20);
    let (mut conn, proof) = raw_data_connection(&p);
    let mut wire = Vec::new();
    let mut expected = Vec::new();
    for i in 0..64u64 {
        let (addr, want) = if i == 17 {
            (0x10, Status::Rejected(Rejection::OutOfBounds))
        } else {
            (p.remote.addr() + i * 100, Status::Ok)
        };
        let r = Request {
            opcode: Opcode::Write,
            request_id: 1000 + i,
            addr,
            len: 100,
            proof,
        };
        wire.extend_from_slice(&r.encode());
        wire.extend_from_slice(&[i as u8; 100]);
        expected.push(Reply {
            status: want,
            request_id: 1000 + i,
        });
    }
    // A READ at the end: its data follows every earlier reply.
    let r = Request {
        opcode: Opcode::Read,
        request_id: 7,
        addr: p.remote.addr() + 300,
        len: 100,
        proof,
    };
    wire.extend_from_slice(&r.encode());
    conn.0.write_all(&wire).unwrap();
    for want in expected {
        let mut head = [0u8; REPLY_LEN];
        conn.0.read_exact(&mut head).unwrap();
        assert_eq!(Reply::decode(&head).unwrap(), want);
    }
    let mut head = [0u8; REPLY_LEN];
    conn.0.read_exact(&mut head).unwrap();
    assert_eq!(
        Reply::decode(&head).unwrap(),
        Reply {
            status: Status::Ok,
            request_id: 7
        }
    );
    let mut data = [0u8; 100];
    conn.0.read_exact(&mut data).unwrap();
    assert_eq!(
        data, [3u8; 100],
        "the READ sees the WRITE before it on the same connection"
    );
    assert_eq!(
        p.remote.to_vec(17 * 100, 100).unwrap(),
        vec![0u8; 100],
        "refused write left no trace"
    );
    still_serves(&p);
}

/// Small requests taken in bulk (many per receive call) and READs answered in bulk (replies and
/// data gathered per send call): WRITEs, READs of what earlier WRITEs on the same connection
/// put there, a refused READ and a refused WRITE (its body dropped) mixed, sent in uneven
/// pieces so requests straddle the target's receives; every reply in order, every byte checked.
#[test]
fn small_reads_and_writes_taken_in_bulk_are_answered_in_order_with_their_data() {
    let p = pair(1 << 20);
    let (mut conn, proof) = raw_data_connection(&p);
    let mut wire = Vec::new();
    // (request id, status, data a READ returns)
    let mut expected: Vec<Expected> = Vec::new();
    let len = 300u64;
    for i in 0..240u64 {
        let slot = p.remote.addr() + (i / 2) * len;
        let fill = vec![(i / 2) as u8 ^ 0x5a; len as usize];
        let (opcode, addr, status, data) = match i {
            // A READ out of bounds, and a WRITE out of bounds (its body is dropped).
            101 => (
                Opcode::Read,
                0x10,
                Status::Rejected(Rejection::OutOfBounds),
                None,
            ),
            150 => (
                Opcode::Write,
                0x10,
                Status::Rejected(Rejection::OutOfBounds),
                None,
            ),
            // The READ of the slot the refused WRITE did not write: never written.
            151 => (Opcode::Read, slot, Status::Ok, Some(vec![0; len as usize])),
            // Even: write the slot; odd: read it back.
            i if i % 2 == 0 => (Opcode::Write, slot, Status::Ok, None),
            _ => (Opcode::Read, slot, Status::Ok, Some(fill.clone())),
        };
        let r = Request {
            opcode,
            request_id: 5000 + i,
            addr,
            len,
            proof,
        };
        wire.extend_from_slice(&r.encode());
        if opcode == Opcode::Write {
            wire.extend_from_slice(&fill);
        }
        expected.push((5000 + i, status, data));
    }
    // Uneven pieces, so headers and bodies straddle the target's receives.
    let writer = {
        let mut s = conn.0.try_clone().unwrap();
        std::thread::spawn(move || {
            for piece in wire.chunks(3001) {
                s.write_all(piece).unwrap();
                std::thread::sleep(std::time::Duration::from_micros(200));
            }
        })
    };
    expect_replies(&mut conn.0, expected);
    writer.join().unwrap();
    assert_eq!(
        p.remote.to_vec(75 * len as usize, len as usize).unwrap(),
        vec![0u8; len as usize],
        "refused write left no trace"
    );
    still_serves(&p);
}
