//! Fuzz targets for te-rpc's decoders of bytes from the network (`cargo xtask fuzz rpc-frame`,
//! `rpc-reply`): run briefly by `cargo test`, longer by xtask.

use std::net::SocketAddr;

use te_testkit::fuzz::{budget, run};

use crate::bytes::Bytes;
use crate::handshake;
use crate::service::{Admit, Service, Trust};
use crate::tensor::{Dtype, TensorMeta, mooncake_header};
use crate::wire::{self, Function, Limits, REQUEST_HEADER, RequestHeader, ResponseHeader};

fn frame(function: Function, body: &[u8], attachment: &[u8]) -> Vec<u8> {
    let mut b = RequestHeader {
        seq: 1,
        function: function.id(),
        body: body.len() as u32,
        attachment: attachment.len() as u32,
    }
    .encode()
    .to_vec();
    b.extend_from_slice(body);
    b.extend_from_slice(attachment);
    b
}

/// A request's header, body and attachment as a server reads them: admitted or refused, then
/// answered, under every trust a connection can be in.
#[test]
fn rpc_frame() {
    let mut string = Vec::new();
    wire::pack_string(b"hello", &mut string);
    let meta = TensorMeta {
        dtype: Dtype::Float32,
        shape: vec![2],
    };
    let seeds = [
        frame(Function::MooncakeData, &string, &[]),
        frame(
            Function::MooncakeTensor,
            &[],
            &[2, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0],
        ),
        frame(Function::TeTensor, &meta.encode(), &[0; 8]),
        frame(Function::TeHello, &handshake::hello(&[3; 16]), &[]),
        frame(Function::TeData, &[], b"data"),
    ];
    let seeds: Vec<&[u8]> = seeds.iter().map(Vec::as_slice).collect();
    let service = Service {
        limits: Limits {
            max_message: 1 << 16,
        },
        key: None,
        mooncake_allow: None,
    };
    let peer: SocketAddr = "127.0.0.1:9".parse().unwrap_or_else(|_| unreachable!());
    run(
        "rpc-frame",
        env!("CARGO_MANIFEST_DIR"),
        &seeds,
        budget(1.0),
        |b: &[u8]| {
            let Some(raw) = b.get(..REQUEST_HEADER) else {
                return;
            };
            let Ok(head) = RequestHeader::decode(raw.try_into().unwrap_or(&[0; REQUEST_HEADER]))
            else {
                return;
            };
            let rest = &b[REQUEST_HEADER..];
            let body_len = (head.body as usize).min(rest.len());
            let (body, attachment) = rest.split_at(body_len);
            for mut trust in [Trust::Fresh, Trust::Proven] {
                if let Admit::Read(function) = service.admit(&trust, peer, &head) {
                    let answer = service.answer(
                        &mut trust,
                        peer,
                        head.seq,
                        function,
                        body.to_vec(),
                        Bytes::from(attachment.to_vec()),
                    );
                    assert!(answer.reply.len() >= wire::RESPONSE_HEADER);
                }
            }
            let _ = mooncake_header(rest);
            let _ = TensorMeta::decode(body);
            let _ = handshake::read_hello(body);
        },
    );
}

/// A response as a client reads it: its header, and an error's packed message.
#[test]
fn rpc_reply() {
    let mut seed = ResponseHeader {
        seq: 1,
        error: 4,
        body: 0,
        attachment: 0,
    }
    .encode()
    .to_vec();
    wire::pack_string(b"invalid rpc arg", &mut seed);
    run(
        "rpc-reply",
        env!("CARGO_MANIFEST_DIR"),
        &[&seed],
        budget(1.0),
        |b: &[u8]| {
            let mut raw = [0u8; wire::RESPONSE_HEADER];
            let n = b.len().min(raw.len());
            raw[..n].copy_from_slice(&b[..n]);
            if let Ok(h) = ResponseHeader::decode(&raw) {
                assert_eq!(h.encode(), raw, "an accepted header re-encodes to itself");
            }
            if let Ok(range) = wire::unpack_string(&b[n..]) {
                assert!(range.end <= b.len() - n);
            }
            let _ = handshake::read_answer(&b[n..]);
        },
    );
}
