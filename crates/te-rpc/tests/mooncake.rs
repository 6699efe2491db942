//! te's communicator and Mooncake's (`mooncake.engine.RpcInterface` from the wheel `.ci/setup`
//! installs) in both directions: a Mooncake receiver sees from te what it sees from Mooncake,
//! and te receives what Mooncake sends as Mooncake's receiver would show it, without its
//! defects.

mod common;

use std::time::Duration;

use common::*;
use te_rpc::tensor::MooncakeView;
use te_rpc::{Dtype, Origin, Outgoing, Payload, TensorMeta};
use te_testkit::mooncake::MooncakeRpc;

const WAIT: Duration = Duration::from_secs(10);

/// Mooncake's tensor header followed by `data`, as its receiver recognises a tensor.
fn with_header(dtype: u32, shape: &[i64], data: &[u8]) -> Vec<u8> {
    let mut b = dtype.to_le_bytes().to_vec();
    b.extend_from_slice(&(shape.len() as u32).to_le_bytes());
    for i in 0..4 {
        b.extend_from_slice(&shape.get(i).copied().unwrap_or(0).to_le_bytes());
    }
    b.extend_from_slice(data);
    b
}

#[test]
fn a_mooncake_server_sees_from_te_what_it_sees_from_mooncake() {
    let (mut server, port) = MooncakeRpc::start(true);
    let target = format!("127.0.0.1:{port}");
    let (mut mooncake, _) = MooncakeRpc::start(false);
    let te = client(quick());
    let sizes = [1usize, 5, 40, 1024, 1025, 64 << 10, 1 << 20];
    let mut payloads: Vec<Vec<u8>> = sizes.iter().map(|n| pattern(*n as u64, *n)).collect();
    payloads.push(with_header(2, &[2, 3], &pattern(9, 24)));
    payloads.push(Vec::new());
    let mut stale = 0;
    for p in &payloads {
        // Mooncake's own client first: its outcome is what te's must match.
        assert_eq!(mooncake.send_data(&target, p), 0);
        let from_mooncake = server.received(1, WAIT);
        te.send(&target, Outgoing::Data(p)).unwrap();
        let from_te = server.received(1, WAIT);
        assert_eq!(from_te.len(), 1, "{} bytes: {from_te:?}", p.len());
        assert_eq!(
            from_te[0].data,
            *p,
            "{} bytes reached Mooncake's callback",
            p.len()
        );
        let header = te_rpc::tensor::mooncake_header(p);
        assert_eq!(from_te[0].tensor, matches!(header, MooncakeView::Tensor(_)));
        // Where Mooncake's own client got its bytes through (its server hands a small call
        // the last attachment of its connection), te's outcome is the same, callback and all.
        if from_mooncake[0].data == *p {
            assert_eq!(from_te, from_mooncake, "{} bytes", p.len());
        } else {
            stale += 1;
        }
    }
    assert!(
        stale > 0,
        "the wheel's defect shows with Mooncake's own client"
    );
    // A tensor: its raw bytes, as Mooncake's engine sends one.
    let meta = TensorMeta {
        dtype: Dtype::Float32,
        shape: vec![3, 4],
    };
    let bytes = pattern(3, 48);
    assert_eq!(
        mooncake.send_tensor(&target, &bytes, "torch.float32", &[3, 4], 4),
        0
    );
    let from_mooncake = server.received(1, WAIT);
    te.send(&target, Outgoing::Tensor(&meta, &bytes)).unwrap();
    let from_te = server.received(1, WAIT);
    assert_eq!(from_te, from_mooncake);
    assert_eq!(from_te[0].data, bytes);
    // After large payloads on te's pooled connection, a small one still arrives as sent
    // (Mooncake's server would hand it the last attachment).
    te.send(&target, Outgoing::Data(&[7; 3000])).unwrap();
    te.send(&target, Outgoing::Data(b"small")).unwrap();
    te.send(&target, Outgoing::Data(b"")).unwrap();
    let got = server.received(3, WAIT);
    let lens: Vec<usize> = got.iter().map(|m| m.data.len()).collect();
    assert_eq!(lens, [3000, 5, 0], "{}", server.log().len());
}

