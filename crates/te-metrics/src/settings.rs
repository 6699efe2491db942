//! The variables te-metrics reads: TENT's (`TENT_METRICS_*`) and the classic engine's
//! (`MC_TE_METRIC*`). `docs/configuration.md` is generated from these (`cargo xtask config`).

use te_sys::env::{Setting, Unset, Value};

pub(crate) const ENABLED: Setting = Setting {
    name: "TENT_METRICS_ENABLED",
    value: Value::Flag { unset: false },
    doc: "count requests and serve /metrics, /metrics/json, /metrics/summary and /health",
};
pub(crate) const HTTP_HOST: Setting = Setting {
    name: "TENT_METRICS_HTTP_HOST",
    value: Value::Text {
        unset: "127.0.0.1",
        values: "an IP address",
    },
    doc: "address of the metrics endpoint (TENT's default is 0.0.0.0; te binds loopback unless told)",
};
pub(crate) const HTTP_PORT: Setting = Setting {
    name: "TENT_METRICS_HTTP_PORT",
    value: Value::Number {
        unset: Unset::Is(9100),
        min: 0,
        max: 65535,
    },
    doc: "port of the metrics endpoint (0: any free port, logged); one taken is an error naming it",
};
pub(crate) const REPORT_INTERVAL: Setting = Setting {
    name: "TENT_METRICS_REPORT_INTERVAL",
    value: Value::Number {
        unset: Unset::Is(30),
        min: 0,
        max: 86400,
    },
    doc: "seconds between summary lines in the log (0: none), with TENT_METRICS_ENABLED",
};
pub(crate) const TE_METRIC: Setting = Setting {
    name: "MC_TE_METRIC",
    value: Value::Flag { unset: false },
    doc: "count requests and log Mooncake's throughput summary every MC_TE_METRIC_INTERVAL_SECONDS",
};
pub(crate) const TE_METRIC_INTERVAL: Setting = Setting {
    name: "MC_TE_METRIC_INTERVAL_SECONDS",
    value: Value::Number {
        unset: Unset::Is(5),
        min: 1,
        max: 86400,
    },
    doc: "seconds between MC_TE_METRIC's log lines",
};

/// Every variable te-metrics reads.
pub const SETTINGS: &[Setting] = &[
    ENABLED,
    HTTP_HOST,
    HTTP_PORT,
    REPORT_INTERVAL,
    TE_METRIC,
    TE_METRIC_INTERVAL,
];
