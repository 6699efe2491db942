//! The endpoint handshake on the wire: Mooncake's `HandShakeDesc` fields plus te's queue-pair
//! data, proof and lane; decoding and checking a request before any proof check or verbs
//! call. Pure: the transport answers with it in `State::accept`.
//!
//! Two dialects share the JSON. te's carries `te_qps` (QP number, PSN, GID, LID each) and
//! `te_proof`, a keyed hash with the segment secret over everything the target acts on
//! ([`request_proof`]): the secret never travels, and a captured request can connect queue
//! pairs only to the QPs it names (the honest initiator's), never to its captor's. Mooncake's carries `qp_num`, one `local_gid` and `local_lid` for all its
//! QPs, no PSN (its QPs start at 0) and no credential; te answers it in kind (and speaks it to
//! Mooncake targets), with the NIC paths swapped and no `ready_ack`, which Mooncake reads as
//! "connected at once".

use te_core::segment::SegmentSecret;

use crate::verbs::QpInfo;

/// The handshake request and reply (Mooncake's `HandShakeDesc` fields plus te's).
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
pub(crate) struct Handshake {
    pub(crate) local_nic_path: String,
    pub(crate) peer_nic_path: String,
    #[serde(default)]
    pub(crate) qp_num: Vec<u32>,
    #[serde(default)]
    pub(crate) reply_msg: String,
    /// Mooncake: the sender's GID (16 × `xx`), for every QP of the request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) local_gid: Option<String>,
    /// Mooncake: the sender's port LID (0 on RoCE).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) local_lid: Option<u16>,
    /// Mooncake: opaque, empty for RDMA.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) payload: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) te_qps: Vec<QpInfo>,
    /// te: [`request_proof`] of the request, hex (replies carry none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) te_proof: Option<String>,
    /// te: which of the initiator's endpoints to the same remote device this is (its lane), so
    /// the target keeps one queue-pair group per initiator lane and a reconnect replaces only
    /// its own.
    #[serde(default)]
    pub(crate) te_lane: u32,
    /// te: the initiator's control listener (`ip:port`, the IP unspecified when it listens on
    /// every address), which the target dials to learn that the initiator is gone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) te_control: Option<String>,
}

/// Queue pairs one handshake may ask for.
pub(crate) const MAX_QPS_PER_EP: usize = 64;
/// Longest NIC path or GID text accepted.
const MAX_FIELD: usize = 1024;

/// A decoded request: te's, with its proof, or Mooncake's, with its peer's QPs (PSN 0).
#[derive(Debug)]
pub(crate) enum Request {
    Te(Handshake, [u8; 16]),
    Mooncake(Handshake, Vec<QpInfo>),
}

/// Decodes a handshake request from the wire (before any proof check or verbs call): JSON of
/// the expected shape and, for te's dialect, a well-formed proof; for Mooncake's (no
/// `te_proof`, no `te_qps`), 1..=`MAX_QPS_PER_EP` QP numbers and a GID.
pub(crate) fn parse_request(payload: &[u8]) -> Result<Request, &'static str> {
    let req = serde_json::from_slice::<Handshake>(payload).map_err(|_| "malformed handshake")?;
    if req.local_nic_path.len() > MAX_FIELD || req.peer_nic_path.len() > MAX_FIELD {
        return Err("NIC path too long");
    }
    if req.te_control.as_ref().is_some_and(|c| c.len() > MAX_FIELD) {
        return Err("control address too long");
    }
    if req.te_proof.is_none() && req.te_qps.is_empty() {
        let qps = mooncake_qps(&req)?;
        return Ok(Request::Mooncake(req, qps));
    }
    let proof = req
        .te_proof
        .as_deref()
        .and_then(unhex16)
        .ok_or("bad segment secret proof (or a te older than wire version 2)")?;
    Ok(Request::Te(req, proof))
}

/// The proof a te request carries: a keyed hash, with the segment secret, over every field the
/// target acts on (both NIC paths, the lane, the control address and each queue pair).
pub(crate) fn request_proof(secret: &SegmentSecret, h: &Handshake) -> [u8; 16] {
    let lane = h.te_lane.to_le_bytes();
    let qps: Vec<[u8; 10]> = h
        .te_qps
        .iter()
        .map(|q| {
            let mut b = [0u8; 10];
            b[..4].copy_from_slice(&q.qp_num.to_le_bytes());
            b[4..8].copy_from_slice(&q.psn.to_le_bytes());
            b[8..].copy_from_slice(&q.lid.to_le_bytes());
            b
        })
        .collect();
    let mut parts: Vec<&[u8]> = vec![
        b"te-rdma-connect-2",
        h.local_nic_path.as_bytes(),
        h.peer_nic_path.as_bytes(),
        &lane,
        h.te_control.as_deref().unwrap_or("").as_bytes(),
    ];
    for (q, fixed) in h.te_qps.iter().zip(&qps) {
        parts.push(fixed);
        parts.push(q.gid.as_bytes());
    }
    secret.prove(&parts)
}