#[test]
fn te_receives_what_a_mooncake_client_sends() {
    let (srv, rx) = server(&quick());
    let target = srv.local_addr().to_string();
    let (mut mooncake, _) = MooncakeRpc::start(false);
    for n in [0usize, 5, 1024, 1025, 1 << 20] {
        let p = pattern(n as u64, n);
        assert_eq!(mooncake.send_data(&target, &p), 0);
        let m = next(&rx);
        assert_eq!(m.origin, Origin::Mooncake);
        assert_eq!(m.source.ip(), srv.local_addr().ip(), "te names the sender");
        assert_eq!(m.payload, Payload::Data(p.into()), "{n} bytes");
    }
    // Mooncake's tensors are raw bytes: data, unless they carry its receiver's header.
    let raw = pattern(4, 48);
    assert_eq!(
        mooncake.send_tensor(&target, &raw, "torch.float32", &[12], 4),
        0
    );
    assert_eq!(next(&rx).payload, Payload::Data(raw.into()));
    for dtype in 1..=9u32 {
        let d = Dtype::from_id(dtype).unwrap();
        let data = pattern(u64::from(dtype), 6 * d.size());
        let framed = with_header(dtype, &[2, 3], &data);
        assert_eq!(mooncake.send_data(&target, &framed), 0);
        match next(&rx).payload {
            Payload::Tensor(t) => {
                assert_eq!(
                    t.meta,
                    TensorMeta {
                        dtype: d,
                        shape: vec![2, 3]
                    }
                );
                assert_eq!(
                    &t.bytes[..],
                    &framed[..],
                    "the whole payload, as Mooncake's receiver gives"
                );
                assert_eq!(t.data(), &data[..]);
            }
            other => panic!("{other:?}"),
        }
    }
    // Shapes of 0 to 4 dimensions.
    for shape in [&[][..], &[5], &[1, 5], &[1, 1, 5], &[1, 1, 1, 5]] {
        let framed = with_header(8, shape, &[1; 5]);
        assert_eq!(
            mooncake.send_tensor(&target, &framed, "torch.uint8", &[framed.len() as u64], 1),
            0
        );
        match next(&rx).payload {
            Payload::Tensor(t) => assert_eq!(
                t.meta.shape,
                shape.iter().map(|d| *d as u64).collect::<Vec<_>>()
            ),
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn a_mooncake_client_is_served_under_a_secret_only_from_the_allow_list() {
    let mut secret = quick();
    secret.key = Some(key(0));
    let (srv, rx) = server(&secret);
    let target = srv.local_addr().to_string();
    let (mut mooncake, _) = MooncakeRpc::start(false);
    // Mooncake's client reports 0 whatever happened; nothing reached te's handler.
    mooncake.send_data(&target, b"not admitted");
    assert!(rx.recv_timeout(Duration::from_millis(500)).is_err());
    let mut listed = secret.clone();
    listed.mooncake_allow = Some(te_rpc::AllowList::parse("127.0.0.1/32").unwrap());
    let (srv2, rx2) = server(&listed);
    assert_eq!(
        mooncake.send_data(&srv2.local_addr().to_string(), b"admitted"),
        0
    );
    assert_eq!(
        next(&rx2).payload,
        Payload::Data(b"admitted".to_vec().into())
    );
    // A te client with the secret sends to an allow-listed Mooncake server, not to another.
    let (mut mserver, port) = MooncakeRpc::start(true);
    let mtarget = format!("127.0.0.1:{port}");
    client(listed)
        .send(&mtarget, Outgoing::Data(b"to mooncake"))
        .unwrap();
    assert_eq!(mserver.received(1, WAIT)[0].data, b"to mooncake");
    let e = client(secret)
        .send(&mtarget, Outgoing::Data(b"x"))
        .unwrap_err();
    assert!(matches!(e, te_rpc::Error::Untrusted { .. }), "{e}");
}
