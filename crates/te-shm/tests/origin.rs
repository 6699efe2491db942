//! One origin for every peer, attacked with real processes on loopback: what a descriptor
//! names on this host (a process for cross-memory attach, a shared-memory file) is used only
//! when the process that served the descriptor, over the very connection te used, is its owner.
//!
//! - A listener beside the victim's (127.0.0.2, the victim's port number), run by another
//!   local user where the machine allows it, serves the victim's own descriptor.
//! - A peer serves a copy of the initiator's own descriptor beside the initiator's listener, so
//!   that it would write itself.
//! - A metadata service (a real Redis) holds a descriptor naming the victim's process and its
//!   shared memory (read-write, where it was published read-only).
//! - A proven peer names another engine's shared-memory file, read-write where its owner
//!   published it read-only.
//!
//! In each, the rails the forged descriptor gives lead nowhere: the only way its transfers
//! could complete is a same-host path, which must not be taken. Every victim checks its bytes.
//! And the honest cases still take the same-host path: an engine in the same Redis, and the
//! engine's own peers.

use std::io::Write;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use te_core::control::frame::FrameType;
use te_core::metadata::store::KvStore;
use te_core::{
    Config, HostBuffer, Opcode, Permission, TransferEngine, TransferRequest, TransferState,
};
use te_shm::{CmaTransport, ShmTransport};
use te_tcp::TcpTransport;
use te_testkit::forger::{Forgery, serve_forged};
use te_testkit::{Killed, assert_neither_way, self_test_args, spawn_ready};

const LEN: usize = 1 << 20;
const VICTIM_BYTE: u8 = 0x5a;
const LOCAL_BYTE: u8 = 0xee;

/// An engine with TCP (the control path, the fallback), shared memory and cross-memory attach,
/// on `metadata`.
fn engine_on(metadata: &str, name: &str) -> (TransferEngine, Arc<ShmTransport>) {
    let mut c = Config::default();
    c.tcp_bind_address = Some("127.0.0.1".parse().unwrap());
    c.retry_cnt = 1;
    let e = TransferEngine::init(c, metadata, name).unwrap();
    let shm = Arc::new(ShmTransport::default());
    e.install_transport(Arc::new(TcpTransport::new())).unwrap();
    e.install_transport(shm.clone()).unwrap();
    e.install_transport(Arc::new(CmaTransport::new())).unwrap();
    (e, shm)
}

fn engine() -> (TransferEngine, Arc<ShmTransport>) {
    engine_on("P2PHANDSHAKE", "127.0.0.1")
}

/// The victim: an engine with a heap buffer (cross-memory attach) and a shared-memory buffer
/// registered read-only, both full of `VICTIM_BYTE`; prints `READY <segment> <heap> <shm>`
/// and, told on stdin, exits 0 when both are intact.
#[test]
#[ignore = "helper: started by the tests below as the victim"]
fn origin_victim() {
    if std::env::var("TE_ORIGIN_VICTIM").is_err() {
        return;
    }
    let (e, shm) = engine();
    let heap = Arc::new(HostBuffer::new(LEN).unwrap());
    heap.write_at(0, &[VICTIM_BYTE; LEN]).unwrap();
    e.register_buffer(&heap, "*", Permission::RemoteReadWrite)
        .unwrap();
    let shared = shm.allocate(LEN).unwrap();
    shared.write_at(0, &[VICTIM_BYTE; LEN]).unwrap();
    e.register_buffer(&shared, "*", Permission::RemoteRead)
        .unwrap();
    let ready = format!("{} {} {}", e.segment_name(), heap.addr(), shared.addr());
    te_testkit::victim_until_checked(&ready, &[&heap, &shared], VICTIM_BYTE);
}

/// A forger ([`te_testkit::forger`]) serving `TE_FORGE_FROM`'s descriptor at `TE_FORGE_AT`;
/// with `TE_FORGE_SELF`, naming itself as the owner and every buffer read-write.
#[test]
#[ignore = "helper: started by the tests below as the forger"]
fn origin_forger() {
    let Ok(from) = std::env::var("TE_FORGE_FROM") else {
        return;
    };
    let own = std::env::var("TE_FORGE_SELF").is_ok();
    let how = Forgery {
        claim_self: own,
        widen: own,
    };
    serve_forged(&from, &std::env::var("TE_FORGE_AT").unwrap(), how);
}

