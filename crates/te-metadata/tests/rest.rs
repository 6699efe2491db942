//! The te-metadata binary on a real socket: Mooncake's REST verbs and 404s, persistence across
//! a kill and restart (every acknowledged change, even with the kill in the middle of a stream
//! of them), and bad requests (garbage, oversized heads and bodies, a wrong path, a
//! missing or badly encoded key, a non-UTF-8 value, an unknown method) answered with 4xx while
//! the server keeps serving, and a store at its `--max-stored` limit refusing what would grow it.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::{http_server, scratch};
use te_core::metadata::http::HttpStore;
use te_core::metadata::store::KvStore;

fn client(url: &str) -> HttpStore {
    HttpStore::new(url, Duration::from_secs(2), 1 << 20).unwrap()
}

/// Sends raw bytes, returns the status code of the answer (read up to the end of its head: a
/// request that came whole leaves the connection open).
fn raw(port: u16, bytes: &[u8]) -> u16 {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let _ = s.write_all(bytes);
    let mut out = Vec::new();
    let mut byte = [0u8; 1];
    while !out.ends_with(b"\r\n\r\n") && matches!(s.read(&mut byte), Ok(1)) {
        out.push(byte[0]);
    }
    let text = String::from_utf8_lossy(&out);
    text.split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status in {text:?}"))
}

/// Sends `bytes` on one connection and reads everything the server answers until it closes.
fn exchange(port: u16, bytes: &[u8]) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(bytes).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

#[test]
fn verbs_and_persistence_across_a_restart() {
    let file = scratch("persist.json");
    common::remove_persisted(&file);
    let mut svc = http_server(0, Some(&file));
    let kv = client(&svc.url);
    assert_eq!(
        kv.get("mooncake/ram/a").unwrap(),
        None,
        "404 reads as absent"
    );
    kv.put("mooncake/ram/a", br#"{"name":"a"}"#).unwrap();
    kv.put(
        "mooncake/rpc_meta/a",
        br#"{"ip_or_host_name":"h","rpc_port":1}"#,
    )
    .unwrap();
    kv.put("x y/z", b"spaces and slashes").unwrap();
    assert_eq!(
        kv.get("mooncake/ram/a").unwrap().unwrap(),
        br#"{"name":"a"}"#
    );
    assert_eq!(kv.get("x y/z").unwrap().unwrap(), b"spaces and slashes");
    kv.delete("x y/z").unwrap();
    assert_eq!(kv.get("x y/z").unwrap(), None);
    kv.delete("never-there").unwrap();

    // Killed (no clean shutdown) and restarted on the same file: nothing is lost.
    let port = svc.port;
    svc.kill();
    assert!(kv.get("mooncake/ram/a").is_err(), "the server is down");
    let svc = http_server(port, Some(&file));
    let kv = client(&svc.url);
    assert_eq!(
        kv.get("mooncake/ram/a").unwrap().unwrap(),
        br#"{"name":"a"}"#
    );
    assert!(kv.get("mooncake/rpc_meta/a").unwrap().is_some());
    assert_eq!(kv.get("x y/z").unwrap(), None, "a delete persisted too");
    drop(svc);
    common::remove_persisted(&file);
}

#[test]
fn every_acknowledged_change_survives_a_kill_mid_stream() {
    let file = scratch("stream.json");
    common::remove_persisted(&file);
    let mut svc = http_server(0, Some(&file));
    // 16 KiB values: the log passes 1 MiB, and is folded into the snapshot, every 64 or so.
    let value = |i: usize| format!("{i}:{}", "v".repeat(16 << 10));
    // Four writers on connections of their own, so changes share syncs (group commit).
    const WRITERS: usize = 4;
    const KEYS: usize = 40;
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let url = svc.url.clone();
            std::thread::spawn(move || {
                let kv = HttpStore::new(&url, Duration::from_secs(5), 1 << 20).unwrap();
                let mut acked = Vec::new();
                for i in 0.. {
                    let key = format!("mooncake/ram/w{w}n{}", i % KEYS);
                    match kv.put(&key, value(i).as_bytes()) {
                        Ok(()) => acked.push(i),
                        Err(_) => break,
                    }
                }
                acked
            })
        })
        .collect();
    common::eventually("every writer's keys all written", || {
        std::fs::metadata(&file).is_ok_and(|m| m.len() > 0)
            && (0..WRITERS).all(|w| {
                client(&svc.url)
                    .get(&format!("mooncake/ram/w{w}n{}", KEYS - 1))
                    .is_ok_and(|v| v.is_some())
            })
    });
    std::thread::sleep(Duration::from_millis(200));
    let port = svc.port;
    svc.kill();
    let acked: Vec<Vec<usize>> = writers.into_iter().map(|t| t.join().unwrap()).collect();
    let svc = http_server(port, Some(&file));
    let kv = HttpStore::new(&svc.url, Duration::from_secs(5), 1 << 20).unwrap();
    // The last acknowledged value of every key is there (one unacknowledged may have landed).
    for (w, acked) in acked.iter().enumerate() {
        for n in 0..KEYS {
            let last = acked.iter().rev().find(|&&i| i % KEYS == n).unwrap();
            let got = kv.get(&format!("mooncake/ram/w{w}n{n}")).unwrap().unwrap();
            let got = String::from_utf8(got).unwrap();
            let index: usize = got.split(':').next().unwrap().parse().unwrap();
            assert!(
                index == *last || index == last + KEYS,
                "key w{w}n{n}: value {index}, last acknowledged {last}"
            );
            assert_eq!(got, value(index));
        }
    }
    drop(svc);
    common::remove_persisted(&file);
}

