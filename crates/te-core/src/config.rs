//! Engine configuration: Mooncake's defaults, overridden by the `MC_*` variables users know.
//!
//! [`Config::default`] holds Mooncake's defaults; [`Config::from_env`] applies the environment;
//! [`Config::from_lookup`] applies any key→value source (tests use a table).
//! An unparsable or out-of-range value is an [`Error::InvalidConfig`] naming the variable,
//! never a silent default. This module reads no files and opens no sockets.

use std::net::IpAddr;
use std::time::Duration;

use te_sys::env;

use crate::error::{Error, Result};

/// Log verbosity, from `MC_LOG_LEVEL` (TRACE, DEBUG, INFO, WARNING, ERROR).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LogLevel {
    /// Everything.
    Trace,
    /// Decisions and connections.
    Debug,
    /// Start-up and notable events (the default).
    Info,
    /// Recoverable problems.
    Warning,
    /// Failures only.
    Error,
}

pub use te_reactor::secret::Redacted;

/// How a transport's endpoint store picks what to evict when full (`MC_ENDPOINT_STORE_TYPE`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EvictionPolicy {
    /// SIEVE: evict the oldest entry not used since the hand last passed (the default).
    Sieve,
    /// Evict the oldest entry.
    Fifo,
}

impl EvictionPolicy {
    /// Parses `MC_ENDPOINT_STORE_TYPE` (`SIEVE` or `FIFO`, any case).
    pub fn parse(s: &str) -> Option<Self> {
        match s.trim().to_ascii_uppercase().as_str() {
            "SIEVE" => Some(EvictionPolicy::Sieve),
            "FIFO" => Some(EvictionPolicy::Fifo),
            _ => None,
        }
    }
}

