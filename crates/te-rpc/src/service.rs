//! What a server decides, apart from its sockets: whether a call's header is served, skipped
//! or refused ([`Service::admit`]), and, once its bytes came, the reply and the message to hand
//! on ([`Service::answer`]).

use std::net::SocketAddr;

use te_reactor::allow::AllowList;
use te_reactor::secret::ClusterKey;

use crate::bytes::Bytes;
use crate::handshake::{self, Nonce};
use crate::message::{Origin, Payload, Received, Tensor};
use crate::tensor::{MooncakeView, TensorMeta, mooncake_header};
use crate::wire::{self, Function, Limits, RequestHeader, ResponseHeader, code};

/// How far a connection's peer is trusted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Trust {
    /// Nothing said yet.
    Fresh,
    /// te's greeting answered; its proof is due.
    Greeted { server: Nonce, client: Nonce },
    /// Greeted, and proved the cluster secret where one is set.
    Proven,
}

/// What to do with a call whose header came.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Admit {
    /// Read its body and attachment.
    Read(Function),
    /// Skip its bytes (a call te does not know), then send the reply.
    Skip { len: u64, reply: Vec<u8> },
    /// Send the reply and close.
    Refuse(Vec<u8>),
}

/// A finished call's outcome.
#[derive(Debug)]
pub(crate) struct Answer {
    /// The response's bytes.
    pub reply: Vec<u8>,
    /// The message for the handler.
    pub deliver: Option<Received>,
    /// Close once the reply is sent.
    pub close: bool,
}

/// A server's policy: its limits and who it trusts.
#[derive(Debug)]
pub(crate) struct Service {
    pub limits: Limits,
    pub key: Option<ClusterKey>,
    pub mooncake_allow: Option<AllowList>,
}

impl Service {
    /// Decides on a call from its header alone, before any of its bytes are read.
    pub(crate) fn admit(&self, trust: &Trust, peer: SocketAddr, head: &RequestHeader) -> Admit {
        let seq = head.seq;
        if let Err(e) = self.limits.check(head.body, head.attachment) {
            return Admit::Refuse(error(seq, code::TOO_LARGE, &e.to_string()));
        }
        let Some(function) = Function::from_id(head.function) else {
            return Admit::Skip {
                len: u64::from(head.body) + u64::from(head.attachment),
                reply: error(seq, code::NOT_REGISTERED, "the rpc function not registered"),
            };
        };
        let small = head.attachment == 0 && head.body <= 64;
        let refuse = match function {
            Function::TeHello | Function::TeProof if !small => Some("a greeting over 64 bytes"),
            Function::TeProof if !matches!(trust, Trust::Greeted { .. }) || self.key.is_none() => {
                Some("a proof without a greeting, or to a server without a cluster secret")
            }
            Function::TeData | Function::TeTensor
                if self.key.is_some() && *trust != Trust::Proven =>
            {
                Some("this server holds a cluster secret: prove it first")
            }
            Function::MooncakeData | Function::MooncakeTensor if !self.admits_mooncake(peer) => {
                Some("Mooncake's calls are not admitted from this address under a cluster secret")
            }
            _ => None,
        };
        match refuse {
            Some(why) => Admit::Refuse(error(seq, code::NOT_TRUSTED, why)),
            None => Admit::Read(function),
        }
    }

    fn admits_mooncake(&self, peer: SocketAddr) -> bool {
        self.key.is_none()
            || self
                .mooncake_allow
                .as_ref()
                .is_some_and(|a| a.admits(peer.ip()))
    }

    /// The reply to a call whose bytes all came, and what to hand on.
    pub(crate) fn answer(
        &self,
        trust: &mut Trust,
        peer: SocketAddr,
        seq: u32,
        function: Function,
        body: Vec<u8>,
        attachment: Bytes,
    ) -> Answer {
        let had_attachment = !attachment.is_empty();
        let result = match function {
            Function::TeHello => return self.greet(trust, seq, &body),
            Function::TeProof => return self.prove(trust, seq, &body),
            Function::TeData if body.is_empty() => Ok(Payload::Data(attachment)),
            Function::TeData => Err("te's message has no body".to_string()),
            Function::TeTensor => te_tensor(&body, attachment),
            Function::MooncakeData => mooncake_data(&body, attachment),
            Function::MooncakeTensor => Ok(mooncake_payload(attachment)),
        };
        match result {
            Ok(payload) => {
                let origin = if function.is_mooncake() {
                    Origin::Mooncake
                } else {
                    Origin::Te
                };
                // Mooncake's server answers a data call that carried an attachment with "ok".
                let ok_attachment: &[u8] = if function == Function::MooncakeData && had_attachment {
                    b"ok"
                } else {
                    b""
                };
                Answer {
                    reply: ok(seq, &wire::VOID_RETURN, ok_attachment),
                    deliver: Some(Received {
                        source: peer,
                        origin,
                        payload,
                    }),
                    close: false,
                }
            }
            Err(why) => Answer {
                reply: error(
                    seq,
                    code::INVALID_ARGUMENT,
                    &format!("invalid rpc arg: {why}"),
                ),
                deliver: None,
                close: true,
            },
        }
    }

