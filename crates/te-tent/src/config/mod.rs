//! te-tent's configuration in TENT's shape: a JSON file or inline JSON (`MC_TENT_CONF`) with
//! the keys Mooncake's TENT reads (its sample `transfer-engine.json` works unchanged), mapped
//! onto te-core's [`Config`] and the transports' settings, then the `MC_*` variables on top,
//! as TENT maps them (`MC_SLICE_SIZE` → `transports/rdma/workers/block_size`, ...). A value of
//! the wrong type or out of range is refused naming its key; a key te has no use for is
//! warned about once. Parsing only: nothing is started here.

mod keys;

use std::collections::{BTreeMap, HashSet};
use std::sync::Mutex;
use std::time::Duration;

use serde::Deserialize;
use te_core::Config;

use crate::TentError;
use crate::policy::Rule;

pub use keys::infer as infer_value;

/// Largest configuration text accepted.
const MAX_CONF_BYTES: usize = 1 << 20;

/// Per-transport settings (`transports.<name>`): what te reads of them. The keys mapped onto
/// classic variables (`workers.block_size`, `device.gid_index`, ...) are read through
/// [`TentFile::mapped`].
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(default)]
pub struct TransportConf {
    /// Install this transport (`true` unless said otherwise).
    pub enable: Option<bool>,
    /// Devices to use (RDMA device names), all when absent.
    pub devices: Option<Vec<String>>,
    /// RDMA: queue pairs, workers and completion queues per device, each unless set itself
    /// (TENT's `num_lanes`).
    pub num_lanes: Option<u32>,
    /// Shared memory: the directory of its files (a tmpfs or CXL mount); `/dev/shm` when
    /// absent or empty.
    pub cxl_mount_path: Option<String>,
}

/// `topology`: which RDMA devices to use.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(default)]
pub struct TopologyConf {
    /// RDMA devices to use (all when absent or empty), unless `transports.rdma.devices` names
    /// them: a filter on RDMA devices only, not on the interfaces TCP uses.
    pub rdma_whitelist: Option<Vec<String>>,
}

/// `staging`: host buffers for moves no transport makes directly.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(default)]
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

/// `metrics`: TENT's switches for the metrics endpoint and the periodic log; each key wins
/// over its `TENT_METRICS_*` variable, as in TENT.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(default)]
pub struct MetricsConf {
    /// Count requests and serve them (`TENT_METRICS_ENABLED`).
    pub enabled: Option<bool>,
    /// The endpoint's port (`TENT_METRICS_HTTP_PORT`).
    #[serde(deserialize_with = "port")]
    pub http_port: Option<u16>,
    /// The endpoint's address (`TENT_METRICS_HTTP_HOST`); loopback unless given.
    pub http_host: Option<String>,
    /// Seconds between summary lines in the log, 0 for none (`TENT_METRICS_REPORT_INTERVAL`).
    pub report_interval_seconds: Option<u64>,
}

impl MetricsConf {
    /// The key's value as the variable `name` would give it, and the key.
    fn as_variable(&self, name: &str) -> Option<(String, &'static str)> {
        match name {
            "TENT_METRICS_ENABLED" => self.enabled.map(|v| (v.to_string(), "metrics.enabled")),
            "TENT_METRICS_HTTP_PORT" => {
                self.http_port.map(|v| (v.to_string(), "metrics.http_port"))
            }
            "TENT_METRICS_HTTP_HOST" => self.http_host.clone().map(|v| (v, "metrics.http_host")),
            "TENT_METRICS_REPORT_INTERVAL" => self
                .report_interval_seconds
                .map(|v| (v.to_string(), "metrics.report_interval_seconds")),
            _ => None,
        }
    }
}

