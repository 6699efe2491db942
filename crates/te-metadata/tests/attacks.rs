//! te-metadata against hostile clients, the real binary on loopback: heads that announce big
//! bodies and send nothing hold none of the server's budget for values in transit, framing that
//! another parser would read otherwise is refused and the connection closed, and with
//! `--token-file` a request without the token is refused before its body is read, while te's
//! engines holding it (`MC_TE_METADATA_TOKEN`) publish, find each other and move bytes.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::{buffer, engine, http_server_with};
use te_core::metadata::http::HttpStore;
use te_core::metadata::store::KvStore;
use te_core::{Opcode, TransferRequest, TransferState};

fn raw(port: u16, bytes: &[u8]) -> TcpStream {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(bytes).unwrap();
    s
}

/// Everything the server sends until it closes the connection.
fn until_closed(s: &mut TcpStream) -> String {
    let mut got = Vec::new();
    s.read_to_end(&mut got).expect("the server closes it");
    String::from_utf8_lossy(&got).into_owned()
}

#[test]
fn heads_announcing_bodies_they_never_send_lock_nobody_out() {
    // Room for four of the largest values in transit.
    let server = http_server_with(
        0,
        None,
        &["--max-value", "1048576", "--max-buffered", "4194304"],
    );
    let head = b"PUT /metadata?key=hog HTTP/1.1\r\nHost: x\r\nContent-Length: 1048576\r\n\r\n";
    let hogs: Vec<TcpStream> = (0..64).map(|_| raw(server.port, head)).collect();
    std::thread::sleep(Duration::from_millis(300));
    let honest = HttpStore::new(&server.url, Duration::from_secs(5), 1 << 20).unwrap();
    let value = "v".repeat(512 << 10);
    honest
        .put("honest", value.as_bytes())
        .expect("an honest PUT is served");
    assert_eq!(
        honest.get("honest").unwrap().as_deref(),
        Some(value.as_bytes())
    );
    drop(hogs);
}

#[test]
fn framing_another_parser_reads_otherwise_is_refused_and_the_connection_closed() {
    let server = http_server_with(0, None, &[]);
    for request in [
        "PUT /metadata?key=a HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        "PUT /metadata?key=a HTTP/1.1\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        "PUT /metadata?key=a HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n",
        "PUT /metadata?key=a HTTP/1.1\r\nContent-Length : 5\r\n\r\nhello",
    ] {
        let mut s = raw(server.port, request.as_bytes());
        let answer = until_closed(&mut s);
        assert!(
            answer.starts_with("HTTP/1.1 400"),
            "{request:?}: {answer:?}"
        );
    }
    let honest = HttpStore::new(&server.url, Duration::from_secs(5), 1 << 20).unwrap();
    assert_eq!(honest.get("a").unwrap(), None, "nothing was stored");
}

#[test]
fn with_a_token_file_only_holders_of_the_token_are_served() {
    let file = common::scratch("token");
    let token = "0123456789abcdef-te-token";
    std::fs::write(&file, format!("{token}\n")).unwrap();
    let server = http_server_with(0, None, &["--token-file", file.to_str().unwrap()]);
    // Refused before its body is read, the connection closed.
    let mut s = raw(
        server.port,
        b"PUT /metadata?key=k HTTP/1.1\r\nContent-Length: 1048576\r\n\r\n",
    );
    let answer = until_closed(&mut s);
    assert!(answer.starts_with("HTTP/1.1 401"), "{answer:?}");
    assert!(answer.contains("MC_TE_METADATA_TOKEN"), "{answer:?}");
    let mut s = raw(
        server.port,
        b"GET /metadata?key=k HTTP/1.1\r\nAuthorization: Bearer wrong-token-0000000\r\n\r\n",
    );
    assert!(until_closed(&mut s).starts_with("HTTP/1.1 401"));
    let without = HttpStore::new(&server.url, Duration::from_secs(5), 1 << 20).unwrap();
    assert!(without.get("k").is_err());
    let with = HttpStore::new(&server.url, Duration::from_secs(5), 1 << 20)
        .unwrap()
        .with_token(Some(token.into()));
    with.put("k", b"v").unwrap();
    assert_eq!(with.get("k").unwrap().as_deref(), Some(&b"v"[..]));
    // te's engines: without the token an engine cannot publish; with it, two find each other.
    let refused = engine(&server.url, "127.0.0.1:17801", |_| {});
    let Err(err) = refused else {
        panic!("publishing without the token succeeded");
    };
    assert!(err.to_string().contains("MC_TE_METADATA_TOKEN"), "{err}");
    let holder = |c: &mut te_core::Config| {
        c.metadata_token = Some(te_core::config::Redacted(token.into()));
    };
    let a = engine(&server.url, "127.0.0.1:17802", holder).unwrap();
    let b = engine(&server.url, "127.0.0.1:17803", holder).unwrap();
    let src = buffer(&a, 1 << 20, 7);
    let dst = buffer(&b, 1 << 20, 0);
    let seg = a.open_segment(b.segment_name()).unwrap();
    let batch = a.allocate_batch(1).unwrap();
    a.submit(
        batch,
        &[TransferRequest {
            opcode: Opcode::Write,
            source: src.addr(),
            target_id: seg,
            target_offset: dst.addr(),
            length: 1 << 20,
        }],
    )
    .unwrap();
    let status = a.wait(batch, Duration::from_secs(30)).unwrap();
    assert_eq!(status.state, TransferState::Completed);
    assert_eq!(dst.to_vec(0, 1 << 20).unwrap(), vec![7u8; 1 << 20]);
}

