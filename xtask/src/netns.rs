//! Two test hosts on one machine: a pair of network namespaces joined by `rails` veth pairs,
//! optionally rate-limited with `tc`, for tests and benchmarks of what crosses a network.
//!
//! Rail i joins interface `ta{i}` (198.18.i.1/24, host A) to `tb{i}` (198.18.i.2/24, host B).
//! Needs root and iproute2. Dropping the value deletes both namespaces (and their veths).
//! Shared by `cargo xtask bench topo` and te-tcp's multi-rail test, so it uses std only.

use std::process::Command;

/// Two namespaces and the veth rails between them.
pub struct TwoHosts {
    /// Host A's namespace.
    pub a: String,
    /// Host B's namespace.
    pub b: String,
    /// Number of rails.
    pub rails: usize,
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Why two hosts cannot be made here, if they cannot (not root, no iproute2).
pub fn unavailable() -> Option<String> {
    let uid = Command::new("id")
        .arg("-u")
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    if uid.as_deref() != Some("0") {
        return Some("network namespaces need root".into());
    }
    if Command::new("ip").arg("-V").output().is_err()
        || Command::new("tc").arg("-V").output().is_err()
    {
        return Some("iproute2 (ip, tc) is not installed".into());
    }
    None
}

impl TwoHosts {
    /// Creates the namespaces and `rails` rails, each direction limited to `rate_mbit` if given.
    ///
    /// # Errors
    /// The first `ip` or `tc` command that failed; whatever was made is removed.
    pub fn create(tag: &str, rails: usize, rate_mbit: Option<u32>) -> Result<Self, String> {
        let id = std::process::id();
        let hosts = TwoHosts {
            a: format!("te-{tag}-{id}-a"),
            b: format!("te-{tag}-{id}-b"),
            rails,
        };
        ip(&["netns", "add", &hosts.a])?;
        ip(&["netns", "add", &hosts.b])?;
        for ns in [&hosts.a, &hosts.b] {
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
        }
        for i in 0..rails {
            let (ta, tb) = (format!("ta{i}"), format!("tb{i}"));
            ip(&[
                "link", "add", &ta, "netns", &hosts.a, "type", "veth", "peer", "name", &tb,
                "netns", &hosts.b,
            ])?;
            for (ns, dev, host) in [(&hosts.a, &ta, 1), (&hosts.b, &tb, 2)] {
                ip(&[
                    "-n",
                    ns,
                    "addr",
                    "add",
                    &format!("198.18.{i}.{host}/24"),
                    "dev",
                    dev,
                ])?;
                ip(&["-n", ns, "link", "set", dev, "up"])?;
                if let Some(rate) = rate_mbit {
                    let out = Command::new("ip")
                        .args([
                            "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", "tbf",
                        ])
                        .args([
                            "rate",
                            &format!("{rate}mbit"),
                            "burst",
                            "256kb",
                            "latency",
                            "100ms",
                        ])
                        .output()
                        .map_err(|e| format!("tc: {e}"))?;
                    if !out.status.success() {
                        return Err(format!(
                            "tc on {dev}: {}",
                            String::from_utf8_lossy(&out.stderr).trim()
                        ));
                    }
                }
            }
        }
        Ok(hosts)
    }

    /// Drops `percent` % of the packets leaving either end of rail `rail`: with `tc netem loss`
    /// where the kernel has netem, else with iptables' `statistic` match (kernels without netem).
    ///
    /// # Errors
    /// Neither way worked.
    #[allow(dead_code)] // used by te-tcp's multi-rail tests, which include this file
    pub fn add_loss(&self, rail: usize, percent: u32) -> Result<(), String> {
        for (ns, dev) in [
            (&self.a, format!("ta{rail}")),
            (&self.b, format!("tb{rail}")),
        ] {
            let netem = Command::new("ip")
                .args([
                    "netns", "exec", ns, "tc", "qdisc", "add", "dev", &dev, "root", "netem",
                ])
                .args(["loss", &format!("{percent}%")])
                .output()
                .map_err(|e| format!("tc: {e}"))?;
            if netem.status.success() {
                continue;
            }
            let probability = format!("{:.4}", f64::from(percent) / 100.0);
            let iptables = Command::new("ip")
                .args([
                    "netns",
                    "exec",
                    ns,
                    "iptables-legacy",
                    "-A",
                    "OUTPUT",
                    "-o",
                    &dev,
                ])
                .args([
                    "-m",
                    "statistic",
                    "--mode",
                    "random",
                    "--probability",
                    &probability,
                    "-j",
                    "DROP",
                ])
                .output()
                .map_err(|e| format!("iptables-legacy: {e}"))?;
            if !iptables.status.success() {
                return Err(format!(
                    "loss on {dev}: netem: {}; iptables: {}",
                    String::from_utf8_lossy(&netem.stderr).trim(),
                    String::from_utf8_lossy(&iptables.stderr).trim()
                ));
            }
        }
        Ok(())
    }

    /// A command that runs `program` inside host A's (`on_a`) or host B's namespace.
    pub fn command(&self, on_a: bool, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args([
            "netns",
            "exec",
            if on_a { &self.a } else { &self.b },
            program,
        ]);
        c
    }

    /// Interface names of one host's rails, comma-separated (for `MC_TE_FILTERS`).
    pub fn interfaces(&self, on_a: bool, rails: usize) -> String {
        let p = if on_a { "ta" } else { "tb" };
        (0..rails.min(self.rails))
            .map(|i| format!("{p}{i}"))
            .collect::<Vec<_>>()
            .join(",")
    }
}

impl Drop for TwoHosts {
    fn drop(&mut self) {
        let _ = ip(&["netns", "del", &self.a]);
        let _ = ip(&["netns", "del", &self.b]);
    }
}
