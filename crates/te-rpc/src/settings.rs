//! The variables te-rpc reads of its own (it also reads te-core's `MC_TE_CLUSTER_SECRET` and
//! `MC_TE_MOONCAKE_ALLOW`). `docs/configuration.md` is generated from these
//! (`cargo xtask config`).

use te_sys::env::{Setting, Unset, Value};

pub(crate) const TE_RPC_MAX_MESSAGE: Setting = Setting {
    name: "MC_TE_RPC_MAX_MESSAGE",
    value: Value::Bytes {
        unset: Unset::Is(1 << 30),
        min: 1,
        max: (1 << 32) - 1,
    },
    doc: "the largest message or tensor the RPC communicator sends or takes; a larger one is refused by name, and nothing is allocated for it",
};

/// Every variable this crate reads of its own.
pub const SETTINGS: &[Setting] = &[TE_RPC_MAX_MESSAGE];
