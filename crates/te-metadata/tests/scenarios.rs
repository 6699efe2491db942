//! Engines sharing a real metadata service — the te-metadata server, Debian's redis-server and
//! (with the `etcd` feature) Debian's etcd —
//! through the same scenarios: open and transfer (bytes compared), a re-published descriptor
//! reaching a peer's cache, the service killed (transfers between open segments go on) and
//! restarted empty (engines publish again), a clean exit removing the descriptor (new opens
//! fail clearly), malformed JSON in the store (a clear error), and Redis authentication; and,
//! counted by Redis's `MONITOR`, each refresh re-reading one batch of open segments in turn.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{Service, buffer, engine, eventually, http_server, redis_server};
use te_core::metadata::store::KvStore;
use te_core::{
    Error, HostBuffer, Opcode, Permission, SegmentId, TransferEngine, TransferRequest,
    TransferState,
};

fn transfer(
    e: &TransferEngine,
    seg: SegmentId,
    local: u64,
    remote: u64,
    op: Opcode,
    len: u64,
) -> TransferState {
    let b = e.allocate_batch(1).unwrap();
    let r = TransferRequest {
        opcode: op,
        source: local,
        target_id: seg,
        target_offset: remote,
        length: len,
    };
    let state = match e.submit(b, &[r]) {
        Ok(()) => e.wait(b, Duration::from_secs(30)).unwrap().state,
        Err(_) => TransferState::Failed,
    };
    e.free_batch(b).unwrap();
    state
}

fn store_client(url: &str) -> Box<dyn KvStore> {
    use te_core::metadata::{http::HttpStore, redis};
    #[cfg(feature = "etcd")]
    if let Some(endpoints) = url.strip_prefix("etcd://") {
        let store =
            te_core::metadata::etcd::EtcdStore::new(endpoints, Duration::from_secs(2), 1 << 20);
        return Box::new(store.unwrap());
    }
    match url.starts_with("redis://") {
        true => Box::new(redis::RedisStore::new(
            redis::RedisTarget::parse(url).unwrap(),
            Duration::from_secs(2),
            1 << 20,
        )),
        false => Box::new(HttpStore::new(url, Duration::from_secs(2), 1 << 20).unwrap()),
    }
}

