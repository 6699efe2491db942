//! Where listeners bind: the address chosen from the configuration and this machine's
//! interfaces (its virtual NICs skipped). Binding (te-sys's `bind_in_range`) and serving are
//! te-core's and the transports'.

use std::net::IpAddr;

/// Chooses the address listeners bind to: the configured one (`MC_TCP_BIND_ADDRESS`), else the
/// host of the local server name when it is an address, else the first running, non-loopback
/// IPv4 address of an interface that is neither virtual (as sysfs says, `virtual_nics`) nor
/// named like a container bridge or veth, else 127.0.0.1.
pub fn choose_bind_ip(
    configured: Option<IpAddr>,
    name_host: Option<IpAddr>,
    interfaces: &[te_sys::InterfaceAddr],
    virtual_nics: &[&str],
) -> IpAddr {
    if let Some(ip) = configured.or(name_host) {
        return ip;
    }
    const VIRTUAL: [&str; 7] = ["docker", "br-", "virbr", "veth", "cni", "flannel", "lxcbr"];
    interfaces
        .iter()
        .filter(|a| a.running && !a.loopback && a.ip.is_ipv4())
        .filter(|a| !virtual_nics.contains(&a.name.as_str()))
        .find(|a| !VIRTUAL.iter().any(|p| a.name.starts_with(p)))
        .map(|a| a.ip)
        .unwrap_or(IpAddr::V4(std::net::Ipv4Addr::LOCALHOST))
}

/// [`choose_bind_ip`] over this machine's interfaces, skipping those `topology` calls virtual.
pub fn bind_ip_for(
    configured: Option<IpAddr>,
    name_host: Option<IpAddr>,
    topology: &crate::Topology,
    interfaces: &[te_sys::InterfaceAddr],
) -> IpAddr {
    let virtual_nics: Vec<&str> = topology
        .nics
        .iter()
        .filter(|n| n.is_virtual)
        .map(|n| n.name.as_str())
        .collect();
    choose_bind_ip(configured, name_host, interfaces, &virtual_nics)
}

#[cfg(test)]
mod tests {
    use super::*;
    use te_sys::InterfaceAddr;

    fn ifa(name: &str, ip: &str, running: bool, loopback: bool) -> InterfaceAddr {
        InterfaceAddr {
            name: name.into(),
            ip: ip.parse().unwrap(),
            up: running,
            running,
            loopback,
        }
    }

    #[test]
    fn bind_ip_skips_loopback_bridges_and_down_interfaces() {
        let list = [
            ifa("lo", "127.0.0.1", true, true),
            ifa("docker0", "172.17.0.1", true, false),
            ifa("eth1", "10.0.0.9", false, false),
            ifa("eth0", "fe80::1", true, false),
            ifa("eth0", "10.0.0.5", true, false),
        ];
        assert_eq!(
            choose_bind_ip(None, None, &list, &[]),
            "10.0.0.5".parse::<IpAddr>().unwrap()
        );
        let forced: IpAddr = "192.0.2.1".parse().unwrap();
        assert_eq!(
            choose_bind_ip(Some(forced), Some("127.0.0.1".parse().unwrap()), &list, &[]),
            forced
        );
        assert_eq!(
            choose_bind_ip(None, Some("127.0.0.1".parse().unwrap()), &list, &[]),
            "127.0.0.1".parse::<IpAddr>().unwrap()
        );
        assert_eq!(
            choose_bind_ip(None, None, &list[..3], &[]),
            "127.0.0.1".parse::<IpAddr>().unwrap()
        );
    }

    #[test]
    fn interfaces_sysfs_calls_virtual_are_skipped() {
        let list = [
            ifa("br0", "10.1.0.1", true, false),
            ifa("eth0", "10.0.0.5", true, false),
        ];
        assert_eq!(
            choose_bind_ip(None, None, &list, &["br0"]),
            "10.0.0.5".parse::<IpAddr>().unwrap()
        );
        assert_eq!(
            choose_bind_ip(None, None, &list, &[]),
            "10.1.0.1".parse::<IpAddr>().unwrap()
        );
    }
}
