//! The variables te-tcp reads (`TcpSettings` holds what they say).
//! `docs/configuration.md` is generated from these (`cargo xtask config`).

use te_sys::env::{Setting, Unset, Value};

pub(crate) const TCP_LANES_PER_PEER: Setting = Setting {
    name: "MC_TCP_LANES_PER_PEER",
    value: Value::Number {
        unset: Unset::Is(4),
        min: 1,
        max: 64,
    },
    doc: "TCP connections per peer",
};
pub(crate) const TCP_STATUS_TIMEOUT_SEC: Setting = Setting {
    name: "MC_TCP_STATUS_TIMEOUT_SEC",
    value: Value::Number {
        unset: Unset::Is(30),
        min: 1,
        max: 3600,
    },
    doc: "how long a TCP connection may make no progress with requests out; then it fails them and the slices queued behind it (each retried as `MC_RETRY_CNT` allows)",
};
pub(crate) const TE_TCP_CONGESTION: Setting = Setting {
    name: "MC_TE_TCP_CONGESTION",
    value: Value::Text {
        unset: "auto",
        values: "auto, host, or an algorithm",
    },
    doc: "congestion control of TCP data connections: `auto` (same-host connections use reno, others the host's default), `host` (the host's default everywhere), or an algorithm's name for every data connection",
};
pub(crate) const TE_MOONCAKE_THREADS: Setting = Setting {
    name: "MC_TE_MOONCAKE_THREADS",
    value: Value::Number {
        unset: Unset::Is(2),
        min: 1,
        max: 64,
    },
    doc: "event-loop threads serving Mooncake connections",
};

/// Every variable this crate reads, in the order the reference lists them.
pub const SETTINGS: &[Setting] = &[
    TCP_LANES_PER_PEER,
    TCP_STATUS_TIMEOUT_SEC,
    TE_TCP_CONGESTION,
    TE_MOONCAKE_THREADS,
];
