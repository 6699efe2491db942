//! Cluster authentication (te's, not Mooncake's): when engines share a cluster secret
//! (`MC_TE_CLUSTER_SECRET`), every control connection starts with a mutual challenge-response
//! in `Auth` frames, and the secret never crosses the wire:
//!
//! 1. client → `{"client_nonce": N_c}`
//! 2. server → `{"server_nonce": N_s}`: nothing a stranger could test guesses against
//! 3. client → `{"client_proof": HMAC(K, "te-auth-client-2" | N_s | N_c)}`
//! 4. server checks it → `{"server_proof": HMAC(K, "te-auth-server-2" | N_c | N_s)}`, or
//!    `{"error": …}` and closes; the client checks the server's proof.
//!
//! The server proves the secret only to a client that proved it first, so whoever connects
//! learns nothing to crack offline; a client proves it to the listener it chose to open. `K` is
//! derived from the secret by PBKDF2 ([`te_reactor::secret::stretched_key`]); nonces are 16
//! random bytes; proofs are compared in constant time. Segment secrets in descriptors are sealed with `K` ([`seal`],
//! [`unseal`]) so neither a metadata service nor a listener on the wire learns them, and whole
//! descriptors are signed with it ([`sign`], [`verify`]), so one rewritten anywhere (a metadata
//! service anyone can write, say) is refused rather than followed. This module does no I/O of
//! its own beyond the frames it is handed.

use std::io::{Read, Write};

use hmac::Mac;
use serde_json::{Value, json};

use super::frame::{FrameType, read_frame, write_frame};
use crate::error::{Error, Result};
use crate::segment::{Received, SegmentDesc, SegmentSecret};

/// Payload limit of authentication frames.
pub const AUTH_MAX: usize = 512;

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

pub use te_reactor::secret::ClusterKey;

