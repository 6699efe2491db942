//! How much a lane asks a Mooncake target for at once: at most 256 KiB of READs
//! (`lane::conn::MOONCAKE_READ_AHEAD`), so the target's send buffers do not pile up. The peer
//! here speaks Mooncake's acknowledged framing on a real socket and holds back its answers for
//! a while, counting the READ bytes each connection asked for meanwhile (the wheel's target
//! cannot show that); then it answers everything, and every byte te read is compared.

mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use te_core::{Opcode, Permission, TransferState};
use te_tcp::wire::mooncake::{HEADER_LEN, Header, STATUS_OK, encode_status};

/// Where the peer's buffer claims to start, and its length.
const BASE: u64 = 1 << 32;
const LEN: usize = 4 << 20;

/// Serves one connection: holds every request that arrives within 300 ms of the one before,
/// notes the READ bytes they ask for, then answers them and every later one.
fn serve(mut s: TcpStream, data: &[u8], asked: &Mutex<Vec<u64>>) {
    let mut buf: Vec<u8> = Vec::new();
    let mut chunk = [0u8; 4096];
    s.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    loop {
        match s.read(&mut chunk) {
            Ok(0) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => break,
            Err(_) => return,
        }
    }
    let header_at = |b: &[u8]| Header::decode(b[..HEADER_LEN].try_into().unwrap()).unwrap();
    let held: u64 = buf
        .chunks_exact(HEADER_LEN)
        .map(header_at)
        .filter(|h| h.opcode == Opcode::Read)
        .map(|h| h.size)
        .sum();
    asked.lock().unwrap().push(held);
    s.set_read_timeout(None).unwrap();
    loop {
        while buf.len() >= HEADER_LEN {
            let h = header_at(&buf);
            buf.drain(..HEADER_LEN);
            assert!(h.acked && h.opcode == Opcode::Read, "{h:?}");
            let at = (h.addr - BASE) as usize;
            s.write_all(&encode_status(STATUS_OK)).unwrap();
            s.write_all(&data[at..at + h.size as usize]).unwrap();
        }
        match s.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

#[test]
fn a_lane_asks_a_mooncake_target_for_at_most_256_kib_of_reads_at_once() {
    let data = Arc::new(pattern(31, LEN));
    let asked = Arc::new(Mutex::new(Vec::new()));
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    {
        let (data, asked) = (data.clone(), asked.clone());
        std::thread::spawn(move || {
            for s in listener.incoming().map_while(Result::ok) {
                let (data, asked) = (data.clone(), asked.clone());
                std::thread::spawn(move || serve(s, &data, &asked));
            }
        });
    }
    let (_control, name) = serve_descriptor(serde_json::json!({
        "protocol": "tcp", "tcp_data_host": "127.0.0.1", "tcp_data_port": port,
        "tcp_proto_version": 2,
        "buffers": [{"name": "cpu:0", "addr": BASE, "length": LEN}],
    }));
    let te = engine();
    let local = buffer(LEN);
    register(&te, &local, Permission::LocalOnly);
    let seg = te.open_segment(&name).unwrap();
    // 32 READs of 64 KiB in one batch, a block apart so none merge: 512 KiB for each of the
    // four lanes, twice what one may ask for at once.
    let block = 64u64 << 10;
    let reads: Vec<_> = (0..32)
        .map(|i| {
            let at = 2 * i * block;
            request(Opcode::Read, local.addr() + at, seg, BASE + at, block)
        })
        .collect();
    assert_eq!(run(&te, &reads), TransferState::Completed);
    let got = local.to_vec(0, LEN).unwrap();
    for i in 0..32 {
        let at = (2 * i * block) as usize;
        let n = block as usize;
        assert_eq!(got[at..at + n], data[at..at + n], "block {i}");
    }
    let asked = asked.lock().unwrap().clone();
    assert!(
        !asked.is_empty() && asked.iter().any(|&n| n > 0),
        "{asked:?}"
    );
    assert!(
        asked.iter().all(|&n| n <= 256 << 10),
        "READ bytes each connection asked for before any answer: {asked:?}"
    );
}
