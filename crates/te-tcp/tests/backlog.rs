//! The engine's listeners' accept backlog (`MC_TE_LISTEN_BACKLOG`) as the kernel shows it: the
//! control listener and the data listener take the configured one, and 4,096 by default. (In a
//! test process of its own: `limits.rs` counts its process's threads.)

mod common;

use common::*;
use te_core::Permission;

/// A listening socket's backlog on `port`, as `ss` shows it (its Send-Q).
fn listen_backlog(port: u16) -> Vec<String> {
    let out = std::process::Command::new("ss")
        .args(["-ltnH", &format!("sport = :{port}")])
        .output()
        .expect("ss (iproute2) runs");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2).map(str::to_string))
        .collect()
}

#[test]
fn the_control_and_data_listeners_take_the_configured_backlog() {
    let mut c = config();
    c.limits.listen_backlog = 1000;
    let target = engine_with(c);
    let remote = buffer(4096);
    register(&target, &remote, Permission::RemoteReadWrite);
    let control: u16 = target
        .segment_name()
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("the segment name ends in the control port");
    let peer = engine();
    let seg = peer.open_segment(target.segment_name()).unwrap();
    let data = peer.segment(seg).unwrap().desc().te_rails[0].port;
    assert_ne!(control, data);
    for port in [control, data] {
        assert_eq!(listen_backlog(port), ["1000"], "port {port}");
    }
    // The default, through a second engine.
    let default = engine();
    let port: u16 = default
        .segment_name()
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap();
    assert_eq!(listen_backlog(port), ["4096"]);
}
