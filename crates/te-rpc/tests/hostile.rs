//! What a stranger can make a server do: malformed frames are refused and the server keeps
//! serving; an announced length costs nothing until its bytes come; under a cluster secret
//! nothing is taken from a peer that has not proved it, and Mooncake's calls only from the
//! allow-list.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::*;
use te_rpc::wire::{Function, RequestHeader, ResponseHeader, code};
use te_rpc::{AllowList, Error, Outgoing, Payload};

fn frame(function: u32, body: &[u8], attachment: &[u8]) -> Vec<u8> {
    let mut b = RequestHeader {
        seq: 7,
        function,
        body: body.len() as u32,
        attachment: attachment.len() as u32,
    }
    .encode()
    .to_vec();
    b.extend_from_slice(body);
    b.extend_from_slice(attachment);
    b
}

/// The response's header, or `None` when the server closed the connection instead.
fn answer(s: &mut TcpStream) -> Option<(ResponseHeader, Vec<u8>)> {
    let mut raw = [0u8; 16];
    s.read_exact(&mut raw).ok()?;
    let h = ResponseHeader::decode(&raw).unwrap();
    let mut rest = vec![0; (h.body + h.attachment) as usize];
    s.read_exact(&mut rest).unwrap();
    Some((h, rest))
}

fn connect(addr: std::net::SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s
}

#[test]
fn malformed_frames_are_refused_and_the_server_keeps_serving() {
    let (srv, rx) = server(&quick());
    let addr = srv.local_addr();
    // Another protocol's bytes: closed without an answer.
    let mut s = connect(addr);
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    assert!(answer(&mut s).is_none());
    // An unknown call with a body: answered "not registered", its bytes skipped, and the
    // connection serves the next call.
    let mut s = connect(addr);
    s.write_all(&frame(0x1234_5678, &[1; 3000], &[2; 5000]))
        .unwrap();
    let (h, _) = answer(&mut s).unwrap();
    assert_eq!(h.error, code::NOT_REGISTERED);
    s.write_all(&frame(Function::TeData.id(), &[], b"after"))
        .unwrap();
    assert_eq!(answer(&mut s).unwrap().0.error, 0);
    assert_eq!(next(&rx).payload, Payload::Data(b"after".to_vec().into()));
    // Bodies that do not decode: refused with "invalid argument", then closed.
    for (function, body) in [
        (
            Function::TeTensor,
            vec![200u8, 1, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0],
        ),
        (Function::TeData, vec![1]),
        (Function::MooncakeData, vec![0x11; 9]),
        (Function::TeHello, b"hello, te".to_vec()),
    ] {
        let mut s = connect(addr);
        s.write_all(&frame(function.id(), &body, &[0; 4])).unwrap();
        match answer(&mut s) {
            Some((h, _)) => assert_ne!(h.error, 0, "{function:?}"),
            None => panic!("{function:?}: closed without an answer"),
        }
        assert!(
            answer(&mut s).is_none(),
            "{function:?}: closed after the refusal"
        );
    }
    // A tensor whose bytes are not its shape's.
    let meta = te_rpc::TensorMeta {
        dtype: te_rpc::Dtype::Int32,
        shape: vec![4],
    };
    let mut s = connect(addr);
    s.write_all(&frame(Function::TeTensor.id(), &meta.encode(), &[0; 15]))
        .unwrap();
    assert_eq!(answer(&mut s).unwrap().0.error, code::INVALID_ARGUMENT);
    assert!(rx.try_recv().is_err(), "nothing malformed was handed on");
    // Still serving.
    client(quick())
        .send(&addr.to_string(), Outgoing::Data(b"still"))
        .unwrap();
    assert_eq!(next(&rx).payload, Payload::Data(b"still".to_vec().into()));
}