fn scenarios(start: impl Fn(u16) -> Service, label: &str) {
    let mut svc = start(0);
    let url = svc.url.clone();
    let port = svc.port;
    let tname = format!("{label}-target-{}", std::process::id());
    let target = engine(&url, &tname, |_| {}).unwrap();
    let tbuf = buffer(&target, 1 << 20, 0xab);
    let init = engine(
        &url,
        &format!("{label}-initiator-{}", std::process::id()),
        |_| {},
    )
    .unwrap();
    let local = Arc::new(HostBuffer::new(1 << 20).unwrap());
    init.register_buffer(&local, "*", Permission::LocalOnly)
        .unwrap();

    // Keys in Mooncake's layout.
    let kv = store_client(&url);
    assert!(kv.get(&format!("mooncake/ram/{tname}")).unwrap().is_some());
    let rpc = kv
        .get(&format!("mooncake/rpc_meta/{tname}"))
        .unwrap()
        .unwrap();
    let rpc: serde_json::Value = serde_json::from_slice(&rpc).unwrap();
    assert!(rpc["rpc_port"].as_u64().unwrap() > 0 && rpc["ip_or_host_name"].is_string());

    // Open by name, write and read back.
    let seg = init.open_segment(&tname).unwrap();
    local.write_at(0, &[0x5a; 4096]).unwrap();
    let state = transfer(&init, seg, local.addr(), tbuf.addr(), Opcode::Write, 4096);
    assert_eq!(state, TransferState::Completed);
    assert_eq!(tbuf.to_vec(0, 4096).unwrap(), vec![0x5a; 4096]);
    let state = transfer(
        &init,
        seg,
        local.addr() + 8192,
        tbuf.addr() + 8192,
        Opcode::Read,
        4096,
    );
    assert_eq!(state, TransferState::Completed);
    assert_eq!(local.to_vec(8192, 4096).unwrap(), vec![0xab; 4096]);

    // A re-published descriptor (a new buffer) reaches the initiator's cache by itself.
    let tbuf2 = buffer(&target, 8192, 0xcd);
    eventually(
        "the re-published descriptor in the initiator's cache",
        || init.segment(seg).unwrap().desc().buffers.len() == 2,
    );
    let state = transfer(&init, seg, local.addr(), tbuf2.addr(), Opcode::Read, 8192);
    assert_eq!(state, TransferState::Completed);
    assert_eq!(local.to_vec(0, 8192).unwrap(), vec![0xcd; 8192]);

    // The service dies: transfers between open segments carry on.
    svc.kill();
    std::thread::sleep(Duration::from_millis(1500));
    local.write_at(0, &[0x77; 65536]).unwrap();
    for _ in 0..3 {
        let state = transfer(&init, seg, local.addr(), tbuf.addr(), Opcode::Write, 65536);
        assert_eq!(
            state,
            TransferState::Completed,
            "transfer while the service is down"
        );
    }
    assert_eq!(tbuf.to_vec(0, 65536).unwrap(), vec![0x77; 65536]);

    // It comes back empty: the engines publish again, and a newcomer can open the target.
    let _restarted = start(port);
    let late = engine(
        &url,
        &format!("{label}-late-{}", std::process::id()),
        |_| {},
    )
    .unwrap();
    eventually("the target re-published after the restart", || {
        late.open_segment(&tname).is_ok()
    });

    // Malformed JSON in the store: a clear error, no panic.
    let kv = store_client(&url);
    kv.put("mooncake/ram/bogus", b"{not json").unwrap();
    kv.put(
        "mooncake/rpc_meta/bogus",
        br#"{"ip_or_host_name":"127.0.0.1","rpc_port":1}"#,
    )
    .unwrap();
    let err = late.open_segment("bogus").unwrap_err();
    assert!(matches!(err, Error::MalformedMessage(_)), "{err:?}");
    kv.put(
        "mooncake/ram/bogus2",
        br#"{"name":"bogus2","protocol":"tcp","buffers":[]}"#,
    )
    .unwrap();
    kv.put("mooncake/rpc_meta/bogus2", b"[1,2]").unwrap();
    assert!(matches!(
        late.open_segment("bogus2"),
        Err(Error::MalformedMessage(_))
    ));

    // A clean exit removes the descriptor: new opens fail clearly, and the initiator's next
    // transfer learns it too.
    drop(tbuf2);
    target.shutdown();
    assert!(kv.get(&format!("mooncake/ram/{tname}")).unwrap().is_none());
    let late2 = engine(
        &url,
        &format!("{label}-late2-{}", std::process::id()),
        |_| {},
    )
    .unwrap();
    let err = late2.open_segment(&tname).unwrap_err();
    assert!(
        matches!(&err, Error::SegmentNotFound { segment, .. } if *segment == tname),
        "{err:?}"
    );
    assert!(
        err.to_string().contains("removed when its owner exited"),
        "{err}"
    );
    eventually("the initiator sees the removal", || {
        let b = init.allocate_batch(1).unwrap();
        let r = TransferRequest {
            opcode: Opcode::Read,
            source: local.addr(),
            target_id: seg,
            target_offset: tbuf.addr(),
            length: 16,
        };
        let refused = matches!(init.submit(b, &[r]), Err(Error::SegmentNotFound { .. }));
        if !refused {
            let _ = init.wait(b, Duration::from_secs(30));
        }
        init.free_batch(b).unwrap();
        refused
    });
}

#[test]
fn http_metadata_server_scenarios() {
    scenarios(|port| http_server(port, None), "http");
}

#[test]
fn redis_scenarios() {
    scenarios(|port| redis_server(port, None), "redis");
}

