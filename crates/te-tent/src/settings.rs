//! The variables te-tent reads beside its configuration file.
//! `docs/configuration.md` is generated from these (`cargo xtask config`).

use te_sys::env::{Setting, Unset, Value};

pub(crate) const TENT_CONF: Setting = Setting {
    name: "MC_TENT_CONF",
    value: Value::Text {
        unset: "none",
        values: "a path or JSON",
    },
    doc: "te-tent's configuration: a JSON file's path, or inline JSON (TENT's keys; see [rust.md](rust.md))",
};
pub(crate) const TENT_RPC_THREADS: Setting = Setting {
    name: "MC_TENT_RPC_THREADS",
    value: Value::Number {
        unset: Unset::Is(1),
        min: 1,
        max: 64,
    },
    doc: "TENT's `rpc_server_threads` when no configuration file sets it; te's control listener threads",
};

/// Every variable this crate reads, in the order the reference lists them.
pub const SETTINGS: &[Setting] = &[TENT_CONF, TENT_RPC_THREADS];
