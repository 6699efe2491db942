//! The variables te-core reads: the engine's, the control channel's, the metadata clients', the
//! Mooncake opt-in's and which NICs serve as rails.
//! `docs/configuration.md` is generated from these (`cargo xtask config`).

use te_sys::env::Setting;

pub(crate) const SLICE_SIZE: Setting = Setting {
    name: "MC_SLICE_SIZE",
    default: "65536",
    range: "4096–1 GiB",
    doc: "bytes per slice (TCP; the copy and file transports take 1 MiB slices)",
};
pub(crate) const FRAGMENT_RATIO: Setting = Setting {
    name: "MC_FRAGMENT_RATIO",
    default: "4",
    range: "1–1024",
    doc: "a tail up to `slice_size / ratio` is merged into the last slice",
};
pub(crate) const RETRY_CNT: Setting = Setting {
    name: "MC_RETRY_CNT",
    default: "9",
    range: "1–127",
    doc: "retries of a slice after a path failure (1–127)",
};
pub(crate) const TCP_BIND_ADDRESS: Setting = Setting {
    name: "MC_TCP_BIND_ADDRESS",
    default: "first running non-bridge interface",
    range: "an IP address",
    doc: "address the control and data listeners bind to",
};
pub(crate) const MIN_RPC_PORT: Setting = Setting {
    name: "MC_MIN_RPC_PORT",
    default: "15000, 17000",
    range: "1–65535",
    doc: "port range of the control listener",
};
pub(crate) const MAX_RPC_PORT: Setting = Setting {
    name: "MC_MAX_RPC_PORT",
    default: "15000, 17000",
    range: "1–65535",
    doc: "port range of the control listener",
};
pub(crate) const HANDSHAKE_CONNECT_TIMEOUT: Setting = Setting {
    name: "MC_HANDSHAKE_CONNECT_TIMEOUT",
    default: "5",
    range: "1–3600",
    doc: "control connect timeout, seconds",
};
pub(crate) const HANDSHAKE_MAX_LENGTH: Setting = Setting {
    name: "MC_HANDSHAKE_MAX_LENGTH",
    default: "1 MiB",
    range: "1–128 MiB",
    doc: "largest control frame (its length field, type byte included), bytes",
};
pub(crate) const HANDSHAKE_PORT: Setting = Setting {
    name: "MC_HANDSHAKE_PORT",
    default: "12001",
    range: "1–65535",
    doc: "the control port of a peer named without one",
};
pub(crate) const SLICE_TIMEOUT: Setting = Setting {
    name: "MC_SLICE_TIMEOUT",
    default: "off",
    range: "1–65535",
    doc: "per-task deadline, seconds (ends TIMEOUT)",
};
pub(crate) const DISABLE_METACACHE: Setting = Setting {
    name: "MC_DISABLE_METACACHE",
    default: "off",
    range: "0/1",
    doc: "re-fetch descriptors on every open",
};
pub(crate) const LOG_LEVEL: Setting = Setting {
    name: "MC_LOG_LEVEL",
    default: "INFO",
    range: "TRACE, DEBUG, INFO, WARNING, ERROR",
    doc: "TRACE, DEBUG, INFO, WARNING, ERROR",
};
pub(crate) const TE_MERGE_REQUESTS: Setting = Setting {
    name: "MC_TE_MERGE_REQUESTS",
    default: "on",
    range: "0/1",
    doc: "merge requests of one submit that are contiguous in both memories before slicing (TENT's `merge_requests`)",
};
pub(crate) const TE_FILTERS: Setting = Setting {
    name: "MC_TE_FILTERS",
    default: "all physical",
    range: "interface names, comma-separated",
    doc: "NICs to use (allow-list, comma-separated); names virtual interfaces in too",
};
pub(crate) const TE_FILTERS_EXCLUDE: Setting = Setting {
    name: "MC_TE_FILTERS_EXCLUDE",
    default: "none",
    range: "interface names, comma-separated",
    doc: "NICs never to use",
};
pub(crate) const CUSTOM_TOPO_JSON: Setting = Setting {
    name: "MC_CUSTOM_TOPO_JSON",
    default: "discover",
    range: "a file path",
    doc: "a priority-matrix file (`{\"cpu:0\": [[\"eth0\"], [\"eth1\"]]}`) instead of discovery",
};
pub(crate) const PATH_ROUNDROBIN: Setting = Setting {
    name: "MC_PATH_ROUNDROBIN",
    default: "off",
    range: "0/1",
    doc: "stripe tasks from a shared counter instead of a random start",
};
pub(crate) const RDMA_RAIL_PAUSE_SECONDS: Setting = Setting {
    name: "MC_RDMA_RAIL_PAUSE_SECONDS",
    default: "30",
    range: "1–3600",
    doc: "how long a failing rail is first paused; each pause in a row doubles it",
};
pub(crate) const TE_RAIL_ERROR_THRESHOLD: Setting = Setting {
    name: "MC_TE_RAIL_ERROR_THRESHOLD",
    default: "3, 10",
    range: "1–1000",
    doc: "errors within the window that pause a rail",
};
pub(crate) const TE_RAIL_ERROR_WINDOW_SECS: Setting = Setting {
    name: "MC_TE_RAIL_ERROR_WINDOW_SECS",
    default: "3, 10",
    range: "1–3600",
    doc: "errors within the window that pause a rail",
};
pub(crate) const TE_RAIL_COOLDOWN_MAX_SECS: Setting = Setting {
    name: "MC_TE_RAIL_COOLDOWN_MAX_SECS",
    default: "300",
    range: "1–86400",
    doc: "longest pause of a rail that keeps failing",
};
pub(crate) const MAX_EP_PER_CTX: Setting = Setting {
    name: "MC_MAX_EP_PER_CTX",
    default: "65535",
    range: "1–65535",
    doc: "endpoints (TCP: lane groups per peer rail) kept before eviction",
};
pub(crate) const ENDPOINT_STORE_TYPE: Setting = Setting {
    name: "MC_ENDPOINT_STORE_TYPE",
    default: "SIEVE",
    range: "SIEVE, FIFO",
    doc: "eviction policy of the endpoint store: SIEVE or FIFO",
};
pub(crate) const NUM_QP_PER_EP: Setting = Setting {
    name: "MC_NUM_QP_PER_EP",
    default: "2, 2",
    range: "1–255",
    doc: "RDMA queue pairs per endpoint, worker threads (completion lanes) per device",
};
pub(crate) const WORKERS_PER_CTX: Setting = Setting {
    name: "MC_WORKERS_PER_CTX",
    default: "2, 2",
    range: "1–8",
    doc: "RDMA queue pairs per endpoint, worker threads (completion lanes) per device",
};
pub(crate) const METADATA_CLUSTER_ID: Setting = Setting {
    name: "MC_METADATA_CLUSTER_ID",
    default: "none",
    range: "a name",
    doc: "namespace of the metadata keys (`mooncake/<id>/…`)",
};
pub(crate) const REDIS_USERNAME: Setting = Setting {
    name: "MC_REDIS_USERNAME",
    default: "none, none, 0",
    range: "a name",
    doc: "Redis login and database",
};
pub(crate) const REDIS_PASSWORD: Setting = Setting {
    name: "MC_REDIS_PASSWORD",
    default: "none, none, 0",
    range: "text",
    doc: "Redis login and database",
};
pub(crate) const REDIS_DB_INDEX: Setting = Setting {
    name: "MC_REDIS_DB_INDEX",
    default: "none, none, 0",
    range: "0–65535",
    doc: "Redis login and database",
};
pub(crate) const METADATA_REFRESH_SECS: Setting = Setting {
    name: "MC_METADATA_REFRESH_SECS",
    default: "5",
    range: "1–3600",
    doc: "how often engines re-publish and re-read open segments in a shared service",
};
pub(crate) const TE_METADATA_REFRESH_BATCH: Setting = Setting {
    name: "MC_TE_METADATA_REFRESH_BATCH",
    default: "64",
    range: "1–1,000,000",
    doc: "open segments re-read per refresh, at most, in turn (a transfer a restarted peer refuses marks its descriptor for reading again anyway)",
};
pub(crate) const TE_CLUSTER_SECRET: Setting = Setting {
    name: "MC_TE_CLUSTER_SECRET",
    default: "none",
    range: "text",
    doc: "the cluster secret control peers must prove; descriptors signed with it (never printed)",
};
pub(crate) const TE_NOTIFY_MAX_BYTES: Setting = Setting {
    name: "MC_TE_NOTIFY_MAX_BYTES",
    default: "64K",
    range: "256 B–64 MiB (K/M suffixes)",
    doc: "largest notification accepted, as sent; a larger one is refused before it is read whole",
};
pub(crate) const TE_NOTIFY_QUEUE_BYTES: Setting = Setting {
    name: "MC_TE_NOTIFY_QUEUE_BYTES",
    default: "64M",
    range: "64 KiB–1 TiB (K/M/G suffixes)",
    doc: "notification bytes held until the application takes them; one source address (an IPv6 /64) may hold a quarter",
};
pub(crate) const TE_METADATA_TOKEN: Setting = Setting {
    name: "MC_TE_METADATA_TOKEN",
    default: "none",
    range: "printable ASCII",
    doc: "the bearer token sent to an HTTP metadata server (`te-metadata --token-file`; never printed)",
};
pub(crate) const TE_MOONCAKE_COMPAT: Setting = Setting {
    name: "MC_TE_MOONCAKE_COMPAT",
    default: "off",
    range: "0/1",
    doc: "serve Mooncake initiators on a separate listener without a credential (see [mooncake.md](mooncake.md))",
};
pub(crate) const TE_MOONCAKE_ALLOW: Setting = Setting {
    name: "MC_TE_MOONCAKE_ALLOW",
    default: "any",
    range: "CIDRs, comma-separated",
    doc: "networks (CIDR, comma-separated) Mooncake peers may connect from",
};
pub(crate) const TE_MOONCAKE_ALLOW_V1: Setting = Setting {
    name: "MC_TE_MOONCAKE_ALLOW_V1",
    default: "off",
    range: "0/1",
    doc: "accept Mooncake's unacknowledged TCP framing too",
};
pub(crate) const TE_MOONCAKE_WITH_CLUSTER_SECRET: Setting = Setting {
    name: "MC_TE_MOONCAKE_WITH_CLUSTER_SECRET",
    default: "off",
    range: "0/1",
    doc: "the second switch the opt-in needs when a cluster secret is set",
};
pub(crate) const CXL_DEV_PATH: Setting = Setting {
    name: "MC_CXL_DEV_PATH",
    default: "none",
    range: "a path",
    doc: "the CXL DAX device te-cxl maps",
};
pub(crate) const CXL_DEV_SIZE: Setting = Setting {
    name: "MC_CXL_DEV_SIZE",
    default: "the file's length",
    range: "bytes, K/M/G/T suffix",
    doc: "bytes of it to map (`64G`, `4096`); required for a DAX device",
};
pub(crate) const MIN_PRC_PORT: Setting = Setting {
    name: "MC_MIN_PRC_PORT",
    default: "unset",
    range: "1–65535",
    doc: "Mooncake's misspelling of `MC_MIN_RPC_PORT`, read when that is unset",
};
pub(crate) const MAX_PRC_PORT: Setting = Setting {
    name: "MC_MAX_PRC_PORT",
    default: "unset",
    range: "1–65535",
    doc: "Mooncake's misspelling of `MC_MAX_RPC_PORT`, read when that is unset",
};

