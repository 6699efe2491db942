//! The congestion control of an engine's data connections as the kernel shows it
//! (`MC_TE_TCP_CONGESTION`): by default both ends of a loopback connection (the lane that
//! connects and the connection the target accepts) use reno, whatever the host's default is;
//! `host` leaves the host's default; a named algorithm is set on every data connection.

mod common;

use common::*;
use te_core::{Opcode, Permission, TransferState};
use te_reactor::congestion::Congestion;
use te_testkit::connection_congestion;

/// Moves 1 MiB to the target and back with engines using `policy`; returns the algorithm of
/// every connection to the target's data port, checked for the bytes on the way.
fn connections_after_a_transfer(policy: Congestion) -> Vec<String> {
    let settings = tcp(|t| t.congestion = policy);
    let (initiator, target) = (
        engine_with_tcp(config(), settings.clone()),
        engine_with_tcp(config(), settings),
    );
    let len = 1 << 20;
    let (local, remote) = (buffer(len), buffer(len));
    register(&initiator, &local, Permission::LocalOnly);
    register(&target, &remote, Permission::RemoteReadWrite);
    let seg = initiator.open_segment(target.segment_name()).unwrap();
    let data = initiator.segment(seg).unwrap().desc().te_rails[0].port;
    local.write_at(0, &pattern(7, len)).unwrap();
    let write = request(Opcode::Write, local.addr(), seg, remote.addr(), len as u64);
    assert_eq!(run(&initiator, &[write]), TransferState::Completed);
    assert_eq!(remote.to_vec(0, len).unwrap(), pattern(7, len));
    local.write_at(0, &vec![0; len]).unwrap();
    let read = request(Opcode::Read, local.addr(), seg, remote.addr(), len as u64);
    assert_eq!(run(&initiator, &[read]), TransferState::Completed);
    assert_eq!(local.to_vec(0, len).unwrap(), pattern(7, len));
    let found = connection_congestion(data);
    // The lanes seen from both ends: at least one connection, so two lines.
    assert!(found.len() >= 2, "connections to port {data}: {found:?}");
    found
}

/// Whether this process may set cubic on a connection.
fn cubic_settable() -> bool {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let s = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    te_sys::set_tcp_congestion(&s, "cubic").is_ok()
}

fn host_default() -> String {
    std::fs::read_to_string("/proc/sys/net/ipv4/tcp_congestion_control")
        .unwrap()
        .trim()
        .to_string()
}

#[test]
fn loopback_connections_use_reno_by_default_and_the_host_default_when_told() {
    let auto = connections_after_a_transfer(Congestion::Auto);
    assert!(auto.iter().all(|a| a == "reno"), "{auto:?}");
    let host = connections_after_a_transfer(Congestion::Host);
    assert!(host.iter().all(|a| *a == host_default()), "{host:?}");
    let named = connections_after_a_transfer(Congestion::Named("cubic".into()));
    // cubic may be unavailable, or not allowed to an unprivileged user: then the host's
    // default stays, and the engine still moves the bytes (checked above).
    let expected = match cubic_settable() {
        true => "cubic".to_string(),
        false => host_default(),
    };
    assert!(named.iter().all(|a| *a == expected), "{named:?}");
}
