//! Two te endpoints: messages arrive exactly as sent, tensors with their own dtype, shape and
//! bytes; sends fail clearly and in time; the pool and the queue are bounded.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use te_rpc::{Dtype, Error, Origin, Outgoing, Owned, Payload, TensorMeta};

#[test]
fn messages_arrive_exactly_as_sent_at_every_size() {
    let (srv, rx) = server(&quick());
    let target = srv.local_addr().to_string();
    let c = client(quick());
    for (i, len) in [0usize, 1, 39, 40, 1024, 1025, 64 << 10, 1 << 20, 5 << 20]
        .into_iter()
        .enumerate()
    {
        let sent = pattern(i as u64, len);
        c.send(&target, Outgoing::Data(&sent)).unwrap();
        let got = next(&rx);
        assert_eq!(got.origin, Origin::Te);
        assert_eq!(got.source.ip(), srv.local_addr().ip());
        assert_eq!(got.payload, Payload::Data(sent.into()), "{len} bytes");
    }
    // A message that looks like Mooncake's tensor header is still a message between te peers.
    let mut lookalike = vec![2, 0, 0, 0, 1, 0, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0];
    lookalike.resize(56, 0);
    c.send(&target, Outgoing::Data(&lookalike)).unwrap();
    assert_eq!(next(&rx).payload, Payload::Data(lookalike.into()));
    assert!(srv.connections() <= 1, "one sender, one pooled connection");
}

#[test]
fn tensors_arrive_with_their_dtype_shape_and_bytes() {
    let (srv, rx) = server(&quick());
    let target = srv.local_addr().to_string();
    let c = client(quick());
    let shapes: [&[u64]; 6] = [&[], &[0], &[7], &[3, 5], &[2, 3, 4], &[2, 1, 3, 2]];
    for (i, dtype) in Dtype::ALL.into_iter().enumerate() {
        for shape in shapes {
            let meta = TensorMeta {
                dtype,
                shape: shape.to_vec(),
            };
            let bytes = pattern(i as u64, meta.byte_len().unwrap() as usize);
            c.send(&target, Outgoing::Tensor(&meta, &bytes)).unwrap();
            match next(&rx).payload {
                Payload::Tensor(t) => {
                    assert_eq!(t.meta, meta);
                    assert_eq!(t.data(), &bytes[..]);
                    assert_eq!(t.header, 0);
                }
                other => panic!("{other:?}"),
            }
        }
    }
    // Bytes that are not the shape's are refused before anything is sent.
    let meta = TensorMeta {
        dtype: Dtype::Float32,
        shape: vec![2, 2],
    };
    let e = c
        .send(&target, Outgoing::Tensor(&meta, &[0; 15]))
        .unwrap_err();
    assert!(matches!(e, Error::Invalid { .. }), "{e}");
    assert!(rx.try_recv().is_err());
}

#[test]
fn a_dead_or_silent_server_fails_the_send_within_its_timeout() {
    // Nobody listens: refused at once.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let mut config = quick();
    config.timeout = Duration::from_secs(1);
    let c = client(config);
    let e = c
        .send(&format!("127.0.0.1:{port}"), Outgoing::Data(b"x"))
        .unwrap_err();
    assert!(matches!(e, Error::Socket { .. }), "{e}");
    assert_eq!(e.code(), -1);
    // A listener that never answers: timed out, by the timeout.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let start = Instant::now();
    let e = c
        .send(
            &silent.local_addr().unwrap().to_string(),
            Outgoing::Data(b"x"),
        )
        .unwrap_err();
    assert!(matches!(e, Error::TimedOut { .. }), "{e}");
    assert_eq!(e.code(), -2);
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
    // Bad addresses are named.
    let e = c.send("no-port-here", Outgoing::Data(b"x")).unwrap_err();
    assert!(e.to_string().contains("no-port-here"), "{e}");
}

#[test]
fn messages_over_the_limit_are_refused_on_either_side() {
    let mut small = quick();
    small.max_message = 1000;
    let (srv, rx) = server(&small);
    let target = srv.local_addr().to_string();
    // The client's own limit: nothing sent.
    let limited = client(small.clone());
    let e = limited
        .send(&target, Outgoing::Data(&[0; 1001]))
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::TooLarge {
                len: 1001,
                max: 1000
            }
        ),
        "{e}"
    );
    // The server's: refused with its code, and it keeps serving.
    let c = client(quick());
    let e = c.send(&target, Outgoing::Data(&[0; 5000])).unwrap_err();
    assert_eq!(e.code(), -3);
    match e {
        Error::Refused { code, message, .. } => {
            assert_eq!(code, te_rpc::wire::code::TOO_LARGE);
            assert!(message.contains("limit"), "{message}");
        }
        other => panic!("{other}"),
    }
    assert!(rx.try_recv().is_err());
    c.send(&target, Outgoing::Data(&[9; 1000])).unwrap();
    assert_eq!(next(&rx).payload, Payload::Data(vec![9; 1000].into()));
}

