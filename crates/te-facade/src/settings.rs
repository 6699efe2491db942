//! The variables the bindings read through te-facade: Mooncake's switches for protocols, the
//! runtime and transfer timeouts.
//! `docs/configuration.md` is generated from these (`cargo xtask config`).

use te_sys::env::Setting;

pub(crate) const FORCE_TCP: Setting = Setting {
    name: "MC_FORCE_TCP",
    default: "off",
    range: "0/1",
    doc: "Mooncake's switch: the `rdma` protocol of `initialize` installs TCP instead",
};
pub(crate) const TRANSFER_TIMEOUT: Setting = Setting {
    name: "MC_TRANSFER_TIMEOUT",
    default: "30",
    range: "seconds",
    doc: "seconds a synchronous call of `te.mooncake` or the C API may take (at least 5), plus a nanosecond per byte",
};
pub(crate) const USE_TENT: Setting = Setting {
    name: "MC_USE_TENT",
    default: "unset",
    range: "set or unset",
    doc: "set to any value: `te.mooncake` and the C API run on te's TENT runtime, as Mooncake's do",
};
pub(crate) const USE_TEV1: Setting = Setting {
    name: "MC_USE_TEV1",
    default: "unset",
    range: "set or unset",
    doc: "set to any value: `te.mooncake` and the C API run on te's TENT runtime, as Mooncake's do",
};

/// Every variable this crate reads, in the order the reference lists them.
pub const SETTINGS: &[Setting] = &[FORCE_TCP, TRANSFER_TIMEOUT, USE_TENT, USE_TEV1];
