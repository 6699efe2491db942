//! Cluster authentication (te's, not Mooncake's): when engines share a cluster secret
//! (`MC_TE_CLUSTER_SECRET`), every control connection starts with a mutual challenge-response
//! in `Auth` frames, and the secret never crosses the wire:
//!
//! 1. client → `{"client_nonce": N_c}`
//! 2. server → `{"server_nonce": N_s, "server_proof": HMAC(K, "te-auth-server" | N_c | N_s)}`
//! 3. client checks the proof → `{"client_proof": HMAC(K, "te-auth-client" | N_s | N_c)}`
//! 4. server checks it → `{"status": "ok"}`, or `{"error": …}` and closes.
//!
//! `K` is SHA-256 of the secret; nonces are 16 random bytes; proofs are compared in constant
//! time. Segment secrets in descriptors are sealed with `K` ([`seal`], [`unseal`]) so neither
//! a metadata service nor a listener on the wire learns them. This module does no I/O of its own
//! beyond the frames it is handed.

use std::io::{Read, Write};

use hmac::{Hmac, Mac};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::frame::{FrameType, read_frame, write_frame};
use crate::error::{Error, Result};
use crate::segment::{SegmentDesc, SegmentSecret};

type HmacSha256 = Hmac<Sha256>;

/// Payload limit of authentication frames.
pub const AUTH_MAX: usize = 512;

/// The key derived from a cluster secret.
#[derive(Clone)]
pub struct ClusterKey([u8; 32]);

impl std::fmt::Debug for ClusterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClusterKey(<redacted>)")
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 || !s.is_ascii() {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).ok())
        .collect()
}

fn nonce() -> Result<[u8; 16]> {
    Ok(SegmentSecret::random()?.to_bytes())
}

impl ClusterKey {
    /// The key for `secret`.
    pub fn from_secret(secret: &str) -> Self {
        ClusterKey(Sha256::digest(secret.as_bytes()).into())
    }

    fn mac(&self, parts: &[&[u8]]) -> HmacSha256 {
        // HMAC takes a key of any length; 32 bytes always fit.
        let mut m = <HmacSha256 as Mac>::new_from_slice(&self.0)
            .unwrap_or_else(|_| unreachable!("HMAC accepts any key length"));
        for p in parts {
            m.update(&(p.len() as u32).to_le_bytes());
            m.update(p);
        }
        m
    }

    fn proof(&self, parts: &[&[u8]]) -> Vec<u8> {
        self.mac(parts).finalize().into_bytes().to_vec()
    }

    fn verify(&self, parts: &[&[u8]], tag: &[u8]) -> bool {
        self.mac(parts).verify_slice(tag).is_ok()
    }
}

fn field(v: &Value, name: &str) -> Option<Vec<u8>> {
    v.get(name).and_then(Value::as_str).and_then(unhex)
}

fn refused(peer: &str, reason: impl Into<String>) -> Error {
    Error::PeerRefused {
        peer: peer.to_string(),
        reason: reason.into(),
    }
}

/// The client's side, run on a fresh connection before any request.
///
/// # Errors
/// [`Error::PeerRefused`] when the peer has no cluster secret, a different one, or fails its
/// proof; [`Error::Socket`] / [`Error::MalformedMessage`] on I/O or framing errors.
pub fn client_handshake(
    stream: &mut (impl Read + Write),
    key: &ClusterKey,
    peer: &str,
) -> Result<()> {
    let io = |e: std::io::Error| Error::socket(format!("authenticating to {peer}"), e);
    let read = |s: &mut dyn Read| -> Result<Value> {
        let (kind, payload) = read_frame(&mut { s }, AUTH_MAX).map_err(|e| {
            Error::MalformedMessage(format!("authentication reply from {peer}: {e}"))
        })?;
        let v: Value = serde_json::from_slice(&payload).map_err(|e| {
            Error::MalformedMessage(format!("authentication reply from {peer}: {e}"))
        })?;
        if kind != FrameType::Auth {
            return Err(refused(peer, "the peer answered with another frame type"));
        }
        if let Some(e) = v.get("error").and_then(Value::as_str) {
            return Err(refused(peer, e));
        }
        Ok(v)
    };
    let client_nonce = nonce()?;
    let hello = json!({"client_nonce": hex(&client_nonce)}).to_string();
    write_frame(stream, FrameType::Auth, hello.as_bytes()).map_err(io)?;
    let challenge = read(stream)?;
    let (Some(server_nonce), Some(server_proof)) = (
        field(&challenge, "server_nonce"),
        field(&challenge, "server_proof"),
    ) else {
        return Err(Error::MalformedMessage(format!(
            "authentication challenge from {peer}"
        )));
    };
    if !key.verify(
        &[b"te-auth-server", &client_nonce, &server_nonce],
        &server_proof,
    ) {
        return Err(refused(
            peer,
            "the peer does not hold this cluster's secret",
        ));
    }
    let proof = key.proof(&[b"te-auth-client", &server_nonce, &client_nonce]);
    let answer = json!({"client_proof": hex(&proof)}).to_string();
    write_frame(stream, FrameType::Auth, answer.as_bytes()).map_err(io)?;
    read(stream).map(|_| ())
}

