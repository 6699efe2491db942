//! Path failures on real sockets: a connection cut mid-transfer is retried and the data still
//! lands byte-exact; a task past its deadline ends TIMEOUT.

mod common;

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::*;
use te_core::{Opcode, Permission, TransferState};

/// Forwards connections to `target_port`; each of the first `cuts` connections is cut after
/// `cut_after` bytes from the initiator.
fn cutting_proxy(target_port: u16, cuts: usize, cut_after: usize) -> (u16, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    std::thread::spawn(move || {
        for client in listener.incoming().map_while(Result::ok) {
            let n = count.fetch_add(1, Ordering::SeqCst);
            let server = TcpStream::connect(("127.0.0.1", target_port)).unwrap();
            let limit = if n < cuts { cut_after } else { usize::MAX };
            let (c2, s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
            std::thread::spawn(move || pump(client, server, limit));
            std::thread::spawn(move || pump(s2, c2, usize::MAX));
        }
    });
    (port, accepted)
}

fn pump(mut from: TcpStream, mut to: TcpStream, limit: usize) {
    let mut buf = vec![0u8; 64 * 1024];
    let mut moved = 0;
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let n = n.min(limit - moved);
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
        moved += n;
        if moved >= limit {
            break;
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}

#[test]
fn a_cut_connection_is_retried_and_the_data_lands_intact() {
    let p = pair(16 << 20);
    let real = p.initiator.segment(p.segment).unwrap();
    let (proxy_port, accepted) = cutting_proxy(real.desc().te_rails[0].port, 2, 3 << 20);
    let mut desc = serde_json::to_value(real.desc()).unwrap();
    desc["te_rails"][0]["port"] = proxy_port.into();
    let (_control, name) = serve_descriptor(desc);
    let via_proxy = p.initiator.open_segment(&name).unwrap();

    let data = pattern(42, 16 << 20);
    p.local.write_at(0, &data).unwrap();
    let w = request(
        Opcode::Write,
        p.local.addr(),
        via_proxy,
        p.remote.addr(),
        data.len() as u64,
    );
    assert_eq!(run(&p.initiator, &[w]), TransferState::Completed);
    assert!(
        p.remote.to_vec(0, data.len()).unwrap() == data,
        "retried write landed intact"
    );
    assert!(accepted.load(Ordering::SeqCst) > 2, "cut lanes reconnected");

    p.local.write_at(0, &vec![0u8; data.len()]).unwrap();
    let r = request(
        Opcode::Read,
        p.local.addr(),
        via_proxy,
        p.remote.addr(),
        data.len() as u64,
    );
    assert_eq!(run(&p.initiator, &[r]), TransferState::Completed);
    assert!(p.local.to_vec(0, data.len()).unwrap() == data);
}

#[test]
fn a_task_past_its_deadline_ends_timeout() {
    let mut cfg = config();
    cfg.slice_timeout = Some(Duration::from_secs(1));
    cfg.tcp_status_timeout = Duration::from_secs(2);
    let e = engine_with(cfg);
    let local = buffer(1 << 20);
    register(&e, &local, Permission::LocalOnly);
    let (_control, name, _blackhole) = silent_segment(1 << 20);
    let seg = e.open_segment(&name).unwrap();
    let b = e.allocate_batch(1).unwrap();
    e.submit(
        b,
        &[request(Opcode::Read, local.addr(), seg, 4096, 1 << 20)],
    )
    .unwrap();
    let s = e.wait(b, WAIT).unwrap();
    assert_eq!(s.state, TransferState::Timeout);
    assert_eq!(s.transferred_bytes, 0);
    e.free_batch(b).unwrap();
}