#[test]
fn sigterm_and_sigint_close_the_listener_and_exit_zero_keeping_what_was_stored() {
    for signal in ["TERM", "INT"] {
        let file = scratch(&format!("signal-{signal}.json"));
        common::remove_persisted(&file);
        let mut svc = http_server(0, Some(&file));
        client(&svc.url).put("mooncake/ram/k", b"v").unwrap();
        let status = svc.terminate(signal);
        assert!(status.success(), "SIG{signal}: {status}");
        assert!(
            TcpStream::connect(("127.0.0.1", svc.port)).is_err(),
            "SIG{signal}: the listener is closed"
        );
        let again = http_server(svc.port, Some(&file));
        assert_eq!(
            client(&again.url).get("mooncake/ram/k").unwrap().unwrap(),
            b"v"
        );
    }
}

#[test]
fn help_version_and_bad_arguments_follow_the_conventions() {
    let run_with = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_te-metadata"))
            .args(args)
            .output()
            .unwrap()
    };
    let run = |arg: &str| run_with(&[arg]);
    let help = run("--help");
    assert_eq!(help.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&help.stdout).starts_with("usage: te-metadata"));
    let version = run("--version");
    assert_eq!(version.status.code(), Some(0));
    assert_eq!(
        String::from_utf8_lossy(&version.stdout).trim(),
        format!("te-metadata {}", env!("CARGO_PKG_VERSION"))
    );
    let bad = run("--bogus");
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("usage: te-metadata"));
    // A budget for values in transit that the largest value could never fit.
    let small = run_with(&["--max-value", "1000", "--max-buffered", "999"]);
    assert_eq!(small.status.code(), Some(2));
    let err = String::from_utf8_lossy(&small.stderr);
    assert!(
        err.contains("--max-buffered 999 is below --max-value 1000"),
        "{err}"
    );
}