/// The victim, started; `READY` split into its segment and its two buffers' addresses. It
/// ends when told to check its memory, or when this process ends (its stdin closes).
fn victim() -> (Child, String, u64, u64) {
    let (child, ready) = spawn_ready(
        Command::new(std::env::current_exe().unwrap())
            .args(self_test_args("origin_victim"))
            .env("TE_ORIGIN_VICTIM", "1")
            .stdin(Stdio::piped()),
    );
    let mut parts = ready.split_whitespace();
    let name = parts.next().unwrap().to_string();
    let heap = parts.next().unwrap().parse().unwrap();
    let shared = parts.next().unwrap().parse().unwrap();
    (child, name, heap, shared)
}

/// Tells the victim to check its memory; whether it found it intact.
fn victim_intact(mut victim: Child) -> bool {
    victim.stdin.take().unwrap().write_all(b"check\n").unwrap();
    victim.wait().unwrap().success()
}

fn root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").unwrap().uid() == 0
}

/// A forger serving `from`'s descriptor at `at`, as user `nobody` when `stranger` (and this
/// process may start one).
fn forger(from: &str, at: &str, stranger: bool, own: bool) -> (Killed, String) {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(self_test_args("origin_forger"))
        .env("TE_FORGE_FROM", from)
        .env("TE_FORGE_AT", at);
    if own {
        cmd.env("TE_FORGE_SELF", "1");
    }
    if stranger {
        cmd.uid(65534).gid(65534);
    }
    let (child, name) = spawn_ready(&mut cmd);
    (Killed(child), name)
}

/// An initiator's buffer of `LOCAL_BYTE`s, registered local-only.
fn local_buffer(e: &TransferEngine) -> Arc<HostBuffer> {
    let local = Arc::new(HostBuffer::new(LEN).unwrap());
    local.write_at(0, &[LOCAL_BYTE; LEN]).unwrap();
    e.register_buffer(&local, "*", Permission::LocalOnly)
        .unwrap();
    local
}

#[test]
fn a_listener_beside_the_victims_port_cannot_aim_copies_at_it() {
    let (victim, name, heap, _) = victim();
    let port = name.rsplit_once(':').unwrap().1;
    // Another user where this process may start one: it holds no socket of the victim's.
    let (forger, forged) = forger(&name, &format!("127.0.0.2:{port}"), root(), false);
    let (e, _) = engine();
    let local = local_buffer(&e);
    let seg = e.open_segment(&forged).expect("a well-formed descriptor");
    let desc = e.segment(seg).unwrap();
    assert_eq!(
        desc.desc().te_owner,
        te_core::segment::process_identity(victim.id()),
        "it names the live victim"
    );
    assert!(
        !desc.same_host(),
        "but the victim did not serve it: nothing on this host is used"
    );
    assert_neither_way(&e, &local, seg, heap);
    drop(forger);
    assert!(victim_intact(victim), "the victim's memory was written");
}

#[test]
fn a_copy_of_the_initiators_own_descriptor_cannot_make_it_write_itself() {
    let (e, _) = engine();
    let mine = Arc::new(HostBuffer::new(LEN).unwrap());
    mine.write_at(0, &[VICTIM_BYTE; LEN]).unwrap();
    e.register_buffer(&mine, "*", Permission::RemoteReadWrite)
        .unwrap();
    let local = local_buffer(&e);
    // Beside the initiator's own listener: another address, its port number.
    let port = e.segment_name().rsplit_once(':').unwrap().1;
    let at = format!("127.0.0.2:{port}");
    let (forger, forged) = forger(e.segment_name(), &at, root(), false);
    let seg = e.open_segment(&forged).unwrap();
    assert_eq!(
        e.segment(seg).unwrap().desc().te_owner,
        te_core::segment::process_identity(std::process::id()),
        "it names this very process"
    );
    assert!(!e.segment(seg).unwrap().same_host());
    assert_neither_way(&e, &local, seg, mine.addr());
    drop(forger);
    assert!(
        mine.to_vec(0, LEN)
            .unwrap()
            .iter()
            .all(|&b| b == VICTIM_BYTE),
        "the initiator wrote its own memory for a forger"
    );
    // Its own segment, fetched from its own listener, is its own: the same-host path serves.
    let own = e.open_segment(e.segment_name()).unwrap();
    assert!(e.segment(own).unwrap().same_host());
}