/// The TENT configuration file: the keys te reads itself; the rest are in
/// [`mapped`](Self::mapped) (as classic variables) or [`ignored`](Self::ignored).
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(default)]
pub struct TentFile {
    /// The local segment name (`host` or `host:port`); default: `rpc_server_hostname`, else
    /// this host's address.
    pub local_segment_name: Option<String>,
    /// `p2p`, `etcd`, `redis` or `http`.
    pub metadata_type: Option<String>,
    /// The metadata service address(es) for the non-p2p types.
    pub metadata_servers: Option<String>,
    /// The host of the control (RPC) listener when `local_segment_name` is empty.
    pub rpc_server_hostname: Option<String>,
    /// The control listener's port; 0 or absent picks one.
    #[serde(deserialize_with = "port")]
    pub rpc_server_port: Option<u16>,
    /// Transports tried per request after the first fails.
    pub max_failover_attempts: Option<u32>,
    /// Retry a failed task on the next capable transport (TENT's name).
    pub enable_auto_failover_on_poll: Option<bool>,
    /// te's earlier name of `enable_auto_failover_on_poll`.
    pub enable_auto_failover: Option<bool>,
    /// Tasks posted at once; the rest wait in priority order.
    pub max_inflight_tasks: Option<usize>,
    /// Per-transport settings, by TENT's name (`io_uring` is te's `uring`).
    pub transports: BTreeMap<String, TransportConf>,
    /// NIC lists (`rdma_blacklist` is read as `MC_TE_FILTERS_EXCLUDE`).
    pub topology: TopologyConf,
    /// Policy rules, first match wins.
    pub policy: Vec<Rule>,
    /// Staging through host memory.
    pub staging: StagingConf,
    /// Metrics.
    pub metrics: MetricsConf,
    /// Classic settings by `MC_*` name (`{"MC_SLICE_SIZE": "65536"}`), for anything the keys
    /// do not cover.
    #[serde(deserialize_with = "plain_values")]
    pub env: BTreeMap<String, String>,
    /// Classic variables the file's keys set: name → (value, key).
    #[serde(skip)]
    pub mapped: BTreeMap<String, (String, String)>,
    /// Keys TENT reads and te does not use (with why), and keys neither reads.
    #[serde(skip)]
    pub ignored: Vec<(String, String)>,
}

/// A port given as a number or a string of digits, as TENT takes it.
fn port<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u16>, D::Error> {
    let v = serde_json::Value::deserialize(d)?;
    let port = match &v {
        serde_json::Value::Null => return Ok(None),
        serde_json::Value::Number(n) => n.as_u64().and_then(|p| u16::try_from(p).ok()),
        serde_json::Value::String(s) => s.parse().ok(),
        _ => None,
    };
    port.map(Some)
        .ok_or_else(|| serde::de::Error::custom(format!("rpc_server_port: not a port: {v}")))
}

/// An object of scalars as text (`{"MC_SLICE_SIZE": 65536}` is `"65536"`).
fn plain_values<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<BTreeMap<String, String>, D::Error> {
    let m = BTreeMap::<String, serde_json::Value>::deserialize(d)?;
    Ok(m.into_iter()
        .map(|(k, v)| {
            let text = match v {
                serde_json::Value::String(s) => s,
                other => other.to_string(),
            };
            (k, text)
        })
        .collect())
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
    /// The control listener's port when the name has none (0: pick one).
    pub rpc_server_port: u16,
    /// Transports tried per request after the first fails.
    pub max_failover_attempts: u32,
    /// Retry failed tasks on the next capable transport.
    pub auto_failover: bool,
    /// Tasks posted at once.
    pub max_inflight_tasks: usize,
    /// Per-transport settings, by te's transport name (`uring` for TENT's `io_uring`).
    pub transports: BTreeMap<String, TransportConf>,
    /// Policy rules.
    pub policy: Vec<Rule>,
    /// Staging.
    pub staging: StagingConf,
    /// Metrics: the file's `metrics` keys, then `TENT_METRICS_*` and `MC_TE_METRIC*`.
    pub metrics: te_metrics::MetricsSettings,
    /// The classic variables the file set and the environment did not (te-rdma reads its
    /// options through [`lookup`](Self::lookup)).
    pub settings: BTreeMap<String, String>,
    /// The transports the plan puts first, after a request's hint (a protocol named at start, as
    /// Mooncake's `initialize` names one); the others follow as failover, and carry what these
    /// cannot reach. `None`: the policy's order alone.
    pub plan_first: Option<Vec<String>>,
}

