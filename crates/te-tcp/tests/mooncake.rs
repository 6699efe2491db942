//! te and the real Mooncake engine (PyPI wheel, installed by `.ci/setup`) over TCP loopback,
//! with P2PHANDSHAKE: Mooncake's Python module drives one side, te's engine the other, and every
//! byte is compared on both.

mod common;

use common::*;
use te_core::Permission;
use te_core::testing::mooncake::MooncakePeer;

/// Without the opt-in, a Mooncake initiator's WRITE to a te target fails loudly (Mooncake
/// returns an error) and te's memory is untouched: never a WRITE reported done that was not
/// applied. READs fail the same way and leave Mooncake's buffer as it was.
#[test]
fn a_mooncake_initiator_is_refused_loudly_by_default() {
    let target = engine();
    let remote = buffer(1 << 20);
    let before = pattern(11, 1 << 20);
    remote.write_at(0, &before).unwrap();
    register(&target, &remote, Permission::RemoteReadWrite);

    let mut mooncake = MooncakePeer::start("127.0.0.1", "P2PHANDSHAKE", &[]);
    let local = mooncake.alloc(1 << 20);
    let data = pattern(12, 64 << 10);
    mooncake.put(local, &data);
    let te_name = target.segment_name().to_string();

    // Mooncake reads te's descriptor: it opens the segment and sees te's buffer.
    assert_eq!(mooncake.first_buffer(&te_name), remote.addr());

    let rc = mooncake.write(&te_name, local, remote.addr(), 4096);
    assert_ne!(rc, 0, "a refused WRITE must not be reported done");
    let rc = mooncake.batch(
        true,
        &te_name,
        &[
            (local, remote.addr(), 4096),
            (local + 4096, remote.addr() + 4096, 60 << 10),
        ],
    );
    assert_ne!(rc, 0, "a refused batch WRITE must not be reported done");
    assert_eq!(
        remote.to_vec(0, 1 << 20).unwrap(),
        before,
        "te's memory untouched"
    );

    let rc = mooncake.read(&te_name, local, remote.addr(), 64 << 10);
    assert_ne!(rc, 0, "a READ that moved nothing must not be reported done");
    assert_eq!(
        mooncake.get(local, 64 << 10),
        data,
        "Mooncake's buffer untouched"
    );
}
