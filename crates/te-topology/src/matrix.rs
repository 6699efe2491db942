//! The NIC priority matrix, in Mooncake's JSON shape: for each memory location
//! (`cpu:N`, `cuda:N`, or the wildcard `*`), the preferred NICs and the other usable ones:
//! `{"cpu:0": [["mlx5_0", "mlx5_1"], ["mlx5_2"]], ...}`.
//!
//! Built from a [`Topology`]: for `cpu:N` the NICs on node N (or of unknown node) are preferred;
//! for `cuda:N` the NICs nearest the GPU on the PCI tree (among those on its node) are. Loaded
//! instead from `MC_CUSTOM_TOPO_JSON` when set. [`NicFilter`] applies `MC_TE_FILTERS` (allow-list)
//! and `MC_TE_FILTERS_EXCLUDE` (deny-list); virtual interfaces are used only when named.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::{Error, NicKind, Result, Topology, pci_distance};

/// Which NICs may be used.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NicFilter {
    /// If set, only these (and virtual ones only if listed here).
    pub allow: Option<Vec<String>>,
    /// Never these.
    pub deny: Vec<String>,
}

fn csv(v: &str) -> Vec<String> {
    v.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect()
}

impl NicFilter {
    /// From `MC_TE_FILTERS` and `MC_TE_FILTERS_EXCLUDE` (comma lists) read through `lookup`.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Self {
        NicFilter {
            allow: lookup("MC_TE_FILTERS")
                .map(|v| csv(&v))
                .filter(|l| !l.is_empty()),
            deny: lookup("MC_TE_FILTERS_EXCLUDE")
                .map(|v| csv(&v))
                .unwrap_or_default(),
        }
    }

    /// Whether the allow-list names `nic` explicitly.
    pub fn names(&self, nic: &str) -> bool {
        self.allow
            .as_ref()
            .is_some_and(|a| a.iter().any(|n| n == nic))
    }

    /// Whether `nic` may be used (`virtual_nic`: only when named).
    pub fn admits(&self, nic: &str, virtual_nic: bool) -> bool {
        if self.deny.iter().any(|n| n == nic) {
            return false;
        }
        match &self.allow {
            Some(_) => self.names(nic),
            None => !virtual_nic,
        }
    }
}

/// Preferred and other usable NICs per location.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct PriorityMatrix(pub BTreeMap<String, (Vec<String>, Vec<String>)>);

impl PriorityMatrix {
    /// The matrix for NICs of `kind` in `topology`, after `filter`.
    pub fn from_topology(topology: &Topology, kind: NicKind, filter: &NicFilter) -> Self {
        let nics: Vec<_> = topology
            .nics_of(kind)
            .filter(|n| filter.admits(&n.name, n.is_virtual))
            .collect();
        let mut m = BTreeMap::new();
        for node in &topology.numa_nodes {
            let (pref, avail): (Vec<_>, Vec<_>) = nics
                .iter()
                .partition(|n| n.numa_node.is_none_or(|x| x == node.id));
            m.insert(format!("cpu:{}", node.id), (names(&pref), names(&avail)));
        }
        for gpu in &topology.gpus {
            let near: Vec<_> = nics
                .iter()
                .filter(|n| {
                    n.numa_node.is_none() || gpu.numa_node.is_none() || n.numa_node == gpu.numa_node
                })
                .collect();
            let pool = if near.is_empty() {
                nics.iter().collect()
            } else {
                near
            };
            let distance = |n: &&&crate::Nic| {
                n.pci_path
                    .as_deref()
                    .map_or(usize::MAX, |p| pci_distance(p, &gpu.pci_path))
            };
            let best = pool.iter().map(distance).min();
            let pref: Vec<_> = pool
                .iter()
                .filter(|n| Some(distance(n)) == best)
                .map(|n| **n)
                .collect();
            let avail: Vec<_> = nics
                .iter()
                .copied()
                .filter(|n| !pref.iter().any(|p| p.name == n.name))
                .collect();
            m.insert(format!("cuda:{}", gpu.index), (names(&pref), names(&avail)));
        }
        PriorityMatrix(m)
    }

    /// Every NIC preferred for every location (Mooncake's `--device_name` matrix).
    pub fn uniform(nics: &[String]) -> Self {
        PriorityMatrix(BTreeMap::from([(
            "*".to_string(),
            (nics.to_vec(), Vec::new()),
        )]))
    }