/// TENT's transport names that are te's under another name.
const TRANSPORT_ALIASES: [(&str, &str); 1] = [("io_uring", "uring")];

/// Keys already warned about in this process (each once).
static WARNED: Mutex<Option<HashSet<String>>> = Mutex::new(None);

/// Logs each of `keys` te does not use, once per process.
fn warn_ignored(keys: &[(String, String)]) {
    let mut warned = WARNED.lock().unwrap_or_else(|e| e.into_inner());
    let warned = warned.get_or_insert_with(HashSet::new);
    for (key, why) in keys {
        if warned.insert(key.clone()) {
            tracing::warn!("TENT configuration: {key} ignored: {why}");
        }
    }
}

impl TentConfig {
    /// From `MC_TENT_CONF` (a file path or inline JSON; defaults when unset) and the `MC_*`
    /// variables.
    ///
    /// # Errors
    /// [`TentError::Config`] naming the bad file, key or variable.
    pub fn from_env() -> Result<Self, TentError> {
        let file = match Self::source_from_env() {
            None => TentFile::default(),
            Some(v) => TentFile::parse_source(&v)?,
        };
        Self::from_file_and_env(file)
    }

    /// `MC_TENT_CONF` as set (a file path or inline JSON), unless unset or blank.
    pub fn source_from_env() -> Option<String> {
        te_sys::env::Env::new(&te_sys::env::process).text(&crate::settings::TENT_CONF)
    }

    /// From a parsed file and the process environment's `MC_*` variables.
    ///
    /// # Errors
    /// As [`from_file`](Self::from_file).
    pub fn from_file_and_env(file: TentFile) -> Result<Self, TentError> {
        Self::from_file(file, te_sys::env::process)
    }

