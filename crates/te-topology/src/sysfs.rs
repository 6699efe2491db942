//! Discovery from sysfs under a root directory (`/` on a real machine, a fixture tree in tests).
//!
//! - NUMA nodes: `sys/devices/system/node/node*/cpulist` (or one node with
//!   `sys/devices/system/cpu/online` on kernels without NUMA).
//! - RDMA devices: `sys/class/infiniband/*`, their interface from `device/net/*`.
//! - Interfaces: `sys/class/net/*`; those under `devices/virtual` are virtual.
//! - GPUs: `sys/bus/pci/devices/*` with class 0x0300/0x0302 and an NVIDIA or AMD vendor id.
//!
//! Each device's PCI address, PCI path and NUMA node come from where its sysfs entry really
//! lives (the nearest PCI device above it); a `numa_node` of -1 means "not known".

use std::fs;
use std::path::{Path, PathBuf};

use crate::{Error, Gpu, GpuVendor, Nic, NicKind, NumaNode, Result, Topology};

fn read(path: &Path) -> Result<String> {
    fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .map_err(|source| Error::Read {
            path: path.display().to_string(),
            source,
        })
}

fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .map(|it| {
            it.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// Parses a kernel CPU list (`0-3,8,10-11`).
///
/// # Errors
/// [`Error::Parse`] on anything else.
pub fn parse_cpulist(path: &str, text: &str) -> Result<Vec<u32>> {
    let bad = || Error::Parse {
        path: path.to_string(),
        reason: format!("bad cpu list {text:?}"),
    };
    let mut cpus = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (u32, u32) =
                    (a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?);
                if b < a || b - a > 1 << 16 {
                    return Err(bad());
                }
                cpus.extend(a..=b);
            }
            None => cpus.push(part.parse().map_err(|_| bad())?),
        }
    }
    cpus.sort_unstable();
    cpus.dedup();
    Ok(cpus)
}

fn numa_nodes(root: &Path) -> Result<Vec<NumaNode>> {
    let dir = root.join("sys/devices/system/node");
    let mut nodes = Vec::new();
    for name in entries(&dir) {
        let Some(id) = name
            .strip_prefix("node")
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let path = dir.join(&name).join("cpulist");
        let cpus = parse_cpulist(&path.display().to_string(), &read(&path)?)?;
        nodes.push(NumaNode { id, cpus });
    }
    if nodes.is_empty() {
        let online = root.join("sys/devices/system/cpu/online");
        if let Ok(text) = read(&online) {
            nodes.push(NumaNode {
                id: 0,
                cpus: parse_cpulist(&online.display().to_string(), &text)?,
            });
        }
    }
    nodes.sort_by_key(|n| n.id);
    Ok(nodes)
}

fn is_pci_address(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 12
        && b[4] == b':'
        && b[7] == b':'
        && b[10] == b'.'
        && s.chars()
            .enumerate()
            .all(|(i, c)| matches!(i, 4 | 7 | 10) || c.is_ascii_hexdigit())
}

/// Where a sysfs entry really lives: (PCI address, PCI path, NUMA node, virtual).
struct Placement {
    pci_address: Option<String>,
    pci_path: Option<String>,
    numa_node: Option<u32>,
    is_virtual: bool,
}

fn placement(root: &Path, entry: &Path) -> Placement {
    let devices =
        fs::canonicalize(root.join("sys/devices")).unwrap_or_else(|_| root.join("sys/devices"));
    let real = fs::canonicalize(entry).unwrap_or_else(|_| entry.to_path_buf());
    let rel = real
        .strip_prefix(&devices)
        .map(Path::to_path_buf)
        .unwrap_or_default();
    let parts: Vec<String> = rel
        .iter()
        .map(|c| c.to_string_lossy().into_owned())
        .collect();
    let is_virtual = parts.first().is_none_or(|p| p == "virtual");
    let pci: Vec<(usize, &String)> = parts
        .iter()
        .enumerate()
        .filter(|(_, p)| p.starts_with("pci") || is_pci_address(p))
        .collect();
    let Some(&(last, address)) = pci.last().filter(|(_, a)| is_pci_address(a)) else {
        return Placement {
            pci_address: None,
            pci_path: None,
            numa_node: None,
            is_virtual,
        };
    };
    let device_dir: PathBuf = devices.join(parts[..=last].iter().collect::<PathBuf>());
    let numa_node = read(&device_dir.join("numa_node"))
        .ok()
        .and_then(|n| n.parse::<i64>().ok())
        .and_then(|n| u32::try_from(n).ok());
    Placement {
        pci_address: Some(address.clone()),
        pci_path: Some(
            pci.iter()
                .map(|(_, p)| p.as_str())
                .collect::<Vec<_>>()
                .join("/"),
        ),
        numa_node,
        is_virtual,
    }
}

