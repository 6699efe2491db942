//! te-tent's configuration in TENT's shape: a JSON file or inline JSON (`MC_TENT_CONF`), whose
//! keys map onto te-core's [`Config`], then the legacy `MC_*` variables on top, as TENT maps
//! them (`MC_SLICE_SIZE` → `transports/rdma/workers/block_size`, ...). Parsing only: nothing
//! is started here.

use std::time::Duration;

use serde::Deserialize;
use te_core::Config;

use crate::TentError;
use crate::policy::Rule;

/// Largest configuration text accepted.
const MAX_CONF_BYTES: usize = 1 << 20;

/// Per-transport settings (`transports.<name>`).
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct TransportConf {
    /// Install this transport (`true` unless said otherwise).
    pub enable: Option<bool>,
    /// RDMA workers: `block_size` (slice size), `num_workers` (per device).
    pub workers: Option<WorkersConf>,
    /// RDMA endpoints: `qp_mul_factor` (QPs per endpoint), `endpoint_store_cap`.
    pub endpoint: Option<EndpointConf>,
    /// Devices to use (RDMA device names), all when absent.
    pub devices: Option<Vec<String>>,
}

/// `transports.rdma.workers`.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct WorkersConf {
    /// Slice size in bytes.
    pub block_size: Option<u64>,
    /// Worker threads per device.
    pub num_workers: Option<u32>,
}

/// `transports.rdma.endpoint`.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct EndpointConf {
    /// Queue pairs per endpoint.
    pub qp_mul_factor: Option<u32>,
    /// Endpoints kept per device.
    pub endpoint_store_cap: Option<u32>,
}

/// `topology`.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct TopologyConf {
    /// NICs to use.
    pub rdma_whitelist: Option<Vec<String>>,
    /// NICs never to use.
    pub rdma_blacklist: Option<Vec<String>>,
}

/// `staging`: host buffers for moves no transport makes directly.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct StagingConf {
    /// Stage at all.
    pub enable: bool,
    /// Bytes per staging hop (a request is staged in pieces of this size).
    pub chunk_size: u64,
}

impl Default for StagingConf {
    fn default() -> Self {
        StagingConf {
            enable: true,
            chunk_size: 4 << 20,
        }
    }
}

/// The TENT configuration file.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct TentFile {
    /// The local segment name (`host` or `host:port`); default: this host's address.
    pub local_segment_name: Option<String>,
    /// `p2p`, `etcd`, `redis` or `http`.
    pub metadata_type: Option<String>,
    /// The metadata service address(es) for the non-p2p types.
    pub metadata_servers: Option<String>,
    /// `TRACE` … `ERROR`.
    pub log_level: Option<String>,
    /// Transports tried per request after the first fails.
    pub max_failover_attempts: Option<u32>,
    /// Retry a failed task on the next capable transport (TENT's `enable_auto_failover_on_poll`).
    pub enable_auto_failover: Option<bool>,
    /// Tasks posted at once; the rest wait in priority order.
    pub max_inflight_tasks: Option<usize>,
    /// Merge requests contiguous in both memories before slicing (default true; the classic
    /// `MC_TE_MERGE_REQUESTS`).
    pub merge_requests: Option<bool>,
    /// Per-transport settings.
    pub transports: std::collections::BTreeMap<String, TransportConf>,
    /// NIC lists.
    pub topology: TopologyConf,
    /// Policy rules, first match wins.
    pub policy: Vec<Rule>,
    /// Staging through host memory.
    pub staging: StagingConf,
    /// Classic settings by `MC_*` name (`{"MC_SLICE_SIZE": "65536"}`), for anything the keys
    /// above do not cover.
    pub env: std::collections::BTreeMap<String, String>,
}

/// Everything te-tent runs with.
#[derive(Clone, Debug)]
pub struct TentConfig {
    /// The classic engine's configuration (TENT keys mapped onto it, then `MC_*` on top).
    pub core: Config,
    /// The metadata connection string for [`te_core::TransferEngine::init`].
    pub metadata_conn: String,
    /// The local segment name.
    pub local_segment_name: String,
    /// Transports tried per request after the first fails.
    pub max_failover_attempts: u32,
    /// Retry failed tasks on the next capable transport.
    pub auto_failover: bool,
    /// Tasks posted at once.
    pub max_inflight_tasks: usize,
    /// Per-transport settings.
    pub transports: std::collections::BTreeMap<String, TransportConf>,
    /// Policy rules.
    pub policy: Vec<Rule>,
    /// Staging.
    pub staging: StagingConf,
}