/// The cluster key for `secret` (`MC_TE_CLUSTER_SECRET`), its strength checked.
///
/// # Errors
/// [`Error::InvalidConfig`] naming the variable (its value never shown) for a weak secret.
pub fn cluster_key(secret: &str) -> Result<ClusterKey> {
    ClusterKey::from_secret(secret).map_err(|reason| Error::InvalidConfig {
        name: crate::settings::TE_CLUSTER_SECRET.name.into(),
        value: "<redacted>".into(),
        reason,
    })
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

/// What the client proves: it holds `key`, for this server's and this client's nonces.
const CLIENT_PROOF: &[u8] = b"te-auth-client-2";
/// What the server proves, once the client has.
const SERVER_PROOF: &[u8] = b"te-auth-server-2";

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
    let server_nonce = field(&challenge, "server_nonce")
        .filter(|n| n.len() == 16)
        .ok_or_else(|| Error::MalformedMessage(format!("authentication challenge from {peer}")))?;
    let proof = key.proof(&[CLIENT_PROOF, &server_nonce, &client_nonce]);
    let answer = json!({"client_proof": hex(&proof)}).to_string();
    write_frame(stream, FrameType::Auth, answer.as_bytes()).map_err(io)?;
    let done = read(stream)?;
    let server_proof = field(&done, "server_proof").unwrap_or_default();
    match key.verify(&[SERVER_PROOF, &client_nonce, &server_nonce], &server_proof) {
        true => Ok(()),
        false => Err(refused(
            peer,
            "the peer does not hold this cluster's secret",
        )),
    }
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

/// The server's first step, given the client's `Auth` hello: the challenge to send (a nonce,
/// and no proof of the server's: a stranger gets nothing to test guesses against) and what the
/// answer is checked against, or (`Err`) the refusal to send before closing.
///
/// # Errors
/// The refusal payload: a malformed hello, or no randomness for a nonce.
pub fn server_challenge(hello: &[u8]) -> std::result::Result<(Vec<u8>, PendingProof), Vec<u8>> {
    let client_nonce = serde_json::from_slice::<Value>(hello)
        .ok()
        .and_then(|v| field(&v, "client_nonce"))
        .filter(|n| n.len() == 16)
        .ok_or_else(|| refusal("malformed authentication request"))?;
    let server_nonce = nonce().map_err(|_| refusal("no randomness for a challenge"))?;
    let challenge = json!({"server_nonce": hex(&server_nonce)}).to_string();
    Ok((
        challenge.into_bytes(),
        PendingProof {
            client_nonce,
            server_nonce,
        },
    ))
}

/// The server's second step, given the client's answer (`None` when the client sent another
/// frame type): the reply to send (the server's own proof, only to a client that proved the
/// secret), and whether the client proved it (if not, the connection closes after the reply).
pub fn server_conclude(
    key: &ClusterKey,
    pending: &PendingProof,
    answer: Option<&[u8]>,
) -> (Vec<u8>, bool) {
    let Some(answer) = answer else {
        return (refusal("expected the authentication answer"), false);
    };
    let (client, server) = (&pending.client_nonce[..], &pending.server_nonce[..]);
    let ok = serde_json::from_slice::<Value>(answer)
        .ok()
        .and_then(|v| field(&v, "client_proof"))
        .is_some_and(|p| key.verify(&[CLIENT_PROOF, server, client], &p));
    match ok {
        true => {
            let proof = key.proof(&[SERVER_PROOF, client, server]);
            let reply = json!({"status": "ok", "server_proof": hex(&proof)}).to_string();
            (reply.into_bytes(), true)
        }
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
    let pending = match server_challenge(hello) {
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

/// Signs `desc` (its secret already sealed) with `key`: `te_signature` becomes an HMAC of the
/// descriptor's canonical JSON without it, every field covered, the name included.
///
/// # Errors
/// A descriptor that cannot be written as JSON.
pub fn sign(key: &ClusterKey, desc: &mut SegmentDesc) -> Result<()> {
    desc.te_signature = None;
    let value = serde_json::to_value(&*desc)
        .map_err(|e| Error::InvalidArgument(format!("descriptor of {}: {e}", desc.name)))?;
    let body = Received::of(&value)
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

    /// The key of a test cluster `n`'s secret (strong enough to be one).
    fn cluster(n: u8) -> ClusterKey {
        ClusterKey::from_secret(&secret(n)).unwrap()
    }

    #[test]
    fn a_weak_cluster_secret_is_named_never_shown() {
        let err = cluster_key("short").unwrap_err().to_string();
        assert!(
            err.contains("MC_TE_CLUSTER_SECRET") && !err.contains("short"),
            "named, never shown: {err}"
        );
        assert!(cluster_key(&secret(1)).is_ok());
    }

    fn secret(n: u8) -> String {
        format!("cluster-{n}-0b6e6a1c5d7f43e2a9")
    }

    fn desc() -> SegmentDesc {
        let secret = SegmentSecret::random().unwrap();
        SegmentDesc::local("node-a", "tcp", secret, &[])
    }

    #[test]
    fn sealing_hides_the_secret_and_only_the_key_opens_it() {
        let key = cluster(1);
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
        let other = cluster(2);
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
        let key = cluster(1);
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
        let other = cluster(2);
        assert!(refused_for(&json, "node-a", &other).contains("does not match"));
        assert!(refused_for(&json, "node-b", &key).contains("published for"));
    }

    fn handshake(client_secret: &str, server_secret: &str) -> (Result<()>, bool) {
        let (mut c, s) = UnixStream::pair().unwrap();
        let server_key = ClusterKey::from_secret(server_secret).unwrap();
        let server = std::thread::spawn(move || {
            let mut r = s.try_clone().unwrap();
            let mut w = s;
            let (kind, hello) = read_frame(&mut r, AUTH_MAX).unwrap();
            assert_eq!(kind, FrameType::Auth);
            server_handshake(&mut r, &mut w, &server_key, &hello)
        });
        let client_key = ClusterKey::from_secret(client_secret).unwrap();
        let client = client_handshake(&mut c, &client_key, "peer");
        drop(c);
        (client, server.join().unwrap())
    }

    #[test]
    fn both_sides_must_hold_the_same_secret() {
        let (client, server) = handshake(&secret(1), &secret(1));
        assert!(client.is_ok() && server, "{client:?}");
        let (client, server) = handshake(&secret(1), &secret(2));
        assert!(
            matches!(client, Err(Error::PeerRefused { .. })),
            "{client:?}"
        );
        assert!(!server);
    }

    /// A stranger who says hello gets a nonce and nothing keyed with the secret; the server's
    /// proof goes only to a client that proved the secret first.
    #[test]
    fn the_server_proves_nothing_before_the_client_has() {
        let key = cluster(1);
        let hello = json!({"client_nonce": hex(&[7u8; 16])}).to_string();
        let (challenge, pending) = server_challenge(hello.as_bytes()).unwrap();
        let v: Value = serde_json::from_slice(&challenge).unwrap();
        assert_eq!(
            v.as_object().unwrap().keys().collect::<Vec<_>>(),
            ["server_nonce"],
            "a nonce alone"
        );
        let wrong = json!({"client_proof": hex(&[0u8; 32])}).to_string();
        let (reply, ok) = server_conclude(&key, &pending, Some(wrong.as_bytes()));
        assert!(!ok);
        assert!(!String::from_utf8(reply).unwrap().contains("server_proof"));
        let server_nonce = field(&v, "server_nonce").unwrap();
        let proof = key.proof(&[CLIENT_PROOF, &server_nonce, &[7u8; 16]]);
        let right = json!({"client_proof": hex(&proof)}).to_string();
        let (reply, ok) = server_conclude(&key, &pending, Some(right.as_bytes()));
        assert!(ok);
        let reply: Value = serde_json::from_slice(&reply).unwrap();
        let server_proof = field(&reply, "server_proof").unwrap();
        assert!(key.verify(&[SERVER_PROOF, &[7u8; 16], &server_nonce], &server_proof));
    }
}
