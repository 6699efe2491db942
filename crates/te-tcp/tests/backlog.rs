//! The engine's listeners' accept backlog (`MC_TE_LISTEN_BACKLOG`) as the kernel shows it: the
//! control listener and the data listener take the configured one, and 4,096 by default. (In a
//! test process of its own: `limits.rs` counts its process's threads.)

mod common;

use common::*;
use te_core::Permission;
use te_testkit::listen_backlog;

/// The port of `engine`'s control listener, from its segment name.
fn control_port(engine: &te_core::TransferEngine) -> u16 {
    te_core::control::parse_segment_name(engine.segment_name(), 0)
        .expect("a segment name with a port")
        .1
}

#[test]
fn the_control_and_data_listeners_take_the_configured_backlog() {
    let mut c = config();
    c.limits.listen_backlog = 1000;
    let target = engine_with(c);
    let remote = buffer(4096);
    register(&target, &remote, Permission::RemoteReadWrite);
    let control = control_port(&target);
    let peer = engine();
    let seg = peer.open_segment(target.segment_name()).unwrap();
    let data = peer.segment(seg).unwrap().desc().te_rails[0].port;
    assert_ne!(control, data);
    for port in [control, data] {
        assert_eq!(listen_backlog(port), ["1000"], "port {port}");
    }
    // The default, through a second engine.
    assert_eq!(listen_backlog(control_port(&engine())), ["4096"]);
}
