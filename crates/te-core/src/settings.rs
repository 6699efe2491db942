//! The variables te-core reads: the engine's, the control channel's, the metadata clients', the
//! Mooncake opt-in's and which NICs serve as rails.
//! `docs/configuration.md` is generated from these (`cargo xtask config`).

use te_sys::env::{Setting, Unset, Value};

pub(crate) const SLICE_SIZE: Setting = Setting {
    name: "MC_SLICE_SIZE",
    value: Value::Bytes {
        unset: Unset::Is(65536),
        min: 4096,
        max: 1 << 30,
    },
    doc: "bytes per slice (TCP; the copy and file transports take 1 MiB slices)",
};
pub(crate) const FRAGMENT_RATIO: Setting = Setting {
    name: "MC_FRAGMENT_RATIO",
    value: Value::Number {
        unset: Unset::Is(4),
        min: 1,
        max: 1024,
    },
    doc: "a tail up to `slice_size / ratio` is merged into the last slice",
};
pub(crate) const RETRY_CNT: Setting = Setting {
    name: "MC_RETRY_CNT",
    value: Value::Number {
        unset: Unset::Is(9),
        min: 1,
        max: 127,
    },
    doc: "retries of a slice after a path failure",
};
pub(crate) const TCP_BIND_ADDRESS: Setting = Setting {
    name: "MC_TCP_BIND_ADDRESS",
    value: Value::Text {
        unset: "first running non-bridge interface",
        values: "an IP address",
    },
    doc: "address the control and data listeners bind to",
};
pub(crate) const MIN_RPC_PORT: Setting = Setting {
    name: "MC_MIN_RPC_PORT",
    value: Value::Number {
        unset: Unset::Is(15000),
        min: 1,
        max: 65535,
    },
    doc: "lowest port tried for the control listener",
};
pub(crate) const MAX_RPC_PORT: Setting = Setting {
    name: "MC_MAX_RPC_PORT",
    value: Value::Number {
        unset: Unset::Is(17000),
        min: 1,
        max: 65535,
    },
    doc: "highest port tried for the control listener",
};
pub(crate) const HANDSHAKE_CONNECT_TIMEOUT: Setting = Setting {
    name: "MC_HANDSHAKE_CONNECT_TIMEOUT",
    value: Value::Number {
        unset: Unset::Is(5),
        min: 1,
        max: 3600,
    },
    doc: "control connect timeout, seconds",
};
pub(crate) const HANDSHAKE_MAX_LENGTH: Setting = Setting {
    name: "MC_HANDSHAKE_MAX_LENGTH",
    value: Value::Bytes {
        unset: Unset::Is(1 << 20),
        min: 1,
        max: 128 << 20,
    },
    doc: "largest control frame (its length field, type byte included)",
};
pub(crate) const HANDSHAKE_PORT: Setting = Setting {
    name: "MC_HANDSHAKE_PORT",
    value: Value::Number {
        unset: Unset::Is(12001),
        min: 1,
        max: 65535,
    },
    doc: "the control port of a peer named without one",
};
pub(crate) const SLICE_TIMEOUT: Setting = Setting {
    name: "MC_SLICE_TIMEOUT",
    value: Value::Number {
        unset: Unset::Means("off"),
        min: 1,
        max: 65535,
    },
    doc: "per-task deadline, seconds (ends TIMEOUT)",
};
pub(crate) const DISABLE_METACACHE: Setting = Setting {
    name: "MC_DISABLE_METACACHE",
    value: Value::Flag { unset: false },
    doc: "re-fetch descriptors on every open",
};
pub(crate) const LOG_LEVEL: Setting = Setting {
    name: "MC_LOG_LEVEL",
    value: Value::Text {
        unset: "INFO",
        values: "TRACE, DEBUG, INFO, WARNING, ERROR",
    },
    doc: "the level of te's log",
};
pub(crate) const TE_MERGE_REQUESTS: Setting = Setting {
    name: "MC_TE_MERGE_REQUESTS",
    value: Value::Flag { unset: true },
    doc: "merge requests of one submit that are contiguous in both memories before slicing (TENT's `merge_requests`)",
};
pub(crate) const TE_FILTERS: Setting = Setting {
    name: "MC_TE_FILTERS",
    value: Value::Text {
        unset: "all physical",
        values: "interface names, comma-separated",
    },
    doc: "NICs to use (allow-list, comma-separated); names virtual interfaces in too",
};
pub(crate) const TE_FILTERS_EXCLUDE: Setting = Setting {
    name: "MC_TE_FILTERS_EXCLUDE",
    value: Value::Text {
        unset: "none",
        values: "interface names, comma-separated",
    },
    doc: "NICs never to use",
};
pub(crate) const CUSTOM_TOPO_JSON: Setting = Setting {
    name: "MC_CUSTOM_TOPO_JSON",
    value: Value::Text {
        unset: "discover",
        values: "a file path",
    },
    doc: "a priority-matrix file (`{\"cpu:0\": [[\"eth0\"], [\"eth1\"]]}`) instead of discovery",
};
pub(crate) const PATH_ROUNDROBIN: Setting = Setting {
    name: "MC_PATH_ROUNDROBIN",
    value: Value::Flag { unset: false },
    doc: "stripe tasks from a shared counter instead of a random start",
};
pub(crate) const RDMA_RAIL_PAUSE_SECONDS: Setting = Setting {
    name: "MC_RDMA_RAIL_PAUSE_SECONDS",
    value: Value::Number {
        unset: Unset::Is(30),
        min: 1,
        max: 3600,
    },
    doc: "how long a failing rail is first paused; each pause in a row doubles it",
};
pub(crate) const TE_RAIL_ERROR_THRESHOLD: Setting = Setting {
    name: "MC_TE_RAIL_ERROR_THRESHOLD",
    value: Value::Number {
        unset: Unset::Is(3),
        min: 1,
        max: 1000,
    },
    doc: "errors within `MC_TE_RAIL_ERROR_WINDOW_SECS` that pause a rail",
};
pub(crate) const TE_RAIL_ERROR_WINDOW_SECS: Setting = Setting {
    name: "MC_TE_RAIL_ERROR_WINDOW_SECS",
    value: Value::Number {
        unset: Unset::Is(10),
        min: 1,
        max: 3600,
    },
    doc: "the window, seconds, in which `MC_TE_RAIL_ERROR_THRESHOLD` errors pause a rail",
};
pub(crate) const TE_RAIL_COOLDOWN_MAX_SECS: Setting = Setting {
    name: "MC_TE_RAIL_COOLDOWN_MAX_SECS",
    value: Value::Number {
        unset: Unset::Is(300),
        min: 1,
        max: 86400,
    },
    doc: "longest pause of a rail that keeps failing",
};
pub(crate) const MAX_EP_PER_CTX: Setting = Setting {
    name: "MC_MAX_EP_PER_CTX",
    value: Value::Number {
        unset: Unset::Is(65535),
        min: 1,
        max: 65535,
    },
    doc: "endpoints (TCP: lane groups per peer rail) kept before eviction",
};
pub(crate) const ENDPOINT_STORE_TYPE: Setting = Setting {
    name: "MC_ENDPOINT_STORE_TYPE",
    value: Value::Text {
        unset: "SIEVE",
        values: "SIEVE, FIFO",
    },
    doc: "eviction policy of the endpoint store: SIEVE or FIFO",
};
pub(crate) const NUM_QP_PER_EP: Setting = Setting {
    name: "MC_NUM_QP_PER_EP",
    value: Value::Number {
        unset: Unset::Is(2),
        min: 1,
        max: 255,
    },
    doc: "RDMA queue pairs per endpoint",
};
pub(crate) const WORKERS_PER_CTX: Setting = Setting {
    name: "MC_WORKERS_PER_CTX",
    value: Value::Number {
        unset: Unset::Is(2),
        min: 1,
        max: 8,
    },
    doc: "RDMA worker threads (completion lanes) per device",
};
pub(crate) const METADATA_CLUSTER_ID: Setting = Setting {
    name: "MC_METADATA_CLUSTER_ID",
    value: Value::Text {
        unset: "none",
        values: "a name",
    },
    doc: "namespace of the metadata keys (`mooncake/<id>/…`)",
};
pub(crate) const REDIS_USERNAME: Setting = Setting {
    name: "MC_REDIS_USERNAME",
    value: Value::Text {
        unset: "none",
        values: "a name",
    },
    doc: "Redis login name",
};
pub(crate) const REDIS_PASSWORD: Setting = Setting {
    name: "MC_REDIS_PASSWORD",
    value: Value::Text {
        unset: "none",
        values: "text",
    },
    doc: "Redis password (never printed)",
};
pub(crate) const REDIS_DB_INDEX: Setting = Setting {
    name: "MC_REDIS_DB_INDEX",
    value: Value::Number {
        unset: Unset::Means("the server's (0)"),
        min: 0,
        max: 65535,
    },
    doc: "Redis database",
};
pub(crate) const METADATA_REFRESH_SECS: Setting = Setting {
    name: "MC_METADATA_REFRESH_SECS",
    value: Value::Number {
        unset: Unset::Is(5),
        min: 1,
        max: 3600,
    },
    doc: "how often engines re-publish and re-read open segments in a shared service",
};
pub(crate) const TE_METADATA_REFRESH_BATCH: Setting = Setting {
    name: "MC_TE_METADATA_REFRESH_BATCH",
    value: Value::Number {
        unset: Unset::Is(64),
        min: 1,
        max: 1000000,
    },
    doc: "open segments re-read per refresh, at most, in turn (a transfer a restarted peer refuses marks its descriptor for reading again anyway)",
};
pub(crate) const TE_CLUSTER_SECRET: Setting = Setting {
    name: "MC_TE_CLUSTER_SECRET",
    value: Value::Text {
        unset: "none",
        values: "text",
    },
    doc: "the cluster secret control peers must prove; descriptors signed with it (never printed)",
};
pub(crate) const TE_NOTIFY_MAX_BYTES: Setting = Setting {
    name: "MC_TE_NOTIFY_MAX_BYTES",
    value: Value::Bytes {
        unset: Unset::Is(64 << 10),
        min: 256,
        max: 64 << 20,
    },
    doc: "largest notification accepted, as sent; a larger one is refused before it is read whole",
};
pub(crate) const TE_NOTIFY_QUEUE_BYTES: Setting = Setting {
    name: "MC_TE_NOTIFY_QUEUE_BYTES",
    value: Value::Bytes {
        unset: Unset::Is(64 << 20),
        min: 64 << 10,
        max: 1 << 40,
    },
    doc: "notification bytes held until the application takes them; one source address (an IPv6 /64) may hold a quarter",
};
pub(crate) const TE_METADATA_TOKEN: Setting = Setting {
    name: "MC_TE_METADATA_TOKEN",
    value: Value::Text {
        unset: "none",
        values: "printable ASCII",
    },
    doc: "the bearer token sent to an HTTP metadata server (`te-metadata --token-file`; never printed)",
};
pub(crate) const TE_MOONCAKE_COMPAT: Setting = Setting {
    name: "MC_TE_MOONCAKE_COMPAT",
    value: Value::Flag { unset: false },
    doc: "serve Mooncake initiators on a separate listener without a credential (see [mooncake.md](mooncake.md))",
};
pub(crate) const TE_MOONCAKE_ALLOW: Setting = Setting {
    name: "MC_TE_MOONCAKE_ALLOW",
    value: Value::Text {
        unset: "any",
        values: "CIDRs, comma-separated",
    },
    doc: "networks (CIDR, comma-separated) Mooncake peers may connect from",
};
pub(crate) const TE_MOONCAKE_ALLOW_V1: Setting = Setting {
    name: "MC_TE_MOONCAKE_ALLOW_V1",
    value: Value::Flag { unset: false },
    doc: "accept Mooncake's unacknowledged TCP framing too",
};
pub(crate) const TE_MOONCAKE_WITH_CLUSTER_SECRET: Setting = Setting {
    name: "MC_TE_MOONCAKE_WITH_CLUSTER_SECRET",
    value: Value::Flag { unset: false },
    doc: "the second switch the opt-in needs when a cluster secret is set",
};
pub(crate) const CXL_DEV_PATH: Setting = Setting {
    name: "MC_CXL_DEV_PATH",
    value: Value::Text {
        unset: "none",
        values: "a path",
    },
    doc: "the CXL DAX device te-cxl maps",
};
pub(crate) const CXL_DEV_SIZE: Setting = Setting {
    name: "MC_CXL_DEV_SIZE",
    value: Value::Bytes {
        unset: Unset::Means("the file's length"),
        min: 1,
        max: 1 << 56,
    },
    doc: "bytes of it to map (`64G`, `4096`); required for a DAX device",
};
pub(crate) const MIN_PRC_PORT: Setting = Setting {
    name: "MC_MIN_PRC_PORT",
    value: Value::Number {
        unset: Unset::Means("unset"),
        min: 1,
        max: 65535,
    },
    doc: "Mooncake's misspelling of `MC_MIN_RPC_PORT`, read when that is unset",
};
pub(crate) const MAX_PRC_PORT: Setting = Setting {
    name: "MC_MAX_PRC_PORT",
    value: Value::Number {
        unset: Unset::Means("unset"),
        min: 1,
        max: 65535,
    },
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