/// The engine's settings. Fields are public; build one with `Config::default()` and adjust.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Config {
    /// Bytes per slice (`MC_SLICE_SIZE`, default 65536).
    pub slice_size: u64,
    /// A remainder up to `slice_size + fragment_limit` is sent as one final slice
    /// (`MC_FRAGMENT_RATIO` = r sets it to `slice_size / r`; default `slice_size / 4`).
    pub fragment_limit: u64,
    /// Attempts after the first for a slice that failed on a retryable error (`MC_RETRY_CNT`, 1–127, default 9).
    pub retry_cnt: u32,
    /// Address the control and data listeners bind to (`MC_TCP_BIND_ADDRESS`).
    pub tcp_bind_address: Option<IpAddr>,
    /// Lowest port tried for the control listener (`MC_MIN_RPC_PORT`, default 15000).
    pub rpc_min_port: u16,
    /// Highest port tried for the control listener (`MC_MAX_RPC_PORT`, default 17000).
    pub rpc_max_port: u16,
    /// Connect timeout for control requests (`MC_HANDSHAKE_CONNECT_TIMEOUT`, seconds, default 5).
    pub handshake_connect_timeout: Duration,
    /// Largest control frame accepted (`MC_HANDSHAKE_MAX_LENGTH`, 1 B–128 MiB, default 1 MiB).
    pub handshake_max_length: usize,
    /// Per-task deadline after submit (`MC_SLICE_TIMEOUT`, seconds, 1–65535; default off).
    pub slice_timeout: Option<Duration>,
    /// Cache segment descriptors (`MC_DISABLE_METACACHE` turns this off).
    pub metacache: bool,
    /// Log verbosity (`MC_LOG_LEVEL`).
    pub log_level: LogLevel,
    /// Queue pairs per RDMA endpoint (`MC_NUM_QP_PER_EP`, 1–255, default 2).
    pub num_qp_per_ep: u32,
    /// Endpoints per RDMA context (`MC_MAX_EP_PER_CTX`, 1–65535, default 65536 clamped to 65535).
    pub max_ep_per_ctx: u32,
    /// Eviction policy of endpoint stores (`MC_ENDPOINT_STORE_TYPE`: SIEVE, the default, or FIFO).
    pub endpoint_store: EvictionPolicy,
    /// Worker threads per RDMA context (`MC_WORKERS_PER_CTX`, 1–8, default 2).
    pub workers_per_ctx: u32,
    /// NICs to use as rails, by name (te-bench's `--device_name`); `None` means discover them.
    pub rails: Option<Vec<String>>,
    /// `MC_TE_FILTERS` (allow-list) and `MC_TE_FILTERS_EXCLUDE` (deny-list) of NICs.
    pub nic_filter: te_topology::NicFilter,
    /// A priority matrix file to use instead of discovery (`MC_CUSTOM_TOPO_JSON`).
    pub custom_topo_json: Option<String>,
    /// Stripe tasks from a shared counter instead of a random start (`MC_PATH_ROUNDROBIN`).
    pub path_roundrobin: bool,
    /// Merge requests of one submit that are contiguous in both memories before slicing
    /// (`MC_TE_MERGE_REQUESTS`, default on; TENT's `merge_requests`). See [`crate::merge`].
    pub merge_requests: bool,
    /// How long a failing rail is paused (`MC_RDMA_RAIL_PAUSE_SECONDS`, default 30).
    pub rail_pause: Duration,
    /// Errors within `rail_error_window` that pause a rail (`MC_TE_RAIL_ERROR_THRESHOLD`, default 3).
    pub rail_error_threshold: usize,
    /// Window in which rail errors add up (`MC_TE_RAIL_ERROR_WINDOW_SECS`, default 10).
    pub rail_error_window: Duration,
    /// Longest pause of a rail failing again and again (`MC_TE_RAIL_COOLDOWN_MAX_SECS`, default 300).
    pub rail_cooldown_max: Duration,
    /// The CXL DAX device te-cxl maps (`MC_CXL_DEV_PATH`, e.g. `/dev/dax0.0`).
    pub cxl_dev_path: Option<std::path::PathBuf>,
    /// Bytes of the CXL device to map (`MC_CXL_DEV_SIZE`, bytes or with a K/M/G/T suffix;
    /// required for a DAX character device, defaults to the length of a regular file).
    pub cxl_dev_size: Option<u64>,
    /// The cluster secret (`MC_TE_CLUSTER_SECRET`, te's): control peers must prove it, and
    /// descriptors carry segment secrets sealed with it. Never printed.
    pub cluster_secret: Option<Redacted>,
    /// The token an HTTP metadata server asks for (`MC_TE_METADATA_TOKEN`: te-metadata's
    /// `--token-file`), sent as `Authorization: Bearer`. Never printed.
    pub metadata_token: Option<Redacted>,
    /// Namespace of the metadata keys (`MC_METADATA_CLUSTER_ID`: `mooncake/<id>/…`).
    pub metadata_cluster_id: Option<String>,
    /// Redis ACL user (`MC_REDIS_USERNAME`).
    pub redis_username: Option<String>,
    /// Redis password (`MC_REDIS_PASSWORD`); never printed.
    pub redis_password: Option<Redacted>,
    /// Redis database (`MC_REDIS_DB_INDEX`, 0–65535).
    pub redis_db_index: Option<u32>,
    /// How often the engine re-reads the descriptors of open segments from a shared metadata
    /// service and re-publishes its own (`MC_METADATA_REFRESH_SECS`, te's, default 5).
    pub metadata_refresh: Duration,
    /// How many open segments' descriptors are re-read at each refresh, in turn, so the load an
    /// engine puts on a shared service is bounded however many peers it opens
    /// (`MC_TE_METADATA_REFRESH_BATCH`, te's, default 64).
    pub metadata_refresh_batch: usize,
    /// Largest batch `allocate_batch` accepts (te's bound, not a Mooncake variable).
    pub max_batch_size: usize,
    /// What received notifications may hold until the application takes them: the largest
    /// one (`MC_TE_NOTIFY_MAX_BYTES`), bytes in all (`MC_TE_NOTIFY_QUEUE_BYTES`), and a count.
    pub notify: crate::notify::NotifyLimits,
    /// The control port of a peer named without one (`MC_HANDSHAKE_PORT`, default 12001, as
    /// Mooncake).
    pub handshake_port: u16,
    /// Serving Mooncake initiators (`MC_TE_MOONCAKE_*`); off by default.
    pub mooncake: crate::mooncake::MooncakeCompat,
    /// Connection caps and server threads (`MC_TE_SERVER_THREADS`, `MC_TE_MAX_*_CONNECTIONS`...).
    pub limits: te_reactor::limits::ServerLimits,
}