/// Every variable this crate reads, in the order the reference lists them.
pub const SETTINGS: &[Setting] = &[
    SLICE_SIZE,
    FRAGMENT_RATIO,
    RETRY_CNT,
    TCP_BIND_ADDRESS,
    MIN_RPC_PORT,
    MAX_RPC_PORT,
    HANDSHAKE_CONNECT_TIMEOUT,
    HANDSHAKE_MAX_LENGTH,
    HANDSHAKE_PORT,
    SLICE_TIMEOUT,
    DISABLE_METACACHE,
    LOG_LEVEL,
    TE_MERGE_REQUESTS,
    TE_FILTERS,
    TE_FILTERS_EXCLUDE,
    CUSTOM_TOPO_JSON,
    PATH_ROUNDROBIN,
    RDMA_RAIL_PAUSE_SECONDS,
    TE_RAIL_ERROR_THRESHOLD,
    TE_RAIL_ERROR_WINDOW_SECS,
    TE_RAIL_COOLDOWN_MAX_SECS,
    MAX_EP_PER_CTX,
    ENDPOINT_STORE_TYPE,
    NUM_QP_PER_EP,
    WORKERS_PER_CTX,
    METADATA_CLUSTER_ID,
    REDIS_USERNAME,
    REDIS_PASSWORD,
    REDIS_DB_INDEX,
    METADATA_REFRESH_SECS,
    TE_METADATA_REFRESH_BATCH,
    TE_CLUSTER_SECRET,
    TE_NOTIFY_MAX_BYTES,
    TE_NOTIFY_QUEUE_BYTES,
    TE_METADATA_TOKEN,
    TE_MOONCAKE_COMPAT,
    TE_MOONCAKE_ALLOW,
    TE_MOONCAKE_ALLOW_V1,
    TE_MOONCAKE_WITH_CLUSTER_SECRET,
    CXL_DEV_PATH,
    CXL_DEV_SIZE,
    MIN_PRC_PORT,
    MAX_PRC_PORT,
];
