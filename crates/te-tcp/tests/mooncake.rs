//! te and the real Mooncake engine (PyPI wheel, installed by `.ci/setup`) over TCP loopback,
//! with P2PHANDSHAKE: Mooncake's Python module drives one side, te's engine the other, and every
//! byte is compared on both.

mod common;

use common::*;
use te_core::Permission;
use te_testkit::assert_same_bytes;
use te_testkit::mooncake::MooncakePeer;

/// A Mooncake target holding `len` zeroed bytes at `remote`, and a te engine with a private
/// buffer of `len` bytes that has the target's segment open as `seg`.
struct TeToMooncake {
    mooncake: MooncakePeer,
    remote: u64,
    te: te_core::TransferEngine,
    local: std::sync::Arc<te_core::HostBuffer>,
    seg: te_core::SegmentId,
}

fn te_to_mooncake(len: usize) -> TeToMooncake {
    let mut mooncake = MooncakePeer::start("127.0.0.1", "P2PHANDSHAKE", &[]);
    let remote = mooncake.alloc(len);
    mooncake.put(remote, &vec![0u8; len]);
    let te = engine();
    let local = buffer(len);
    register(&te, &local, Permission::LocalOnly);
    let seg = te.open_segment(&mooncake.name).unwrap();
    TeToMooncake {
        mooncake,
        remote,
        te,
        local,
        seg,
    }
}

impl TeToMooncake {
    /// The local buffer filled with pattern `seed`, and a WRITE of all of it to `remote` in
    /// segment `seg`.
    fn whole_write(
        &self,
        seg: te_core::SegmentId,
        seed: u64,
    ) -> (te_core::TransferRequest, Vec<u8>) {
        let len = self.local.len();
        let data = pattern(seed, len);
        self.local.write_at(0, &data).unwrap();
        let write = request(
            te_core::Opcode::Write,
            self.local.addr(),
            seg,
            self.remote,
            len as u64,
        );
        (write, data)
    }
}

/// Segment `seg`'s descriptor as `te` read it, changed by `edit` and served under a new name
/// (keep the server alive), opened in `te`.
fn reserved(
    te: &te_core::TransferEngine,
    seg: te_core::SegmentId,
    edit: impl FnOnce(&mut serde_json::Value),
) -> (te_reactor::Server, te_core::SegmentId) {
    let mut desc = serde_json::to_value(te.segment(seg).unwrap().desc()).unwrap();
    edit(&mut desc);
    let (server, name) = serve_descriptor(desc);
    (server, te.open_segment(&name).unwrap())
}

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
    assert_same_bytes(
        &remote.to_vec(0, 1 << 20).unwrap(),
        &before,
        "te's memory untouched",
    );

    let rc = mooncake.read(&te_name, local, remote.addr(), 64 << 10);
    assert_ne!(rc, 0, "a READ that moved nothing must not be reported done");
    assert_same_bytes(
        &mooncake.get(local, 64 << 10),
        &data,
        "Mooncake's buffer untouched",
    );
}

/// te as initiator to a Mooncake target: detected from its descriptor (no `te_wire_version`,
/// `tcp_proto_version` 2), Mooncake's acknowledged framing pipelined over te's lanes. WRITEs
/// and READs of several sizes and offsets in one batch, every byte compared on both sides.
#[test]
fn te_writes_and_reads_a_mooncake_target() {
    let len = 4 << 20;
    let TeToMooncake {
        mut mooncake,
        remote,
        te,
        local,
        seg,
    } = te_to_mooncake(len);
    let desc = te.segment(seg).unwrap().desc().clone();
    assert!(desc.te_wire_version.is_none() && desc.tcp_proto_version == Some(2));

    let data = pattern(21, len);
    local.write_at(0, &data).unwrap();
    // Offsets and lengths that cross slices and lanes: 1 byte, an odd 3 MiB + 7, and the rest.
    let pieces = [
        (0u64, 1u64),
        (1, (3 << 20) + 7),
        ((3 << 20) + 8, (1 << 20) - 8),
    ];
    let batch = |op| -> Vec<_> {
        pieces
            .iter()
            .map(|&(off, n)| request(op, local.addr() + off, seg, remote + off, n))
            .collect()
    };
    let writes = batch(te_core::Opcode::Write);
    assert_eq!(run(&te, &writes), te_core::TransferState::Completed);
    assert_same_bytes(
        &mooncake.get(remote, len),
        &data,
        "Mooncake's memory holds what te wrote",
    );

    let back = pattern(22, len);
    mooncake.put(remote, &back);
    let reads = batch(te_core::Opcode::Read);
    assert_eq!(run(&te, &reads), te_core::TransferState::Completed);
    assert_same_bytes(
        &local.to_vec(0, len).unwrap(),
        &back,
        "te read Mooncake's bytes",
    );
}

