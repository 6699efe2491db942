//! Which GID a device's queue pairs use: the one whose network interface is the rail's and
//! whose address is the rail's address. RoCE lists a GID per address of each interface on the
//! port (and per RoCE version); the first one is often IPv6 link-local, which routes nowhere
//! beyond the link. The order, best first:
//!
//! 1. the address of a local rail on the GID's own interface (or the engine's bind address);
//! 2. the interface of a local rail;
//! 3. the address family the rail (or the bind address) has, IPv4 when nothing says;
//! 4. a routable address before a link-local one (`fe80::/10`);
//! 5. RoCE v2 before v1 and InfiniBand;
//! 6. the lower index.
//!
//! `MC_GID_INDEX` (TENT's `gid_index`) names one and overrides all of it. Pure: the table is
//! read by `verbs.rs`.

use std::net::{IpAddr, Ipv6Addr};

/// One entry of a port's GID table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    /// Its index in the table.
    pub index: u32,
    /// The GID (for RoCE, an IPv6 address or an IPv4-mapped one).
    pub gid: Ipv6Addr,
    /// RoCE v2 (UDP-encapsulated, routable).
    pub roce_v2: bool,
    /// The network interface it belongs to (RoCE), if any.
    pub netdev: Option<String>,
}

/// What the engine knows of where this device should be reached.
#[derive(Clone, Debug, Default)]
pub struct Want<'a> {
    /// The device's name (a rail may be named by it rather than by its interface).
    pub device: &'a str,
    /// `MC_GID_INDEX`: this index, or an error.
    pub asked: Option<u32>,
    /// The local rails: interface name and address.
    pub rails: &'a [(String, IpAddr)],
    /// The address the engine binds to, when it is a specific one.
    pub bind: Option<IpAddr>,
}

/// The chosen GID and why, for the log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Choice {
    /// Its index.
    pub index: u32,
    /// The GID.
    pub gid: Ipv6Addr,
    /// Why this one, in words.
    pub why: String,
}

/// The GID's address as the network sees it: IPv4 for an IPv4-mapped GID.
fn address(gid: &Ipv6Addr) -> IpAddr {
    match gid.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(*gid),
    }
}

fn link_local(ip: &IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_link_local(),
        IpAddr::V6(v6) => (v6.segments()[0] & 0xffc0) == 0xfe80,
    }
}

/// Chooses among `table` (zero GIDs are skipped) as `want` says.
///
/// # Errors
/// No usable GID, or `want.asked` names none.
pub fn choose(table: &[Candidate], want: &Want<'_>) -> Result<Choice, String> {
    let usable = table.iter().filter(|c| !c.gid.is_unspecified());
    if let Some(asked) = want.asked {
        let c = usable
            .clone()
            .find(|c| c.index == asked)
            .ok_or_else(|| format!("MC_GID_INDEX={asked} names no GID on this port"))?;
        return Ok(Choice {
            index: c.index,
            gid: c.gid,
            why: "MC_GID_INDEX names it".into(),
        });
    }
    let best = usable
        .max_by_key(|c| {
            let rank = rank(c, want);
            (rank, std::cmp::Reverse(c.index))
        })
        .ok_or("no usable GID on this port")?;
    Ok(Choice {
        index: best.index,
        gid: best.gid,
        why: reason(best, want),
    })
}

/// The rail `c` belongs to, if any: the rail named by its interface, else a rail named by the
/// device.
fn rail_of<'a>(c: &Candidate, want: &'a Want<'_>) -> Option<&'a (String, IpAddr)> {
    let netdev = c.netdev.as_deref();
    want.rails
        .iter()
        .find(|(name, _)| Some(name.as_str()) == netdev)
        .or_else(|| {
            want.rails
                .iter()
                .find(|(name, _)| !want.device.is_empty() && name == want.device)
        })
}

/// The family wanted for `c`: its rail's, else the bind address's, else IPv4.
fn wants_v6(c: &Candidate, want: &Want<'_>) -> bool {
    rail_of(c, want)
        .map(|(_, ip)| *ip)
        .or(want.bind)
        .is_some_and(|ip| ip.is_ipv6())
}

fn rank(c: &Candidate, want: &Want<'_>) -> (bool, bool, bool, bool, bool) {
    let addr = address(&c.gid);
    let rail = rail_of(c, want);
    let own_address = rail.is_some_and(|(_, ip)| *ip == addr) || want.bind == Some(addr);
    (
        own_address,
        rail.is_some(),
        addr.is_ipv6() == wants_v6(c, want),
        !link_local(&addr),
        c.roce_v2,
    )
}