#[cfg(feature = "etcd")]
#[test]
fn etcd_scenarios() {
    scenarios(common::etcd_server, "etcd");
}

#[test]
fn redis_authentication_and_database() {
    let svc = redis_server(0, Some("s3cret-pass"));
    let name = format!("auth-target-{}", std::process::id());
    // Right password, database 2: served, and the keys land in database 2 only.
    let ok = engine(&svc.url, &name, |c| {
        c.redis_password = Some(te_core::config::Redacted("s3cret-pass".into()));
        c.redis_db_index = Some(2);
    })
    .unwrap();
    let db2 = te_core::metadata::redis::RedisStore::new(
        te_core::metadata::redis::RedisTarget::parse(&format!(
            "redis://:s3cret-pass@127.0.0.1:{}/2",
            svc.port
        ))
        .unwrap(),
        Duration::from_secs(2),
        1 << 20,
    );
    assert!(db2.get(&format!("mooncake/ram/{name}")).unwrap().is_some());
    let db0 = te_core::metadata::redis::RedisStore::new(
        te_core::metadata::redis::RedisTarget::parse(&format!(
            "redis://:s3cret-pass@127.0.0.1:{}",
            svc.port
        ))
        .unwrap(),
        Duration::from_secs(2),
        1 << 20,
    );
    assert!(db0.get(&format!("mooncake/ram/{name}")).unwrap().is_none());
    drop(ok);
    // Wrong password, and none: refused at start with the reason, the password never printed.
    let wrong = engine(&svc.url, "auth-wrong", |c| {
        c.redis_password = Some(te_core::config::Redacted("nope-nope".into()));
    })
    .unwrap_err();
    assert!(wrong.to_string().contains("authentication"), "{wrong}");
    assert!(!wrong.to_string().contains("nope-nope"));
    let none = engine(&svc.url, "auth-none", |_| {}).unwrap_err();
    assert!(none.to_string().contains("authentication"), "{none}");
}

#[test]
fn a_cluster_id_namespaces_the_keys() {
    let svc = http_server(0, None);
    let name = format!("ns-target-{}", std::process::id());
    let a = engine(&svc.url, &name, |c| {
        c.metadata_cluster_id = Some("cluster-a".into())
    })
    .unwrap();
    let kv = store_client(&svc.url);
    assert!(
        kv.get(&format!("mooncake/cluster-a/ram/{name}"))
            .unwrap()
            .is_some()
    );
    assert!(kv.get(&format!("mooncake/ram/{name}")).unwrap().is_none());
    let other = engine(&svc.url, "ns-other", |c| {
        c.metadata_cluster_id = Some("cluster-b".into())
    })
    .unwrap();
    assert!(matches!(
        other.open_segment(&name),
        Err(Error::SegmentNotFound { .. })
    ));
    let same = engine(&svc.url, "ns-same", |c| {
        c.metadata_cluster_id = Some("cluster-a".into())
    })
    .unwrap();
    assert!(same.open_segment(&name).is_ok());
    drop(a);
}

/// Mooncake's own HTTP metadata server never replaces an `rpc_meta` entry ("Duplicate rpc_meta
/// key not allowed"). An engine re-publishes its entry every refresh, and one restarted on the
/// same listener finds its old entry there: publishing the entry it already holds succeeds,
/// and one that names another listener is an error naming both.
#[test]
fn rpc_entries_republish_on_mooncakes_metadata_server() {
    let server = te_testkit::mooncake::http_metadata_server();
    let md = te_core::metadata::open(&server.url, &te_core::Config::default()).unwrap();
    md.publish_rpc("te-node", "127.0.0.1", 4000).unwrap();
    md.publish_rpc("te-node", "127.0.0.1", 4000)
        .expect("the entry it holds is published again");
    let err = md
        .publish_rpc("te-node", "127.0.0.1", 4001)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(
            "names 127.0.0.1:4000, not this engine's 127.0.0.1:4001, and the service refused \
             to replace it"
        ) && err.contains("Duplicate rpc_meta key not allowed")
            && err.contains("another engine is named \"te-node\", or one that stopped"),
        "{err}"
    );
    assert_eq!(
        md.rpc_address("te-node").unwrap(),
        ("127.0.0.1".to_string(), 4000)
    );
}