#[test]
fn a_client_holds_at_most_its_pool_per_peer() {
    let (tx, rx) = std::sync::mpsc::channel();
    let tx = std::sync::Mutex::new(tx);
    let slow = move |m: te_rpc::Received| {
        std::thread::sleep(Duration::from_millis(20));
        let _ = tx.lock().unwrap().send(m);
    };
    let srv = te_rpc::Server::start("127.0.0.1:0", &quick(), Arc::new(slow)).unwrap();
    let target = srv.local_addr().to_string();
    let mut config = quick();
    config.pool_size = 2;
    let c = client(config);
    let peak = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    std::thread::scope(|s| {
        for t in 0..8u8 {
            let (c, target, srv, peak) = (&c, &target, &srv, &peak);
            s.spawn(move || {
                for _ in 0..5 {
                    c.send(target, Outgoing::Data(&[t; 100])).unwrap();
                    peak.fetch_max(srv.connections(), std::sync::atomic::Ordering::Relaxed);
                }
            });
        }
    });
    assert_eq!(rx.try_iter().count(), 40);
    assert!(peak.load(std::sync::atomic::Ordering::Relaxed) <= 2);
}

#[test]
fn asynchronous_sends_from_many_tasks_all_arrive() {
    let (srv, rx) = server(&quick());
    let target = srv.local_addr().to_string();
    let c = client(quick());
    let futures: Vec<_> = (0..200u32)
        .map(|i| c.send_async(&target, Owned::Data(i.to_le_bytes().to_vec())))
        .collect();
    for f in futures {
        block_on(f).unwrap();
    }
    let mut got: Vec<u32> = rx
        .try_iter()
        .map(|m| match m.payload {
            Payload::Data(b) => u32::from_le_bytes(b[..].try_into().unwrap()),
            other => panic!("{other:?}"),
        })
        .collect();
    got.sort_unstable();
    assert_eq!(got, (0..200).collect::<Vec<_>>());
    // A failed asynchronous send resolves to the error; a callback send reports it.
    let e = block_on(c.send_async("127.0.0.1:1", Owned::Data(vec![1]))).unwrap_err();
    assert_eq!(e.code(), -1, "{e}");
    let (tx, done) = std::sync::mpsc::channel();
    c.send_then(
        &target,
        Owned::Data(vec![5]),
        Box::new(move |r| tx.send(r.is_ok()).unwrap()),
    )
    .unwrap();
    assert!(done.recv_timeout(Duration::from_secs(5)).unwrap());
    c.stop();
    assert!(matches!(
        block_on(c.send_async(&target, Owned::Data(vec![1]))),
        Err(Error::Stopped)
    ));
    assert!(matches!(
        c.send(&target, Outgoing::Data(b"x")),
        Err(Error::Stopped)
    ));
}

