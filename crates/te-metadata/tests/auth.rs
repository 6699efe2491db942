//! Cluster authentication on real control listeners: engines sharing `MC_TE_CLUSTER_SECRET`
//! open, transfer, notify and probe each other; a peer without the secret, with another one,
//! or speaking raw bad frames gets a refusal and nothing else; a peer with a secret facing an
//! engine without one is told so; and descriptors (served peer to peer or kept in the te-metadata
//! server) carry the segment secret only sealed.

mod common;

use std::io::{Read, Write};
use std::sync::Arc;
use std::time::Duration;

use common::{buffer, engine, http_server};
use te_core::config::Redacted;
use te_core::control::frame::{FrameType, read_frame, write_frame};
use te_core::metadata::store::KvStore;
use te_core::{
    Config, Error, HostBuffer, Notification, Opcode, PeerLiveness, Permission, TransferRequest,
    TransferState,
};

fn with_secret(secret: &'static str) -> impl FnOnce(&mut Config) {
    move |c| c.cluster_secret = Some(Redacted(secret.into()))
}

fn p2p(tweak: impl FnOnce(&mut Config)) -> te_core::TransferEngine {
    engine("P2PHANDSHAKE", "127.0.0.1", tweak).unwrap()
}

#[test]
fn peers_with_the_secret_work_and_others_are_refused() {
    let target = p2p(with_secret("correct-horse-0b6e6a1c5d"));
    let tbuf = buffer(&target, 1 << 16, 0x11);
    let name = target.segment_name().to_string();

    // Same secret: open, transfer, notify, probe.
    let friend = p2p(with_secret("correct-horse-0b6e6a1c5d"));
    let local = Arc::new(HostBuffer::new(1 << 16).unwrap());
    friend
        .register_buffer(&local, "*", Permission::LocalOnly)
        .unwrap();
    let seg = friend.open_segment(&name).unwrap();
    let b = friend.allocate_batch(1).unwrap();
    let r = TransferRequest {
        opcode: Opcode::Read,
        source: local.addr(),
        target_id: seg,
        target_offset: tbuf.addr(),
        length: 1 << 16,
    };
    friend.submit(b, &[r]).unwrap();
    assert_eq!(
        friend.wait(b, Duration::from_secs(30)).unwrap().state,
        TransferState::Completed
    );
    friend.free_batch(b).unwrap();
    assert_eq!(local.to_vec(0, 1 << 16).unwrap(), vec![0x11; 1 << 16]);
    let note = Notification {
        name: "n".into(),
        notify_msg: "hello".into(),
    };
    friend.send_notify(&name, &note).unwrap();
    assert_eq!(
        target
            .next_notify(Duration::from_secs(5))
            .map(|r| r.notification)
            .unwrap()
            .notify_msg,
        "hello"
    );
    assert_eq!(friend.probe(&name), PeerLiveness::Alive);

    // No secret: refused with the reason, no descriptor, no notification delivered.
    let stranger = p2p(|_| {});
    let err = stranger.open_segment(&name).unwrap_err();
    assert!(
        matches!(&err, Error::PeerRefused { reason, .. } if reason.contains("authentication required")),
        "{err:?}"
    );
    assert!(stranger.send_notify(&name, &note).is_err());
    assert_eq!(stranger.probe(&name), PeerLiveness::Unreachable);
    // Another secret: refused too.
    let impostor = p2p(with_secret("battery-staple-7f43e2a9d1"));
    let err = impostor.open_segment(&name).unwrap_err();
    assert!(matches!(&err, Error::PeerRefused { .. }), "{err:?}");
    assert!(impostor.send_notify(&name, &note).is_err());
    assert!(
        target
            .next_notify(Duration::from_millis(300))
            .map(|r| r.notification)
            .is_none(),
        "nothing got through"
    );

    // A secret facing an engine without one is told so.
    let open = p2p(|_| {});
    let err = friend.open_segment(open.segment_name()).unwrap_err();
    assert!(
        matches!(&err, Error::PeerRefused { reason, .. } if reason.contains("no cluster secret")),
        "{err:?}"
    );
}

