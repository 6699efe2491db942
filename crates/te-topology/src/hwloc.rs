//! Discovery through hwloc (Cargo feature `hwloc`), via the `hwlocality` binding.
//!
//! hwloc sees I/O devices only where they hang off PCI, so software interfaces (`lo`, bridges,
//! veth) are not listed; a device attached to the whole machine rather than one NUMA node has an
//! unknown node (`None`), as a sysfs `numa_node` of -1 does.

use hwlocality::object::TopologyObject;
use hwlocality::object::attributes::ObjectAttributes;
use hwlocality::object::types::{OSDeviceType, ObjectType};
use hwlocality::topology::builder::TypeFilter;

use crate::{Error, Gpu, GpuVendor, Nic, NicKind, NumaNode, Result, Topology};

fn hw_err(e: impl std::fmt::Display) -> Error {
    Error::Hwloc(e.to_string())
}

fn pci_address(obj: &TopologyObject) -> Option<String> {
    match obj.attributes() {
        Some(ObjectAttributes::PCIDevice(p)) => Some(format!(
            "{:04x}:{:02x}:{:02x}.{:x}",
            p.domain(),
            p.bus_id(),
            p.bus_device(),
            p.function()
        )),
        _ => None,
    }
}

/// PCI address of the nearest PCI device at or above `obj`, and the root-first path of them.
fn pci_placement(obj: &TopologyObject) -> (Option<String>, Option<String>) {
    let chain: Vec<String> = std::iter::once(obj)
        .chain(obj.ancestors())
        .filter_map(pci_address)
        .collect();
    let Some(top) = chain.last() else {
        return (None, None);
    };
    let root = format!("pci{}", &top[..7]);
    let path = std::iter::once(root)
        .chain(chain.iter().rev().cloned())
        .collect::<Vec<_>>()
        .join("/");
    (chain.first().cloned(), Some(path))
}

/// The NUMA node of an I/O object; `None` when it is attached to all nodes at once.
fn numa_of(obj: &TopologyObject, node_count: usize) -> Option<u32> {
    let nodes = obj.first_non_io_ancestor()?.nodeset()?;
    let set: Vec<usize> = nodes.iter_set().map(usize::from).collect();
    match set.as_slice() {
        [one] if node_count > 1 => u32::try_from(*one).ok(),
        _ => None,
    }
}

/// Discovers this machine through hwloc.
///
/// # Errors
/// [`Error::Hwloc`] when hwloc cannot build the topology.
pub fn discover() -> Result<Topology> {
    let hw = hwlocality::Topology::builder()
        .with_type_filter(ObjectType::OSDevice, TypeFilter::KeepAll)
        .map_err(hw_err)?
        .with_type_filter(ObjectType::PCIDevice, TypeFilter::KeepAll)
        .map_err(hw_err)?
        .with_type_filter(ObjectType::Bridge, TypeFilter::KeepAll)
        .map_err(hw_err)?
        .build()
        .map_err(hw_err)?;
    let mut numa_nodes: Vec<NumaNode> = hw
        .objects_with_type(ObjectType::NUMANode)
        .filter_map(|n| {
            let id = u32::try_from(n.os_index()?).ok()?;
            let mut cpus: Vec<u32> = n
                .cpuset()?
                .iter_set()
                .filter_map(|c| u32::try_from(usize::from(c)).ok())
                .collect();
            cpus.sort_unstable();
            Some(NumaNode { id, cpus })
        })
        .collect();
    numa_nodes.sort_by_key(|n| n.id);
    let count = numa_nodes.len();

    let mut nics = Vec::new();
    for obj in hw.objects_with_type(ObjectType::OSDevice) {
        let kind = match obj.attributes() {
            Some(ObjectAttributes::OSDevice(a)) => match a.device_type() {
                OSDeviceType::Network => NicKind::Ethernet,
                OSDeviceType::OpenFabrics => NicKind::Rdma,
                _ => continue,
            },
            _ => continue,
        };
        let Some(name) = obj.name().map(|n| n.to_string_lossy().into_owned()) else {
            continue;
        };
        let (pci_address, pci_path) = pci_placement(obj);
        nics.push(Nic {
            netdev: (kind == NicKind::Ethernet).then(|| name.clone()),
            name,
            kind,
            numa_node: numa_of(obj, count),
            pci_address,
            pci_path,
            is_virtual: false,
        });
    }
    nics.sort_by(|a, b| {
        (a.kind != NicKind::Rdma, &a.name).cmp(&(b.kind != NicKind::Rdma, &b.name))
    });

    let mut gpus: Vec<Gpu> = Vec::new();
    for obj in hw.objects_with_type(ObjectType::PCIDevice) {
        let Some(ObjectAttributes::PCIDevice(p)) = obj.attributes() else {
            continue;
        };
        if !matches!(p.class_id(), 0x0300 | 0x0302) {
            continue;
        }
        let vendor = match p.vendor_id() {
            0x10de => GpuVendor::Nvidia,
            0x1002 => GpuVendor::Amd,
            _ => continue,
        };
        let (Some(pci_address), Some(pci_path)) = pci_placement(obj) else {
            continue;
        };
        gpus.push(Gpu {
            index: 0,
            vendor,
            numa_node: numa_of(obj, count),
            pci_address,
            pci_path,
        });
    }
    gpus.sort_by(|a, b| a.pci_address.cmp(&b.pci_address));
    for (i, g) in gpus.iter_mut().enumerate() {
        g.index = i as u32;
    }
    Ok(Topology {
        numa_nodes,
        nics,
        gpus,
    })
}
