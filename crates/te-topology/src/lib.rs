//! te-topology: what a machine has (NUMA nodes and their CPUs, NICs, GPUs, and where each sits
//! on the PCI tree) and the NIC priority matrix built from it, in Mooncake's JSON shape.
//!
//! - [`sysfs`]: discovery from `/sys` (the default; no system library). Takes a root, so fixture
//!   trees stand in for real machines in tests.
//! - `hwloc` (Cargo feature `hwloc`): the same answer through hwloc, via the maintained
//!   `hwlocality` binding. The older `hwloc2` crate panics on hwloc 2.x for NUMA and PCI lookups,
//!   so it is not used.
//! - [`matrix`]: the priority matrix, `MC_CUSTOM_TOPO_JSON`, and NIC allow/deny filters.
//! - [`bind`]: the address listeners bind to, from the configuration and the interfaces.
//!
//! This crate only reads; it opens no device and sends nothing.
#![forbid(unsafe_code)]

pub mod bind;
#[cfg(feature = "hwloc")]
pub mod hwloc;
pub mod matrix;
pub mod rails;
pub mod sysfs;

use serde::{Deserialize, Serialize};

pub use matrix::{NicFilter, PriorityMatrix};

/// What can go wrong while discovering or loading a topology.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A file held something te cannot parse.
    #[error("parsing {path}: {reason}")]
    Parse {
        /// The file (or variable).
        path: String,
        /// What is wrong.
        reason: String,
    },
    /// The hwloc library failed.
    #[error("hwloc: {0}")]
    Hwloc(String),
}

/// Result alias of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A NUMA node and its CPUs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NumaNode {
    /// The node's index.
    pub id: u32,
    /// Logical CPUs of the node, ascending.
    pub cpus: Vec<u32>,
}

/// Kinds of network device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum NicKind {
    /// An RDMA device (`/sys/class/infiniband`).
    Rdma,
    /// An Ethernet (IP) interface (`/sys/class/net`).
    Ethernet,
}

/// A network device.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Nic {
    /// Device name (`mlx5_0`, `eth0`).
    pub name: String,
    /// RDMA device or IP interface.
    pub kind: NicKind,
    /// For an RDMA device, its network interface; for an interface, itself.
    pub netdev: Option<String>,
    /// NUMA node it is attached to; `None` when the platform does not say.
    pub numa_node: Option<u32>,
    /// PCI address of the device (`0000:1a:00.0`).
    pub pci_address: Option<String>,
    /// The root complex (`pci0000:00`) and the PCI addresses down to the device, `/`-separated.
    pub pci_path: Option<String>,
    /// A software interface (bridge, veth, loopback, tunnel): never a default rail.
    pub is_virtual: bool,
}

/// GPU vendors te knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum GpuVendor {
    /// PCI vendor 0x10de.
    Nvidia,
    /// PCI vendor 0x1002.
    Amd,
}

/// A GPU, by PCI class (display 0x0300 or 3D 0x0302) and vendor.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Gpu {
    /// Index in PCI address order (the `N` of `cuda:N` when CUDA enumerates by bus id).
    pub index: u32,
    /// Vendor.
    pub vendor: GpuVendor,
    /// NUMA node it is attached to, if known.
    pub numa_node: Option<u32>,
    /// PCI address (`0000:1b:00.0`).
    pub pci_address: String,
    /// The root complex and the PCI addresses down to the GPU, `/`-separated.
    pub pci_path: String,
}

/// A machine's topology.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Topology {
    /// NUMA nodes, by id.
    pub numa_nodes: Vec<NumaNode>,
    /// Network devices, RDMA devices first, each kind by name.
    pub nics: Vec<Nic>,
    /// GPUs, by PCI address.
    pub gpus: Vec<Gpu>,
}

impl Topology {
    /// Discovers this machine through sysfs.
    ///
    /// # Errors
    /// [`Error::Read`] / [`Error::Parse`] when sysfs is unreadable or malformed.
    pub fn discover() -> Result<Self> {
        sysfs::discover(std::path::Path::new("/"))
    }

    /// The NICs of one kind, in the topology's order.
    pub fn nics_of(&self, kind: NicKind) -> impl Iterator<Item = &Nic> {
        self.nics.iter().filter(move |n| n.kind == kind)
    }

    /// The topology as pretty JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|_| "{}".into())
    }
}

/// PCI-tree distance between two `/`-separated PCI paths (root complex first): the hops from
/// each end up to their deepest common ancestor.
pub fn pci_distance(a: &str, b: &str) -> usize {
    let a: Vec<&str> = a.split('/').filter(|s| !s.is_empty()).collect();
    let b: Vec<&str> = b.split('/').filter(|s| !s.is_empty()).collect();
    let common = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    (a.len() - common) + (b.len() - common)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pci_distances() {
        let gpu = "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:08.0/0000:03:00.0";
        let nic_same_switch = "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:10.0/0000:04:00.0";
        let nic_same_root = "pci0000:00/0000:00:03.0/0000:05:00.0/0000:06:08.0/0000:07:00.0";
        let nic_other_root = "pci0000:80/0000:80:01.0/0000:81:00.0";
        assert_eq!(pci_distance(gpu, nic_same_switch), 4);
        assert_eq!(pci_distance(gpu, nic_same_root), 8);
        assert_eq!(pci_distance(gpu, nic_other_root), 8);
        assert_eq!(pci_distance(gpu, gpu), 0);
    }
}
