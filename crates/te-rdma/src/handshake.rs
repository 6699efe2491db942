//! The endpoint handshake on the wire: Mooncake's `HandShakeDesc` fields plus te's queue-pair
//! data, secret and lane; decoding and checking a request before any secret comparison or
//! verbs call. Pure: the transport answers with it in `State::accept`.

use crate::verbs::QpInfo;

/// The handshake request and reply (Mooncake's `HandShakeDesc` fields plus te's).
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct Handshake {
    pub(crate) local_nic_path: String,
    pub(crate) peer_nic_path: String,
    #[serde(default)]
    pub(crate) qp_num: Vec<u32>,
    #[serde(default)]
    pub(crate) reply_msg: String,
    #[serde(default)]
    pub(crate) te_qps: Vec<QpInfo>,
    #[serde(default)]
    pub(crate) te_secret: Option<String>,
    /// te: which of the initiator's endpoints to the same remote device this is (its lane), so
    /// the target keeps one queue-pair group per initiator lane and a reconnect replaces only
    /// its own.
    #[serde(default)]
    pub(crate) te_lane: u32,
}

/// Queue pairs one handshake may ask for.
pub(crate) const MAX_QPS_PER_EP: usize = 64;

/// Decodes a handshake request from the wire (before any secret comparison or verbs call):
/// JSON of the expected shape and a well-formed secret.
pub(crate) fn parse_request(payload: &[u8]) -> Result<(Handshake, [u8; 16]), &'static str> {
    let req = serde_json::from_slice::<Handshake>(payload).map_err(|_| "malformed handshake")?;
    let secret = req
        .te_secret
        .as_deref()
        .and_then(unhex16)
        .ok_or("bad segment secret")?;
    Ok((req, secret))
}

/// What a handshake whose secret matched must hold: a device in the peer path and
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

    /// Fuzz target (`cargo xtask fuzz rdma-handshake --secs N`): the handshake decoder refuses
    /// garbage, never panics.
    #[test]
    fn rdma_handshake() {
        let seed = br#"{"local_nic_path":"a:1@rxe0","peer_nic_path":"b:2@rxe1","qp_num":[5],"te_qps":[{"qp_num":5,"psn":1,"gid":"0000:0000:0000:0000:0000:ffff:c612:0001","lid":0}],"te_secret":"000102030405060708090a0b0c0d0e0f","te_lane":1}"#;
        let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fuzz/regressions");
        assert!(parse_request(seed).is_ok_and(|(r, _)| check_shape(&r).is_ok()));
        te_core::fuzz::run(
            "rdma-handshake",
            &dir,
            &[seed],
            te_core::fuzz::budget(1.0),
            |b: &[u8]| {
                if let Ok((req, _)) = parse_request(b) {
                    if check_shape(&req).is_ok() {
                        assert!(!req.te_qps.is_empty() && req.te_qps.len() <= MAX_QPS_PER_EP);
                    }
                }
            },
        );
    }
}
