//! Serving Mooncake engines: the opt-in that lets a Mooncake initiator, which carries no
//! credential, reach a te engine's memory, and the network allow-list that bounds who may.
//!
//! - [`MooncakeCompat`]: the `MC_TE_MOONCAKE_*` settings. Off by default: without
//!   `MC_TE_MOONCAKE_COMPAT=1`, te's own secret-checked listeners are all there is.
//! - [`AllowList`] (te-reactor's): `MC_TE_MOONCAKE_ALLOW=CIDR,...`, checked on the peer address
//!   of every connection that arrives without te's credential.
//!
//! Pure parsing and decisions; the listeners that apply them are te-tcp's (data) and
//! [`crate::control`]'s (descriptors, notifications, probes).

use std::net::IpAddr;

pub use te_reactor::allow::{AllowList, Network};

use crate::error::{Error, Result};

/// te-core's `MC_TE_MOONCAKE_*` settings (te-tcp reads its listener's own).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct MooncakeCompat {
    /// Serve Mooncake initiators (`MC_TE_MOONCAKE_COMPAT=1`): a separate TCP listener in
    /// Mooncake's framing, published as `tcp_data_port`, with te's bounds, permission and pin
    /// checks but no credential.
    pub enabled: bool,
    /// Who may use it (`MC_TE_MOONCAKE_ALLOW`); `None` admits any address that reaches it.
    pub allow: Option<AllowList>,
    /// Accept Mooncake's unacknowledged framing too (`MC_TE_MOONCAKE_ALLOW_V1=1`): its WRITEs
    /// are applied but a refusal can only show as a closed connection, which a Mooncake
    /// initiator may miss.
    pub allow_v1: bool,
    /// The second switch needed with a cluster secret (`MC_TE_MOONCAKE_WITH_CLUSTER_SECRET=1`):
    /// Mooncake peers cannot prove the secret, so the opt-in opens a door the secret closes.
    pub with_cluster_secret: bool,
}

impl MooncakeCompat {
    /// Reads the settings through `get` (which yields trimmed, non-empty values).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the variable.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let flag = |name: &str| -> Result<bool> {
            get(name).map_or(Ok(false), |v| Ok(te_sys::env::flag(name, &v)?))
        };
        let allow = match get(crate::settings::TE_MOONCAKE_ALLOW.name) {
            None => None,
            Some(v) => Some(AllowList::parse(&v).map_err(|reason| Error::InvalidConfig {
                name: crate::settings::TE_MOONCAKE_ALLOW.name.into(),
                value: v.clone(),
                reason,
            })?),
        };
        Ok(MooncakeCompat {
            enabled: flag(crate::settings::TE_MOONCAKE_COMPAT.name)?,
            allow,
            allow_v1: flag(crate::settings::TE_MOONCAKE_ALLOW_V1.name)?,
            with_cluster_secret: flag(crate::settings::TE_MOONCAKE_WITH_CLUSTER_SECRET.name)?,
        })
    }

    /// Whether a peer at `ip`, which did not prove te's credential, may be served.
    pub fn admits(&self, ip: IpAddr) -> bool {
        self.enabled && self.allow.as_ref().is_none_or(|a| a.admits(ip))
    }

    /// Checks the settings against the cluster secret.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] when the opt-in is on with a cluster secret but without its
    /// second switch.
    pub fn check(&self, cluster_secret: bool) -> Result<()> {
        if self.enabled && cluster_secret && !self.with_cluster_secret {
            return Err(Error::InvalidConfig {
                name: crate::settings::TE_MOONCAKE_COMPAT.name.into(),
                value: "1".into(),
                reason: "a cluster secret is set (MC_TE_CLUSTER_SECRET) and Mooncake peers \
                         cannot prove it; set MC_TE_MOONCAKE_WITH_CLUSTER_SECRET=1 as well to \
                         serve them anyway"
                    .into(),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn settings_parse_and_refuse_a_silent_downgrade() {
        use te_sys::env::table;
        let off = MooncakeCompat::from_lookup(table(&[])).unwrap();
        assert!(!off.enabled && !off.admits(ip("127.0.0.1")));
        off.check(true).unwrap();
        let on = MooncakeCompat::from_lookup(table(&[
            ("MC_TE_MOONCAKE_COMPAT", "1"),
            ("MC_TE_MOONCAKE_ALLOW", "127.0.0.0/8, 198.18.0.0/15"),
        ]))
        .unwrap();
        assert!(on.admits(ip("127.0.0.1")) && on.admits(ip("198.18.0.2")));
        assert_eq!(
            on.allow.as_ref().unwrap().to_string(),
            "127.0.0.0/8,198.18.0.0/15"
        );
        assert!(!on.admits(ip("10.0.0.1")));
        on.check(false).unwrap();
        assert!(matches!(
            on.check(true),
            Err(Error::InvalidConfig { name, .. }) if name == "MC_TE_MOONCAKE_COMPAT"
        ));
        let both = MooncakeCompat::from_lookup(table(&[
            ("MC_TE_MOONCAKE_COMPAT", "true"),
            ("MC_TE_MOONCAKE_WITH_CLUSTER_SECRET", "1"),
        ]))
        .unwrap();
        both.check(true).unwrap();
        assert!(
            both.admits(ip("10.1.2.3")),
            "no allow-list admits any address"
        );
        for (name, value) in [
            ("MC_TE_MOONCAKE_ALLOW", "10.0.0.0/40"),
            ("MC_TE_MOONCAKE_ALLOW", ","),
            ("MC_TE_MOONCAKE_COMPAT", "maybe"),
        ] {
            let err = MooncakeCompat::from_lookup(|k: &str| (k == name).then(|| value.to_string()))
                .unwrap_err();
            assert!(
                matches!(&err, Error::InvalidConfig { name: n, .. } if n == name),
                "{err:?}"
            );
        }
    }
}