fn nics(root: &Path) -> Vec<Nic> {
    let mut out = Vec::new();
    let ib = root.join("sys/class/infiniband");
    for name in entries(&ib) {
        let entry = ib.join(&name);
        let p = placement(root, &entry);
        let netdev = entries(&entry.join("device/net")).into_iter().next();
        out.push(Nic {
            name,
            kind: NicKind::Rdma,
            netdev,
            numa_node: p.numa_node,
            pci_address: p.pci_address,
            pci_path: p.pci_path,
            is_virtual: p.is_virtual,
        });
    }
    let net = root.join("sys/class/net");
    for name in entries(&net) {
        let p = placement(root, &net.join(&name));
        out.push(Nic {
            netdev: Some(name.clone()),
            name,
            kind: NicKind::Ethernet,
            numa_node: p.numa_node,
            pci_address: p.pci_address,
            pci_path: p.pci_path,
            is_virtual: p.is_virtual,
        });
    }
    out
}

fn gpus(root: &Path) -> Vec<Gpu> {
    let bus = root.join("sys/bus/pci/devices");
    let mut out = Vec::new();
    for address in entries(&bus) {
        let dir = bus.join(&address);
        let class = read(&dir.join("class")).unwrap_or_default();
        if !(class.starts_with("0x0300") || class.starts_with("0x0302")) {
            continue;
        }
        let vendor = match read(&dir.join("vendor")).unwrap_or_default().as_str() {
            "0x10de" => GpuVendor::Nvidia,
            "0x1002" => GpuVendor::Amd,
            _ => continue,
        };
        let p = placement(root, &dir);
        out.push(Gpu {
            index: out.len() as u32,
            vendor,
            numa_node: p.numa_node,
            pci_path: p.pci_path.unwrap_or_else(|| address.clone()),
            pci_address: address,
        });
    }
    out
}

/// Discovers the topology under `root` (`/` for this machine).
///
/// # Errors
/// [`Error::Read`] / [`Error::Parse`] for an unreadable or malformed NUMA description.
pub fn discover(root: &Path) -> Result<Topology> {
    Ok(Topology {
        numa_nodes: numa_nodes(root)?,
        nics: nics(root),
        gpus: gpus(root),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists() {
        assert_eq!(
            parse_cpulist("x", "0-3,8,10-11\n").unwrap(),
            vec![0, 1, 2, 3, 8, 10, 11]
        );
        assert_eq!(parse_cpulist("x", "").unwrap(), Vec::<u32>::new());
        for bad in ["a", "3-1", "1-", "0-99999999"] {
            assert!(parse_cpulist("x", bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn pci_addresses() {
        assert!(is_pci_address("0000:1a:00.0"));
        assert!(!is_pci_address("pci0000:00"));
        assert!(!is_pci_address("virtio2"));
    }

    #[test]
    fn this_machine_has_nodes_and_loopback_is_virtual() {
        let t = discover(Path::new("/")).unwrap();
        assert!(!t.numa_nodes.is_empty() && t.numa_nodes.iter().all(|n| !n.cpus.is_empty()));
        let lo = t.nics.iter().find(|n| n.name == "lo").expect("lo listed");
        assert!(lo.is_virtual && lo.pci_address.is_none());
    }
}
