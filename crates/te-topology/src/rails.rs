//! Which local NICs serve as rails, and the local priority matrix over them: a pure function of
//! the choice the configuration makes ([`RailChoice`]), the discovered topology and the
//! interfaces' addresses.
//!
//! Rails are, in order of precedence: the NICs named as rails (te-bench's `--device_name`); the
//! interfaces the allow-list names; the single interface of the bind address; the loopback
//! interface alone for an engine named by a loopback address (its peers are on this host, and
//! its traffic stays off the external interfaces); every physical interface the filters admit;
//! and, when none has an address, the bind address alone. A rail needs an IPv4 address on an
//! interface that is up.

use std::net::IpAddr;

use te_sys::InterfaceAddr;

use crate::{NicFilter, NicKind, PriorityMatrix, Topology};

/// One local rail: a NIC and its address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rail {
    /// NIC name (`eth0`, or `default`).
    pub name: String,
    /// Its address.
    pub ip: IpAddr,
}

/// What the configuration says about rails.
#[derive(Clone, Debug)]
pub struct RailChoice<'a> {
    /// NICs named as rails (`--device_name`), all preferred everywhere.
    pub named: Option<&'a [String]>,
    /// The NIC allow- and deny-lists (`MC_TE_FILTERS`, ...).
    pub filter: &'a NicFilter,
    /// A bind address was given (`MC_TCP_BIND_ADDRESS`): its interface alone.
    pub bind_address_given: bool,
    /// A topology file (`MC_CUSTOM_TOPO_JSON`) holding the matrix.
    pub custom_matrix: Option<&'a str>,
}

/// No filter: every NIC admitted.
static ADMIT_ALL: NicFilter = NicFilter {
    allow: None,
    deny: Vec::new(),
};

impl Default for RailChoice<'_> {
    fn default() -> Self {
        RailChoice {
            named: None,
            filter: &ADMIT_ALL,
            bind_address_given: false,
            custom_matrix: None,
        }
    }
}

/// Why no rails could be planned.
#[derive(Debug, thiserror::Error)]
pub enum RailError {
    /// A NIC named explicitly has no running IPv4 address.
    #[error("NIC {0:?} has no running IPv4 address to serve as a rail")]
    NoAddress(String),
    /// The topology file cannot be loaded.
    #[error("{path}: {reason}")]
    Matrix {
        /// The file.
        path: String,
        /// Why.
        reason: String,
    },
}

/// The IPv4 address of interface `name`. The interface must be up; carrier may still be coming
/// (a veth whose peer was just brought up), so `IFF_RUNNING` is not required.
fn address_of(name: &str, interfaces: &[InterfaceAddr]) -> Option<IpAddr> {
    interfaces
        .iter()
        .find(|a| a.name == name && a.up && a.ip.is_ipv4())
        .map(|a| a.ip)
}

