//! The variables te-nvlink reads: Mooncake's switches for fabric handles.
//! `docs/configuration.md` is generated from these (`cargo xtask config`).

use te_sys::env::Setting;

pub(crate) const FORCE_MNNVL: Setting = Setting {
    name: "MC_FORCE_MNNVL",
    default: "off",
    range: "0/1",
    doc: "fabric handles serve peers on other hosts (multi-node NVLink); implies `MC_USE_FABRIC`. `1`/`true`/`yes`/`on` is on, `0`/`false`/`no`/`off` off",
};
pub(crate) const USE_FABRIC: Setting = Setting {
    name: "MC_USE_FABRIC",
    default: "off",
    range: "0/1",
    doc: "GPU memory te-nvlink allocates is fabric memory (shareable by fabric handle) where the GPU supports it",
};

/// Every variable this crate reads, in the order the reference lists them.
pub const SETTINGS: &[Setting] = &[FORCE_MNNVL, USE_FABRIC];