/// The server's side between its challenge and the client's answer.
#[derive(Debug)]
pub struct PendingProof {
    client_nonce: Vec<u8>,
    server_nonce: [u8; 16],
}

fn refusal(why: &str) -> Vec<u8> {
    json!({"error": why}).to_string().into_bytes()
}

/// The server's first step, given the client's `Auth` hello: the challenge to send and what
/// the answer is checked against, or (`Err`) the refusal to send before closing.
///
/// # Errors
/// The refusal payload: a malformed hello, or no randomness for a nonce.
pub fn server_challenge(
    key: &ClusterKey,
    hello: &[u8],
) -> std::result::Result<(Vec<u8>, PendingProof), Vec<u8>> {
    let client_nonce = serde_json::from_slice::<Value>(hello)
        .ok()
        .and_then(|v| field(&v, "client_nonce"))
        .filter(|n| n.len() == 16)
        .ok_or_else(|| refusal("malformed authentication request"))?;
    let server_nonce = nonce().map_err(|_| refusal("no randomness for a challenge"))?;
    let proof = key.proof(&[b"te-auth-server", &client_nonce, &server_nonce]);
    let challenge =
        json!({"server_nonce": hex(&server_nonce), "server_proof": hex(&proof)}).to_string();
    Ok((
        challenge.into_bytes(),
        PendingProof {
            client_nonce,
            server_nonce,
        },
    ))
}