#[test]
fn a_server_stopped_while_clients_send_fails_their_sends_without_hanging() {
    let (srv, rx) = server(&quick());
    let target = srv.local_addr().to_string();
    let c = client(quick());
    let stop = std::sync::atomic::AtomicBool::new(false);
    let outcomes = std::thread::scope(|s| {
        let senders: Vec<_> = (0..4)
            .map(|_| {
                s.spawn(|| {
                    let (mut ok, mut failed) = (0, 0);
                    let start = Instant::now();
                    while start.elapsed() < Duration::from_secs(2) {
                        match c.send(&target, Outgoing::Data(&[1; 64 << 10])) {
                            Ok(()) => ok += 1,
                            Err(_) => failed += 1,
                        }
                        if stop.load(std::sync::atomic::Ordering::Relaxed) && failed > 0 {
                            break;
                        }
                    }
                    (ok, failed)
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(300));
        srv.stop();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        senders
            .into_iter()
            .map(|h| h.join().unwrap())
            .collect::<Vec<_>>()
    });
    let delivered = rx.try_iter().count();
    let ok: usize = outcomes.iter().map(|o| o.0).sum();
    assert!(ok > 0, "sends before the stop arrived");
    assert!(
        outcomes.iter().all(|o| o.1 > 0),
        "every sender saw the stop: {outcomes:?}"
    );
    assert!(
        delivered >= ok,
        "every acknowledged send was handed over ({delivered} < {ok})"
    );
}

/// A handler's own memory, as a binding gives it.
struct Marked(Vec<u8>);

impl te_rpc::Buffer for Marked {
    fn as_slice(&self) -> &[u8] {
        &self.0
    }
    fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.0
    }
    fn into_any(self: Box<Self>) -> Box<dyn std::any::Any + Send> {
        self
    }
}

struct Giving {
    tx: std::sync::Mutex<std::sync::mpsc::Sender<(bool, Vec<u8>)>>,
    wrong_length: bool,
}

impl te_rpc::Handler for Giving {
    fn receive(&self, m: te_rpc::Received) {
        let bytes = match m.payload {
            Payload::Data(b) => b,
            Payload::Tensor(t) => t.bytes,
        };
        let out = match bytes.downcast::<Marked>() {
            Ok(given) => (true, given.0),
            Err(b) => (false, b.into_vec()),
        };
        let _ = self.tx.lock().unwrap().send(out);
    }

    fn buffer(&self, len: usize) -> Option<Box<dyn te_rpc::Buffer>> {
        let len = if self.wrong_length { len + 1 } else { len };
        Some(Box::new(Marked(vec![0; len])))
    }
}

#[test]
fn large_payloads_are_read_into_the_handlers_own_memory() {
    for wrong_length in [false, true] {
        let (tx, rx) = std::sync::mpsc::channel();
        let handler = Giving {
            tx: std::sync::Mutex::new(tx),
            wrong_length,
        };
        let srv = te_rpc::Server::start("127.0.0.1:0", &quick(), Arc::new(handler)).unwrap();
        let target = srv.local_addr().to_string();
        let c = client(quick());
        for len in [100, te_rpc::GIVEN_MIN - 1, te_rpc::GIVEN_MIN, 3 << 20] {
            let sent = pattern(len as u64, len);
            c.send(&target, Outgoing::Data(&sent)).unwrap();
            let (given, got) = rx.recv_timeout(Duration::from_secs(10)).unwrap();
            assert_eq!(got, sent, "{len} bytes");
            assert_eq!(
                given,
                len >= te_rpc::GIVEN_MIN && !wrong_length,
                "{len} bytes"
            );
        }
        let meta = TensorMeta {
            dtype: Dtype::Int64,
            shape: vec![1 << 14],
        };
        let bytes = pattern(5, 1 << 17);
        c.send(&target, Outgoing::Tensor(&meta, &bytes)).unwrap();
        assert_eq!(
            rx.recv_timeout(Duration::from_secs(10)).unwrap(),
            (!wrong_length, bytes)
        );
    }
}

#[test]
fn a_pooled_connection_the_server_closed_is_replaced_not_failed() {
    let mut config = quick();
    config.idle_timeout = Duration::from_millis(500);
    let (srv, rx) = server(&config);
    let target = srv.local_addr().to_string();
    let c = client(quick());
    c.send(&target, Outgoing::Data(b"first")).unwrap();
    assert_eq!(next(&rx).payload, Payload::Data(b"first".to_vec().into()));
    let deadline = Instant::now() + Duration::from_secs(10);
    while srv.connections() > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(
        srv.connections(),
        0,
        "the server closed its idle connection"
    );
    c.send(&target, Outgoing::Data(b"second")).unwrap();
    assert_eq!(next(&rx).payload, Payload::Data(b"second".to_vec().into()));
}

#[test]
fn a_client_closes_connections_it_no_longer_uses() {
    let (a, rx_a) = server(&quick());
    let (b, rx_b) = server(&quick());
    let mut config = quick();
    config.idle_timeout = Duration::from_millis(300);
    let c = client(config);
    c.send(&a.local_addr().to_string(), Outgoing::Data(b"a"))
        .unwrap();
    assert_eq!(next(&rx_a).payload, Payload::Data(b"a".to_vec().into()));
    assert_eq!(a.connections(), 1);
    std::thread::sleep(Duration::from_millis(600));
    // A send to another peer prunes the first peer's idle connection.
    c.send(&b.local_addr().to_string(), Outgoing::Data(b"b"))
        .unwrap();
    assert_eq!(next(&rx_b).payload, Payload::Data(b"b".to_vec().into()));
    let deadline = Instant::now() + Duration::from_secs(5);
    while a.connections() > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(a.connections(), 0, "the unused connection was closed");
    // And the first peer is still reachable.
    c.send(&a.local_addr().to_string(), Outgoing::Data(b"again"))
        .unwrap();
    assert_eq!(next(&rx_a).payload, Payload::Data(b"again".to_vec().into()));
}
