//! The variables te-nvlink reads: Mooncake's switches for fabric handles.
//! `docs/configuration.md` is generated from these (`cargo xtask config`).

use te_sys::env::{Setting, Value};

pub(crate) const FORCE_MNNVL: Setting = Setting {
    name: "MC_FORCE_MNNVL",
    value: Value::Flag { unset: false },
    doc: "fabric handles serve peers on other hosts (multi-node NVLink); implies `MC_USE_FABRIC`",
};
pub(crate) const USE_FABRIC: Setting = Setting {
    name: "MC_USE_FABRIC",
    value: Value::Flag { unset: false },
    doc: "GPU memory te-nvlink allocates is fabric memory (shareable by fabric handle) where the GPU supports it",
};

/// Every variable this crate reads, in the order the reference lists them.
pub const SETTINGS: &[Setting] = &[FORCE_MNNVL, USE_FABRIC];
