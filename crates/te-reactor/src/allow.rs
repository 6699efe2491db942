//! Network allow-lists: which peer addresses a server admits (`10.0.0.0/8, ::1`), checked on
//! the address of a connection before anything it sends is read. Pure parsing and matching.

use std::net::IpAddr;

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
}