#[test]
fn a_corrupt_persistence_file_stops_the_server_with_a_reason() {
    let file = scratch("corrupt.json");
    std::fs::write(&file, b"{ this is not json").unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_te-metadata"))
        .args(["--addr", "127.0.0.1:0", "--persist"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not a JSON object"), "{err}");
    common::remove_persisted(&file);
}

#[test]
fn bad_requests_get_4xx_and_the_server_keeps_serving() {
    let svc = http_server(0, None);
    let p = svc.port;
    assert_eq!(raw(p, b"GET /elsewhere?key=a HTTP/1.1\r\n\r\n"), 404);
    assert_eq!(raw(p, b"GET /metadata HTTP/1.1\r\n\r\n"), 400);
    assert_eq!(raw(p, b"GET /metadata?key=%zz HTTP/1.1\r\n\r\n"), 400);
    assert_eq!(
        raw(
            p,
            b"PATCH /metadata?key=a HTTP/1.1\r\nContent-Length: 0\r\n\r\n"
        ),
        405
    );
    assert_eq!(
        raw(
            p,
            b"PUT /metadata?key=a HTTP/1.1\r\nContent-Length: 2\r\n\r\n\xff\xfe"
        ),
        400
    );
    assert_eq!(
        raw(
            p,
            b"PUT /metadata?key=a HTTP/1.1\r\nContent-Length: 99999999999\r\n\r\n"
        ),
        413
    );
    assert_eq!(
        raw(
            p,
            b"PUT /metadata?key=a HTTP/1.1\r\nContent-Length: banana\r\n\r\n"
        ),
        400
    );
    assert_eq!(
        raw(p, b"GET /metadata?key=a HTTP/1.1\r\nno colon here\r\n\r\n"),
        400
    );
    let mut huge = b"GET /metadata?key=a HTTP/1.1\r\nX: ".to_vec();
    huge.extend(vec![b'a'; 20 << 10]);
    huge.extend_from_slice(b"\r\n\r\n");
    assert_eq!(raw(p, &huge), 400);
    assert_eq!(raw(p, b"\x00\x01\x02garbage\r\n\r\n"), 404);
    // A request that came whole keeps its connection, whatever the answer: a 404 and then a
    // 200 on one connection.
    let out = exchange(p, b"GET /metadata?key=absent HTTP/1.1\r\n\r\nPUT /metadata?key=k HTTP/1.1\r\nContent-Length: 1\r\nConnection: close\r\n\r\nv");
    assert!(
        out.starts_with("HTTP/1.1 404 Not Found\r\n") && out.contains("HTTP/1.1 200 OK\r\n"),
        "{out}"
    );
    // Still serving, and keep-alive works for two requests on one connection.
    let kv = client(&svc.url);
    kv.put("k", b"v").unwrap();
    let out = exchange(p, b"GET /metadata?key=k HTTP/1.1\r\n\r\nGET /metadata?key=k HTTP/1.1\r\nConnection: close\r\n\r\n");
    assert_eq!(out.matches("HTTP/1.1 200 OK").count(), 2, "{out}");
}

/// te's HTTP client keeps its connection open between requests, as Mooncake's curl handles do,
/// and replaces one the server closed while it was idle without failing the request.
#[test]
fn the_client_keeps_its_connection_and_survives_the_server_closing_it() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let options = te_metadata::Options {
        idle_timeout: Duration::from_secs(1),
        ..te_metadata::Options::default()
    };
    let server = te_metadata::Server::start(listener, options).unwrap();
    let kv = client(&format!("http://{}/metadata", server.addr()));
    for i in 0..50 {
        let key = format!("mooncake/ram/n{i}");
        kv.put(&key, format!("d{i}").as_bytes()).unwrap();
        assert_eq!(kv.get(&key).unwrap().unwrap(), format!("d{i}").as_bytes());
        assert_eq!(kv.get("absent").unwrap(), None, "a 404 keeps it too");
        assert_eq!(kv.idle_connections(), 1);
        assert_eq!(server.connections(), 1, "one connection for every request");
    }
    // The server closes it after a second of silence; the next request goes on a new one.
    common::eventually("the server closing the idle connection", || {
        server.connections() == 0
    });
    assert_eq!(kv.idle_connections(), 1, "the client has not noticed");
    kv.delete("mooncake/ram/n0").unwrap();
    assert_eq!(kv.get("mooncake/ram/n0").unwrap(), None);
    assert_eq!(kv.get("mooncake/ram/n1").unwrap().unwrap(), b"d1");
    assert_eq!((kv.idle_connections(), server.connections()), (1, 1));
}

#[test]
fn a_full_store_refuses_what_would_grow_it_and_takes_what_frees_room() {
    let file = scratch("full.json");
    common::remove_persisted(&file);
    // Room for two 1,000-byte values under keys of 6 bytes (64 bytes each of bookkeeping).
    let room = 2 * (6 + 1000 + 64) + 100;
    let mut svc = common::http_server_with(0, Some(&file), &["--max-stored", &room.to_string()]);
    let kv = client(&svc.url);
    let value = |b: u8| vec![b; 1000];
    kv.put("key-01", &value(1)).unwrap();
    kv.put("key-02", &value(2)).unwrap();
    let err = kv.put("key-03", &value(3)).unwrap_err().to_string();
    assert!(err.contains("HTTP 507"), "{err}");
    assert!(
        err.contains("--max-stored"),
        "the engine is told why: {err}"
    );
    assert_eq!(kv.get("key-03").unwrap(), None, "nothing stored");
    assert!(
        kv.put("key-01", &vec![1; 1101]).is_err(),
        "a value grown past the limit"
    );
    assert_eq!(kv.get("key-01").unwrap().unwrap(), value(1));
    // Re-publishing the same descriptor, or a smaller one, is always taken.
    kv.put("key-01", &value(9)).unwrap();
    kv.delete("key-02").unwrap();
    kv.put("key-03", &value(3)).unwrap();
    // What was taken survives a restart under the same limit; the server kept serving.
    let port = svc.port;
    svc.kill();
    let svc = common::http_server_with(port, Some(&file), &["--max-stored", &room.to_string()]);
    let kv = client(&svc.url);
    assert_eq!(kv.get("key-01").unwrap().unwrap(), value(9));
    assert_eq!(kv.get("key-02").unwrap(), None);
    assert_eq!(kv.get("key-03").unwrap().unwrap(), value(3));
    assert!(kv.put("key-04", &value(4)).is_err());
    assert_eq!(
        raw(svc.port, b"GET /metadata?key=key-04 HTTP/1.1\r\n\r\n"),
        404
    );
    common::remove_persisted(&file);
}
