//! Serving Mooncake engines: the opt-in that lets a Mooncake initiator, which carries no
//! credential, reach a te engine's memory, and the network allow-list that bounds who may.
//!
//! - [`MooncakeCompat`]: the `MC_TE_MOONCAKE_*` settings. Off by default: without
//!   `MC_TE_MOONCAKE_COMPAT=1`, te's own secret-checked listeners are all there is.
//! - [`AllowList`]: `MC_TE_MOONCAKE_ALLOW=CIDR,...`, checked on the peer address of every
//!   connection that arrives without te's credential.
//!
//! Pure parsing and decisions; the listeners that apply them are te-tcp's (data) and
//! [`crate::control`]'s (descriptors, notifications, probes).

use std::net::IpAddr;

use crate::error::{Error, Result};

/// One network, `addr/prefix` (a bare address is a /32 or /128).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Network {
    addr: IpAddr,
    prefix: u8,
}

impl Network {
    /// Parses `10.0.0.0/8`, `::1/128`, `127.0.0.1`.
    ///
    /// # Errors
    /// A message saying what is wrong with `s`.
    pub fn parse(s: &str) -> std::result::Result<Self, String> {
        let s = s.trim();
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let addr: IpAddr = addr
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse()
            .map_err(|_| format!("{s:?} is not an address or CIDR network"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) => p
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= max)
                .ok_or_else(|| format!("{s:?}: prefix must be 0..={max}"))?,
        };
        // Peers' IPv4-mapped addresses are compared as IPv4 ([`contains`]): so is such a
        // network, or it would never match.
        if let IpAddr::V6(v6) = addr {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return match prefix.checked_sub(96) {
                    Some(p4) => Ok(Network {
                        addr: IpAddr::V4(v4),
                        prefix: p4,
                    }),
                    None => Err(format!(
                        "{s:?}: an IPv4-mapped network needs a prefix of 96 or more (or write it as IPv4)"
                    )),
                };
            }
        }
        Ok(Network { addr, prefix })
    }

    /// Whether `ip` lies in this network. An IPv4-mapped IPv6 address (`::ffff:a.b.c.d`, as a
    /// dual-stack listener reports IPv4 peers) is compared as its IPv4 address.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        let bits = |a: u128, width: u32| {
            let shift = width - u32::from(self.prefix);
            if shift >= 128 { 0 } else { a >> shift }
        };
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                bits(u128::from(u32::from(net)), 32) == bits(u128::from(u32::from(ip)), 32)
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                bits(u128::from(net), 128) == bits(u128::from(ip), 128)
            }
            _ => false,
        }
    }
}

impl std::fmt::Display for Network {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

impl std::fmt::Display for AllowList {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let nets: Vec<String> = self.0.iter().map(Network::to_string).collect();
        f.write_str(&nets.join(","))
    }
}

/// The networks Mooncake peers may connect from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AllowList(Vec<Network>);

impl AllowList {
    /// Parses a comma-separated list of networks.
    ///
    /// # Errors
    /// A message naming the first bad entry, or an empty list.
    pub fn parse(s: &str) -> std::result::Result<Self, String> {
        let nets = s
            .split(',')
            .filter(|e| !e.trim().is_empty())
            .map(Network::parse)
            .collect::<std::result::Result<Vec<_>, _>>()?;
        if nets.is_empty() {
            return Err("lists no network".into());
        }
        Ok(AllowList(nets))
    }

    /// Whether `ip` is in one of the networks.
    pub fn admits(&self, ip: IpAddr) -> bool {
        self.0.iter().any(|n| n.contains(ip))
    }
}

/// The `MC_TE_MOONCAKE_*` settings.
#[derive(Clone, Debug, PartialEq, Eq)]
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
    /// Event-loop threads serving Mooncake connections (`MC_TE_MOONCAKE_THREADS`, 1–64;
    /// default 2), however many connections there are.
    pub threads: usize,
    /// Spread the connections of peers on this host (a loopback address, or this host's own)
    /// moving large WRITEs over the loops too (`MC_TE_MOONCAKE_SPREAD_LOCAL_WRITES=1`). Off by
    /// default: such a peer's sending side does its TCP work on this host's cores, and a second
    /// loop waking for each piece of a WRITE takes cores from it (Mooncake's 1 MiB WRITEs to te
    /// over loopback, 2 cores: 1.50 GB/s spread against 1.73 gathered, 1.73 to Mooncake's own
    /// target). A peer on another host has its WRITEs spread whatever this says.
    pub spread_local_writes: bool,
    /// Serve WRITEs from peers on this host with the loop thread in `SCHED_BATCH`
    /// (`MC_TE_MOONCAKE_BATCH_LOCAL_WRITES`; on by default, `0` turns it off): such a peer
    /// copies each body into its socket on this host's cores, and a loop that preempts it at
    /// every arrival takes turns with it request by request. Threads the operator put under
    /// another policy are left alone (Mooncake's 64 KiB WRITEs to te over loopback, 2 cores:
    /// 1.21 GB/s against 1.06 with it off).
    pub batch_local_writes: bool,
}

impl Default for MooncakeCompat {
    fn default() -> Self {
        MooncakeCompat {
            enabled: false,
            allow: None,
            allow_v1: false,
            with_cluster_secret: false,
            threads: 2,
            spread_local_writes: false,
            batch_local_writes: true,
        }
    }
}

