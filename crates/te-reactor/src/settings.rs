//! The variables te-reactor reads: the limits of te's servers and of the initiator's loops.
//! `docs/configuration.md` is generated from these (`cargo xtask config`).

use te_sys::env::Setting;

pub(crate) const TE_SERVER_THREADS: Setting = Setting {
    name: "MC_TE_SERVER_THREADS",
    default: "cores, at most 8",
    range: "1–256",
    doc: "event-loop threads of each data listener (1–256)",
};
pub(crate) const TE_MAX_DATA_CONNECTIONS: Setting = Setting {
    name: "MC_TE_MAX_DATA_CONNECTIONS",
    default: "10240",
    range: "1–1048576",
    doc: "data connections a listener holds; more are refused with a reason",
};
pub(crate) const TE_MAX_DATA_CONNECTIONS_PER_ADDRESS: Setting = Setting {
    name: "MC_TE_MAX_DATA_CONNECTIONS_PER_ADDRESS",
    default: "1024",
    range: "0–1048576",
    doc: "data connections from one source (an IPv4 address, an IPv6 /64; loopback too unless MC_TE_CAP_LOOPBACK=0)",
};
pub(crate) const TE_CONTROL_THREADS: Setting = Setting {
    name: "MC_TE_CONTROL_THREADS",
    default: "1",
    range: "1–64",
    doc: "event-loop threads of the control listener (1–64)",
};
pub(crate) const TE_MAX_CONTROL_CONNECTIONS: Setting = Setting {
    name: "MC_TE_MAX_CONTROL_CONNECTIONS",
    default: "4096",
    range: "1–1048576",
    doc: "control connections held at once",
};
pub(crate) const TE_MAX_CONTROL_CONNECTIONS_PER_ADDRESS: Setting = Setting {
    name: "MC_TE_MAX_CONTROL_CONNECTIONS_PER_ADDRESS",
    default: "64",
    range: "0–1048576",
    doc: "control connections from one source (an IPv4 address, an IPv6 /64; loopback too unless MC_TE_CAP_LOOPBACK=0)",
};
pub(crate) const TE_CAP_LOOPBACK: Setting = Setting {
    name: "MC_TE_CAP_LOOPBACK",
    default: "1",
    range: "0 or 1",
    doc: "whether loopback sources are held to the per-source caps like any other (0: exempt, for a host whose processes stand for many peers)",
};
pub(crate) const TE_CONN_REPLY_BYTES: Setting = Setting {
    name: "MC_TE_CONN_REPLY_BYTES",
    default: "4096",
    range: "64–1 MiB",
    doc: "reply bytes a data connection gathers before sending them (64–1 MiB)",
};
pub(crate) const TE_CLIENT_THREADS: Setting = Setting {
    name: "MC_TE_CLIENT_THREADS",
    default: "cores, 4 to 8",
    range: "1–256",
    doc: "event-loop threads driving every TCP lane of an engine (1–256)",
};
pub(crate) const TE_LISTEN_BACKLOG: Setting = Setting {
    name: "MC_TE_LISTEN_BACKLOG",
    default: "4096",
    range: "1–65,535",
    doc: "connections each listener's kernel queue holds before they are accepted (1–65,535; Linux caps it at `net.core.somaxconn`)",
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