/// The commands Redis's `MONITOR` reports, as (client address, command words), read until
/// `enough` says so (or 20 s pass).
fn monitor(
    port: u16,
    mut enough: impl FnMut(&[(String, Vec<String>)]) -> bool,
) -> Vec<(String, Vec<String>)> {
    use std::io::{BufRead, BufReader, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(b"MONITOR\r\n").unwrap();
    let mut lines = BufReader::new(s).lines();
    assert_eq!(lines.next().unwrap().unwrap(), "+OK");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let mut seen = Vec::new();
    while !enough(&seen) {
        assert!(
            std::time::Instant::now() < deadline,
            "MONITOR: {} commands",
            seen.len()
        );
        // `+1733390000.123456 [0 127.0.0.1:40000] "GET" "key"`
        let line = lines.next().unwrap().unwrap();
        let Some((client, rest)) = line.split_once(" [").and_then(|(_, r)| r.split_once("] "))
        else {
            continue;
        };
        let client = client.split(' ').nth(1).unwrap_or_default().to_string();
        let words = rest
            .split("\" \"")
            .map(|w| w.trim_matches('"').to_string())
            .collect();
        seen.push((client, words));
    }
    seen
}

/// An engine with many open segments re-reads a batch of them each refresh, in turn: its load on
/// the service does not grow with its peers. Counted by Redis itself (`MONITOR`).
#[test]
fn each_refresh_rereads_one_batch_of_open_segments_in_turn() {
    let svc = redis_server(0, None);
    let pid = std::process::id();
    let targets: Vec<_> = (0..6)
        .map(|i| {
            let e = engine(&svc.url, &format!("batch-t{i}-{pid}"), |_| {}).unwrap();
            let b = buffer(&e, 4096, i as u8);
            (e, b)
        })
        .collect();
    let name = format!("batch-init-{pid}");
    let init = engine(&svc.url, &name, |c| c.metadata_refresh_batch = 2).unwrap();
    for i in 0..6 {
        init.open_segment(&format!("batch-t{i}-{pid}")).unwrap();
    }
    let own = format!("mooncake/ram/{name}");
    let is_publish = |w: &Vec<String>| w.len() > 1 && w[0] == "SET" && w[1] == own;
    // Five publications of the initiator's own descriptor: four refreshes between them.
    let seen = monitor(svc.port, |seen| {
        seen.iter().filter(|(_, w)| is_publish(w)).count() >= 5
    });
    let client = &seen.iter().find(|(_, w)| is_publish(w)).unwrap().0;
    let mut refreshes: Vec<Vec<String>> = Vec::new();
    for (_, words) in seen.iter().filter(|(c, _)| c == client) {
        if is_publish(words) {
            refreshes.push(Vec::new());
        } else if let (Some(last), [get, key]) = (refreshes.last_mut(), words.as_slice())
            && get == "GET"
            && let Some(t) = key.strip_prefix("mooncake/ram/")
        {
            last.push(t.to_string());
        }
    }
    // The last publication's refresh may still be under way.
    refreshes.pop();
    assert_eq!(refreshes.len(), 4, "{refreshes:?}");
    for r in &refreshes {
        assert_eq!(r.len(), 2, "one batch per refresh: {refreshes:?}");
    }
    // Three refreshes in a row read all six, each once.
    let mut three: Vec<_> = refreshes[..3].concat();
    three.sort();
    let want: Vec<_> = (0..6).map(|i| format!("batch-t{i}-{pid}")).collect();
    assert_eq!(three, want, "{refreshes:?}");
    drop(targets);
}
