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
//! a metadata service nor a listener on the wire learns them, and whole descriptors are signed
//! with it ([`sign`], [`verify`]), so one rewritten anywhere (a metadata service anyone can
//! write, say) is refused rather than followed. This module does no I/O of its own beyond the
//! frames it is handed.

use std::io::{Read, Write};

use hmac::{Hmac, Mac};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::frame::{FrameType, read_frame, write_frame};
use crate::error::{Error, Result};
use crate::segment::{Received, SegmentDesc, SegmentSecret};

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
        keyed_mac(&self.0, parts)
    }

    fn proof(&self, parts: &[&[u8]]) -> Vec<u8> {
        self.mac(parts).finalize().into_bytes().to_vec()
    }

    fn verify(&self, parts: &[&[u8]], tag: &[u8]) -> bool {
        self.mac(parts).verify_slice(tag).is_ok()
    }
}

/// HMAC-SHA256 keyed by `key` over `parts`, each length-prefixed so that no two lists of parts
/// hash alike: the one construction behind te's proofs and signatures (cluster and segment
/// secrets alike).
pub(crate) fn keyed_mac(key: &[u8], parts: &[&[u8]]) -> HmacSha256 {
    let mut m = <HmacSha256 as Mac>::new_from_slice(key)
        .unwrap_or_else(|_| unreachable!("HMAC accepts any key length"));
    for p in parts {
        m.update(&(p.len() as u32).to_le_bytes());
        m.update(p);
    }
    m
}

pub use te_reactor::secret::same_bytes;

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

/// `value` as one string whatever the order of its objects' keys: objects with their keys
/// sorted, no spaces, strings and numbers as serde_json writes them.
fn canonical(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push(':');
                canonical(&map[k], out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                canonical(v, out);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

/// What a descriptor's signature covers, from its JSON as received: `None` for JSON that is
/// no object with a string `name`.
pub fn received(value: &Value) -> Option<Received> {
    let mut unsigned = value.as_object()?.clone();
    unsigned.remove("te_signature");
    let name = unsigned.get("name")?.as_str()?.to_string();
    let mut text = String::new();
    canonical(&Value::Object(unsigned), &mut text);
    Some(Received {
        canonical: text,
        name,
    })
}

/// Signs `desc` (its secret already sealed) with `key`: `te_signature` becomes an HMAC of the
/// descriptor's canonical JSON without it, every field covered, the name included.
///
/// # Errors
/// A descriptor that cannot be written as JSON.
pub fn sign(key: &ClusterKey, desc: &mut SegmentDesc) -> Result<()> {
    desc.te_signature = None;
    let value = serde_json::to_value(&*desc)
        .map_err(|e| Error::InvalidArgument(format!("descriptor of {}: {e}", desc.name)))?;
    let body = received(&value)
        .ok_or_else(|| Error::InvalidArgument(format!("descriptor of {}", desc.name)))?;
    desc.te_signature = Some(hex(&key.proof(&[b"te-desc", body.canonical.as_bytes()])));
    Ok(())
}

/// Checks, under a cluster secret (`key`), that `desc` was fetched as its publisher signed it
/// for segment `name`: signed with this key, nothing changed since, published under `name`.
/// Without a key there is nothing to check.
///
/// # Errors
/// [`Error::PeerRefused`] naming the segment: an unsigned descriptor (a peer without the
/// cluster secret, a Mooncake engine, or one stripped of its signature), one altered or signed
/// with another secret, or one published for another name.
pub fn verify(key: Option<&ClusterKey>, name: &str, desc: &SegmentDesc) -> Result<()> {
    let Some(key) = key else {
        return Ok(());
    };
    let refuse = |why: &str| refused(name, format!("descriptor refused: {why}"));
    let (Some(signature), Some(body)) = (&desc.te_signature, &desc.received) else {
        return Err(refuse(
            "it is not signed with the cluster key (MC_TE_CLUSTER_SECRET): only te engines \
             holding the same secret are opened",
        ));
    };
    let valid = unhex(signature)
        .is_some_and(|tag| key.verify(&[b"te-desc", body.canonical.as_bytes()], &tag));
    if !valid {
        return Err(refuse(
            "its signature does not match: it was altered, or signed with another cluster secret",
        ));
    }
    if body.name != name {
        return Err(refuse(&format!(
            "it was published for segment {:?}",
            body.name
        )));
    }
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

    /// `desc` sealed and signed with `key`, then published and received as JSON.
    fn published(key: &ClusterKey, mut desc: SegmentDesc) -> String {
        seal(key, &mut desc).unwrap();
        sign(key, &mut desc).unwrap();
        desc.to_json()
    }

    #[test]
    fn a_signed_descriptor_is_taken_and_any_change_refused() {
        let key = ClusterKey::from_secret("cluster one");
        let json = published(&key, desc());
        let got = SegmentDesc::from_json(json.as_bytes()).unwrap();
        verify(Some(&key), "node-a", &got).expect("as published");
        verify(None, "node-a", &got).expect("no key, nothing to check");
        // Whatever the order of its keys and its spacing.
        let v: Value = serde_json::from_str(&json).unwrap();
        let pretty = serde_json::to_string_pretty(&v).unwrap();
        verify(
            Some(&key),
            "node-a",
            &SegmentDesc::from_json(pretty.as_bytes()).unwrap(),
        )
        .expect("re-formatted");
        let refused_for = |json: &str, name: &str, key: &ClusterKey| {
            let d = SegmentDesc::from_json(json.as_bytes()).unwrap();
            match verify(Some(key), name, &d) {
                Err(Error::PeerRefused { peer, reason }) => {
                    assert_eq!(peer, name);
                    reason
                }
                other => panic!("{json}: {other:?}"),
            }
        };
        // A rail moved to another port, a buffer grown, a field te does not know added.
        let mut moved: Value = serde_json::from_str(&json).unwrap();
        moved["te_rails"] = serde_json::json!([{"name": "lo", "ip": "127.0.0.1", "port": 9}]);
        assert!(refused_for(&moved.to_string(), "node-a", &key).contains("does not match"));
        let mut grown: Value = serde_json::from_str(&json).unwrap();
        grown["te_host_id"] = Value::from("another-host");
        assert!(refused_for(&grown.to_string(), "node-a", &key).contains("does not match"));
        let mut extra: Value = serde_json::from_str(&json).unwrap();
        extra["shm"] = Value::from("/etc/passwd");
        assert!(refused_for(&extra.to_string(), "node-a", &key).contains("does not match"));
        // Stripped of its signature, signed with another secret, or for another segment.
        let mut stripped: Value = serde_json::from_str(&json).unwrap();
        stripped.as_object_mut().unwrap().remove("te_signature");
        assert!(refused_for(&stripped.to_string(), "node-a", &key).contains("not signed"));
        let other = ClusterKey::from_secret("cluster two");
        assert!(refused_for(&json, "node-a", &other).contains("does not match"));
        assert!(refused_for(&json, "node-b", &key).contains("published for"));
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