/// The local rails and the matrix over them.
///
/// # Errors
/// [`RailError::NoAddress`] when a NIC named explicitly has no running IPv4 address;
/// [`RailError::Matrix`] when the topology file cannot be loaded.
pub fn plan(
    choice: &RailChoice<'_>,
    bind_ip: IpAddr,
    topology: &Topology,
    interfaces: &[InterfaceAddr],
) -> Result<(Vec<Rail>, PriorityMatrix), RailError> {
    let named = choice.named.or(choice.filter.allow.as_deref());
    let rails: Vec<Rail> = match named {
        Some(names) => names
            .iter()
            .filter(|n| !choice.filter.deny.contains(n))
            .map(|n| {
                address_of(n, interfaces)
                    .map(|ip| Rail {
                        name: n.clone(),
                        ip,
                    })
                    .ok_or_else(|| RailError::NoAddress(n.clone()))
            })
            .collect::<Result<_, _>>()?,
        None if choice.bind_address_given || bind_ip.is_loopback() => Vec::new(),
        None => topology
            .nics_of(NicKind::Ethernet)
            .filter(|n| choice.filter.admits(&n.name, n.is_virtual))
            .filter_map(|n| {
                address_of(&n.name, interfaces).map(|ip| Rail {
                    name: n.name.clone(),
                    ip,
                })
            })
            .collect(),
    };
    let rails = if rails.is_empty() {
        let name = interfaces
            .iter()
            .find(|a| a.ip == bind_ip)
            .map_or("default".to_string(), |a| a.name.clone());
        vec![Rail { name, ip: bind_ip }]
    } else {
        rails
    };
    let names: Vec<String> = rails.iter().map(|r| r.name.clone()).collect();
    let matrix = match (choice.custom_matrix, choice.named) {
        (Some(path), _) => PriorityMatrix::from_custom_env(|_| Some(path.to_string()))
            .map_err(|e| RailError::Matrix {
                path: path.to_string(),
                reason: e.to_string(),
            })?
            .unwrap_or_default(),
        // Named rails: all preferred everywhere, as Mooncake's `--device_name` matrix.
        (None, Some(_)) => PriorityMatrix::uniform(&names),
        (None, None) => {
            let only_rails = NicFilter {
                allow: Some(names.clone()),
                deny: Vec::new(),
            };
            let m = PriorityMatrix::from_topology(topology, NicKind::Ethernet, &only_rails);
            if m.devices().is_empty() {
                PriorityMatrix::uniform(&names)
            } else {
                m
            }
        }
    };
    Ok((rails, matrix))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Nic;

    fn ifa(name: &str, ip: &str) -> InterfaceAddr {
        InterfaceAddr {
            name: name.into(),
            ip: ip.parse().unwrap(),
            up: true,
            running: true,
            loopback: name == "lo",
        }
    }

    fn nic(name: &str, node: Option<u32>, is_virtual: bool) -> Nic {
        Nic {
            name: name.into(),
            kind: NicKind::Ethernet,
            netdev: Some(name.into()),
            numa_node: node,
            pci_address: None,
            pci_path: None,
            is_virtual,
        }
    }

    fn topo() -> Topology {
        Topology {
            numa_nodes: vec![
                crate::NumaNode {
                    id: 0,
                    cpus: vec![0],
                },
                crate::NumaNode {
                    id: 1,
                    cpus: vec![1],
                },
            ],
            nics: vec![
                nic("eth0", Some(0), false),
                nic("eth1", Some(1), false),
                nic("veth0", None, true),
            ],
            gpus: vec![],
        }
    }

    fn ifaces() -> Vec<InterfaceAddr> {
        vec![
            ifa("lo", "127.0.0.1"),
            ifa("eth0", "10.0.0.1"),
            ifa("eth1", "10.0.1.1"),
            ifa("veth0", "198.18.0.1"),
        ]
    }

    #[test]
    fn discovered_physical_interfaces_are_rails_with_their_matrix() {
        let (rails, m) = plan(
            &RailChoice::default(),
            "10.0.0.1".parse().unwrap(),
            &topo(),
            &ifaces(),
        )
        .unwrap();
        assert_eq!(
            rails.iter().map(|r| r.name.as_str()).collect::<Vec<_>>(),
            ["eth0", "eth1"]
        );
        assert_eq!(m.entry("cpu:1").unwrap().0, ["eth1"]);
        assert_eq!(m.entry("cpu:1").unwrap().1, ["eth0"]);
    }

    #[test]
    fn a_bind_address_alone_makes_one_rail() {
        let c = RailChoice {
            bind_address_given: true,
            ..RailChoice::default()
        };
        let (rails, m) = plan(&c, "127.0.0.1".parse().unwrap(), &topo(), &ifaces()).unwrap();
        assert_eq!(
            rails,
            vec![Rail {
                name: "lo".into(),
                ip: "127.0.0.1".parse().unwrap()
            }]
        );
        assert_eq!(m.entry("cpu:0").unwrap().0, ["lo"]);
    }

    #[test]
    fn an_engine_named_by_a_loopback_address_keeps_to_the_loopback_rail() {
        let (rails, m) = plan(
            &RailChoice::default(),
            "127.0.0.1".parse().unwrap(),
            &topo(),
            &ifaces(),
        )
        .unwrap();
        assert_eq!(
            rails,
            vec![Rail {
                name: "lo".into(),
                ip: "127.0.0.1".parse().unwrap()
            }],
            "no physical interface serves a loopback engine"
        );
        assert_eq!(m.entry("cpu:1").unwrap().0, ["lo"]);
    }

    #[test]
    fn named_rails_include_virtual_interfaces_and_must_have_addresses() {
        let filter = NicFilter {
            allow: Some(vec!["veth0".into(), "eth1".into()]),
            deny: vec![],
        };
        let mut c = RailChoice {
            filter: &filter,
            ..RailChoice::default()
        };
        let (rails, _) = plan(&c, "10.0.0.1".parse().unwrap(), &topo(), &ifaces()).unwrap();
        assert_eq!(
            rails.iter().map(|r| r.name.as_str()).collect::<Vec<_>>(),
            ["veth0", "eth1"]
        );
        let missing = ["eth9".to_string()];
        c.named = Some(&missing);
        assert!(matches!(
            plan(&c, "10.0.0.1".parse().unwrap(), &topo(), &ifaces()),
            Err(RailError::NoAddress(n)) if n == "eth9"
        ));
        let both = ["eth1".to_string(), "eth0".to_string()];
        c.named = Some(&both);
        let (rails, m) = plan(&c, "10.0.0.1".parse().unwrap(), &topo(), &ifaces()).unwrap();
        assert_eq!(rails.len(), 2);
        assert_eq!(
            m.entry("cuda:3").unwrap().0,
            ["eth1", "eth0"],
            "device_name: all preferred"
        );
    }

    #[test]
    fn no_usable_interface_falls_back_to_the_bind_address() {
        let (rails, _) = plan(
            &RailChoice::default(),
            "192.0.2.7".parse().unwrap(),
            &Topology::default(),
            &[],
        )
        .unwrap();
        assert_eq!(
            rails,
            vec![Rail {
                name: "default".into(),
                ip: "192.0.2.7".parse().unwrap()
            }]
        );
    }
}