    /// Parses Mooncake's JSON shape.
    ///
    /// # Errors
    /// [`Error::Parse`] for anything else, or an empty NIC name.
    pub fn parse(source: &str, json: &str) -> Result<Self> {
        let m: PriorityMatrix = serde_json::from_str(json).map_err(|e| Error::Parse {
            path: source.to_string(),
            reason: e.to_string(),
        })?;
        if m.0
            .values()
            .flat_map(|(p, a)| p.iter().chain(a))
            .any(|n| n.is_empty())
        {
            return Err(Error::Parse {
                path: source.to_string(),
                reason: "empty NIC name".into(),
            });
        }
        Ok(m)
    }

    /// Loads `MC_CUSTOM_TOPO_JSON` (a file path) if set.
    ///
    /// # Errors
    /// The file cannot be read or parsed.
    pub fn from_custom_env(lookup: impl Fn(&str) -> Option<String>) -> Result<Option<Self>> {
        let Some(path) = lookup("MC_CUSTOM_TOPO_JSON").filter(|p| !p.trim().is_empty()) else {
            return Ok(None);
        };
        let text = std::fs::read_to_string(&path).map_err(|source| Error::Read {
            path: path.clone(),
            source,
        })?;
        Self::parse(&path, &text).map(Some)
    }

    /// Drops NICs the filter refuses (virtual-ness is not known here, so only the lists apply).
    pub fn filtered(&self, filter: &NicFilter) -> Self {
        let keep = |l: &Vec<String>| {
            l.iter()
                .filter(|n| filter.admits(n, false) || filter.names(n))
                .cloned()
                .collect()
        };
        PriorityMatrix(
            self.0
                .iter()
                .map(|(k, (p, a))| (k.clone(), (keep(p), keep(a))))
                .collect(),
        )
    }

    /// The entry for `location`, else the `*` entry.
    pub fn entry(&self, location: &str) -> Option<(&[String], &[String])> {
        self.0
            .get(location)
            .or_else(|| self.0.get("*"))
            .map(|(p, a)| (p.as_slice(), a.as_slice()))
    }

    /// Every NIC named, in first-seen order (Mooncake's device indices).
    pub fn devices(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for (p, a) in self.0.values() {
            for n in p.iter().chain(a) {
                if !out.contains(n) {
                    out.push(n.clone());
                }
            }
        }
        out
    }

    /// Compact JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|_| "{}".into())
    }
}

fn names(nics: &[&crate::Nic]) -> Vec<String> {
    nics.iter().map(|n| n.name.clone()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters() {
        let f = NicFilter::from_lookup(|k| (k == "MC_TE_FILTERS").then(|| "veth0, eth1".into()));
        assert!(f.admits("veth0", true) && f.admits("eth1", false));
        assert!(!f.admits("eth0", false));
        let f = NicFilter::from_lookup(|k| (k == "MC_TE_FILTERS_EXCLUDE").then(|| "eth1".into()));
        assert!(f.admits("eth0", false) && !f.admits("eth1", false) && !f.admits("docker0", true));
    }

    #[test]
    fn json_shape_round_trips_and_wildcard_applies() {
        let json = r#"{"cpu:0":[["mlx5_0","mlx5_1"],["mlx5_2"]],"*":[["mlx5_2"],[]]}"#;
        let m = PriorityMatrix::parse("t", json).unwrap();
        assert_eq!(PriorityMatrix::parse("t", &m.to_json()).unwrap(), m);
        assert_eq!(m.entry("cpu:0").unwrap().0, ["mlx5_0", "mlx5_1"]);
        assert_eq!(m.entry("cuda:3").unwrap().0, ["mlx5_2"]);
        assert_eq!(m.devices(), ["mlx5_2", "mlx5_0", "mlx5_1"]);
        for bad in [
            "[]",
            r#"{"cpu:0":[["a"]]}"#,
            r#"{"cpu:0":[[""],[]]}"#,
            "nope",
        ] {
            assert!(PriorityMatrix::parse("t", bad).is_err(), "{bad}");
        }
        let deny = NicFilter {
            allow: None,
            deny: vec!["mlx5_1".into()],
        };
        assert_eq!(m.filtered(&deny).entry("cpu:0").unwrap().0, ["mlx5_0"]);
    }
}
