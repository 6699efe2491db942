//! The variables te-reactor reads: the limits of te's servers and of the initiator's loops.
//! `docs/configuration.md` is generated from these (`cargo xtask config`).

use te_sys::env::{Setting, Unset, Value};

pub(crate) const TE_SERVER_THREADS: Setting = Setting {
    name: "MC_TE_SERVER_THREADS",
    value: Value::Number {
        unset: Unset::Means("cores, at most 8"),
        min: 1,
        max: 256,
    },
    doc: "event-loop threads of each data listener",
};
pub(crate) const TE_MAX_DATA_CONNECTIONS: Setting = Setting {
    name: "MC_TE_MAX_DATA_CONNECTIONS",
    value: Value::Number {
        unset: Unset::Is(10240),
        min: 1,
        max: 1048576,
    },
    doc: "data connections a listener holds; more are refused with a reason",
};
pub(crate) const TE_MAX_DATA_CONNECTIONS_PER_ADDRESS: Setting = Setting {
    name: "MC_TE_MAX_DATA_CONNECTIONS_PER_ADDRESS",
    value: Value::Number {
        unset: Unset::Is(1024),
        min: 0,
        max: 1048576,
    },
    doc: "data connections from one source (an IPv4 address, an IPv6 /64; loopback too unless MC_TE_CAP_LOOPBACK=0)",
};
pub(crate) const TE_CONTROL_THREADS: Setting = Setting {
    name: "MC_TE_CONTROL_THREADS",
    value: Value::Number {
        unset: Unset::Is(1),
        min: 1,
        max: 64,
    },
    doc: "event-loop threads of the control listener",
};
pub(crate) const TE_MAX_CONTROL_CONNECTIONS: Setting = Setting {
    name: "MC_TE_MAX_CONTROL_CONNECTIONS",
    value: Value::Number {
        unset: Unset::Is(4096),
        min: 1,
        max: 1048576,
    },
    doc: "control connections held at once",
};
pub(crate) const TE_MAX_CONTROL_CONNECTIONS_PER_ADDRESS: Setting = Setting {
    name: "MC_TE_MAX_CONTROL_CONNECTIONS_PER_ADDRESS",
    value: Value::Number {
        unset: Unset::Is(64),
        min: 0,
        max: 1048576,
    },
    doc: "control connections from one source (an IPv4 address, an IPv6 /64; loopback too unless MC_TE_CAP_LOOPBACK=0)",
};
pub(crate) const TE_CAP_LOOPBACK: Setting = Setting {
    name: "MC_TE_CAP_LOOPBACK",
    value: Value::Flag { unset: true },
    doc: "whether loopback sources are held to the per-source caps like any other (0: exempt, for a host whose processes stand for many peers)",
};
pub(crate) const TE_CONN_REPLY_BYTES: Setting = Setting {
    name: "MC_TE_CONN_REPLY_BYTES",
    value: Value::Bytes {
        unset: Unset::Is(4096),
        min: 64,
        max: 1 << 20,
    },
    doc: "reply bytes a data connection gathers before sending them",
};
pub(crate) const TE_CLIENT_THREADS: Setting = Setting {
    name: "MC_TE_CLIENT_THREADS",
    value: Value::Number {
        unset: Unset::Means("cores, 4 to 8"),
        min: 1,
        max: 256,
    },
    doc: "event-loop threads driving every TCP lane of an engine",
};
pub(crate) const TE_LISTEN_BACKLOG: Setting = Setting {
    name: "MC_TE_LISTEN_BACKLOG",
    value: Value::Number {
        unset: Unset::Is(4096),
        min: 1,
        max: 65535,
    },
    doc: "connections each listener's kernel queue holds before they are accepted (Linux caps it at `net.core.somaxconn`)",
};

/// Every variable this crate reads, in the order the reference lists them.
pub const SETTINGS: &[Setting] = &[
    TE_SERVER_THREADS,
    TE_MAX_DATA_CONNECTIONS,
    TE_MAX_DATA_CONNECTIONS_PER_ADDRESS,
    TE_CONTROL_THREADS,
    TE_MAX_CONTROL_CONNECTIONS,
    TE_MAX_CONTROL_CONNECTIONS_PER_ADDRESS,
    TE_CAP_LOOPBACK,
    TE_CONN_REPLY_BYTES,
    TE_CLIENT_THREADS,
    TE_LISTEN_BACKLOG,
];