/// A listener of the attacker's: counts the connections it gets.
fn trap() -> (u16, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let hits = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = hits.clone();
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            drop(s);
        }
    });
    (port, hits)
}

#[test]
fn a_descriptor_rewritten_in_the_service_is_refused_under_a_cluster_secret() {
    let svc = http_server_with(0, None, &[]);
    let with_secret = |c: &mut te_core::Config| {
        c.cluster_secret = Some(te_core::config::Redacted(
            "shared-secret-0b6e6a1c5d7f".into(),
        ));
    };
    let tname = format!("signed-target-{}", std::process::id());
    // The target does not re-publish during the test: the rewrite stays in the service.
    let target = engine(&svc.url, &tname, |c| {
        with_secret(c);
        c.metadata_refresh = Duration::from_secs(3600);
    })
    .unwrap();
    let remote = buffer(&target, 1 << 20, 0x11);
    // An honest reader opens the segment while it is intact, and moves bytes.
    let reader = engine(&svc.url, "signed-reader", with_secret).unwrap();
    let local = buffer(&reader, 1 << 20, 0);
    let seg = reader.open_segment(&tname).unwrap();
    let read = TransferRequest {
        opcode: Opcode::Read,
        source: local.addr(),
        target_id: seg,
        target_offset: remote.addr(),
        length: 4096,
    };
    let run = |e: &te_core::TransferEngine, r: TransferRequest| {
        let b = e.allocate_batch(1).unwrap();
        e.submit(b, &[r]).unwrap();
        let s = e.wait(b, Duration::from_secs(30)).unwrap();
        e.free_batch(b).unwrap();
        s.state
    };
    assert_eq!(run(&reader, read), TransferState::Completed);
    // The attacker, who can write the service but holds no secret: the rails now point at its
    // listener, everything else (the sealed secret included) kept.
    let (port, hits) = trap();
    let kv = HttpStore::new(&svc.url, Duration::from_secs(5), 1 << 20).unwrap();
    let key = format!("mooncake/ram/{tname}");
    let mut desc: serde_json::Value =
        serde_json::from_slice(&kv.get(&key).unwrap().unwrap()).unwrap();
    assert!(desc["te_signature"].is_string(), "{desc}");
    for rail in desc["te_rails"].as_array_mut().unwrap() {
        rail["port"] = serde_json::Value::from(port);
    }
    kv.put(&key, desc.to_string().as_bytes()).unwrap();
    // A newcomer with the secret refuses it, naming the segment.
    let newcomer = engine(&svc.url, "signed-newcomer", with_secret).unwrap();
    match newcomer.open_segment(&tname) {
        Err(te_core::Error::PeerRefused { peer, reason }) => {
            assert_eq!(peer, tname);
            assert!(reason.contains("signature does not match"), "{reason}");
        }
        other => panic!("a rewritten descriptor was taken: {:?}", other.map(|_| ())),
    }
    // The reader's refreshes refuse it too: it keeps what it had, and its reads still go to
    // the target's own listener.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(run(&reader, read), TransferState::Completed);
    assert_eq!(local.to_vec(0, 4096).unwrap(), vec![0x11u8; 4096]);
    // Stripped of its signature, it is refused as unsigned.
    desc.as_object_mut().unwrap().remove("te_signature");
    kv.put(&key, desc.to_string().as_bytes()).unwrap();
    let err = newcomer.open_segment(&tname).unwrap_err();
    assert!(err.to_string().contains("not signed"), "{err}");
    assert_eq!(
        hits.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "an honest initiator connected to the attacker's listener"
    );
}