/// The server's second step, given the client's answer (`None` when the client sent another
/// frame type): the reply to send, and whether the client proved the secret (if not, the
/// connection closes after the reply).
pub fn server_conclude(
    key: &ClusterKey,
    pending: &PendingProof,
    answer: Option<&[u8]>,
) -> (Vec<u8>, bool) {
    let Some(answer) = answer else {
        return (refusal("expected the authentication answer"), false);
    };
    let ok = serde_json::from_slice::<Value>(answer)
        .ok()
        .and_then(|v| field(&v, "client_proof"))
        .is_some_and(|p| {
            key.verify(
                &[
                    b"te-auth-client",
                    &pending.server_nonce,
                    &pending.client_nonce,
                ],
                &p,
            )
        });
    match ok {
        true => (br#"{"status":"ok"}"#.to_vec(), true),
        false => (
            refusal("authentication failed: wrong cluster secret"),
            false,
        ),
    }
}

/// The server's side over a blocking stream, given the client's first `Auth` payload: both
/// steps with their frames. Returns whether the client proved the secret; on failure the
/// client has been told why and the connection should close.
pub fn server_handshake(
    reader: &mut impl Read,
    writer: &mut impl Write,
    key: &ClusterKey,
    hello: &[u8],
) -> bool {
    let pending = match server_challenge(key, hello) {
        Ok((challenge, pending)) => {
            if write_frame(writer, FrameType::Auth, &challenge).is_err() {
                return false;
            }
            pending
        }
        Err(refused) => {
            let _ = write_frame(writer, FrameType::Auth, &refused);
            return false;
        }
    };
    let answer = match read_frame(reader, AUTH_MAX) {
        Ok((FrameType::Auth, payload)) => Some(payload),
        _ => None,
    };
    let (reply, ok) = server_conclude(key, &pending, answer.as_deref());
    write_frame(writer, FrameType::Auth, &reply).is_ok() && ok
}

/// Replaces `desc`'s clear segment secret by one sealed with `key` (a fresh nonce each time).
///
/// # Errors
/// No randomness for the nonce.
pub fn seal(key: &ClusterKey, desc: &mut SegmentDesc) -> Result<()> {
    let Some(clear) = desc.te_secret.take().and_then(|s| unhex(&s)) else {
        return Ok(());
    };
    let n = nonce()?;
    let pad = key.proof(&[b"te-seal", desc.name.as_bytes(), &n]);
    let sealed: Vec<u8> = clear.iter().zip(&pad).map(|(a, b)| a ^ b).collect();
    let tag = key.proof(&[b"te-seal-tag", desc.name.as_bytes(), &n, &sealed]);
    desc.te_secret_sealed = Some(format!("{}:{}:{}", hex(&n), hex(&sealed), hex(&tag[..16])));
    Ok(())
}

/// Restores the clear secret of a sealed descriptor (named `name`).
///
/// # Errors
/// [`Error::PeerRefused`] when the descriptor is sealed and no key is configured, or it was
/// sealed with another key or altered.
pub fn unseal(key: Option<&ClusterKey>, name: &str, desc: &mut SegmentDesc) -> Result<()> {
    let Some(sealed) = desc.te_secret_sealed.take() else {
        return Ok(());
    };
    let refuse = |why: &str| refused(name, why);
    let key = key.ok_or_else(|| {
        refuse("the segment's secret is sealed with a cluster secret; set MC_TE_CLUSTER_SECRET")
    })?;
    let mut parts = sealed.split(':').map(unhex);
    let (Some(Some(n)), Some(Some(body)), Some(Some(tag)), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(Error::MalformedMessage(format!(
            "segment {name}: bad sealed secret"
        )));
    };
    // The tag is compared in constant time by the MAC's own check.
    let tag_ok = tag.len() == 16
        && key
            .mac(&[b"te-seal-tag", desc.name.as_bytes(), &n, &body])
            .verify_truncated_left(&tag)
            .is_ok();
    if !tag_ok || body.len() != 16 {
        return Err(refuse(
            "the segment's secret was sealed with another cluster secret",
        ));
    }
    let pad = key.proof(&[b"te-seal", desc.name.as_bytes(), &n]);
    let clear: Vec<u8> = body.iter().zip(&pad).map(|(a, b)| a ^ b).collect();
    desc.te_secret = Some(hex(&clear));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;

    fn desc() -> SegmentDesc {
        let secret = SegmentSecret::random().unwrap();
        SegmentDesc::local("node-a", "tcp", secret, &[])
    }

    #[test]
    fn sealing_hides_the_secret_and_only_the_key_opens_it() {
        let key = ClusterKey::from_secret("cluster one");
        let mut d = desc();
        let clear = d.te_secret.clone().unwrap();
        seal(&key, &mut d).unwrap();
        assert!(d.te_secret.is_none());
        assert!(
            !d.to_json().contains(&clear),
            "the clear secret is not in the JSON"
        );
        let mut opened = d.clone();
        unseal(Some(&key), "node-a", &mut opened).unwrap();
        assert_eq!(opened.te_secret.as_deref(), Some(clear.as_str()));
        let mut wrong = d.clone();
        let other = ClusterKey::from_secret("cluster two");
        assert!(matches!(
            unseal(Some(&other), "node-a", &mut wrong),
            Err(Error::PeerRefused { .. })
        ));
        let mut none = d.clone();
        let err = unseal(None, "node-a", &mut none).unwrap_err();
        assert!(err.to_string().contains("MC_TE_CLUSTER_SECRET"), "{err}");
        let mut bad = d;
        bad.te_secret_sealed = Some("zz".into());
        assert!(unseal(Some(&key), "node-a", &mut bad).is_err());
    }

    fn handshake(client_secret: &str, server_secret: &str) -> (Result<()>, bool) {
        let (mut c, s) = UnixStream::pair().unwrap();
        let server_key = ClusterKey::from_secret(server_secret);
        let server = std::thread::spawn(move || {
            let mut r = s.try_clone().unwrap();
            let mut w = s;
            let (kind, hello) = read_frame(&mut r, AUTH_MAX).unwrap();
            assert_eq!(kind, FrameType::Auth);
            server_handshake(&mut r, &mut w, &server_key, &hello)
        });
        let client = client_handshake(&mut c, &ClusterKey::from_secret(client_secret), "peer");
        drop(c);
        (client, server.join().unwrap())
    }

    #[test]
    fn both_sides_must_hold_the_same_secret() {
        let (client, server) = handshake("s3cret", "s3cret");
        assert!(client.is_ok() && server, "{client:?}");
        let (client, server) = handshake("s3cret", "other");
        assert!(
            matches!(client, Err(Error::PeerRefused { .. })),
            "{client:?}"
        );
        assert!(!server);
    }
}
