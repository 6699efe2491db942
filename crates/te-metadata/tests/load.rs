//! The te-metadata binary under load and against slow or silent clients, on real sockets:
//! a thousand connections held open cost no threads and crowd out nobody, a request trickled
//! in is cut off, a silent connection is closed, `Expect: 100-continue` gets its interim
//! answer, connections over the cap are answered 503 while the server keeps serving, and
//! values past the server-wide budget for values in transit are turned away with a 503 that
//! loses nothing and keeps the connection.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::{http_server, http_server_with};
use te_core::metadata::http::HttpStore;
use te_core::metadata::store::KvStore;
use te_testkit::closed_within;

fn client(url: &str) -> HttpStore {
    HttpStore::new(url, Duration::from_secs(5), 1 << 20).unwrap()
}

fn connect(port: u16) -> TcpStream {
    let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

/// Reads one reply (head and `Content-Length` body) from `s`; its status and body.
fn read_reply(s: &mut TcpStream) -> (u16, String) {
    let mut got = Vec::new();
    let mut byte = [0u8; 1];
    while !got.ends_with(b"\r\n\r\n") {
        assert_eq!(s.read(&mut byte).unwrap(), 1, "reply cut short: {got:?}");
        got.push(byte[0]);
    }
    let head = String::from_utf8(got).unwrap();
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("Content-Length: "))
        .map_or(0, |v| v.trim().parse().unwrap());
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).unwrap();
    (status, String::from_utf8(body).unwrap())
}