fn reason(c: &Candidate, want: &Want<'_>) -> String {
    let (own, on_rail, family, routable, v2) = rank(c, want);
    let mut why = Vec::new();
    if own {
        why.push("the rail's own address".to_string());
    } else if on_rail {
        why.push("on the rail's interface".to_string());
    }
    let addr = address(&c.gid);
    why.push(match (addr.is_ipv6(), family) {
        (true, true) => "IPv6 as the rail".into(),
        (false, true) => "IPv4 as the rail".into(),
        (true, false) => "IPv6 (no IPv4 GID)".into(),
        (false, false) => "IPv4 (no IPv6 GID)".into(),
    });
    why.push(
        if routable {
            "routable"
        } else {
            "link-local only: nothing routable on this port"
        }
        .into(),
    );
    why.push(if v2 { "RoCE v2" } else { "no RoCE v2 GID" }.into());
    why.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(index: u32, gid: &str, roce_v2: bool, netdev: &str) -> Candidate {
        Candidate {
            index,
            gid: gid.parse().unwrap(),
            roce_v2,
            netdev: Some(netdev.into()),
        }
    }

    /// The choice for `table` knowing only the rails.
    fn on_rails(table: &[Candidate], rails: &[(String, IpAddr)]) -> Result<Choice, String> {
        choose(
            table,
            &Want {
                rails,
                ..Want::default()
            },
        )
    }

    fn rails(list: &[(&str, &str)]) -> Vec<(String, IpAddr)> {
        list.iter()
            .map(|(n, ip)| (n.to_string(), ip.parse().unwrap()))
            .collect()
    }

    /// A NIC with only IPv6 addresses lists link-local first: the routable one is chosen.
    #[test]
    fn an_ipv6_only_nic_gets_its_routable_gid_not_link_local() {
        let table = [
            c(0, "fe80::5054:ff:fe12:3456", false, "eth1"),
            c(1, "fe80::5054:ff:fe12:3456", true, "eth1"),
            c(2, "fd00:1::2", false, "eth1"),
            c(3, "fd00:1::2", true, "eth1"),
        ];
        let r = rails(&[("eth1", "fd00:1::2")]);
        let got = on_rails(&table, &r).unwrap();
        assert_eq!(got.index, 3, "{}", got.why);
        assert!(got.why.contains("rail's own address"), "{}", got.why);
        // Nothing known of the rail: still routable over link-local.
        assert_eq!(choose(&table, &Want::default()).unwrap().index, 3);
    }

    #[test]
    fn the_rails_family_and_address_decide_on_a_mixed_nic() {
        let table = [
            c(0, "fe80::1", true, "eth0"),
            c(1, "::ffff:10.0.0.5", true, "eth0"),
            c(2, "2001:db8::5", true, "eth0"),
            c(3, "::ffff:10.0.0.6", true, "eth0"),
        ];
        let v4 = rails(&[("eth0", "10.0.0.6")]);
        assert_eq!(on_rails(&table, &v4).unwrap().index, 3);
        let v6 = rails(&[("eth0", "2001:db8::5")]);
        assert_eq!(on_rails(&table, &v6).unwrap().index, 2);
        // No rail: IPv4 first, the lower index among equals.
        assert_eq!(choose(&table, &Want::default()).unwrap().index, 1);
        // An IPv6 bind address with no rail on this interface.
        let bind = Want {
            bind: Some("2001:db8::9".parse().unwrap()),
            ..Want::default()
        };
        assert_eq!(choose(&table, &bind).unwrap().index, 2);
    }

    #[test]
    fn the_rails_interface_wins_over_another_interface_on_the_port() {
        let table = [
            c(0, "::ffff:192.168.5.1", true, "eth0.100"),
            c(1, "::ffff:10.1.0.1", true, "eth0"),
        ];
        let r = rails(&[("eth0", "10.1.0.9")]);
        let got = on_rails(&table, &r).unwrap();
        assert_eq!(got.index, 1);
        assert!(got.why.contains("rail's interface"), "{}", got.why);
    }

    #[test]
    fn a_rail_named_by_the_device_brings_its_address() {
        let table = [
            c(0, "::ffff:10.0.0.1", true, "eth0"),
            c(1, "fd00::7", true, "eth0"),
        ];
        let r = rails(&[("rxe0", "fd00::7")]);
        let want = Want {
            device: "rxe0",
            rails: &r,
            ..Want::default()
        };
        assert_eq!(choose(&table, &want).unwrap().index, 1);
    }

    #[test]
    fn roce_v2_before_v1_and_link_local_only_when_alone() {
        let table = [
            c(0, "::ffff:10.0.0.1", false, "eth0"),
            c(1, "::ffff:10.0.0.1", true, "eth0"),
        ];
        assert_eq!(choose(&table, &Want::default()).unwrap().index, 1);
        let only = [
            c(0, "fe80::1", false, "eth0"),
            c(1, "fe80::1", true, "eth0"),
        ];
        let got = choose(&only, &Want::default()).unwrap();
        assert_eq!(got.index, 1);
        assert!(got.why.contains("link-local only"), "{}", got.why);
    }

    #[test]
    fn mc_gid_index_overrides_and_zero_gids_are_never_chosen() {
        let table = [
            c(0, "::", true, "eth0"),
            c(1, "fe80::1", false, "eth0"),
            c(2, "::ffff:10.0.0.1", true, "eth0"),
        ];
        let asked = |i| Want {
            asked: Some(i),
            ..Want::default()
        };
        assert_eq!(choose(&table, &asked(1)).unwrap().index, 1);
        assert!(
            choose(&table, &asked(0))
                .unwrap_err()
                .contains("MC_GID_INDEX=0")
        );
        assert!(choose(&table, &asked(7)).is_err());
        assert!(choose(&table[..1], &Want::default()).is_err());
        let ib = [Candidate {
            index: 0,
            gid: "fe80::2:c903:a:1234".parse().unwrap(),
            roce_v2: false,
            netdev: None,
        }];
        assert_eq!(
            choose(&ib, &Want::default()).unwrap().index,
            0,
            "InfiniBand's port GID"
        );
    }
}