/// The queue pairs a Mooncake handshake (request or reply) names: its `qp_num`s, each with the
/// one `local_gid` and `local_lid`, PSN 0.
pub(crate) fn mooncake_qps(h: &Handshake) -> Result<Vec<QpInfo>, &'static str> {
    if h.qp_num.is_empty() || h.qp_num.len() > MAX_QPS_PER_EP {
        return Err("handshake asks for no queue pair, or too many");
    }
    let gid = h
        .local_gid
        .as_deref()
        .filter(|g| g.len() <= MAX_FIELD && crate::verbs::parse_gid(g).is_some())
        .ok_or("handshake without a valid local_gid")?;
    Ok(h.qp_num
        .iter()
        .map(|&qp_num| QpInfo {
            qp_num,
            psn: 0,
            gid: gid.to_string(),
            lid: h.local_lid.unwrap_or(0),
        })
        .collect())
}

/// What a te handshake whose proof matched must hold: a device in the peer path and
/// 1..=`MAX_QPS_PER_EP` queue pairs.
pub(crate) fn check_shape(req: &Handshake) -> Result<(), &'static str> {
    if !req.peer_nic_path.contains('@') {
        return Err("handshake without a device");
    }
    if req.te_qps.is_empty() || req.te_qps.len() > MAX_QPS_PER_EP {
        return Err("handshake asks for no queue pair, or too many");
    }
    Ok(())
}