impl MooncakeCompat {
    /// Reads the settings through `get` (which yields trimmed, non-empty values).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the variable.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let flag = |name: &str| -> Result<bool> {
            get(name).map_or(Ok(false), |v| crate::config::parse_bool(name, &v))
        };
        let allow = match get("MC_TE_MOONCAKE_ALLOW") {
            None => None,
            Some(v) => Some(AllowList::parse(&v).map_err(|reason| Error::InvalidConfig {
                name: "MC_TE_MOONCAKE_ALLOW".into(),
                value: v.clone(),
                reason,
            })?),
        };
        let threads = match get("MC_TE_MOONCAKE_THREADS") {
            None => MooncakeCompat::default().threads,
            Some(v) => v
                .trim()
                .parse::<usize>()
                .ok()
                .filter(|n| (1..=64).contains(n))
                .ok_or_else(|| Error::InvalidConfig {
                    name: "MC_TE_MOONCAKE_THREADS".into(),
                    value: v.clone(),
                    reason: "must be between 1 and 64".into(),
                })?,
        };
        Ok(MooncakeCompat {
            enabled: flag("MC_TE_MOONCAKE_COMPAT")?,
            allow,
            allow_v1: flag("MC_TE_MOONCAKE_ALLOW_V1")?,
            with_cluster_secret: flag("MC_TE_MOONCAKE_WITH_CLUSTER_SECRET")?,
            threads,
            spread_local_writes: flag("MC_TE_MOONCAKE_SPREAD_LOCAL_WRITES")?,
            batch_local_writes: get("MC_TE_MOONCAKE_BATCH_LOCAL_WRITES").map_or(Ok(true), |v| {
                crate::config::parse_bool("MC_TE_MOONCAKE_BATCH_LOCAL_WRITES", &v)
            })?,
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
                name: "MC_TE_MOONCAKE_COMPAT".into(),
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
    fn networks_contain_what_their_prefix_says() {
        let lan = Network::parse("198.18.0.0/15").unwrap();
        assert!(lan.contains(ip("198.18.3.4")) && lan.contains(ip("198.19.255.255")));
        assert!(!lan.contains(ip("198.20.0.1")) && !lan.contains(ip("::1")));
        let one = Network::parse("127.0.0.1").unwrap();
        assert!(one.contains(ip("127.0.0.1")) && !one.contains(ip("127.0.0.2")));
        assert!(one.contains(ip("::ffff:127.0.0.1")), "IPv4-mapped peers");
        let any = Network::parse("0.0.0.0/0").unwrap();
        assert!(any.contains(ip("8.8.8.8")));
        let v6 = Network::parse("[fd00::]/8").unwrap();
        assert!(v6.contains(ip("fd12::1")) && !v6.contains(ip("fe80::1")));
        assert!(Network::parse("::/0").unwrap().contains(ip("::1")));
        for bad in ["10.0.0.0/33", "::/129", "10.0.0/8", "x", "10.0.0.0/-1", ""] {
            assert!(Network::parse(bad).is_err(), "{bad}");
        }
        // An IPv4-mapped entry is read as the IPv4 network it names, so it matches.
        let mapped = Network::parse("::ffff:127.0.0.0/104").unwrap();
        assert_eq!(mapped.to_string(), "127.0.0.0/8");
        assert!(mapped.contains(ip("127.1.2.3")) && mapped.contains(ip("::ffff:127.9.9.9")));
        assert!(!mapped.contains(ip("10.0.0.1")));
        let host = Network::parse("[::ffff:10.1.2.3]").unwrap();
        assert!(host.contains(ip("10.1.2.3")) && !host.contains(ip("10.1.2.4")));
        let err = Network::parse("::ffff:0.0.0.0/80").unwrap_err();
        assert!(err.contains("96"), "{err}");
    }

    #[test]
    fn settings_parse_and_refuse_a_silent_downgrade() {
        let table = |pairs: &'static [(&str, &str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        let off = MooncakeCompat::from_lookup(table(&[])).unwrap();
        assert!(!off.enabled && !off.admits(ip("127.0.0.1")));
        assert!(!off.spread_local_writes, "local WRITEs gathered by default");
        assert!(
            off.batch_local_writes,
            "local WRITEs served in batch by default"
        );
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
        let spread =
            MooncakeCompat::from_lookup(table(&[("MC_TE_MOONCAKE_SPREAD_LOCAL_WRITES", "1")]))
                .unwrap();
        assert!(spread.spread_local_writes);
        let unbatched =
            MooncakeCompat::from_lookup(table(&[("MC_TE_MOONCAKE_BATCH_LOCAL_WRITES", "0")]))
                .unwrap();
        assert!(!unbatched.batch_local_writes);
        assert!(
            both.admits(ip("10.1.2.3")),
            "no allow-list admits any address"
        );
        for (name, value) in [
            ("MC_TE_MOONCAKE_ALLOW", "10.0.0.0/40"),
            ("MC_TE_MOONCAKE_ALLOW", ","),
            ("MC_TE_MOONCAKE_COMPAT", "maybe"),
            ("MC_TE_MOONCAKE_THREADS", "0"),
            ("MC_TE_MOONCAKE_THREADS", "many"),
            ("MC_TE_MOONCAKE_SPREAD_LOCAL_WRITES", "sometimes"),
            ("MC_TE_MOONCAKE_BATCH_LOCAL_WRITES", "often"),
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