    /// From a parsed file, with `lookup` giving the `MC_*` (and `TENT_*`) variables, which
    /// win over the file's keys, as in TENT. Keys and variables te does not use are warned
    /// about (once per process).
    ///
    /// # Errors
    /// [`TentError::Config`] naming the bad key or variable.
    pub fn from_file(
        mut file: TentFile,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, TentError> {
        let bad = |key: &str, why: String| TentError::Config(format!("{key}: {why}"));
        let mut ignored = std::mem::take(&mut file.ignored);
        ignored.extend(
            keys::audit_variables(&lookup)
                .map_err(TentError::Config)?
                .into_iter()
                .map(|(var, why)| (var, why.to_string())),
        );
        warn_ignored(&ignored);
        for (tent, te) in TRANSPORT_ALIASES {
            if let Some(conf) = file.transports.remove(tent) {
                if file.transports.contains_key(te) {
                    return Err(bad(
                        &format!("transports.{tent}"),
                        format!("given twice (also as transports.{te})"),
                    ));
                }
                file.transports.insert(te.to_string(), conf);
            }
        }
        if let Some(allowed) = file
            .topology
            .rdma_whitelist
            .take()
            .filter(|l| !l.is_empty())
        {
            let rdma = file.transports.entry("rdma".into()).or_default();
            rdma.devices.get_or_insert(allowed);
        }
        // The file's keys as classic variables: `env` first, then the keys (more specific);
        // RDMA's `num_lanes` fills in the counts not given themselves.
        let mut settings: BTreeMap<String, (String, String)> = file
            .env
            .iter()
            .map(|(k, v)| (k.clone(), (v.clone(), format!("env.{k}"))))
            .collect();
        settings.extend(file.mapped.clone());
        if let Some(lanes) = file.transports.get("rdma").and_then(|r| r.num_lanes) {
            for var in [
                "MC_NUM_QP_PER_EP",
                "MC_WORKERS_PER_CTX",
                "MC_NUM_CQ_PER_CTX",
            ] {
                settings
                    .entry(var.to_string())
                    .or_insert_with(|| (lanes.to_string(), "transports.rdma.num_lanes".into()));
            }
        }
        // A refusal of a variable the file set names the file's key.
        let core = Config::from_lookup(|name| {
            lookup(name).or_else(|| settings.get(name).map(|(v, _)| v.clone()))
        })
        .map_err(|e| {
            let text = e.to_string();
            match settings
                .iter()
                .find(|(var, _)| lookup(var).is_none() && text.contains(var.as_str()))
            {
                Some((var, (_, key))) => TentError::Config(format!("{key} (as {var}): {text}")),
                None => TentError::Config(text),
            }
        })?;
        // TENT reads its metrics keys before their variables.
        let metrics = te_metrics::MetricsSettings::from_lookup(|name| {
            (file.metrics.as_variable(name).map(|(v, _)| v)).or_else(|| lookup(name))
        })
        .map_err(|e| {
            let text = e.to_string();
            match [
                "TENT_METRICS_HTTP_HOST",
                "TENT_METRICS_HTTP_PORT",
                "TENT_METRICS_REPORT_INTERVAL",
            ]
            .iter()
            .find_map(|v| file.metrics.as_variable(v).filter(|_| text.starts_with(v)))
            {
                Some((_, key)) => TentError::Config(format!("{key}: {text}")),
                None => TentError::Config(text),
            }
        })?;
        let metadata_conn = match (file.metadata_type.as_deref(), &file.metadata_servers) {
            (None | Some("p2p" | "P2PHANDSHAKE"), _) => "P2PHANDSHAKE".to_string(),
            (Some("etcd"), Some(s)) => format!("etcd://{s}"),
            (Some("redis"), Some(s)) if s.starts_with("redis://") => s.clone(),
            (Some("redis"), Some(s)) => format!("redis://{s}"),
            (Some("http"), Some(s)) => s.clone(),
            (Some(t), None) => return Err(bad("metadata_servers", format!("needed for {t}"))),
            (Some(t), _) => return Err(bad("metadata_type", format!("unknown type {t:?}"))),
        };
        let named = |s: &Option<String>| s.clone().filter(|n| !n.trim().is_empty());
        let local = named(&file.local_segment_name)
            .or_else(|| named(&file.rpc_server_hostname))
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
        let auto_failover = file
            .enable_auto_failover_on_poll
            .or(file.enable_auto_failover)
            .unwrap_or(true);
        Ok(TentConfig {
            core,
            metadata_conn,
            local_segment_name: local,
            rpc_server_port: file.rpc_server_port.unwrap_or(0),
            max_failover_attempts: attempts,
            auto_failover,
            max_inflight_tasks: inflight,
            transports: file.transports,
            policy: file.policy,
            staging: file.staging,
            metrics,
            settings: settings
                .into_iter()
                .filter(|(var, _)| lookup(var).is_none())
                .map(|(var, (value, _))| (var, value))
                .collect(),
            plan_first: None,
        })
    }

    /// Variable `name` as te runs with it: the environment's, else the file's.
    pub fn lookup(&self, name: &str) -> Option<String> {
        te_sys::env::process(name).or_else(|| self.settings.get(name).cloned())
    }

    /// Whether transport `name` (te's name) is enabled (it is unless its `enable` is false).
    pub fn enabled(&self, name: &str) -> bool {
        self.transports
            .get(name)
            .and_then(|t| t.enable)
            .unwrap_or(true)
    }

    /// The name the engine starts under: the local segment name, with `rpc_server_port`
    /// added when the name has no port and the port is not 0.
    pub fn segment_name(&self) -> String {
        let name = self.local_segment_name.trim();
        let has_port = te_core::control::parse_segment_name(name, 0).is_ok_and(|(_, p)| p != 0);
        match (has_port, self.rpc_server_port) {
            (false, port) if port != 0 => format!("{name}:{port}"),
            _ => name.to_string(),
        }
    }

    /// The slice timeout classic settings give, if any.
    pub fn slice_timeout(&self) -> Option<Duration> {
        self.core.slice_timeout
    }
}

impl TentFile {
    /// Parses `source`: inline JSON when it starts with `{` (or `[`), else the path of a JSON
    /// file.
    ///
    /// # Errors
    /// [`TentError::Config`]: unreadable, too large, not JSON, or a value of the wrong type
    /// or out of range (naming its key).
    pub fn parse_source(source: &str) -> Result<Self, TentError> {
        let text = match source.trim_start().starts_with(['{', '[']) {
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
        let root: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| TentError::Config(format!("not JSON: {e}")))?;
        Self::from_value(root)
    }

