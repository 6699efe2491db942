//! The sysfs and hwloc backends give the same answer on this machine.
#![cfg(feature = "hwloc")]

use te_topology::{Nic, Topology, sysfs};

/// What both backends can know about a NIC. On a one-node machine every device is local to
/// that node, so "node 0" and "unknown" mean the same.
fn key(t: &Topology, n: &Nic) -> (String, te_topology::NicKind, Option<u32>, Option<String>) {
    let node = if t.numa_nodes.len() > 1 {
        n.numa_node
    } else {
        None
    };
    (n.name.clone(), n.kind, node, n.pci_address.clone())
}

#[test]
fn sysfs_and_hwloc_agree() {
    let s = sysfs::discover(std::path::Path::new("/")).unwrap();
    let h = te_topology::hwloc::discover().unwrap();
    assert_eq!(s.numa_nodes, h.numa_nodes);
    // hwloc lists only devices that hang off PCI.
    let on_pci = |t: &Topology| -> Vec<_> {
        t.nics
            .iter()
            .filter(|n| n.pci_address.is_some())
            .map(|n| key(t, n))
            .collect()
    };
    assert_eq!(on_pci(&s), on_pci(&h));
    eprintln!("NICs on PCI, both backends: {:?}", on_pci(&s));
    let gpus = |t: &Topology| -> Vec<_> {
        t.gpus
            .iter()
            .map(|g| (g.index, g.pci_address.clone(), g.pci_path.clone()))
            .collect()
    };
    assert_eq!(gpus(&s), gpus(&h));
    let paths = |t: &Topology| -> Vec<_> {
        t.nics
            .iter()
            .filter(|n| n.pci_address.is_some())
            .map(|n| n.pci_path.clone())
            .collect()
    };
    assert_eq!(paths(&s), paths(&h));
}