#[test]
fn an_announced_length_costs_nothing_until_its_bytes_come() {
    let mut config = quick();
    config.timeout = Duration::from_secs(1);
    let (srv, rx) = server(&config);
    let addr = srv.local_addr();
    // Over the limit: refused at the header.
    let mut s = connect(addr);
    let head = RequestHeader {
        seq: 1,
        function: Function::TeData.id(),
        body: 0,
        attachment: u32::MAX,
    };
    s.write_all(&head.encode()).unwrap();
    assert_eq!(answer(&mut s).unwrap().0.error, code::TOO_LARGE);
    assert!(answer(&mut s).is_none());
    // Within it, two hundred connections announcing 1 GiB each and sending ten bytes: the
    // server's memory grows by about what came, and each stalled connection is closed once
    // the timeout passes.
    let before = resident();
    let mut held = Vec::new();
    for _ in 0..200 {
        let mut s = connect(addr);
        let head = RequestHeader {
            attachment: 1 << 30,
            ..head
        };
        s.write_all(&head.encode()).unwrap();
        s.write_all(&[1; 10]).unwrap();
        held.push(s);
    }
    std::thread::sleep(Duration::from_millis(300));
    let grown = resident().saturating_sub(before);
    assert!(
        grown < 64 << 20,
        "200 announced gigabytes cost {grown} bytes"
    );
    std::thread::sleep(Duration::from_secs(3));
    for s in &mut held {
        assert!(answer(s).is_none(), "a stalled call's connection is closed");
    }
    assert!(rx.try_recv().is_err());
}

fn resident() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

#[test]
fn under_a_cluster_secret_only_peers_that_prove_it_are_served() {
    let mut secret = quick();
    secret.key = Some(key(0));
    let (srv, rx) = server(&secret);
    let target = srv.local_addr().to_string();
    // The same secret: served.
    client(secret.clone())
        .send(&target, Outgoing::Data(b"proved"))
        .unwrap();
    assert_eq!(next(&rx).payload, Payload::Data(b"proved".to_vec().into()));
    // No secret, or another: refused, nothing handed on.
    let e = client(quick())
        .send(&target, Outgoing::Data(b"x"))
        .unwrap_err();
    assert!(matches!(e, Error::Untrusted { .. }), "{e}");
    let mut other = quick();
    other.key = Some(key(1));
    let e = client(other)
        .send(&target, Outgoing::Data(b"x"))
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::Refused {
                code: code::NOT_TRUSTED,
                ..
            } | Error::Untrusted { .. }
        ),
        "{e}"
    );
    // A client with a secret does not send to a server without one.
    let (open, open_rx) = server(&quick());
    let e = client(secret.clone())
        .send(&open.local_addr().to_string(), Outgoing::Data(b"x"))
        .unwrap_err();
    assert!(matches!(e, Error::Untrusted { .. }), "{e}");
    assert!(open_rx.try_recv().is_err());
    // te's message without the greeting, and Mooncake's calls from outside the allow-list:
    // refused at the header, the connection closed.
    for function in [Function::TeData, Function::MooncakeTensor] {
        let mut s = connect(srv.local_addr());
        s.write_all(&frame(function.id(), &[], &[1; 64])).unwrap();
        assert_eq!(
            answer(&mut s).unwrap().0.error,
            code::NOT_TRUSTED,
            "{function:?}"
        );
        assert!(answer(&mut s).is_none());
    }
    // A proof without a greeting.
    let mut s = connect(srv.local_addr());
    s.write_all(&frame(Function::TeProof.id(), &[0; 32], &[]))
        .unwrap();
    assert_eq!(answer(&mut s).unwrap().0.error, code::NOT_TRUSTED);
    assert!(rx.try_recv().is_err());
    // Mooncake's calls from an allow-listed address are served.
    let mut listed = secret.clone();
    listed.mooncake_allow = Some(AllowList::parse("127.0.0.0/8").unwrap());
    let (srv2, rx2) = server(&listed);
    let mut s = connect(srv2.local_addr());
    s.write_all(&frame(Function::MooncakeTensor.id(), &[], &[3; 64]))
        .unwrap();
    assert_eq!(answer(&mut s).unwrap().0.error, 0);
    assert_eq!(next(&rx2).payload, Payload::Data(vec![3; 64].into()));
}
