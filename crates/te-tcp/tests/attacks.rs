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

/// Sockets that never say anything, fresh (not idle for long), fill the data listener's cap:
/// an honest peer proves itself on its first request and is served at once, the strangers
/// making room, and keeps its place while more strangers come.
#[test]
fn fresh_idle_sockets_at_the_data_cap_make_room_for_an_honest_peer_at_once() {
    let mut c = config();
    c.limits.max_data_connections = 200;
    let target = engine_with(c);
    let remote = buffer(1 << 20);
    register(&target, &remote, Permission::RemoteReadWrite);
    let port = target.local_descriptor().te_rails[0].port;
    let _idle: Vec<TcpStream> = (0..200)
        .map(|_| TcpStream::connect(("127.0.0.1", port)).unwrap())
        .collect();
    let honest = engine();
    let src = buffer(1 << 20);
    src.write_at(0, &pattern(5, 1 << 20)).unwrap();
    register(&honest, &src, Permission::LocalOnly);
    let seg = honest.open_segment(target.segment_name()).unwrap();
    let write = request(Opcode::Write, src.addr(), seg, remote.addr(), 1 << 20);
    let started = Instant::now();
    assert_eq!(run(&honest, &[write]), TransferState::Completed);
    assert!(
        started.elapsed() < EVICT_MIN_IDLE,
        "served at once, not once the strangers had idled: {:?}",
        started.elapsed()
    );
    assert_eq!(remote.to_vec(0, 1 << 20).unwrap(), pattern(5, 1 << 20));
    // More strangers: they take each other's places, never the honest peer's.
    let _more: Vec<TcpStream> = (0..300)
        .map(|_| TcpStream::connect(("127.0.0.1", port)).unwrap())
        .collect();
    src.write_at(0, &pattern(6, 1 << 20)).unwrap();
    assert_eq!(run(&honest, &[write]), TransferState::Completed);
    assert_eq!(remote.to_vec(0, 1 << 20).unwrap(), pattern(6, 1 << 20));
}

/// A stranger on this very host is a stranger: its sockets from 127.0.0.1 are held to the
/// per-source cap like any address's, and an honest local peer still gets in.
#[test]
fn a_local_stranger_is_held_to_the_per_source_cap() {
    let mut c = config();
    c.limits.max_data_connections_per_address = 8;
    c.limits.max_control_connections_per_address = 8;
    let target = engine_with(c);
    let remote = buffer(1 << 16);
    register(&target, &remote, Permission::RemoteReadWrite);
    let port = target.local_descriptor().te_rails[0].port;
    let (_, control) = te_core::control::split_host_port(target.segment_name()).unwrap();
    let mut held: Vec<TcpStream> = (0..40)
        .flat_map(|_| {
            [
                TcpStream::connect(("127.0.0.1", port)).unwrap(),
                TcpStream::connect(("127.0.0.1", control)).unwrap(),
            ]
        })
        .collect();
    let honest = engine();
    let src = buffer(1 << 16);
    src.write_at(0, &pattern(9, 1 << 16)).unwrap();
    register(&honest, &src, Permission::LocalOnly);
    let seg = honest.open_segment(target.segment_name()).unwrap();
    let write = request(Opcode::Write, src.addr(), seg, remote.addr(), 1 << 16);
    let b = honest.allocate_batch(1).unwrap();
    honest.submit(b, &[write]).unwrap();
    let state = honest.wait(b, WAIT).unwrap().state;
    let why = honest.task_error(b, 0).unwrap();
    assert_eq!(state, TransferState::Completed, "{why:?}");
    honest.free_batch(b).unwrap();
    assert_eq!(remote.to_vec(0, 1 << 16).unwrap(), pattern(9, 1 << 16));
    // Of the stranger's 80 sockets, the listeners kept at most their caps.
    let open = held
        .iter_mut()
        .map(|s| closed_within(s, Duration::from_millis(20)))
        .filter(|closed| !closed)
        .count();
    assert!(open <= 16, "{open} of the stranger's sockets still held");
}

/// At the cap, held by peers that proved themselves, a newcomer is refused; its slices are
/// retried after a backoff (its rail not charged), and go through as soon as a place frees.
#[test]
fn a_peer_refused_at_the_cap_retries_and_gets_in_when_a_place_frees() {
    let mut c = config();
    c.limits.max_data_connections = 1;
    let target = engine_with(c);
    let remote = buffer(1 << 16);
    register(&target, &remote, Permission::RemoteReadWrite);
    let one_lane = || engine_with_tcp(config(), tcp(|t| t.lanes_per_peer = 1));
    let first = one_lane();
    let src = buffer(1 << 16);
    register(&first, &src, Permission::LocalOnly);
    let seg = first.open_segment(target.segment_name()).unwrap();
    let w = request(Opcode::Write, src.addr(), seg, remote.addr(), 1 << 16);
    assert_eq!(run(&first, &[w]), TransferState::Completed);
    let second = one_lane();
    let other = buffer(1 << 16);
    other.write_at(0, &pattern(4, 1 << 16)).unwrap();
    register(&second, &other, Permission::LocalOnly);
    let seg2 = second.open_segment(target.segment_name()).unwrap();
    let releaser = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        drop(first);
    });
    let w2 = request(Opcode::Write, other.addr(), seg2, remote.addr(), 1 << 16);
    assert_eq!(
        run(&second, &[w2]),
        TransferState::Completed,
        "retried until the place was free"
    );
    releaser.join().unwrap();
    assert_eq!(remote.to_vec(0, 1 << 16).unwrap(), pattern(4, 1 << 16));
    assert!(
        second.nic_load_stats().iter().all(|s| !s.paused),
        "the refusals charged no rail"
    );
}

/// Control sockets that never say anything fill the control listener's cap: an honest peer's
/// descriptor request is served at once, the strangers making room.
#[test]
fn idle_control_sockets_at_the_cap_do_not_lock_out_an_honest_peer() {
    let mut c = config();
    c.limits.max_control_connections = 16;
    let target = engine_with(c);
    let (_, port) = te_core::control::split_host_port(target.segment_name()).unwrap();
    let _idle: Vec<TcpStream> = (0..16)
        .map(|_| TcpStream::connect(("127.0.0.1", port)).unwrap())
        .collect();
    let honest = engine();
    let started = Instant::now();
    honest
        .open_segment(target.segment_name())
        .expect("served, not refused");
    assert!(
        started.elapsed() < EVICT_MIN_IDLE,
        "{:?}",
        started.elapsed()
    );
}

/// The control listener's cap held by peers that proved themselves (a request answered, the
/// connection kept): a newcomer is refused, asks again after a backoff within its connect
/// timeout, and is served as soon as a place frees, instead of failing at the first refusal.
#[test]
fn a_control_client_refused_at_the_cap_asks_again_and_is_served() {
    use te_core::control::frame::{FrameType, read_frame, write_frame};
    let mut c = config();
    c.limits.max_control_connections = 2;
    let target = engine_with(c);
    let (_, port) = te_core::control::split_host_port(target.segment_name()).unwrap();
    let held: Vec<TcpStream> = (0..2)
        .map(|_| {
            let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
            write_frame(&mut s, FrameType::Probe, b"{}").unwrap();
            let (_, reply) = read_frame(&mut s, 4096).unwrap();
            assert!(String::from_utf8_lossy(&reply).contains("success"));
            s
        })
        .collect();
    let releaser = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(400));
        drop(held);
    });
    let honest = engine();
    honest
        .open_segment(target.segment_name())
        .expect("asked again until a place was free");
    releaser.join().unwrap();
}