#[test]
fn a_proven_peer_cannot_name_another_engines_shared_memory() {
    let (victim, name, _, shared) = victim();
    // The forger names itself (so its descriptor is proven its own), the victim's file, and
    // read-write where the victim published it read-only.
    let (forger, forged) = forger(&name, "127.0.0.1:0", false, true);
    let (e, _) = engine();
    let local = local_buffer(&e);
    let seg = e.open_segment(&forged).unwrap();
    let desc = e.segment(seg).unwrap();
    assert!(desc.same_host(), "the forger proved the descriptor its own");
    let buffer = desc.check_access(shared, 4096, Opcode::Write).unwrap();
    assert!(
        buffer.shm_name.is_some(),
        "it names the victim's file, read-write"
    );
    assert_neither_way(&e, &local, seg, shared);
    drop(forger);
    assert!(
        victim_intact(victim),
        "the victim's shared memory was written"
    );
}

#[test]
fn a_metadata_service_cannot_aim_copies_at_a_process() {
    let dir = tempdir("redis");
    let redis = te_testkit::services::redis_server(0, None, &dir);
    let url = format!("redis://127.0.0.1:{}", redis.port);
    let (victim, name, heap, shared) = victim();
    // The victim's descriptor, as any reader of its control port gets it, under another name
    // and with dead rails; the service names the victim's listener as that name's.
    let (host, port) = name.rsplit_once(':').unwrap();
    let reply = te_core::control::request(
        host,
        port.parse().unwrap(),
        FrameType::Metadata,
        b"{}",
        Duration::from_secs(5),
        1 << 20,
        None,
    )
    .unwrap();
    let mut desc: serde_json::Value = serde_json::from_slice(&reply).unwrap();
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    desc["name"] = "forged".into();
    // Its shared memory too, read-write where the victim published it read-only.
    for b in desc["buffers"].as_array_mut().unwrap() {
        b["permission"] = "remote_read_write".into();
    }
    desc["te_rails"] = serde_json::json!([{"name": "lo", "ip": "127.0.0.1",
        "port": dead.local_addr().unwrap().port()}]);
    drop(dead);
    let store = te_core::metadata::redis::RedisStore::new(
        te_core::metadata::redis::RedisTarget::parse(&url).unwrap(),
        Duration::from_secs(5),
        1 << 20,
    );
    store
        .put("mooncake/ram/forged", desc.to_string().as_bytes())
        .unwrap();
    let rpc = format!(r#"{{"ip_or_host_name":"{host}","rpc_port":{port}}}"#);
    store
        .put("mooncake/rpc_meta/forged", rpc.as_bytes())
        .unwrap();

    let (e, _) = engine_on(&url, "initiator");
    let local = local_buffer(&e);
    let seg = e.open_segment("forged").unwrap();
    assert!(
        !e.segment(seg).unwrap().same_host(),
        "the victim serves its own name, not this one: nothing proven"
    );
    assert_neither_way(&e, &local, seg, heap);
    assert_neither_way(&e, &local, seg, shared);
    assert!(victim_intact(victim), "the victim's memory was written");

    // An honest engine in the same service is proven by its own listener, and served on this
    // host (cross-memory attach: nothing moves over TCP).
    let (honest, _) = engine_on(&url, "honest");
    let theirs = Arc::new(HostBuffer::new(LEN).unwrap());
    honest
        .register_buffer(&theirs, "*", Permission::RemoteReadWrite)
        .unwrap();
    let seg = e.open_segment("honest").unwrap();
    assert!(e.segment(seg).unwrap().same_host(), "proven by its owner");
    let b = e.allocate_batch(1).unwrap();
    let w = TransferRequest {
        opcode: Opcode::Write,
        source: local.addr(),
        target_id: seg,
        target_offset: theirs.addr(),
        length: LEN as u64,
    };
    e.submit(b, &[w]).unwrap();
    let status = e.wait(b, Duration::from_secs(60)).unwrap();
    assert_eq!(status.state, TransferState::Completed, "{status:?}");
    assert!(
        theirs
            .to_vec(0, LEN)
            .unwrap()
            .iter()
            .all(|&b| b == LOCAL_BYTE)
    );
    let tcp: u64 = e.nic_load_stats().iter().map(|s| s.bytes_done).sum();
    assert_eq!(tcp, 0, "no byte went through TCP");
    std::fs::remove_dir_all(&dir).unwrap();
}

fn tempdir(what: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("te-origin-{what}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
