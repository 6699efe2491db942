//! The variables the bindings read through te-facade: Mooncake's switches for protocols, the
//! runtime and transfer timeouts.
//! `docs/configuration.md` is generated from these (`cargo xtask config`).

use std::time::Duration;

use te_sys::env::{Env, Setting, Unset, Value};

pub(crate) const FORCE_TCP: Setting = Setting {
    name: "MC_FORCE_TCP",
    value: Value::Flag { unset: false },
    doc: "Mooncake's switch: the `rdma` protocol of `initialize` installs TCP instead",
};
pub(crate) const TRANSFER_TIMEOUT: Setting = Setting {
    name: "MC_TRANSFER_TIMEOUT",
    value: Value::Number {
        unset: Unset::Is(30),
        min: 0,
        max: 1 << 32,
    },
    doc: "seconds a synchronous call of `te.mooncake` or the C API may take (at least 5), plus a nanosecond per byte",
};
pub(crate) const USE_TENT: Setting = Setting {
    name: "MC_USE_TENT",
    value: Value::Text {
        unset: "unset",
        values: "set or unset",
    },
    doc: "set to any value: `te.mooncake` and the C API run on te's TENT runtime, as Mooncake's do",
};
pub(crate) const USE_TEV1: Setting = Setting {
    name: "MC_USE_TEV1",
    value: Value::Text {
        unset: "unset",
        values: "set or unset",
    },
    doc: "Mooncake's other name for `MC_USE_TENT`",
};

/// Every variable this crate reads, in the order the reference lists them.
pub const SETTINGS: &[Setting] = &[FORCE_TCP, TRANSFER_TIMEOUT, USE_TENT, USE_TEV1];

/// The bindings' own settings, read once per engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FacadeSettings {
    /// `MC_FORCE_TCP`.
    pub(crate) force_tcp: bool,
    /// `MC_TRANSFER_TIMEOUT`, at least 5 s (Mooncake's rule).
    pub(crate) transfer_timeout: Duration,
}

impl FacadeSettings {
    /// From the process environment.
    ///
    /// # Errors
    /// A variable set to a value te cannot honour, named.
    pub(crate) fn from_env() -> te_sys::Result<Self> {
        Self::from_lookup(&te_sys::env::process)
    }

    /// From `lookup` (a variable's value by name).
    ///
    /// # Errors
    /// As [`from_env`](Self::from_env).
    pub(crate) fn from_lookup(lookup: &dyn Fn(&str) -> Option<String>) -> te_sys::Result<Self> {
        let env = Env::new(lookup);
        let secs: u64 = env.number_or_initial(&TRANSFER_TIMEOUT)?;
        Ok(FacadeSettings {
            force_tcp: env.flag_or_initial(&FORCE_TCP)?,
            transfer_timeout: Duration::from_secs(secs.max(5)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(vars: &[(&str, &str)]) -> te_sys::Result<FacadeSettings> {
        FacadeSettings::from_lookup(&te_sys::env::table(vars))
    }

    #[test]
    fn mooncakes_defaults_and_rules_hold_and_nonsense_is_refused_by_name() {
        let s = read(&[]).unwrap();
        assert_eq!(
            (s.force_tcp, s.transfer_timeout),
            (false, Duration::from_secs(30))
        );
        let s = read(&[("MC_FORCE_TCP", "yes"), ("MC_TRANSFER_TIMEOUT", " 2 ")]).unwrap();
        assert_eq!(
            (s.force_tcp, s.transfer_timeout),
            (true, Duration::from_secs(5))
        );
        let s = read(&[("MC_TRANSFER_TIMEOUT", "120"), ("MC_FORCE_TCP", "")]).unwrap();
        assert_eq!(
            (s.force_tcp, s.transfer_timeout),
            (false, Duration::from_secs(120))
        );
        for (var, value) in [("MC_TRANSFER_TIMEOUT", "soon"), ("MC_FORCE_TCP", "2")] {
            let e = read(&[(var, value)]).unwrap_err().to_string();
            assert!(e.contains(var) && e.contains(value), "{e}");
        }
    }
}
