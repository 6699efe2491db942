//! A hostile (or spoofed) HTTP metadata server against a real engine: a chunk size near 2^64
//! is an error, not a panic, and the engine's keeper goes on re-publishing after meeting it; an
//! answer trickled a byte at a time ends at the exchange's deadline instead of holding
//! `open_segment` for as long as the server likes.

use std::io::{BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use te_core::{Config, Error, TransferEngine};

/// How the server answers a GET.
const HONEST: u8 = 0;
const GIANT_CHUNK: u8 = 1;
const TRICKLE: u8 = 2;

struct Server {
    url: String,
    mode: Arc<AtomicU8>,
    puts: Arc<AtomicUsize>,
}

/// A metadata server on loopback that takes every PUT and DELETE, and answers GETs as `mode`
/// says: honest ones describe segment `peer`.
fn server() -> Server {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/metadata", listener.local_addr().unwrap());
    let mode = Arc::new(AtomicU8::new(HONEST));
    let puts = Arc::new(AtomicUsize::new(0));
    let (m, p) = (mode.clone(), puts.clone());
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let (m, p) = (m.clone(), p.clone());
            std::thread::spawn(move || serve(conn, &m, &p));
        }
    });
    Server { url, mode, puts }
}

fn serve(conn: TcpStream, mode: &AtomicU8, puts: &AtomicUsize) {
    let mut reader = BufReader::new(conn.try_clone().unwrap());
    let mut out = conn;
    while let Ok(Some(head)) = te_reactor::http::read_head(&mut reader) {
        let Ok(_) = te_reactor::http::read_body(&mut reader, &head, 1 << 20, false) else {
            return;
        };
        let answer = |out: &mut TcpStream, body: &[u8]| {
            let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", body.len());
            out.write_all(head.as_bytes())
                .and_then(|()| out.write_all(body))
        };
        if !head.first_line.starts_with("GET") {
            if head.first_line.starts_with("PUT") {
                puts.fetch_add(1, Ordering::AcqRel);
            }
            if answer(&mut out, b"").is_err() {
                return;
            }
            continue;
        }
        let done = match mode.load(Ordering::Acquire) {
            HONEST if head.first_line.contains("rpc_meta") => {
                answer(&mut out, br#"{"ip_or_host_name":"127.0.0.1","rpc_port":9}"#)
            }
            HONEST => answer(
                &mut out,
                br#"{"name":"peer","protocol":"tcp","tcp_data_port":9,"buffers":[]}"#,
            ),
            GIANT_CHUNK => out.write_all(
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\nffffffffffffffff\r\n",
            ),
            _ => {
                // A body announced, then one byte now and then, for ever.
                let _ = out.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\n");
                while out.write_all(b"{").is_ok() {
                    std::thread::sleep(Duration::from_millis(300));
                }
                return;
            }
        };
        if done.is_err() {
            return;
        }
    }
}

fn engine(url: &str, name: &str) -> TransferEngine {
    let mut c = Config::default();
    c.tcp_bind_address = Some("127.0.0.1".parse().unwrap());
    c.handshake_connect_timeout = Duration::from_secs(1);
    c.metadata_refresh = Duration::from_secs(1);
    TransferEngine::init(c, url, name).unwrap()
}

#[test]
fn a_giant_chunk_size_is_an_error_and_the_keeper_goes_on() {
    let s = server();
    let e = engine(&s.url, "victim");
    e.open_segment("peer").expect("an honest answer first");
    s.mode.store(GIANT_CHUNK, Ordering::Release);
    match e.refresh_segment("peer") {
        Err(Error::MalformedMessage(m)) => assert!(m.contains("over"), "{m}"),
        other => panic!("{other:?}"),
    }
    // The keeper re-reads `peer` every second and meets the same answer; it must live on and
    // keep publishing this engine's descriptor.
    let before = s.puts.load(Ordering::Acquire);
    let deadline = Instant::now() + Duration::from_secs(30);
    while s.puts.load(Ordering::Acquire) < before + 4 {
        assert!(
            Instant::now() < deadline,
            "the keeper stopped re-publishing"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_trickled_answer_ends_at_the_exchanges_deadline() {
    let s = server();
    let e = engine(&s.url, "patient");
    s.mode.store(TRICKLE, Ordering::Release);
    let start = Instant::now();
    let err = e.open_segment("peer").unwrap_err();
    let took = start.elapsed();
    assert!(
        err.to_string().contains("no answer within 1 s"),
        "{err} (after {took:?})"
    );
    // Without a deadline for the whole exchange this would not return at all.
    assert!(took < Duration::from_secs(20), "{took:?}");
}