#[test]
fn raw_frames_without_the_proof_get_nothing() {
    let target = p2p(with_secret("k-0b6e6a1c5d7f43e2"));
    let (host, port) = te_core::control::split_host_port(target.segment_name()).unwrap();
    let talk = |frames: &[(FrameType, &[u8])]| -> Vec<(FrameType, Vec<u8>)> {
        let mut s = std::net::TcpStream::connect((host.as_str(), port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        for (k, p) in frames {
            let _ = write_frame(&mut s, *k, p);
        }
        let mut out = Vec::new();
        while let Ok(f) = read_frame(&mut s, 1 << 20) {
            out.push(f);
        }
        out
    };
    // A plain Metadata request: one refusal, then the connection closes.
    let got = talk(&[(FrameType::Metadata, b"{}"), (FrameType::Metadata, b"{}")]);
    assert_eq!(got.len(), 1);
    let text = String::from_utf8_lossy(&got[0].1);
    assert!(
        text.contains("authentication required") && !text.contains("buffers"),
        "{text}"
    );
    // Garbage in the Auth frame, and a short nonce: refused.
    for hello in [&b"not json"[..], br#"{"client_nonce":"abcd"}"#] {
        let got = talk(&[(FrameType::Auth, hello), (FrameType::Metadata, b"{}")]);
        assert_eq!(got.len(), 1, "{got:?}");
        assert!(String::from_utf8_lossy(&got[0].1).contains("error"));
    }
    // A valid hello but a forged answer: challenged, then refused.
    let got = talk(&[
        (
            FrameType::Auth,
            br#"{"client_nonce":"00112233445566778899aabbccddeeff"}"#,
        ),
        (FrameType::Auth, br#"{"client_proof":"00"}"#),
        (FrameType::Metadata, b"{}"),
    ]);
    assert_eq!(got.len(), 2, "{got:?}");
    let challenge = String::from_utf8_lossy(&got[0].1);
    assert!(
        challenge.contains("server_nonce") && !challenge.contains("proof"),
        "a stranger gets a nonce, nothing to test guesses of the secret against: {challenge}"
    );
    assert!(String::from_utf8_lossy(&got[1].1).contains("authentication failed"));
    assert!(!String::from_utf8_lossy(&got[1].1).contains("proof"));
    // Raw bytes that are no frame at all close the connection; the engine keeps serving.
    let mut s = std::net::TcpStream::connect((host.as_str(), port)).unwrap();
    s.write_all(&[0xff; 64]).unwrap();
    let mut sink = Vec::new();
    let _ = s.read_to_end(&mut sink);
    let friend = p2p(with_secret("k-0b6e6a1c5d7f43e2"));
    assert!(friend.open_segment(target.segment_name()).is_ok());
}

#[test]
fn descriptors_carry_the_segment_secret_only_sealed() {
    // Peer to peer: what the listener serves.
    let target = p2p(with_secret("seal-me-0b6e6a1c5d7f43"));
    let (host, port) = te_core::control::split_host_port(target.segment_name()).unwrap();
    let key = te_core::control::auth::ClusterKey::from_secret("seal-me-0b6e6a1c5d7f43").unwrap();
    let served = te_core::control::request(
        &host,
        port,
        FrameType::Metadata,
        b"{}",
        Duration::from_secs(5),
        1 << 20,
        Some(&key),
    )
    .unwrap();
    let served: serde_json::Value = serde_json::from_slice(&served).unwrap();
    assert!(
        served.get("te_secret").is_none() && served["te_secret_sealed"].is_string(),
        "{served}"
    );

    // In a shared service: sealed there too; engines with the secret transfer, others cannot.
    let svc = http_server(0, None);
    let tname = format!("sealed-target-{}", std::process::id());
    let owner = engine(&svc.url, &tname, with_secret("shared-0b6e6a1c5d7f43e2")).unwrap();
    let obuf = buffer(&owner, 4096, 0x42);
    let kv =
        te_core::metadata::http::HttpStore::new(&svc.url, Duration::from_secs(2), 1 << 20).unwrap();
    let stored = kv.get(&format!("mooncake/ram/{tname}")).unwrap().unwrap();
    let stored: serde_json::Value = serde_json::from_slice(&stored).unwrap();
    assert!(
        stored.get("te_secret").is_none() && stored["te_secret_sealed"].is_string(),
        "{stored}"
    );
    let reader = engine(
        &svc.url,
        "sealed-reader",
        with_secret("shared-0b6e6a1c5d7f43e2"),
    )
    .unwrap();
    let local = Arc::new(HostBuffer::new(4096).unwrap());
    reader
        .register_buffer(&local, "*", Permission::LocalOnly)
        .unwrap();
    let seg = reader.open_segment(&tname).unwrap();
    let b = reader.allocate_batch(1).unwrap();
    let r = TransferRequest {
        opcode: Opcode::Read,
        source: local.addr(),
        target_id: seg,
        target_offset: obuf.addr(),
        length: 4096,
    };
    reader.submit(b, &[r]).unwrap();
    assert_eq!(
        reader.wait(b, Duration::from_secs(30)).unwrap().state,
        TransferState::Completed
    );
    assert_eq!(local.to_vec(0, 4096).unwrap(), vec![0x42; 4096]);
    let outsider = engine(&svc.url, "sealed-outsider", |_| {}).unwrap();
    let err = outsider.open_segment(&tname).unwrap_err();
    assert!(err.to_string().contains("MC_TE_CLUSTER_SECRET"), "{err}");
}
