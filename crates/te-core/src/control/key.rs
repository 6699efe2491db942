//! The cluster key ([`ClusterKey`]): what every proof, seal and signature under a cluster secret
//! (`MC_TE_CLUSTER_SECRET`) is keyed with, and `keyed_mac`, the one MAC construction behind
//! them (segment secrets' proofs too).
//!
//! A listener an initiator is sent to may record one proof and try secrets against it offline,
//! so the secret must not be guessable and each guess must cost: a weak secret is refused at
//! start, and the key is stretched with PBKDF2 ([`te_reactor::secret::check_secret`],
//! [`te_reactor::secret::stretched_key`]).

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::error::{Error, Result};

pub(crate) type HmacSha256 = Hmac<Sha256>;

/// The key derived from a cluster secret.
#[derive(Clone)]
pub struct ClusterKey(pub(crate) [u8; 32]);

impl std::fmt::Debug for ClusterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClusterKey(<redacted>)")
    }
}

impl ClusterKey {
    /// The key for `secret`, after its strength is checked.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming `MC_TE_CLUSTER_SECRET` (its value never shown) for a
    /// secret too weak to be one.
    pub fn from_secret(secret: &str) -> Result<Self> {
        te_reactor::secret::check_secret(secret).map_err(|reason| Error::InvalidConfig {
            name: crate::settings::TE_CLUSTER_SECRET.name.into(),
            value: "<redacted>".into(),
            reason,
        })?;
        Ok(ClusterKey(te_reactor::secret::stretched_key(secret)))
    }

    pub(crate) fn mac(&self, parts: &[&[u8]]) -> HmacSha256 {
        keyed_mac(&self.0, parts)
    }

    pub(crate) fn proof(&self, parts: &[&[u8]]) -> Vec<u8> {
        self.mac(parts).finalize().into_bytes().to_vec()
    }

    pub(crate) fn verify(&self, parts: &[&[u8]], tag: &[u8]) -> bool {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_is_stretched_and_weak_secrets_are_named_never_shown() {
        let secret = "0b6e6a1c5d7f43e2a9";
        let a = ClusterKey::from_secret(secret).unwrap();
        assert_eq!(a.0, ClusterKey::from_secret(secret).unwrap().0);
        assert_eq!(a.0, te_reactor::secret::stretched_key(secret));
        assert_ne!(
            a.0,
            ClusterKey::from_secret("0b6e6a1c5d7f43e2a8").unwrap().0
        );
        let err = ClusterKey::from_secret("short").unwrap_err().to_string();
        assert!(
            err.contains("MC_TE_CLUSTER_SECRET") && !err.contains("short"),
            "named, never shown: {err}"
        );
    }
}
