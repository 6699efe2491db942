//! Segment names are keys te chooses: a name that arrives from a peer (NIXL's
//! `loadRemoteConnInfo`, a store master) never reaches a local file segment, and a descriptor a
//! metadata service returns for one name never replaces another segment, a file's included.
//! Against a real file and a real Redis.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use te_core::metadata::store::KvStore;
use te_core::{
    Config, Error, FileAccess, HostBuffer, Opcode, Permission, TransferEngine, TransferRequest,
    TransferState,
};
use te_uring::{BufIoTransport, FileOptions};

const LEN: usize = 1 << 20;

fn engine(metadata: &str, name: &str) -> TransferEngine {
    let mut c = Config::default();
    c.tcp_bind_address = Some("127.0.0.1".parse().unwrap());
    let e = TransferEngine::init(c, metadata, name).unwrap();
    e.install_transport(Arc::new(BufIoTransport::new(FileOptions::default())))
        .unwrap();
    e
}

/// A file of `LEN` bytes of `byte`, opened read-write as a segment of `e`: its path and id.
fn file_segment(e: &TransferEngine, tag: &str, byte: u8) -> (std::path::PathBuf, u64) {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("te-uring-names");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{tag}-{}", std::process::id()));
    std::fs::write(&path, vec![byte; LEN]).unwrap();
    let id = e.open_file_segment(&path, FileAccess::ReadWrite).unwrap();
    (path.canonicalize().unwrap(), id)
}

fn refused_as_a_peer(e: &TransferEngine, name: &str) {
    for open in [
        e.open_segment(name),
        e.open_segment(&format!("/{name}")),
        e.refresh_segment(name),
    ] {
        match open {
            Err(Error::InvalidArgument(m)) => assert!(m.contains("file"), "{m}"),
            other => panic!("{name}: {other:?}"),
        }
    }
}

#[test]
fn a_peers_name_spelled_as_a_file_never_opens_the_local_file() {
    let e = engine("P2PHANDSHAKE", "127.0.0.1");
    let (path, id) = file_segment(&e, "p2p", 0x11);
    let name = format!("file:{}", path.display());
    assert_eq!(e.segment(id).unwrap().name(), name, "the file's own name");
    refused_as_a_peer(&e, &name);
    refused_as_a_peer(&e, "file:/etc/passwd");
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn a_descriptor_fetched_for_one_name_never_replaces_another_segment() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("te-names-redis-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let redis = te_testkit::services::redis_server(0, None, &dir);
    let url = format!("redis://127.0.0.1:{}", redis.port);
    let e = engine(&url, "initiator");
    let (path, file) = file_segment(&e, "store", 0x22);
    let file_name = format!("file:{}", path.display());
    // The service answers for `peerA` with a descriptor that names itself the file, and points
    // at a listener of the attacker's (any address would do: nothing may be fetched through it).
    let store = te_core::metadata::redis::RedisStore::new(
        te_core::metadata::redis::RedisTarget::parse(&url).unwrap(),
        Duration::from_secs(5),
        1 << 20,
    );
    let forged = format!(
        r#"{{"name":{file_name:?},"protocol":"tcp","tcp_data_port":9,"buffers":[{{"name":"cpu:0","addr":0,"length":{LEN}}}]}}"#
    );
    store.put("mooncake/ram/peerA", forged.as_bytes()).unwrap();
    store
        .put(
            "mooncake/rpc_meta/peerA",
            br#"{"ip_or_host_name":"127.0.0.1","rpc_port":9}"#,
        )
        .unwrap();
    match e.open_segment("peerA") {
        Err(Error::MalformedMessage(m)) => {
            assert!(m.contains("peerA") && m.contains(&file_name), "{m}")
        }
        other => panic!("{other:?}"),
    }
    assert!(
        !e.open_segment_names().iter().any(|n| n == "peerA"),
        "nothing kept for peerA"
    );
    // The file segment is still the file: a READ gives the file's bytes.
    let local = Arc::new(HostBuffer::new(LEN).unwrap());
    e.register_buffer(&local, "*", Permission::LocalOnly)
        .unwrap();
    let r = TransferRequest {
        opcode: Opcode::Read,
        source: local.addr(),
        target_id: file,
        target_offset: 0,
        length: LEN as u64,
    };
    let b = e.allocate_batch(1).unwrap();
    e.submit(b, &[r]).unwrap();
    assert_eq!(
        e.wait(b, Duration::from_secs(30)).unwrap().state,
        TransferState::Completed
    );
    assert!(local.to_vec(0, LEN).unwrap().iter().all(|&b| b == 0x22));
    assert_eq!(e.segment(file).unwrap().name(), file_name);
    std::fs::remove_file(&path).unwrap();
    drop(redis);
    std::fs::remove_dir_all(&dir).unwrap();
}
