//! Connections that never authenticate, against a real engine on loopback: idle sockets filling
//! the data listener's cap do not lock an honest peer out (the idlest goes to make room, and an
//! untrusted one is closed after its first-request deadline), and a control frame trickled in
//! is cut off at its deadline, or refused at once when it is larger than an unauthenticated
//! peer may send; a request captured by a listener that a forged descriptor names is worthless
//! on the real data port.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::*;
use te_core::{Opcode, Permission, TransferState};
use te_reactor::EVICT_MIN_IDLE;
use te_testkit::closed_within;

#[test]
fn idle_sockets_at_the_data_cap_do_not_lock_an_honest_peer_out() {
    let mut c = config();
    c.limits.max_data_connections = 16;
    let target = engine_with(c);
    let remote = buffer(1 << 20);
    register(&target, &remote, Permission::RemoteReadWrite);
    let port = target.local_descriptor().te_rails[0].port;
    // Every place taken by sockets that send nothing.
    let mut idle: Vec<TcpStream> = (0..16)
        .map(|_| TcpStream::connect(("127.0.0.1", port)).unwrap())
        .collect();
    std::thread::sleep(EVICT_MIN_IDLE + Duration::from_millis(500));
    let honest = engine();
    let src = buffer(1 << 20);
    src.write_at(0, &pattern(3, 1 << 20)).unwrap();
    register(&honest, &src, Permission::LocalOnly);
    let seg = honest.open_segment(target.segment_name()).unwrap();
    let write = request(Opcode::Write, src.addr(), seg, remote.addr(), 1 << 20);
    assert_eq!(run(&honest, &[write]), TransferState::Completed);
    assert_eq!(remote.to_vec(0, 1 << 20).unwrap(), pattern(3, 1 << 20));
    // The ones not closed to make room go at their first-request deadline.
    let started = Instant::now();
    for (i, s) in idle.iter_mut().enumerate() {
        let left = Duration::from_secs(15).saturating_sub(started.elapsed());
        assert!(closed_within(s, left), "idle socket {i} still open");
    }
}

#[test]
fn a_control_frame_trickled_in_is_cut_off_at_its_deadline() {
    let target = engine();
    let (_, port) = te_core::control::split_host_port(target.segment_name()).unwrap();
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    // A Metadata frame announcing 64 KiB, then its payload a byte a second.
    s.write_all(&(1u64 + 65_536).to_le_bytes()).unwrap();
    s.write_all(&[1u8]).unwrap();
    let started = Instant::now();
    let mut closed = false;
    while started.elapsed() < Duration::from_secs(15) {
        if s.write_all(b"x").is_err() || closed_within(&mut s, Duration::from_secs(1)) {
            closed = true;
            break;
        }
    }
    assert!(closed, "a trickled frame was never cut off");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "cut off after {:?}",
        started.elapsed()
    );
}

#[test]
fn with_a_cluster_secret_a_large_frame_before_authentication_is_refused_at_once() {
    let mut c = config();
    c.cluster_secret = Some(te_core::config::Redacted("attack-test-secret".into()));
    let target = engine_with(c);
    let (_, port) = te_core::control::split_host_port(target.segment_name()).unwrap();
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.write_all(&(1u64 + (1 << 20)).to_le_bytes()).unwrap();
    s.write_all(&[4u8]).unwrap();
    s.write_all(&vec![b'{'; 4096]).unwrap_or(());
    assert!(
        closed_within(&mut s, Duration::from_secs(3)),
        "a 1 MiB frame from an unauthenticated peer was taken"
    );
}

/// A listener that a rewritten descriptor names learns nothing it can replay: the honest
/// initiator's request carries a proof made for that listener's own greeting, never the
/// segment secret, and replayed on the real data port (on a connection of its own) it is
/// refused and writes nothing.
#[test]
fn a_request_captured_by_a_forged_listener_is_refused_on_the_real_port() {
    use te_tcp::wire::{REQUEST_LEN, Request, Status, encode_greeting};

    let p = pair(1 << 20);
    let real = p.initiator.segment(p.segment).unwrap();
    let secret = real.secret();
    let fake = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let mut desc = serde_json::to_value(real.desc()).unwrap();
    desc["te_rails"][0]["port"] = fake.local_addr().unwrap().port().into();
    let (_control, name) = serve_descriptor(desc);
    let captured = std::thread::spawn(move || {
        let (mut s, _) = fake.accept().unwrap();
        s.write_all(&encode_greeting(&[7u8; 16])).unwrap();
        let mut wire = vec![0u8; REQUEST_LEN + 64];
        s.read_exact(&mut wire).unwrap();
        (s, wire)
    });

    let forged = p.initiator.open_segment(&name).unwrap();
    p.local.write_at(0, b"PWNED!!!").unwrap();
    let b = p.initiator.allocate_batch(1).unwrap();
    p.initiator
        .submit(
            b,
            &[request(
                Opcode::Write,
                p.local.addr(),
                forged,
                p.remote.addr(),
                64,
            )],
        )
        .unwrap();
    let (_held, wire) = captured.join().unwrap();
    let header: [u8; REQUEST_LEN] = wire[..REQUEST_LEN].try_into().unwrap();
    let r = Request::decode(&header).unwrap();
    assert_eq!(&wire[REQUEST_LEN..REQUEST_LEN + 8], b"PWNED!!!");
    let raw = secret.to_bytes();
    assert!(
        !wire.windows(raw.len()).any(|w| w == raw),
        "the segment secret never leaves the initiator"
    );
    assert_eq!(r.proof, te_tcp::wire::connection_proof(&secret, &[7u8; 16]));

    // Replayed on the real port, on a connection with its own greeting: refused, nothing written.
    let mut replay = DataConn::open(real.desc().te_rails[0].port, secret);
    assert_ne!(replay.1, r.proof);
    let reply = replay.call(r, &wire[REQUEST_LEN..]);
    assert_eq!(
        reply.status,
        Status::Rejected(te_core::transport::Rejection::BadSecret)
    );
    assert_eq!(p.remote.to_vec(0, 64).unwrap(), vec![0u8; 64]);
    p.initiator.cancel(b).unwrap();
    p.initiator.wait(b, WAIT).unwrap();
    p.initiator.free_batch(b).unwrap();
}
