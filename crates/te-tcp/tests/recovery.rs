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
    proxy(target_port, cuts, cut_after, Duration::ZERO)
}

/// Forwards connections to `target_port`, each as `cutting_proxy` says, and waits `pace` after
/// each read it passes on from the target (at most 64 KiB), so a transfer through it takes
/// time that the test, not the host's speed, decides.
fn proxy(
    target_port: u16,
    cuts: usize,
    cut_after: usize,
    pace: Duration,
) -> (u16, Arc<AtomicUsize>) {
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
            std::thread::spawn(move || pump(client, server, limit, Duration::ZERO));
            std::thread::spawn(move || pump(s2, c2, usize::MAX, pace));
        }
    });
    (port, accepted)
}

fn pump(mut from: TcpStream, mut to: TcpStream, limit: usize, pace: Duration) {
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
        if !pace.is_zero() {
            std::thread::sleep(pace);
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
    let e = engine_with_tcp(cfg, tcp(|t| t.status_timeout = Duration::from_secs(2)));
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

/// A peer that takes bytes into its socket buffers and then nothing more (hung: it accepts,
/// never reads, never answers) fails a large batch after the status timeout and its retries,
/// whatever the batch's size: a stalled connection fails the slices queued behind it too, so
/// each attempt costs every lane one connection and one timeout, not one per socket-buffer-ful
/// of the batch.
#[test]
fn a_hung_peer_fails_a_large_batch_in_one_stall_per_attempt() {
    let mut cfg = config();
    cfg.retry_cnt = 1;
    let settings = tcp(|t| t.status_timeout = Duration::from_secs(1));
    let lanes = settings.lanes_per_peer;
    let e = engine_with_tcp(cfg, settings);
    let len = 128 << 20;
    let local = buffer(len);
    register(&e, &local, Permission::LocalOnly);
    let (_control, name, blackhole) = silent_segment(len as u64);
    let seg = e.open_segment(&name).unwrap();
    let writes: Vec<_> = (0..128u64)
        .map(|i| {
            request(
                Opcode::Write,
                local.addr() + (i << 20),
                seg,
                4096 + (i << 20),
                1 << 20,
            )
        })
        .collect();
    assert_eq!(run(&e, &writes), TransferState::Failed);
    // Every connection the lanes made is waiting in the hung peer's backlog.
    blackhole.set_nonblocking(true).unwrap();
    let connections = std::iter::from_fn(|| blackhole.accept().ok()).count();
    assert!(
        (1..=lanes * 2).contains(&connections),
        "{connections} connections for {lanes} lanes and one retry"
    );
}

/// A peer that goes away in the middle of a request on te's data port (a WRITE's body half
/// sent, or a large READ's data half read) takes its pin with it: both regions unregister
/// long before the stall timeout, and the target serves the next transfer.
#[test]
fn a_peer_gone_mid_body_or_mid_reply_leaves_no_pin() {
    use te_tcp::wire::{REPLY_LEN, Reply, Request, Status};

    let cfg = config();
    let target = engine_with_tcp(cfg, tcp(|t| t.status_timeout = Duration::from_secs(60)));
    let initiator = engine();
    let written = buffer(1 << 20);
    let read = buffer(64 << 20);
    register(&target, &written, Permission::RemoteReadWrite);
    register(&target, &read, Permission::RemoteReadWrite);
    let seg = initiator.open_segment(target.segment_name()).unwrap();
    let desc = initiator.segment(seg).unwrap();
    let port = desc.desc().te_rails[0].port;
    let connect = || {
        let c = DataConn::open(port, desc.secret());
        c.0.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        c
    };
    let header = |opcode, addr, len, proof| Request {
        opcode,
        request_id: 1,
        addr,
        len,
        proof,
    };

    let DataConn(mut half_body, proof) = connect();
    half_body
        .write_all(&header(Opcode::Write, written.addr(), 8192, proof).encode())
        .unwrap();
    half_body.write_all(&[7u8; 4096]).unwrap();
    // 64 MiB asked for, a little read: the rest fills the sockets and the target's send waits.
    let DataConn(mut half_reply, proof) = connect();
    half_reply
        .write_all(&header(Opcode::Read, read.addr(), 64 << 20, proof).encode())
        .unwrap();
    let mut head = [0u8; REPLY_LEN];
    half_reply.read_exact(&mut head).unwrap();
    assert_eq!(Reply::decode(&head).unwrap().status, Status::Ok);
    let mut some = vec![0u8; 1 << 20];
    half_reply.read_exact(&mut some).unwrap();
    for (what, b) in [("mid-body", &written), ("mid-reply", &read)] {
        assert_pinned(&target, b.addr(), what);
    }
    drop(half_body);
    drop(half_reply);

    for (what, b) in [("mid-body", &written), ("mid-reply", &read)] {
        unregister_once_unpinned(&target, b.addr(), Duration::from_secs(10), what);
    }

    register(&target, &written, Permission::RemoteReadWrite);
    let local = buffer(1 << 20);
    register(&initiator, &local, Permission::LocalOnly);
    let seg = initiator.open_segment(target.segment_name()).unwrap();
    let data = pattern(5, 1 << 20);
    local.write_at(0, &data).unwrap();
    let write = request(Opcode::Write, local.addr(), seg, written.addr(), 1 << 20);
    assert_eq!(run(&initiator, &[write]), TransferState::Completed);
    assert_eq!(
        written.to_vec(0, 1 << 20).unwrap(),
        data,
        "the next WRITE landed"
    );
}

/// The TCP sockets this process holds a descriptor of whose remote end is port `port`: the
/// entries of `/proc/net/tcp{,6}` with that remote port and the inode of one of this process's
/// descriptors. A closed socket the kernel keeps in TIME_WAIT holds no descriptor (its inode
/// is 0), nor does one of another process, so neither counts: such sockets to a port a dropped
/// target used are left by earlier tests and other test processes, whose targets had that port
/// before (seen in CI: one in TIME_WAIT).
fn sockets_to(port: u16) -> usize {
    let held: std::collections::HashSet<String> = std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
        .filter_map(|link| {
            let link = link.to_str()?;
            Some(
                link.strip_prefix("socket:[")?
                    .strip_suffix(']')?
                    .to_string(),
            )
        })
        .collect();
    let port = format!(":{port:04X}");
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .map(|table| {
            table
                .lines()
                .skip(1)
                .map(|l| l.split_whitespace().collect::<Vec<_>>())
                .filter(|f| {
                    f.get(2).is_some_and(|r| r.ends_with(&port))
                        && f.get(9).is_some_and(|inode| held.contains(*inode))
                })
                .count()
        })
        .sum()
}

/// Idle lane connections are not watched, yet one whose peer went away is closed within
/// seconds, not kept (in CLOSE_WAIT, a descriptor each) until the lane is next used: a decode
/// node that talked to many short-lived peers does not pile up their sockets.
#[test]
fn idle_connections_to_a_peer_that_went_away_are_closed() {
    let p = pair(4 << 20);
    let port = p.initiator.segment(p.segment).unwrap().desc().te_rails[0].port;
    let data = pattern(8, 4 << 20);
    p.local.write_at(0, &data).unwrap();
    let w = request(
        Opcode::Write,
        p.local.addr(),
        p.segment,
        p.remote.addr(),
        data.len() as u64,
    );
    assert_eq!(run(&p.initiator, &[w]), TransferState::Completed);
    assert!(
        sockets_to(port) > 0,
        "the lanes' connections are open (and counted)"
    );

    drop(p.target);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while sockets_to(port) > 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(
        sockets_to(port),
        0,
        "connections to a peer that went away are closed"
    );
}

/// An engine closed while a large READ is coming in: the close fails what is left and returns
/// only once its lanes are gone, so nothing lands in its memory afterwards (the application may
/// free its buffer at once), and the task ends failed. The READ comes through a proxy that
/// paces it (at most 64 KiB a millisecond per lane: seconds for the whole READ), so the close
/// lands while it is coming in however fast this host moves bytes.
#[test]
fn a_closed_engine_receives_nothing_more_into_its_memory() {
    let len: usize = 256 << 20;
    let p = pair(len);
    p.remote.write_at(0, &vec![0xa5; len]).unwrap();
    let real = p.initiator.segment(p.segment).unwrap();
    let (proxy_port, _) = proxy(real.desc().te_rails[0].port, 0, 0, Duration::from_millis(1));
    let mut desc = serde_json::to_value(real.desc()).unwrap();
    desc["te_rails"][0]["port"] = proxy_port.into();
    let (_control, name) = serve_descriptor(desc);
    let paced = p.initiator.open_segment(&name).unwrap();
    let b = p.initiator.allocate_batch(1).unwrap();
    let r = te_core::TransferRequest {
        opcode: Opcode::Read,
        source: p.local.addr(),
        target_id: paced,
        target_offset: p.remote.addr(),
        length: len as u64,
    };
    p.initiator.submit(b, &[r]).unwrap();
    te_testkit::wait_for_first_byte(&p.local, 0xa5);
    p.initiator.shutdown();
    te_testkit::assert_nothing_lands(&p.local, len, "its engine was closed");
    let status = p.initiator.wait(b, Duration::from_secs(60)).unwrap();
    assert_eq!(status.state, TransferState::Failed, "{status:?}");
    assert!(status.transferred_bytes < len as u64, "{status:?}");
}