/// A descriptor may name its data host rather than give an address (Mooncake publishes what
/// its engine was told): te resolves it once, when it first sends to that peer, and the bytes
/// land. (Where a name has both families, the local rail's is preferred: a unit test of
/// `lane::prefer_family`.)
#[test]
fn a_data_host_given_by_name_is_resolved_and_written_to() {
    let len = 1 << 20;
    let mut t = te_to_mooncake(len);
    let (_control, named) = reserved(&t.te, t.seg, |d| d["tcp_data_host"] = "localhost".into());
    let (write, data) = t.whole_write(named, 41);
    assert_eq!(run(&t.te, &[write]), te_core::TransferState::Completed);
    let written = t.mooncake.get(t.remote, len);
    assert_same_bytes(&written, &data, "written through a named host");
}

/// A peer whose data port does not answer yet: the transfer fails, and once it answers (here a
/// forwarder to the real Mooncake target appears on that port) the next one lands. After a
/// failed connect the host is resolved again on the posting thread, never on a lane loop.
#[test]
fn a_peer_unreachable_at_first_is_reached_once_it_listens() {
    let len = 256 << 10;
    let mut t = te_to_mooncake(len);
    let port = te_testkit::services::free_port();
    let mut data_port = 0;
    let (_control, later) = reserved(&t.te, t.seg, |d| {
        data_port = d["tcp_data_port"].as_u64().unwrap() as u16;
        d["tcp_data_host"] = "localhost".into();
        d["tcp_data_port"] = port.into();
    });
    let (write, data) = t.whole_write(later, 43);
    assert_eq!(
        run(&t.te, &[write]),
        te_core::TransferState::Failed,
        "nothing listens there yet"
    );
    let listener = std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
    std::thread::spawn(move || {
        for client in listener.incoming().map_while(Result::ok) {
            let server = std::net::TcpStream::connect(("127.0.0.1", data_port)).unwrap();
            let (mut c2, mut s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
            let (mut client, mut server) = (client, server);
            std::thread::spawn(move || std::io::copy(&mut client, &mut server));
            std::thread::spawn(move || std::io::copy(&mut s2, &mut c2));
        }
    });
    assert_eq!(run(&t.te, &[write]), te_core::TransferState::Completed);
    let written = t.mooncake.get(t.remote, len);
    assert_same_bytes(&written, &data, "written once the peer listened");
}

/// A Mooncake target's refusal reaches te's task as a rejection (not retried), and the lane
/// recovers for the next request. The descriptor is Mooncake's own with its buffer claimed
/// larger, so te's own initiator-side check lets the request through to Mooncake.
#[test]
fn a_mooncake_targets_refusal_fails_the_task() {
    let TeToMooncake {
        mut mooncake,
        remote,
        te,
        local,
        seg,
    } = te_to_mooncake(1 << 20);
    let mut end = 0;
    let (_control, widened) = reserved(&te, seg, |desc| {
        // Mooncake's allocator hands out a buffer inside a larger registered chunk; claim past
        // it.
        let chunk = desc["buffers"][0].clone();
        end = chunk["addr"].as_u64().unwrap() + chunk["length"].as_u64().unwrap();
        desc["buffers"][0]["length"] = (chunk["length"].as_u64().unwrap() + (1 << 20)).into();
        // The data endpoint is the real one (serve_descriptor renames the segment).
        desc["tcp_data_host"] = "127.0.0.1".into();
    });
    let outside = request(te_core::Opcode::Write, local.addr(), widened, end, 4096);
    let b = te.allocate_batch(1).unwrap();
    te.submit(b, &[outside]).unwrap();
    let status = te.wait(b, WAIT).unwrap();
    assert_eq!(status.state, te_core::TransferState::Failed);
    assert_eq!(
        te.task_error(b, 0).unwrap(),
        Some(te_core::transport::SliceError::Rejected(
            te_core::transport::Rejection::OutOfBounds
        )),
        "Mooncake's refusal, not a path failure"
    );
    te.free_batch(b).unwrap();
    // A refusal among pipelined requests: only the refused task fails; what the target's
    // closing connection cut off behind it is retried, and lands.
    let data = pattern(31, 1 << 20);
    local.write_at(0, &data).unwrap();
    let mut mixed: Vec<_> = (0..8u64)
        .map(|i| {
            let off = i * (128 << 10);
            request(
                te_core::Opcode::Write,
                local.addr() + off,
                widened,
                remote + off,
                128 << 10,
            )
        })
        .collect();
    mixed.insert(
        3,
        request(te_core::Opcode::Write, local.addr(), widened, end, 64 << 10),
    );
    let b = te.allocate_batch(mixed.len()).unwrap();
    te.submit(b, &mixed).unwrap();
    te.wait(b, WAIT).unwrap();
    for task in 0..mixed.len() {
        let state = te.task_status(b, task).unwrap().state;
        let want = match task {
            3 => te_core::TransferState::Failed,
            _ => te_core::TransferState::Completed,
        };
        assert_eq!(state, want, "task {task}");
    }
    te.free_batch(b).unwrap();
    assert_same_bytes(&mooncake.get(remote, 1 << 20), &data, "bytes");
}

/// A te target with the opt-in (`MC_TE_MOONCAKE_COMPAT=1`), `allow` as its allow-list.
fn compat_target(allow: &str, v1: bool) -> te_core::TransferEngine {
    let v1 = ("MC_TE_MOONCAKE_ALLOW_V1", if v1 { "1" } else { "0" });
    engine_with(compat_config(&[("MC_TE_MOONCAKE_ALLOW", allow), v1]))
}

/// With the opt-in, Mooncake's Python engine writes into and reads from a te target's memory:
/// single transfers of odd sizes and a batch, every byte compared on both sides.
#[test]
fn with_the_opt_in_a_mooncake_initiator_writes_and_reads_te_memory() {
    let target = compat_target("127.0.0.0/8", false);
    let len = 4 << 20;
    let remote = buffer(len);
    register(&target, &remote, Permission::RemoteReadWrite);
    let te_name = target.segment_name().to_string();
    let desc = target.local_descriptor();
    assert_eq!(desc.tcp_proto_version, Some(2));
    assert_eq!(desc.tcp_data_host.as_deref(), Some("127.0.0.1"));
    assert_ne!(
        Some(desc.te_rails[0].port),
        desc.tcp_data_port,
        "a port of its own"
    );

    let mut mooncake = MooncakePeer::start("127.0.0.1", "P2PHANDSHAKE", &[]);
    let local = mooncake.alloc(len);
    let data = pattern(41, len);
    mooncake.put(local, &data);
    assert_eq!(mooncake.write(&te_name, local, remote.addr(), 1), 0);
    assert_eq!(
        mooncake.write(&te_name, local + 1, remote.addr() + 1, (3 << 20) + 7),
        0
    );
    let rest = (3 << 20) + 8;
    let items: Vec<_> = (0..4)
        .map(|i| {
            let off = rest + i * ((len - rest) / 4);
            (
                local + off as u64,
                remote.addr() + off as u64,
                (len - rest) / 4,
            )
        })
        .collect();
    assert_eq!(mooncake.batch(true, &te_name, &items), 0);
    assert_same_bytes(
        &remote.to_vec(0, len).unwrap(),
        &data,
        "te holds what Mooncake wrote",
    );

    let back = pattern(42, len);
    remote.write_at(0, &back).unwrap();
    assert_eq!(mooncake.read(&te_name, local, remote.addr(), len), 0);
    assert_same_bytes(&mooncake.get(local, len), &back, "Mooncake read te's bytes");
}

/// With the opt-in, te's checks still hold and reach the Mooncake caller as errors: an
/// address outside every region, a read-only region written, a range across two regions; a
/// peer outside the allow-list is refused; and te keeps serving after each refusal.
#[test]
fn with_the_opt_in_refusals_reach_the_mooncake_caller() {
    let target = compat_target("127.0.0.1/32", false);
    let writable = buffer(1 << 20);
    let read_only = buffer(1 << 20);
    let before = pattern(51, 1 << 20);
    writable.write_at(0, &before).unwrap();
    read_only.write_at(0, &before).unwrap();
    register(&target, &writable, Permission::RemoteReadWrite);
    register(&target, &read_only, Permission::RemoteRead);
    let te_name = target.segment_name().to_string();
    let mut mooncake = MooncakePeer::start("127.0.0.1", "P2PHANDSHAKE", &[]);
    let local = mooncake.alloc(1 << 20);
    mooncake.put(local, &pattern(52, 1 << 20));

    let unregistered = writable.addr() + (64 << 20);
    let cases = [
        ("unregistered address", unregistered, 4096),
        ("read-only region written", read_only.addr(), 4096),
        (
            "past the region's end",
            writable.addr() + (1 << 20) - 100,
            4096,
        ),
    ];
    for (what, addr, len) in cases {
        assert_ne!(mooncake.write(&te_name, local, addr, len), 0, "{what}");
        assert_same_bytes(&writable.to_vec(0, 1 << 20).unwrap(), &before, what);
        assert_same_bytes(&read_only.to_vec(0, 1 << 20).unwrap(), &before, what);
        // The target still serves an allowed request.
        assert_eq!(
            mooncake.write(&te_name, local, writable.addr(), 64),
            0,
            "{what}"
        );
        assert_same_bytes(
            &writable.to_vec(0, 64).unwrap(),
            &mooncake.get(local, 64),
            "bytes",
        );
        writable.write_at(0, &before[..64]).unwrap();
    }
    // Reading the read-only region is allowed; reading an unregistered address is not.
    assert_eq!(mooncake.read(&te_name, local, read_only.addr(), 4096), 0);
    assert_same_bytes(&mooncake.get(local, 4096), &before[..4096], "bytes");
    assert_ne!(mooncake.read(&te_name, local, unregistered, 4096), 0);

    // An allow-list without loopback: the Mooncake peer on 127.0.0.1 is refused.
    let closed = compat_target("198.18.0.0/15", false);
    let elsewhere = buffer(1 << 20);
    elsewhere.write_at(0, &before).unwrap();
    register(&closed, &elsewhere, Permission::RemoteReadWrite);
    let name = closed.segment_name().to_string();
    assert_ne!(mooncake.write(&name, local, elsewhere.addr(), 4096), 0);
    assert_same_bytes(&elsewhere.to_vec(0, 1 << 20).unwrap(), &before, "bytes");
}

/// Mooncake's unacknowledged framing (a Mooncake engine with `MC_TCP_PROTO=1`). Without the
/// opt-in it finds no data port and fails. With the opt-in it is refused (the connection
/// reset, nothing written, a READ failing) unless `MC_TE_MOONCAKE_ALLOW_V1=1`, which applies it.
/// A refused v1 WRITE can still be reported done by Mooncake: its v1 client reads no status,
/// which is why te refuses the framing rather than serving it half.
#[test]
fn the_unacknowledged_framing_is_refused_unless_allowed() {
    let mut mooncake = MooncakePeer::start("127.0.0.1", "P2PHANDSHAKE", &[("MC_TCP_PROTO", "1")]);
    let local = mooncake.alloc(1 << 20);
    let data = pattern(61, 1 << 20);
    mooncake.put(local, &data);
    let zeros = vec![0u8; 1 << 20];

    let default = engine();
    let remote = buffer(1 << 20);
    register(&default, &remote, Permission::RemoteReadWrite);
    let name = default.segment_name().to_string();
    assert_ne!(mooncake.write(&name, local, remote.addr(), 1 << 20), 0);
    assert_same_bytes(&remote.to_vec(0, 1 << 20).unwrap(), &zeros, "bytes");

    let refusing = compat_target("127.0.0.1", false);
    let remote = buffer(1 << 20);
    register(&refusing, &remote, Permission::RemoteReadWrite);
    let name = refusing.segment_name().to_string();
    let _ = mooncake.write(&name, local, remote.addr(), 1 << 20);
    assert_same_bytes(
        &remote.to_vec(0, 1 << 20).unwrap(),
        &zeros,
        "refused: nothing written",
    );
    assert_ne!(mooncake.read(&name, local, remote.addr(), 4096), 0);
    assert_same_bytes(
        &mooncake.get(local, 1 << 20),
        &data,
        "a refused READ moved nothing",
    );

    let allowing = compat_target("127.0.0.1", true);
    let remote = buffer(1 << 20);
    register(&allowing, &remote, Permission::RemoteReadWrite);
    let name = allowing.segment_name().to_string();
    assert_eq!(mooncake.write(&name, local, remote.addr(), 1 << 20), 0);
    // v1 acknowledges nothing: Mooncake's "done" comes before te has the bytes. They land.
    let deadline = std::time::Instant::now() + WAIT;
    while remote.to_vec(0, 1 << 20).unwrap() != data && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert_same_bytes(
        &remote.to_vec(0, 1 << 20).unwrap(),
        &data,
        "v1 WRITE applied",
    );
    let back = pattern(62, 4096);
    remote.write_at(0, &back).unwrap();
    assert_eq!(mooncake.read(&name, local, remote.addr(), 4096), 0);
    assert_same_bytes(&mooncake.get(local, 4096), &back, "bytes");
}

/// Notifications cross both ways: Mooncake's `transfer_sync` with a `TransferNotify` reaches
/// te after its data (opt-in target), and te's `send_notify` reaches Mooncake's `get_notifies`.
#[test]
fn notifications_cross_both_ways() {
    let target = compat_target("127.0.0.1", false);
    let remote = buffer(1 << 20);
    register(&target, &remote, Permission::RemoteReadWrite);
    let mut mooncake = MooncakePeer::start("127.0.0.1", "P2PHANDSHAKE", &[]);
    let local = mooncake.alloc(1 << 20);
    let data = pattern(71, 1 << 20);
    mooncake.put(local, &data);
    let rc = mooncake.write_with_notify(
        target.segment_name(),
        (local, remote.addr(), 1 << 20),
        "kv-block-7",
        "ready",
    );
    assert_eq!(rc, 0);
    let got = target
        .next_notify(WAIT)
        .map(|r| r.notification)
        .expect("Mooncake's notification");
    assert_eq!(
        (got.name.as_str(), got.notify_msg.as_str()),
        ("kv-block-7", "ready")
    );
    assert_same_bytes(
        &remote.to_vec(0, 1 << 20).unwrap(),
        &data,
        "its data came first",
    );

    let n = te_core::Notification {
        name: "from-te".into(),
        notify_msg: "hello mooncake".into(),
    };
    target.send_notify(&mooncake.name, &n).unwrap();
    let deadline = std::time::Instant::now() + WAIT;
    let mut seen = Vec::new();
    while seen.is_empty() && std::time::Instant::now() < deadline {
        seen = mooncake.notifies();
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(
        seen,
        [("from-te".to_string(), "hello mooncake".to_string())]
    );
}

/// Descriptors through Mooncake's own HTTP metadata server, in Mooncake's key layout, both
/// ways: Mooncake opens the te segment by name and writes into it (opt-in), te opens the
/// Mooncake segment by name and writes and reads it.
#[test]
fn descriptors_through_mooncakes_metadata_server_both_ways() {
    let server = te_testkit::mooncake::http_metadata_server();
    let mut c = config();
    c.mooncake = te_core::mooncake::MooncakeCompat::from_lookup(|k| {
        (k == "MC_TE_MOONCAKE_COMPAT").then(|| "1".to_string())
    })
    .unwrap();
    let te = te_core::TransferEngine::init(c, &server.url, "te-node").unwrap();
    te.install_transport(std::sync::Arc::new(te_tcp::TcpTransport::new()))
        .unwrap();
    let len = 1 << 20;
    let te_mem = buffer(len);
    register(&te, &te_mem, Permission::RemoteReadWrite);

    let mut mooncake = MooncakePeer::start(
        "mc-node",
        &server.url,
        &[("MC_TCP_BIND_ADDRESS", "127.0.0.1")],
    );
    let mc_mem = mooncake.alloc(len);
    let data = pattern(81, len);
    mooncake.put(mc_mem, &data);
    assert_eq!(
        mooncake.write("te-node", mc_mem, te_mem.addr(), len),
        0,
        "Mooncake wrote to te by name:\n{}",
        mooncake.log()
    );
    assert_same_bytes(&te_mem.to_vec(0, len).unwrap(), &data, "bytes");

    let seg = te.open_segment("mc-node").unwrap();
    let back = pattern(82, len);
    te_mem.write_at(0, &back).unwrap();
    let w = request(
        te_core::Opcode::Write,
        te_mem.addr(),
        seg,
        mc_mem,
        len as u64,
    );
    assert_eq!(run(&te, &[w]), te_core::TransferState::Completed);
    assert_same_bytes(
        &mooncake.get(mc_mem, len),
        &back,
        "te wrote to Mooncake by name",
    );
    mooncake.put(mc_mem, &data);
    let r = request(
        te_core::Opcode::Read,
        te_mem.addr(),
        seg,
        mc_mem,
        len as u64,
    );
    assert_eq!(run(&te, &[r]), te_core::TransferState::Completed);
    assert_same_bytes(
        &te_mem.to_vec(0, len).unwrap(),
        &data,
        "te read Mooncake by name",
    );
}

/// With a cluster secret, the opt-in needs its second switch; with both, a Mooncake peer on
/// the allow-list gets a descriptor with no segment secret in it (clear or sealed) and may
/// write, while te peers still prove the cluster secret and get the sealed one.
#[test]
fn with_a_cluster_secret_mooncake_peers_never_see_segment_secrets() {
    let with = |second: bool| {
        let mut c = config();
        c.cluster_secret = Some(te_core::config::Redacted(
            "cluster-one-0b6e6a1c5d7f43".into(),
        ));
        c.mooncake = te_core::mooncake::MooncakeCompat::from_lookup(|k| match k {
            "MC_TE_MOONCAKE_COMPAT" => Some("1".into()),
            "MC_TE_MOONCAKE_ALLOW" => Some("127.0.0.1".into()),
            "MC_TE_MOONCAKE_WITH_CLUSTER_SECRET" => second.then(|| "1".into()),
            _ => None,
        })
        .unwrap();
        c
    };
    let refused = te_core::TransferEngine::init(with(false), "P2PHANDSHAKE", "127.0.0.1");
    assert!(
        matches!(&refused, Err(te_core::Error::InvalidConfig { name, .. }) if name == "MC_TE_MOONCAKE_COMPAT"),
        "{:?}",
        refused.err()
    );

    let target = engine_with(with(true));
    let remote = buffer(1 << 20);
    register(&target, &remote, Permission::RemoteReadWrite);
    let name = target.segment_name().to_string();
    // What an unauthenticated peer is served: the descriptor, without any secret.
    let (host, port) = te_core::control::split_host_port(&name).unwrap();
    let served = te_core::control::request(
        &host,
        port,
        te_core::control::frame::FrameType::Metadata,
        b"{}",
        WAIT,
        1 << 20,
        None,
    )
    .unwrap();
    let served: serde_json::Value = serde_json::from_slice(&served).unwrap();
    assert_eq!(served["buffers"][0]["addr"], remote.addr());
    assert!(served.get("te_secret").is_none() && served.get("te_secret_sealed").is_none());

    let mut mooncake = MooncakePeer::start("127.0.0.1", "P2PHANDSHAKE", &[]);
    let local = mooncake.alloc(1 << 20);
    let data = pattern(91, 1 << 20);
    mooncake.put(local, &data);
    assert_eq!(mooncake.write(&name, local, remote.addr(), 1 << 20), 0);
    assert_same_bytes(&remote.to_vec(0, 1 << 20).unwrap(), &data, "bytes");

    // A te peer with the cluster secret still moves bytes over te's own framing.
    let mut c = config();
    c.cluster_secret = Some(te_core::config::Redacted(
        "cluster-one-0b6e6a1c5d7f43".into(),
    ));
    let te_peer = engine_with(c);
    let mine = buffer(1 << 20);
    register(&te_peer, &mine, Permission::LocalOnly);
    let seg = te_peer.open_segment(&name).unwrap();
    assert!(
        te_peer
            .segment(seg)
            .unwrap()
            .desc()
            .te_wire_version
            .is_some()
    );
    let back = pattern(92, 1 << 20);
    mine.write_at(0, &back).unwrap();
    let w = request(
        te_core::Opcode::Write,
        mine.addr(),
        seg,
        remote.addr(),
        1 << 20,
    );
    assert_eq!(run(&te_peer, &[w]), te_core::TransferState::Completed);
    assert_same_bytes(&remote.to_vec(0, 1 << 20).unwrap(), &back, "bytes");
}