impl Default for Config {
    fn default() -> Self {
        use crate::settings as S;
        Config {
            slice_size: S::SLICE_SIZE.initial(),
            fragment_limit: S::SLICE_SIZE.initial::<u64>() / S::FRAGMENT_RATIO.initial::<u64>(),
            retry_cnt: S::RETRY_CNT.initial(),
            tcp_bind_address: None,
            rpc_min_port: S::MIN_RPC_PORT.initial(),
            rpc_max_port: S::MAX_RPC_PORT.initial(),
            handshake_connect_timeout: Duration::from_secs(S::HANDSHAKE_CONNECT_TIMEOUT.initial()),
            handshake_max_length: S::HANDSHAKE_MAX_LENGTH.initial(),
            slice_timeout: None,
            metacache: !S::DISABLE_METACACHE.on_by_default(),
            log_level: LogLevel::Info,
            num_qp_per_ep: S::NUM_QP_PER_EP.initial(),
            max_ep_per_ctx: S::MAX_EP_PER_CTX.initial(),
            workers_per_ctx: S::WORKERS_PER_CTX.initial(),
            endpoint_store: EvictionPolicy::Sieve,
            rails: None,
            nic_filter: te_topology::NicFilter::default(),
            custom_topo_json: None,
            path_roundrobin: S::PATH_ROUNDROBIN.on_by_default(),
            merge_requests: S::TE_MERGE_REQUESTS.on_by_default(),
            rail_pause: Duration::from_secs(S::RDMA_RAIL_PAUSE_SECONDS.initial()),
            rail_error_threshold: S::TE_RAIL_ERROR_THRESHOLD.initial(),
            rail_error_window: Duration::from_secs(S::TE_RAIL_ERROR_WINDOW_SECS.initial()),
            rail_cooldown_max: Duration::from_secs(S::TE_RAIL_COOLDOWN_MAX_SECS.initial()),
            cxl_dev_path: None,
            cxl_dev_size: None,
            cluster_secret: None,
            metadata_token: None,
            metadata_cluster_id: None,
            redis_username: None,
            redis_password: None,
            redis_db_index: None,
            metadata_refresh: Duration::from_secs(S::METADATA_REFRESH_SECS.initial()),
            metadata_refresh_batch: S::TE_METADATA_REFRESH_BATCH.initial(),
            max_batch_size: 1 << 20,
            notify: crate::notify::NotifyLimits::default(),
            handshake_port: S::HANDSHAKE_PORT.initial(),
            mooncake: crate::mooncake::MooncakeCompat::default(),
            limits: te_reactor::limits::ServerLimits::default(),
        }
    }
}

impl LogLevel {
    /// `MC_LOG_LEVEL` of the process environment, if set.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for a level it does not name.
    pub fn from_env() -> Result<Option<Self>> {
        let name = crate::settings::LOG_LEVEL.name;
        te_sys::env::process(name)
            .filter(|v| !v.trim().is_empty())
            .map(|v| Self::parse(name, &v))
            .transpose()
    }

    fn parse(name: &str, value: &str) -> Result<Self> {
        match value.trim().to_ascii_uppercase().as_str() {
            "TRACE" => Ok(LogLevel::Trace),
            "DEBUG" => Ok(LogLevel::Debug),
            "INFO" => Ok(LogLevel::Info),
            "WARNING" | "WARN" => Ok(LogLevel::Warning),
            "ERROR" => Ok(LogLevel::Error),
            _ => Err(
                env::invalid(name, value, "expected TRACE, DEBUG, INFO, WARNING or ERROR").into(),
            ),
        }
    }
}

impl Config {
    /// Mooncake's defaults overridden by the process environment.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the first variable whose value is unusable.
    pub fn from_env() -> Result<Self> {
        Self::from_lookup(te_sys::env::process)
    }