/// Threads of process `pid`.
fn threads(pid: u32) -> usize {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

#[test]
fn a_thousand_open_connections_cost_no_threads_and_crowd_out_nobody() {
    let svc = http_server(0, None);
    let before = threads(svc.pid());
    let mut idle: Vec<TcpStream> = (0..1000).map(|_| connect(svc.port)).collect();
    // Every one is being served: a keep-alive request on every hundredth gets its answer.
    client(&svc.url).put("k", b"v").unwrap();
    for s in idle.iter_mut().step_by(100) {
        s.write_all(b"GET /metadata?key=k HTTP/1.1\r\n\r\n")
            .unwrap();
        assert_eq!(read_reply(s), (200, "v".to_string()));
    }
    let during = threads(svc.pid());
    assert!(
        during == before && during <= 8,
        "{during} threads with 1,000 connections, {before} with none"
    );
    // New clients are served while they are held.
    let kv = client(&svc.url);
    for i in 0..50 {
        let key = format!("mooncake/ram/node{i}");
        kv.put(&key, format!("desc {i}").as_bytes()).unwrap();
        assert_eq!(
            kv.get(&key).unwrap().unwrap(),
            format!("desc {i}").as_bytes()
        );
    }
    drop(idle);
}

#[test]
fn a_request_trickled_in_is_cut_off_at_the_request_timeout() {
    let svc = http_server_with(0, None, &["--request-timeout", "1"]);
    let mut slow = connect(svc.port);
    let head = b"PUT /metadata?key=slow HTTP/1.1\r\nContent-Length: 1000\r\n\r\n";
    slow.write_all(head).unwrap();
    // A byte every 100 ms: never idle, never whole.
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut cut = false;
    while Instant::now() < deadline {
        if slow.write_all(b"x").is_err() {
            cut = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
        slow.set_nonblocking(true).unwrap();
        let mut b = [0u8; 16];
        let read = slow.read(&mut b);
        slow.set_nonblocking(false).unwrap();
        if matches!(read, Ok(0))
            || matches!(&read, Err(e) if e.kind() != std::io::ErrorKind::WouldBlock)
        {
            cut = true;
            break;
        }
    }
    assert!(cut, "a request trickling in for 15 s was never cut off");
    client(&svc.url).put("slow", b"fast").unwrap();
    assert_eq!(client(&svc.url).get("slow").unwrap().unwrap(), b"fast");
}

#[test]
fn a_silent_connection_is_closed_after_the_idle_timeout() {
    let svc = http_server_with(0, None, &["--idle-timeout", "1"]);
    client(&svc.url).put("k", b"v").unwrap();
    let mut s = connect(svc.port);
    s.write_all(b"GET /metadata?key=k HTTP/1.1\r\n\r\n")
        .unwrap();
    assert_eq!(read_reply(&mut s), (200, "v".to_string()), "kept alive");
    assert!(
        closed_within(&mut s, Duration::from_secs(15)),
        "a silent keep-alive connection was still open after 15 s"
    );
}

#[test]
fn expect_100_continue_gets_its_interim_answer() {
    let svc = http_server(0, None);
    let mut s = connect(svc.port);
    s.write_all(
        b"PUT /metadata?key=big HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n",
    )
    .unwrap();
    let mut interim = [0u8; 25];
    s.read_exact(&mut interim).unwrap();
    assert_eq!(&interim, b"HTTP/1.1 100 Continue\r\n\r\n");
    s.write_all(b"hello").unwrap();
    assert_eq!(read_reply(&mut s).0, 200);
    assert_eq!(client(&svc.url).get("big").unwrap().unwrap(), b"hello");
}

#[test]
fn connections_over_the_cap_are_answered_503_and_the_server_keeps_serving() {
    let svc = http_server_with(0, None, &["--max-connections", "4"]);
    let held: Vec<TcpStream> = (0..4).map(|_| connect(svc.port)).collect();
    // Accepted in the order they connected: the fifth finds the cap.
    let mut over = connect(svc.port);
    let (status, body) = read_reply(&mut over);
    assert_eq!(status, 503, "{body}");
    assert!(
        body.contains("at most 4 connections") && body.contains("--max-connections"),
        "{body}"
    );
    drop(held);
    common::eventually("a place under the cap", || {
        client(&svc.url).put("k", b"v").is_ok()
    });
    assert_eq!(client(&svc.url).get("k").unwrap().unwrap(), b"v");
}

/// A client whose receive buffer is fixed at 64 KiB, so a reply it does not read stays, but for
/// what the server's send buffer takes, in the server's outbox.
fn tight_client(port: u16) -> TcpStream {
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    s.set_recv_buffer_size(64 << 10).unwrap();
    s.connect(&std::net::SocketAddr::from(([127, 0, 0, 1], port)).into())
        .unwrap();
    let s: TcpStream = s.into();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

/// The start of a reply's body, for messages.
fn brief(body: &str) -> &str {
    &body[..body.len().min(200)]
}

/// Sends a PUT of `value` under `key` on `s`, without waiting for the reply.
fn send_put(s: &mut TcpStream, key: &str, value: &[u8]) {
    let head = format!(
        "PUT /metadata?key={key} HTTP/1.1\r\nContent-Length: {}\r\n\r\n",
        value.len()
    );
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(value).unwrap();
}

#[test]
fn values_in_transit_past_the_budget_are_turned_away_and_nothing_is_lost() {
    const MIB: usize = 1 << 20;
    // Values up to 8 MiB; 12 MiB in transit at once.
    let svc = http_server_with(
        0,
        None,
        &["--max-value", "8388608", "--max-buffered", "12582912"],
    );
    let big = vec![b'b'; 8 * MIB];
    let mid = vec![b'm'; 5 * MIB];

    // A body being gathered holds what has come of it (not what its head announces): one of
    // 8 MiB, told to go on, holds 8 of the 12 once all but its last byte are in.
    let mut holder = connect(svc.port);
    holder
        .write_all(b"PUT /metadata?key=big HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 8388608\r\n\r\n")
        .unwrap();
    let mut interim = [0u8; 25];
    holder.read_exact(&mut interim).unwrap();
    assert_eq!(&interim, b"HTTP/1.1 100 Continue\r\n\r\n");
    holder.write_all(&big[..8 * MIB - 1]).unwrap();
    // The server reads those bytes as they come (milliseconds over loopback).
    std::thread::sleep(Duration::from_secs(1));

    // A 5 MiB body does not fit: read past, answered 503 naming the flag, the connection kept,
    // and nothing stored.
    let mut other = connect(svc.port);
    send_put(&mut other, "mid", &mid);
    let (status, body) = read_reply(&mut other);
    assert_eq!(status, 503, "{}", brief(&body));
    assert!(body.contains("--max-buffered"), "{}", brief(&body));
    other
        .write_all(b"GET /metadata?key=mid HTTP/1.1\r\n\r\n")
        .unwrap();
    assert_eq!(
        read_reply(&mut other).0,
        404,
        "a turned-away PUT stored nothing"
    );
    // Small values still fit beside it.
    send_put(&mut other, "small", b"s");
    assert_eq!(read_reply(&mut other).0, 200);

    // The 8 MiB body's last byte comes in and it is stored; its room is given back, and the
    // retry fits.
    holder.write_all(&big[8 * MIB - 1..]).unwrap();
    assert_eq!(read_reply(&mut holder).0, 200);
    send_put(&mut other, "mid", &mid);
    assert_eq!(
        read_reply(&mut other).0,
        200,
        "the retry on the same connection"
    );

    // A reply carrying a value holds its length until it is sent: a client that does not read
    // its 8 MiB leaves most of it waiting, so a second 8 MiB reply does not fit.
    let mut reader = tight_client(svc.port);
    reader
        .write_all(b"GET /metadata?key=big HTTP/1.1\r\n\r\n")
        .unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        reader.read_exact(&mut byte).unwrap();
        head.push(byte[0]);
    }
    assert!(
        head.starts_with(b"HTTP/1.1 200 "),
        "{:?}",
        String::from_utf8_lossy(&head)
    );
    let mut second = connect(svc.port);
    second
        .write_all(b"GET /metadata?key=big HTTP/1.1\r\n\r\n")
        .unwrap();
    let (status, body) = read_reply(&mut second);
    assert_eq!(status, 503, "{}", brief(&body));
    assert!(body.contains("--max-buffered"), "{}", brief(&body));
    // Replies to changes are never turned away, even now.
    send_put(&mut second, "small", b"t");
    assert_eq!(read_reply(&mut second).0, 200);

    // Once the first reader takes its value, whole, the second is served.
    let mut value = vec![0u8; 8 * MIB];
    reader.read_exact(&mut value).unwrap();
    assert!(value == big, "the 8 MiB value came back changed");
    common::eventually("room for the second reply", || {
        second
            .write_all(b"GET /metadata?key=big HTTP/1.1\r\n\r\n")
            .unwrap();
        let (status, body) = read_reply(&mut second);
        status == 200 && body.len() == 8 * MIB
    });
    let kv = HttpStore::new(&svc.url, Duration::from_secs(5), 8 * MIB).unwrap();
    assert_eq!(kv.get("mid").unwrap(), Some(mid));
}