    fn greet(&self, trust: &mut Trust, seq: u32, body: &[u8]) -> Answer {
        let (client, server) = match (handshake::read_hello(body), handshake::nonce()) {
            (Ok(c), Ok(s)) => (c, s),
            (Err(why), _) => return refusal(seq, code::INVALID_ARGUMENT, &why),
            (_, Err(e)) => return refusal(seq, code::STOPPING, &e.to_string()),
        };
        *trust = if self.key.is_some() {
            Trust::Greeted { server, client }
        } else {
            Trust::Proven
        };
        Answer {
            reply: ok(seq, &handshake::answer(&server, self.key.is_some()), b""),
            deliver: None,
            close: false,
        }
    }

    fn prove(&self, trust: &mut Trust, seq: u32, body: &[u8]) -> Answer {
        let (Trust::Greeted { server, client }, Some(key)) = (&*trust, &self.key) else {
            return refusal(seq, code::NOT_TRUSTED, "a proof without a greeting");
        };
        if !handshake::check_client(key, server, client, body) {
            return refusal(
                seq,
                code::NOT_TRUSTED,
                "the cluster secret's proof is wrong",
            );
        }
        let proof = handshake::server_proof(key, server, client);
        *trust = Trust::Proven;
        Answer {
            reply: ok(seq, &proof, b""),
            deliver: None,
            close: false,
        }
    }
}

fn te_tensor(body: &[u8], bytes: Bytes) -> Result<Payload, String> {
    let meta = TensorMeta::decode(body)?;
    meta.check_len(bytes.len() as u64)?;
    Ok(Payload::Tensor(Tensor {
        meta,
        bytes,
        header: 0,
    }))
}

/// Mooncake's data call: the attachment when there is one, else the string argument.
fn mooncake_data(body: &[u8], attachment: Bytes) -> Result<Payload, String> {
    let range = wire::unpack_string(body)?;
    if !attachment.is_empty() {
        return Ok(mooncake_payload(attachment));
    }
    Ok(mooncake_payload(body[range].to_vec().into()))
}

/// A Mooncake peer's payload, routed as Mooncake's receiver routes it.
fn mooncake_payload(bytes: Bytes) -> Payload {
    match mooncake_header(&bytes) {
        MooncakeView::Tensor(meta) => Payload::Tensor(Tensor {
            meta,
            bytes,
            header: crate::tensor::MOONCAKE_HEADER,
        }),
        MooncakeView::Oversized => {
            tracing::warn!(
                len = bytes.len(),
                "a Mooncake tensor header with a dimension of 2^48 or more: handed on as data"
            );
            Payload::Data(bytes)
        }
        MooncakeView::Data => Payload::Data(bytes),
    }
}

fn ok(seq: u32, body: &[u8], attachment: &[u8]) -> Vec<u8> {
    let head = ResponseHeader {
        seq,
        error: 0,
        body: body.len() as u32,
        attachment: attachment.len() as u32,
    };
    let mut b = head.encode().to_vec();
    b.extend_from_slice(body);
    b.extend_from_slice(attachment);
    b
}

/// An error response: the code, and the message as a packed string.
pub(crate) fn error(seq: u32, error: u8, message: &str) -> Vec<u8> {
    let mut body = Vec::new();
    wire::pack_string(message.as_bytes(), &mut body);
    let head = ResponseHeader {
        seq,
        error,
        body: body.len() as u32,
        attachment: 0,
    };
    let mut b = head.encode().to_vec();
    b.extend_from_slice(&body);
    b
}

fn refusal(seq: u32, code: u8, why: &str) -> Answer {
    Answer {
        reply: error(seq, code, why),
        deliver: None,
        close: true,
    }
}