    /// Checks and reads a configuration already parsed as JSON (flat keys such as
    /// `"transports/rdma/enable"` are read as TENT reads them).
    ///
    /// # Errors
    /// As [`parse_source`](Self::parse_source).
    pub fn from_value(mut root: serde_json::Value) -> Result<Self, TentError> {
        keys::nest_flat_keys(&mut root);
        let audit = keys::audit(&root).map_err(TentError::Config)?;
        let mut file: TentFile =
            serde_json::from_value(root).map_err(|e| TentError::Config(e.to_string()))?;
        file.mapped = audit.mapped;
        file.ignored = audit
            .ignored
            .into_iter()
            .map(|(k, why)| (k, why.to_string()))
            .chain(audit.unknown.into_iter().map(|k| {
                (
                    k,
                    "neither TENT nor te reads this key (a typo?)".to_string(),
                )
            }))
            .collect();
        Ok(file)
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
            c.transports["rdma"].devices,
            Some(vec!["eth1".to_string(), "eth2".to_string()])
        );
        assert_eq!(
            c.core.nic_filter.allow, None,
            "TCP's interfaces are not filtered"
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
            (r#"{"metadata_type": "etcd"}"#, "metadata_servers"),
            (r#"{"metadata_type": "zk", "metadata_servers": "x"}"#, "zk"),
            (r#"{"max_failover_attempts": 99}"#, "max_failover_attempts"),
            (r#"{"staging": {"chunk_size": 1}}"#, "chunk_size"),
            (r#"{"policy": [{"transports": []}]}"#, "policy"),
            (
                r#"{"policy": [{"priority": "urgent", "transports": ["tcp"]}]}"#,
                "urgent",
            ),
            (r#"{"env": {"MC_SLICE_SIZE": "lots"}}"#, "env.MC_SLICE_SIZE"),
            (
                r#"{"transports": {"rdma": {"workers": {"num_workers": 9}}}}"#,
                "transports.rdma.workers.num_workers",
            ),
            (
                r#"{"transports": {"rdma": {"num_lanes": 12}}}"#,
                "transports.rdma.num_lanes (as MC_WORKERS_PER_CTX)",
            ),
            (
                r#"{"transports": {"io_uring": {"enable": true}, "uring": {"enable": false}}}"#,
                "given twice",
            ),
            (r#"{"log_level": "chatty"}"#, "log_level (as MC_LOG_LEVEL)"),
            (r#"{"rpc_server_port": true}"#, "rpc_server_port"),
            ("/nonexistent/tent.json", "nonexistent"),
            ("[1, 2]", "a JSON object"),
        ];
        for (source, needle) in cases {
            let err = TentFile::parse_source(source)
                .and_then(|f| TentConfig::from_file(f, |_| None))
                .unwrap_err();
            assert!(err.to_string().contains(needle), "{source}: {err}");
        }
    }

    #[test]
    fn the_metrics_block_wins_over_its_variables_as_in_tent() {
        let env = te_sys::env::table(&[
            ("TENT_METRICS_ENABLED", "0"),
            ("TENT_METRICS_HTTP_PORT", "9300"),
            ("TENT_METRICS_REPORT_INTERVAL", "7"),
        ]);
        let file = TentFile::parse_source(r#"{"metrics": {"enabled": true, "http_port": "9200"}}"#)
            .unwrap();
        let c = TentConfig::from_file(file, &env).unwrap();
        assert_eq!(c.metrics.http, Some("127.0.0.1:9200".parse().unwrap()));
        assert_eq!(c.metrics.report_every, Some(Duration::from_secs(7)));
        let off = TentConfig::from_file(TentFile::default(), |_| None).unwrap();
        assert!(!off.metrics.counting(), "off unless asked");
        let bad = TentFile::parse_source(r#"{"metrics": {"enabled": true, "http_host": "here"}}"#)
            .and_then(|f| TentConfig::from_file(f, |_| None))
            .unwrap_err()
            .to_string();
        assert!(bad.contains("metrics.http_host"), "{bad}");
    }

    #[test]
    fn unknown_keys_are_reported_not_refused() {
        let file =
            TentFile::parse_source(r#"{"transports": {"rdma": {"wrokers": {}}}, "colour": 1}"#)
                .unwrap();
        let keys: Vec<&str> = file.ignored.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["colour", "transports.rdma.wrokers"]);
        assert!(file.ignored[0].1.contains("neither TENT nor te"));
        TentConfig::from_file(file, |_| None).expect("starts all the same");
    }

    #[test]
    fn mooncakes_rules_and_names_read_as_tes() {
        let file = TentFile::parse_source(
            r#"{"local_segment_name": "", "rpc_server_hostname": "127.0.0.1",
                "rpc_server_port": "15123", "enable_auto_failover_on_poll": false,
                "transports": {"io_uring": {"enable": false},
                               "shm": {"cxl_mount_path": "/mnt/cxl"},
                               "rdma": {"num_lanes": 3, "endpoint": {"qp_mul_factor": 5},
                                        "max_timeout_ns": 10000000000,
                                        "device": {"gid_index": 1}}},
                "policy": [{"name": "files", "segment_type": "file", "priority": "LOW",
                            "intent_type": "checkpoint",
                            "transports": ["gds", "io_uring", "unspec", "rdma"]},
                           {"segment_type": "memory", "priority": 0,
                            "transports": ["mnnvl", "tcp"]}]}"#,
        )
        .unwrap();
        let c = TentConfig::from_file(file, |_| None).unwrap();
        assert_eq!(c.segment_name(), "127.0.0.1:15123");
        assert!(!c.auto_failover);
        assert!(!c.enabled("uring") && c.enabled("tcp"));
        assert_eq!(
            c.transports["shm"].cxl_mount_path.as_deref(),
            Some("/mnt/cxl")
        );
        assert_eq!(c.core.num_qp_per_ep, 5, "qp_mul_factor given itself");
        assert_eq!(c.core.workers_per_ctx, 3, "num_lanes fills the rest");
        assert_eq!(c.lookup("MC_NUM_CQ_PER_CTX").as_deref(), Some("3"));
        assert_eq!(c.lookup("MC_GID_INDEX").as_deref(), Some("1"));
        assert_eq!(c.core.slice_timeout, Some(Duration::from_secs(10)));
        let files = &c.policy[0];
        assert_eq!(files.transports, ["gds", "uring", "rdma"]);
        assert_eq!(files.priority, Some(vec![crate::Priority::Low]));
        assert_eq!(files.intent, Some(vec![crate::Intent::Checkpoint]));
        assert_eq!(c.policy[1].transports, ["nvlink", "tcp"]);
        assert_eq!(c.policy[1].priority, Some(vec![crate::Priority::High]));
    }
}