impl TentConfig {
    /// From `MC_TENT_CONF` (a file path or inline JSON; defaults when unset) and the `MC_*`
    /// variables.
    ///
    /// # Errors
    /// [`TentError::Config`] naming the bad file, key or variable.
    pub fn from_env() -> Result<Self, TentError> {
        let file = match std::env::var("MC_TENT_CONF")
            .ok()
            .filter(|v| !v.trim().is_empty())
        {
            None => TentFile::default(),
            Some(v) => TentFile::parse_source(&v)?,
        };
        Self::from_file(file, |name| std::env::var(name).ok())
    }

    /// From a parsed file, with `lookup` giving the `MC_*` variables (which win over the
    /// file's keys, as in TENT).
    ///
    /// # Errors
    /// [`TentError::Config`] naming the bad key or variable.
    pub fn from_file(
        file: TentFile,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, TentError> {
        let bad = |key: &str, why: String| TentError::Config(format!("{key}: {why}"));
        // The file's keys as the MC_* variables TENT maps them from; the environment wins.
        let mut mapped: std::collections::BTreeMap<String, String> = file.env.clone();
        let rdma = file.transports.get("rdma");
        let workers = rdma.and_then(|r| r.workers.as_ref());
        let endpoint = rdma.and_then(|r| r.endpoint.as_ref());
        let mut put = |name: &str, v: Option<String>| {
            if let Some(v) = v {
                mapped.insert(name.to_string(), v);
            }
        };
        put(
            "MC_SLICE_SIZE",
            workers.and_then(|w| w.block_size).map(|v| v.to_string()),
        );
        put(
            "MC_WORKERS_PER_CTX",
            workers.and_then(|w| w.num_workers).map(|v| v.to_string()),
        );
        put(
            "MC_NUM_QP_PER_EP",
            endpoint
                .and_then(|e| e.qp_mul_factor)
                .map(|v| v.to_string()),
        );
        put(
            "MC_MAX_EP_PER_CTX",
            endpoint
                .and_then(|e| e.endpoint_store_cap)
                .map(|v| v.to_string()),
        );
        put(
            "MC_TE_FILTERS",
            file.topology.rdma_whitelist.as_ref().map(|l| l.join(",")),
        );
        put(
            "MC_TE_FILTERS_EXCLUDE",
            file.topology.rdma_blacklist.as_ref().map(|l| l.join(",")),
        );
        put("MC_LOG_LEVEL", file.log_level.clone());
        put(
            "MC_TE_MERGE_REQUESTS",
            file.merge_requests.map(|m| m.to_string()),
        );
        let core = Config::from_lookup(|name| lookup(name).or_else(|| mapped.get(name).cloned()))
            .map_err(|e| TentError::Config(e.to_string()))?;
        let metadata_conn = match (file.metadata_type.as_deref(), &file.metadata_servers) {
            (None | Some("p2p"), _) => "P2PHANDSHAKE".to_string(),
            (Some("etcd"), Some(s)) => format!("etcd://{s}"),
            (Some("redis"), Some(s)) if s.starts_with("redis://") => s.clone(),
            (Some("redis"), Some(s)) => format!("redis://{s}"),
            (Some("http"), Some(s)) => s.clone(),
            (Some(t), None) => return Err(bad("metadata_servers", format!("needed for {t}"))),
            (Some(t), _) => return Err(bad("metadata_type", format!("unknown type {t:?}"))),
        };
        let local = file
            .local_segment_name
            .clone()
            .or_else(|| core.tcp_bind_address.map(|ip| ip.to_string()))
            .unwrap_or_else(|| "127.0.0.1".into());
        let attempts = file.max_failover_attempts.unwrap_or(3);
        if attempts > 16 {
            return Err(bad("max_failover_attempts", format!("{attempts} > 16")));
        }
        let inflight = file.max_inflight_tasks.unwrap_or(4096);
        if inflight == 0 {
            return Err(bad("max_inflight_tasks", "must be at least 1".into()));
        }
        if file.staging.chunk_size < 4096 || file.staging.chunk_size > 1 << 30 {
            return Err(bad(
                "staging.chunk_size",
                format!("{} outside 4 KiB..=1 GiB", file.staging.chunk_size),
            ));
        }
        for rule in &file.policy {
            rule.validate().map_err(|e| bad("policy", e))?;
        }
        Ok(TentConfig {
            core,
            metadata_conn,
            local_segment_name: local,
            max_failover_attempts: attempts,
            auto_failover: file.enable_auto_failover.unwrap_or(true),
            max_inflight_tasks: inflight,
            transports: file.transports,
            policy: file.policy,
            staging: file.staging,
        })
    }

    /// Whether transport `name` is enabled (it is unless its `enable` is false).
    pub fn enabled(&self, name: &str) -> bool {
        self.transports
            .get(name)
            .and_then(|t| t.enable)
            .unwrap_or(true)
    }

    /// The slice timeout classic settings give, if any.
    pub fn slice_timeout(&self) -> Option<Duration> {
        self.core.slice_timeout
    }
}

impl TentFile {
    /// Parses `source`: inline JSON when it starts with `{`, else the path of a JSON file.
    ///
    /// # Errors
    /// [`TentError::Config`]: unreadable, too large, or not the expected JSON.
    pub fn parse_source(source: &str) -> Result<Self, TentError> {
        let text = match source.trim_start().starts_with('{') {
            true => source.to_string(),
            false => {
                let meta = std::fs::metadata(source)
                    .map_err(|e| TentError::Config(format!("{source}: {e}")))?;
                if meta.len() > MAX_CONF_BYTES as u64 {
                    return Err(TentError::Config(format!("{source}: over 1 MiB")));
                }
                std::fs::read_to_string(source)
                    .map_err(|e| TentError::Config(format!("{source}: {e}")))?
            }
        };
        if text.len() > MAX_CONF_BYTES {
            return Err(TentError::Config("configuration over 1 MiB".into()));
        }
        serde_json::from_str(&text).map_err(|e| TentError::Config(format!("TENT config: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tent_keys_map_to_classic_settings_and_the_environment_wins() {
        let file = TentFile::parse_source(
            r#"{"metadata_type": "redis", "metadata_servers": "10.0.0.1:6379",
                "max_failover_attempts": 2,
                "transports": {"rdma": {"workers": {"block_size": 131072, "num_workers": 4},
                                         "endpoint": {"qp_mul_factor": 6}},
                               "shm": {"enable": false}},
                "topology": {"rdma_whitelist": ["eth1", "eth2"]},
                "policy": [{"name": "local", "same_machine": true, "transports": ["shm"]}]}"#,
        )
        .unwrap();
        let env = |name: &str| (name == "MC_NUM_QP_PER_EP").then(|| "3".to_string());
        let c = TentConfig::from_file(file, env).unwrap();
        assert_eq!(c.core.slice_size, 131072);
        assert_eq!(c.core.workers_per_ctx, 4);
        assert_eq!(
            c.core.num_qp_per_ep, 3,
            "MC_NUM_QP_PER_EP wins over the file"
        );
        assert_eq!(
            c.core.nic_filter.allow,
            Some(vec!["eth1".to_string(), "eth2".to_string()])
        );
        assert_eq!(c.metadata_conn, "redis://10.0.0.1:6379");
        assert_eq!(c.max_failover_attempts, 2);
        assert!(!c.enabled("shm") && c.enabled("tcp"));
        assert_eq!(c.policy.len(), 1);
        assert!(
            c.core.merge_requests,
            "merging is on unless the file says no"
        );
        let off = TentFile::parse_source(r#"{"merge_requests": false}"#).unwrap();
        assert!(
            !TentConfig::from_file(off, |_| None)
                .unwrap()
                .core
                .merge_requests
        );
    }

    #[test]
    fn bad_configurations_say_what_is_wrong() {
        let cases = [
            (r#"{"transports": {"rdma": {"wrokers": {}}}}"#, "wrokers"),
            (r#"{"metadata_type": "etcd"}"#, "metadata_servers"),
            (r#"{"metadata_type": "zk", "metadata_servers": "x"}"#, "zk"),
            (r#"{"max_failover_attempts": 99}"#, "max_failover_attempts"),
            (r#"{"staging": {"chunk_size": 1}}"#, "chunk_size"),
            (r#"{"policy": [{"transports": []}]}"#, "policy"),
            (r#"{"env": {"MC_SLICE_SIZE": "lots"}}"#, "MC_SLICE_SIZE"),
            ("/nonexistent/tent.json", "nonexistent"),
        ];
        for (source, needle) in cases {
            let err = TentFile::parse_source(source)
                .and_then(|f| TentConfig::from_file(f, |_| None))
                .unwrap_err();
            assert!(err.to_string().contains(needle), "{source}: {err}");
        }
    }
}
