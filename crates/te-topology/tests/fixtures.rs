//! Discovery and priority matrices on committed sysfs fixture trees.

use std::path::PathBuf;

use te_topology::{NicFilter, NicKind, PriorityMatrix, Topology, sysfs};

fn fixture(name: &str) -> Topology {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    sysfs::discover(&root).unwrap()
}

fn entry(m: &PriorityMatrix, loc: &str) -> (Vec<String>, Vec<String>) {
    let (p, a) = m.entry(loc).unwrap_or_else(|| panic!("no entry {loc}"));
    (p.to_vec(), a.to_vec())
}

fn names(prefix: &str, ids: impl IntoIterator<Item = usize>, suffix: &str) -> Vec<String> {
    ids.into_iter()
        .map(|i| format!("{prefix}{i}{suffix}"))
        .collect()
}

#[test]
fn two_socket_eight_gpu_server() {
    let t = fixture("two-socket-8gpu");
    assert_eq!(t.numa_nodes.len(), 2);
    assert_eq!(t.numa_nodes[1].cpus.len(), 48);
    assert!(t.numa_nodes[1].cpus.contains(&72));
    assert_eq!(
        t.gpus.len(),
        8,
        "the non-NVIDIA display function is not a GPU"
    );
    assert_eq!(t.gpus[5].numa_node, Some(1));
    let rdma: Vec<_> = t.nics_of(NicKind::Rdma).collect();
    assert_eq!(rdma.len(), 8);
    assert_eq!(rdma[3].netdev.as_deref(), Some("ens4f0"));
    assert_eq!(rdma[3].numa_node, Some(0));
    assert!(t.nics.iter().any(|n| n.name == "docker0" && n.is_virtual));

    let m = PriorityMatrix::from_topology(&t, NicKind::Rdma, &NicFilter::default());
    assert_eq!(
        entry(&m, "cpu:0"),
        (names("mlx5_", 0..4, ""), names("mlx5_", 4..8, ""))
    );
    assert_eq!(
        entry(&m, "cpu:1"),
        (names("mlx5_", 4..8, ""), names("mlx5_", 0..4, ""))
    );
    for gpu in 0..8 {
        let switch = gpu / 2;
        let pref = names("mlx5_", [2 * switch, 2 * switch + 1], "");
        let avail: Vec<String> = names("mlx5_", 0..8, "")
            .into_iter()
            .filter(|n| !pref.contains(n))
            .collect();
        assert_eq!(
            entry(&m, &format!("cuda:{gpu}")),
            (pref, avail),
            "cuda:{gpu}"
        );
    }
    // The same layout for the interfaces, with docker0 and lo left out.
    let m = PriorityMatrix::from_topology(&t, NicKind::Ethernet, &NicFilter::default());
    assert_eq!(entry(&m, "cpu:1").0, names("ens", 5..9, "f0"));
    assert_eq!(entry(&m, "cuda:7").0, names("ens", 7..9, "f0"));
    assert!(!m.devices().iter().any(|n| n == "docker0" || n == "lo"));
    // A deny-list removes a NIC everywhere.
    let deny = NicFilter {
        allow: None,
        deny: vec!["mlx5_0".into()],
    };
    let m = PriorityMatrix::from_topology(&t, NicKind::Rdma, &deny);
    assert_eq!(entry(&m, "cuda:0").0, ["mlx5_1"]);
    assert!(!m.devices().contains(&"mlx5_0".to_string()));
}

#[test]
fn one_socket_machine() {
    let t = fixture("one-socket");
    assert_eq!(t.numa_nodes.len(), 1);
    let eth1 = t.nics.iter().find(|n| n.name == "eth1").unwrap();
    assert_eq!(
        (eth1.numa_node, eth1.pci_address.as_deref()),
        (None, Some("0000:3b:00.0"))
    );
    assert_eq!(
        eth1.pci_path.as_deref(),
        Some("pci0000:00/0000:00:1c.0/0000:3b:00.0")
    );
    let m = PriorityMatrix::from_topology(&t, NicKind::Ethernet, &NicFilter::default());
    assert_eq!(
        entry(&m, "cpu:0"),
        (vec!["eth0".to_string(), "eth1".to_string()], vec![])
    );
    let m = PriorityMatrix::from_topology(&t, NicKind::Rdma, &NicFilter::default());
    assert_eq!(entry(&m, "cpu:0"), (vec!["mlx5_0".to_string()], vec![]));
    // Virtual interfaces serve only when named.
    let named = NicFilter {
        allow: Some(vec!["veth1234".into(), "eth0".into()]),
        deny: vec![],
    };
    let m = PriorityMatrix::from_topology(&t, NicKind::Ethernet, &named);
    assert_eq!(entry(&m, "cpu:0").0, ["eth0", "veth1234"]);
}

#[test]
fn machine_without_nics_or_numa() {
    let t = fixture("no-nics");
    assert_eq!(t.numa_nodes.len(), 1);
    assert_eq!(t.numa_nodes[0].cpus, vec![0, 1, 2, 3]);
    assert!(t.gpus.is_empty());
    let m = PriorityMatrix::from_topology(&t, NicKind::Ethernet, &NicFilter::default());
    assert_eq!(entry(&m, "cpu:0"), (vec![], vec![]));
    assert!(m.devices().is_empty());
}

#[test]
fn custom_matrix_file() {
    let dir = std::env::temp_dir().join(format!("te-topo-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("m.json");
    std::fs::write(&path, r#"{"cpu:0":[["eth9"],["eth8"]]}"#).unwrap();
    let p = path.display().to_string();
    let m = PriorityMatrix::from_custom_env(|k| (k == "MC_CUSTOM_TOPO_JSON").then(|| p.clone()))
        .unwrap()
        .unwrap();
    assert_eq!(
        entry(&m, "cpu:0"),
        (vec!["eth9".to_string()], vec!["eth8".to_string()])
    );
    assert!(PriorityMatrix::from_custom_env(|_| None).unwrap().is_none());
    let missing = "/nonexistent/m.json".to_string();
    assert!(PriorityMatrix::from_custom_env(|_| Some(missing.clone())).is_err());
}