/// A handshake in Mooncake's dialect from `local` to `peer` for `qps` (this side's queue
/// pairs, which share one GID and LID): a request, or (paths swapped by the caller) a reply.
pub(crate) fn mooncake(local: String, peer: String, qps: &[QpInfo]) -> Handshake {
    Handshake {
        local_nic_path: local,
        peer_nic_path: peer,
        qp_num: qps.iter().map(|q| q.qp_num).collect(),
        local_gid: qps.first().map(|q| q.gid.clone()),
        local_lid: Some(qps.first().map_or(0, |q| q.lid)),
        payload: Some(String::new()),
        ..Handshake::default()
    }
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub(crate) fn unhex16(s: &str) -> Option<[u8; 16]> {
    let mut out = [0u8; 16];
    if s.len() != 32 || !s.is_ascii() {
        return None;
    }
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// As Mooncake 0.3.13 sends it (field for field; GID of 198.18.0.1 on RoCE v2).
    const MOONCAKE: &[u8] = br#"{"local_gid":"00:00:00:00:00:00:00:00:00:00:ff:ff:c6:12:00:01","local_lid":0,"local_nic_path":"198.18.0.1:15001@rxe0","payload":"","peer_nic_path":"198.18.1.1:16002@rxe1","qp_num":[17,18],"ready_ack":false,"reply_msg":""}
"#;

    #[test]
    fn mooncake_requests_are_read_and_answered_in_kind() {
        let Ok(Request::Mooncake(req, qps)) = parse_request(MOONCAKE) else {
            panic!("a Mooncake request")
        };
        assert_eq!(req.peer_nic_path, "198.18.1.1:16002@rxe1");
        assert_eq!(qps.len(), 2);
        assert!(qps.iter().all(|q| q.psn == 0 && q.lid == 0));
        assert_eq!(qps[1].qp_num, 18);
        let mine = [QpInfo {
            qp_num: 99,
            psn: 0,
            gid: "fe:80:00:00:00:00:00:00:00:00:00:00:00:00:00:01".into(),
            lid: 3,
        }];
        let reply = mooncake(req.peer_nic_path, req.local_nic_path, &mine);
        let json: serde_json::Value = serde_json::to_value(&reply).unwrap();
        assert_eq!(json["local_nic_path"], "198.18.1.1:16002@rxe1");
        assert_eq!(json["peer_nic_path"], "198.18.0.1:15001@rxe0");
        assert_eq!(json["qp_num"], serde_json::json!([99]));
        assert_eq!(json["local_lid"], 3);
        assert_eq!(json["reply_msg"], "");
        for absent in ["te_qps", "te_proof", "ready_ack"] {
            assert!(json.get(absent).is_none(), "{absent}");
        }
        // Refused: no GID, a bad one, no QPs, too many.
        for bad in [
            r#"{"local_nic_path":"a@x","peer_nic_path":"b@y","qp_num":[1]}"#.to_string(),
            r#"{"local_nic_path":"a@x","peer_nic_path":"b@y","qp_num":[1],"local_gid":"zz"}"#
                .to_string(),
            r#"{"local_nic_path":"a@x","peer_nic_path":"b@y","qp_num":[],"local_gid":"::"}"#
                .to_string(),
            format!(
                r#"{{"local_nic_path":"a@x","peer_nic_path":"b@y","qp_num":[{}1],"local_gid":"00:00:00:00:00:00:00:00:00:00:00:00:00:00:00:01"}}"#,
                "1,".repeat(64)
            ),
        ] {
            assert!(parse_request(bad.as_bytes()).is_err(), "{bad}");
        }
    }

    #[test]
    fn te_requests_carry_the_initiators_control_address_bounded() {
        let req = |control: &str| {
            format!(
                r#"{{"local_nic_path":"a:1@rxe0","peer_nic_path":"b:2@rxe1","te_qps":[{{"qp_num":5,"psn":1,"gid":"::1","lid":0}}],"te_proof":"000102030405060708090a0b0c0d0e0f","te_control":"{control}"}}"#
            )
        };
        let Ok(Request::Te(h, _)) = parse_request(req("198.18.0.1:16001").as_bytes()) else {
            panic!("a te request")
        };
        assert_eq!(h.te_control.as_deref(), Some("198.18.0.1:16001"));
        assert_eq!(
            parse_request(req(&"9".repeat(MAX_FIELD + 1)).as_bytes()).err(),
            Some("control address too long")
        );
        // Older te peers send none; replies carry none.
        let json = serde_json::to_value(Handshake::default()).unwrap();
        assert!(json.get("te_control").is_none());
    }

    /// The proof covers every field the target acts on: change any one, or the secret, and it
    /// no longer matches; the secret appears nowhere in the request.
    #[test]
    fn a_te_request_proves_the_secret_over_what_the_target_acts_on() {
        let secret = SegmentSecret::from_bytes(*b"0123456789abcdef");
        let qp = |qp_num| QpInfo {
            qp_num,
            psn: 7,
            gid: "00:00:00:00:00:00:00:00:00:00:ff:ff:c6:12:00:01".into(),
            lid: 0,
        };
        let base = Handshake {
            local_nic_path: "198.18.0.1:15001@rxe0".into(),
            peer_nic_path: "198.18.1.1:16002@rxe1".into(),
            te_qps: vec![qp(5), qp(6)],
            te_lane: 1,
            te_control: Some("198.18.0.1:15001".into()),
            ..Handshake::default()
        };
        let mut signed = Handshake {
            te_proof: Some(hex(&request_proof(&secret, &base))),
            ..base
        };
        let wire = serde_json::to_vec(&signed).unwrap();
        assert!(!wire.windows(16).any(|w| w == secret.to_bytes()));
        assert!(!String::from_utf8_lossy(&wire).contains(&hex(&secret.to_bytes())));
        let Ok(Request::Te(req, proof)) = parse_request(&wire) else {
            panic!("a te request")
        };
        assert_eq!(request_proof(&secret, &req), proof);
        let other = SegmentSecret::from_bytes([1; 16]);
        assert_ne!(request_proof(&other, &req), proof, "another secret");
        type Change = fn(&mut Handshake);
        let changes: [(&str, Change); 7] = [
            ("local path", |h| h.local_nic_path.push('x')),
            ("peer path", |h| {
                h.peer_nic_path = "198.18.1.1:16002@rxe2".into()
            }),
            ("lane", |h| h.te_lane = 2),
            ("control", |h| h.te_control = Some("198.18.9.9:1".into())),
            ("qp number", |h| h.te_qps[1].qp_num = 66),
            ("gid", |h| h.te_qps[0].gid = "::2".into()),
            ("one qp fewer", |h| {
                h.te_qps.pop();
            }),
        ];
        for (what, change) in changes {
            let mut h = serde_json::from_slice::<Handshake>(&wire).unwrap();
            change(&mut h);
            assert_ne!(request_proof(&secret, &h), proof, "{what}");
        }
        // A te request without a proof (an older te sent the secret itself) is refused.
        signed.te_proof = None;
        let old = serde_json::to_string(&signed).unwrap().replacen(
            '{',
            r#"{"te_secret":"30313233343536373839616263646566","#,
            1,
        );
        assert!(parse_request(old.as_bytes()).is_err());
    }

    /// Fuzz target (`cargo xtask fuzz rdma-handshake --secs N`): the handshake decoder refuses
    /// garbage, never panics, and what it accepts is bounded.
    #[test]
    fn rdma_handshake() {
        let seed = br#"{"local_nic_path":"a:1@rxe0","peer_nic_path":"b:2@rxe1","qp_num":[5],"te_qps":[{"qp_num":5,"psn":1,"gid":"0000:0000:0000:0000:0000:ffff:c612:0001","lid":0}],"te_proof":"000102030405060708090a0b0c0d0e0f","te_lane":1}"#;
        assert!(matches!(parse_request(seed), Ok(Request::Te(r, _)) if check_shape(&r).is_ok()));
        te_testkit::fuzz::run(
            "rdma-handshake",
            env!("CARGO_MANIFEST_DIR"),
            &[seed, MOONCAKE],
            te_testkit::fuzz::budget(1.0),
            |b: &[u8]| match parse_request(b) {
                Ok(Request::Te(req, _)) => {
                    if check_shape(&req).is_ok() {
                        assert!(!req.te_qps.is_empty() && req.te_qps.len() <= MAX_QPS_PER_EP);
                    }
                }
                Ok(Request::Mooncake(req, qps)) => {
                    assert_eq!(qps.len(), req.qp_num.len());
                    assert!(!qps.is_empty() && qps.len() <= MAX_QPS_PER_EP);
                }
                Err(_) => {}
            },
        );
    }
}