    /// Mooncake's defaults overridden by `lookup(name)` for each known `MC_*` name.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the first variable whose value is unusable.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self> {
        use crate::settings as S;
        let mut c = Config::default();
        let get = |name: &str| lookup(name).filter(|v| !v.trim().is_empty());
        let env = env::Env::new(&get);
        let secs = |s: &env::Setting| env.number_or_initial(s).map(Duration::from_secs);
        c.slice_size = env.number_or_initial(&S::SLICE_SIZE)?;
        c.fragment_limit = c.slice_size / env.number_or_initial::<u64>(&S::FRAGMENT_RATIO)?;
        c.retry_cnt = env.number_or_initial(&S::RETRY_CNT)?;
        c.tcp_bind_address = env.parsed(&S::TCP_BIND_ADDRESS, |v| {
            v.parse().map_err(|_| "not an IP address".to_string())
        })?;
        // Mooncake's misspelt names count where the right ones are unset.
        c.rpc_min_port = match env.number(&S::MIN_RPC_PORT)? {
            Some(p) => p,
            None => env.number(&S::MIN_PRC_PORT)?.unwrap_or(c.rpc_min_port),
        };
        c.rpc_max_port = match env.number(&S::MAX_RPC_PORT)? {
            Some(p) => p,
            None => env.number(&S::MAX_PRC_PORT)?.unwrap_or(c.rpc_max_port),
        };
        if c.rpc_min_port > c.rpc_max_port {
            return Err(env::invalid(
                S::MIN_RPC_PORT.name,
                &c.rpc_min_port.to_string(),
                format!("greater than MC_MAX_RPC_PORT ({})", c.rpc_max_port),
            )
            .into());
        }
        c.handshake_connect_timeout = secs(&S::HANDSHAKE_CONNECT_TIMEOUT)?;
        c.handshake_max_length = env.number_or_initial(&S::HANDSHAKE_MAX_LENGTH)?;
        c.slice_timeout = env.number(&S::SLICE_TIMEOUT)?.map(Duration::from_secs);
        c.metacache = !env.flag_or_initial(&S::DISABLE_METACACHE)?;
        if let Some(v) = get(S::LOG_LEVEL.name) {
            c.log_level = LogLevel::parse(S::LOG_LEVEL.name, &v)?;
        }
        c.num_qp_per_ep = env.number_or_initial(&S::NUM_QP_PER_EP)?;
        c.max_ep_per_ctx = env.number_or_initial(&S::MAX_EP_PER_CTX)?;
        c.workers_per_ctx = env.number_or_initial(&S::WORKERS_PER_CTX)?;
        if let Some(v) = get(S::ENDPOINT_STORE_TYPE.name) {
            c.endpoint_store = EvictionPolicy::parse(&v).ok_or_else(|| {
                env::invalid(S::ENDPOINT_STORE_TYPE.name, &v, "expected SIEVE or FIFO")
            })?;
        }
        c.nic_filter = te_topology::NicFilter::from_lookup(|k| get(k));
        c.custom_topo_json = get(S::CUSTOM_TOPO_JSON.name);
        c.path_roundrobin = env.flag_or_initial(&S::PATH_ROUNDROBIN)?;
        c.merge_requests = env.flag_or_initial(&S::TE_MERGE_REQUESTS)?;
        c.rail_pause = secs(&S::RDMA_RAIL_PAUSE_SECONDS)?;
        c.rail_error_threshold = env.number_or_initial(&S::TE_RAIL_ERROR_THRESHOLD)?;
        c.rail_error_window = secs(&S::TE_RAIL_ERROR_WINDOW_SECS)?;
        c.rail_cooldown_max = secs(&S::TE_RAIL_COOLDOWN_MAX_SECS)?;
        c.cxl_dev_path = get(crate::settings::CXL_DEV_PATH.name).map(|v| v.trim().into());
        // Set is set: an empty or weak secret is refused, never taken for none.
        if let Some(secret) = lookup(crate::settings::TE_CLUSTER_SECRET.name) {
            te_reactor::secret::check_secret(&secret).map_err(|reason| Error::InvalidConfig {
                name: crate::settings::TE_CLUSTER_SECRET.name.into(),
                value: "<redacted>".into(),
                reason,
            })?;
            c.cluster_secret = Some(Redacted(secret));
        }
        c.metadata_token =
            match lookup(crate::settings::TE_METADATA_TOKEN.name).filter(|v| !v.is_empty()) {
                Some(t) if t.bytes().all(|b| b.is_ascii_graphic()) => Some(Redacted(t)),
                Some(_) => {
                    return Err(Error::InvalidConfig {
                        name: crate::settings::TE_METADATA_TOKEN.name.into(),
                        value: "<redacted>".into(),
                        reason: "must be printable ASCII without spaces".into(),
                    });
                }
                None => None,
            };
        c.metadata_cluster_id =
            get(crate::settings::METADATA_CLUSTER_ID.name).map(|v| v.trim().to_string());
        c.redis_username = get(crate::settings::REDIS_USERNAME.name);
        c.redis_password = lookup(crate::settings::REDIS_PASSWORD.name)
            .filter(|v| !v.is_empty())
            .map(Redacted);
        c.redis_db_index = env.number(&S::REDIS_DB_INDEX)?;
        c.metadata_refresh = secs(&S::METADATA_REFRESH_SECS)?;
        c.metadata_refresh_batch = env.number_or_initial(&S::TE_METADATA_REFRESH_BATCH)?;
        c.cxl_dev_size = env.number(&S::CXL_DEV_SIZE)?;
        c.handshake_port = env.number_or_initial(&S::HANDSHAKE_PORT)?;
        c.notify.max_message = env.number_or_initial(&S::TE_NOTIFY_MAX_BYTES)?;
        c.notify.max_queued = env.number_or_initial(&S::TE_NOTIFY_QUEUE_BYTES)?;
        c.mooncake = crate::mooncake::MooncakeCompat::from_lookup(|k| get(k))?;
        c.limits = te_reactor::limits::ServerLimits::from_lookup(|k| get(k))?;
        c.mooncake.check(c.cluster_secret.is_some())?;
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn with(pairs: &[(&str, &str)]) -> Result<Config> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::from_lookup(|k| map.get(k).cloned())
    }

    #[test]
    fn an_empty_or_weak_cluster_secret_refuses_the_start() {
        for weak in ["", "s3cret", "aaaabbbbccccddddeeee"] {
            let err = with(&[("MC_TE_CLUSTER_SECRET", weak)]).unwrap_err();
            let text = err.to_string();
            assert!(
                text.contains("MC_TE_CLUSTER_SECRET") && text.contains("openssl rand"),
                "{weak:?}: {text}"
            );
            assert!(
                weak.is_empty() || !text.contains(weak),
                "never shown: {text}"
            );
        }
        let strong = "9f86d081884c7d659a2feaa0c55ad015";
        let c = with(&[("MC_TE_CLUSTER_SECRET", strong)]).unwrap();
        assert_eq!(c.cluster_secret.as_ref().map(|s| s.expose()), Some(strong));
        assert!(with(&[]).unwrap().cluster_secret.is_none());
        // A Config made in code is checked when an engine starts.
        let code = Config {
            cluster_secret: Some(Redacted("s3cret".into())),
            ..Config::default()
        };
        let err = crate::TransferEngine::init(code, "P2PHANDSHAKE", "127.0.0.1").unwrap_err();
        assert!(err.to_string().contains("MC_TE_CLUSTER_SECRET"), "{err}");
    }

    #[test]
    fn metadata_settings_parse_and_the_password_stays_hidden() {
        let c = with(&[
            ("MC_METADATA_CLUSTER_ID", "prod"),
            ("MC_REDIS_USERNAME", "te"),
            ("MC_REDIS_PASSWORD", "hunter2"),
            ("MC_REDIS_DB_INDEX", "3"),
        ])
        .unwrap();
        assert_eq!(c.metadata_cluster_id.as_deref(), Some("prod"));
        assert_eq!(c.redis_username.as_deref(), Some("te"));
        assert_eq!(
            c.redis_password.as_ref().map(Redacted::expose),
            Some("hunter2")
        );
        assert_eq!(c.redis_db_index, Some(3));
        assert!(!format!("{c:?}").contains("hunter2"));
        assert!(with(&[("MC_REDIS_DB_INDEX", "-1")]).is_err());
        let c = with(&[
            ("MC_METADATA_REFRESH_SECS", "2"),
            ("MC_TE_METADATA_REFRESH_BATCH", "500"),
        ])
        .unwrap();
        assert_eq!(c.metadata_refresh, Duration::from_secs(2));
        assert_eq!(c.metadata_refresh_batch, 500);
        assert_eq!(Config::default().metadata_refresh_batch, 64);
        assert!(with(&[("MC_TE_METADATA_REFRESH_BATCH", "0")]).is_err());
    }

    #[test]
    fn cxl_device_settings_parse_sizes() {
        let c = with(&[
            ("MC_CXL_DEV_PATH", "/dev/dax0.0"),
            ("MC_CXL_DEV_SIZE", "64M"),
        ])
        .unwrap();
        assert_eq!(
            c.cxl_dev_path.as_deref(),
            Some(std::path::Path::new("/dev/dax0.0"))
        );
        assert_eq!(c.cxl_dev_size, Some(64 << 20));
        let c = with(&[("MC_CXL_DEV_SIZE", "4096")]).unwrap();
        assert_eq!(c.cxl_dev_size, Some(4096));
        assert_eq!(with(&[]).unwrap().cxl_dev_path, None);
    }

    #[test]
    fn defaults_match_mooncake() {
        let c = with(&[]).unwrap();
        assert_eq!(c.slice_size, 65536);
        assert_eq!(c.fragment_limit, 16384);
        assert_eq!(c.retry_cnt, 9);
        assert_eq!((c.rpc_min_port, c.rpc_max_port), (15000, 17000));
        assert_eq!(c.handshake_max_length, 1 << 20);
        assert_eq!(c.slice_timeout, None);
        assert_eq!(c.log_level, LogLevel::Info);
        assert!(c.metacache);
        assert!(c.merge_requests, "TENT merges by default");
        assert!(
            !with(&[("MC_TE_MERGE_REQUESTS", "0")])
                .unwrap()
                .merge_requests
        );
        assert!(
            with(&[("MC_TE_MERGE_REQUESTS", "maybe")])
                .unwrap_err()
                .to_string()
                .contains("MC_TE_MERGE_REQUESTS")
        );
    }

    #[test]
    fn variables_override_defaults() {
        let c = with(&[
            ("MC_SLICE_SIZE", "131072"),
            ("MC_RETRY_CNT", "3"),
            ("MC_TCP_BIND_ADDRESS", "127.0.0.1"),
            ("MC_LOG_LEVEL", "warning"),
            ("MC_SLICE_TIMEOUT", "7"),
            ("MC_DISABLE_METACACHE", "1"),
            ("MC_TE_FILTERS", "eth1,veth0"),
            ("MC_PATH_ROUNDROBIN", "1"),
            ("MC_RDMA_RAIL_PAUSE_SECONDS", "5"),
        ])
        .unwrap();
        assert_eq!(c.slice_size, 131072);
        assert_eq!(c.fragment_limit, 32768);
        assert_eq!(c.retry_cnt, 3);
        assert_eq!(c.tcp_bind_address, Some("127.0.0.1".parse().unwrap()));
        assert_eq!(c.log_level, LogLevel::Warning);
        assert_eq!(c.slice_timeout, Some(Duration::from_secs(7)));
        assert!(!c.metacache);
        assert!(c.nic_filter.names("veth0") && !c.nic_filter.admits("eth0", false));
        assert!(c.path_roundrobin);
        assert_eq!(c.rail_pause, Duration::from_secs(5));
    }

    #[test]
    fn invalid_values_name_the_variable() {
        let cases = [
            ("MC_SLICE_SIZE", "abc"),
            ("MC_SLICE_SIZE", "12"),
            ("MC_RETRY_CNT", "0"),
            ("MC_RETRY_CNT", "200"),
            ("MC_TCP_BIND_ADDRESS", "not-an-ip"),
            ("MC_LOG_LEVEL", "LOUD"),
            ("MC_HANDSHAKE_MAX_LENGTH", "999999999999"),
            ("MC_DISABLE_METACACHE", "maybe"),
            ("MC_WORKERS_PER_CTX", "9"),
            ("MC_PATH_ROUNDROBIN", "sometimes"),
            ("MC_ENDPOINT_STORE_TYPE", "LRU"),
            ("MC_RDMA_RAIL_PAUSE_SECONDS", "0"),
            ("MC_CXL_DEV_SIZE", "12X"),
            ("MC_CXL_DEV_SIZE", "0"),
            ("MC_CXL_DEV_SIZE", "99999999999T"),
        ];
        for (name, value) in cases {
            match with(&[(name, value)]) {
                Err(Error::InvalidConfig {
                    name: n, value: v, ..
                }) => {
                    assert_eq!(n, name);
                    assert_eq!(v, value);
                }
                other => panic!("{name}={value}: expected InvalidConfig, got {other:?}"),
            }
        }
    }

    #[test]
    fn port_range_must_be_ordered() {
        let err = with(&[("MC_MIN_RPC_PORT", "18000")]).unwrap_err();
        assert!(matches!(err, Error::InvalidConfig { ref name, .. } if name == "MC_MIN_RPC_PORT"));
    }
}
