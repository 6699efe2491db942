//! te-metrics: what te's engines did, for operators. An engine counts its requests in
//! [`counters::Metrics`] (switched on per engine) and transports count each rail's load in
//! [`rail::RailCounters`]; this crate shows the counts of every engine of the process that
//! [`watch`] was given, summed:
//!
//! - over HTTP ([`MetricsServer`]): `/metrics` (Prometheus text: TENT's `tent_*` series, te's
//!   own `te_*`), `/metrics/json`, `/metrics/summary` (TENT's one line) and `/health`; bound to
//!   loopback unless told otherwise, one server per process;
//! - in the log ([`Reporter`]): the summary every few seconds, as Mooncake's `MC_TE_METRIC`.
//!
//! [`MetricsSettings`] reads TENT's switches (`TENT_METRICS_*`) and the classic engine's
//! (`MC_TE_METRIC`, `MC_TE_METRIC_INTERVAL_SECONDS`); [`start_from_env`] does what they ask.

mod config;
pub mod counters;
mod expose;
pub mod rail;
mod server;
mod settings;
pub mod tally;

use std::sync::{Arc, Mutex, OnceLock, Weak};

pub use config::MetricsSettings;
use counters::{Metrics, Snapshot};
pub use expose::{Exposition, classic_report, json, prometheus_text, summary};
pub use server::{MetricsServer, Pages, Reporter};
pub use settings::SETTINGS;

/// What can go wrong starting the metrics.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    /// A variable's value is unusable.
    #[error("{name}={value:?}: {reason}")]
    Setting {
        /// The variable.
        name: &'static str,
        /// Its value.
        value: String,
        /// Why it is refused.
        reason: String,
    },
    /// The HTTP address cannot be bound (taken, not local, no permission).
    #[error("metrics endpoint {addr}: {source} (set TENT_METRICS_HTTP_PORT to a free port)")]
    Bind {
        /// The address asked for.
        addr: String,
        /// The system's answer.
        source: std::io::Error,
    },
    /// A thread could not be started.
    #[error("metrics: {0}")]
    Thread(std::io::Error),
}

/// The counters of every engine being watched.
fn watched() -> &'static Mutex<Vec<Weak<Metrics>>> {
    static WATCHED: OnceLock<Mutex<Vec<Weak<Metrics>>>> = OnceLock::new();
    WATCHED.get_or_init(Mutex::default)
}

/// Adds an engine's counters to what this process shows (until the engine is gone).
pub fn watch(metrics: &Arc<Metrics>) {
    let mut list = watched().lock().unwrap_or_else(|e| e.into_inner());
    list.retain(|w| w.strong_count() > 0);
    if !list
        .iter()
        .any(|w| std::ptr::eq(w.as_ptr(), Arc::as_ptr(metrics)))
    {
        list.push(Arc::downgrade(metrics));
    }
}

/// The sum of every watched engine's counters now.
pub fn snapshot() -> Snapshot {
    let live: Vec<Arc<Metrics>> = {
        let mut list = watched().lock().unwrap_or_else(|e| e.into_inner());
        list.retain(|w| w.strong_count() > 0);
        list.iter().filter_map(Weak::upgrade).collect()
    };
    let mut total = Snapshot::default();
    for m in live {
        total.add(&m.snapshot());
    }
    total.connections = te_reactor::connection_counts();
    total
}

/// The process's metrics, started once as the variables ask: nothing, the log report, the
/// HTTP endpoint, or both.
#[derive(Debug, Default)]
pub struct Started {
    /// The HTTP endpoint, when asked for.
    pub server: Option<MetricsServer>,
    /// The periodic log, when asked for.
    pub reporter: Option<Reporter>,
}

/// What [`start`] started in this process.
static STARTED: OnceLock<Result<Started, String>> = OnceLock::new();

/// The address the process's metrics endpoint serves on, once started.
pub fn endpoint() -> Option<std::net::SocketAddr> {
    match STARTED.get() {
        Some(Ok(Started {
            server: Some(server),
            ..
        })) => Some(server.addr()),
        _ => None,
    }
}

/// Starts what `settings` ask for, once per process (later calls return what the first
/// started, or its error again); whether counting is asked for at all.
///
/// # Errors
/// The endpoint's address cannot be bound, or a thread cannot start.
pub fn start(settings: &MetricsSettings) -> Result<bool, String> {
    if !settings.counting() {
        return Ok(false);
    }
    let started = STARTED.get_or_init(|| {
        let server = match settings.http {
            Some(addr) => Some(MetricsServer::start(addr).map_err(|e| e.to_string())?),
            None => None,
        };
        let reporter = match settings.report_every {
            Some(every) => {
                Some(Reporter::start(every, settings.classic_report).map_err(|e| e.to_string())?)
            }
            None => None,
        };
        Ok(Started { server, reporter })
    });
    started.as_ref().map(|_| true).map_err(Clone::clone)
}

/// [`start`] with the process's variables, and `metrics` watched when they ask for counting:
/// whether it counts.
///
/// # Errors
/// A variable's value is unusable, or [`start`]'s.
pub fn start_from_env(metrics: &Arc<Metrics>) -> Result<bool, String> {
    let settings = MetricsSettings::from_lookup(te_sys::env::process).map_err(|e| e.to_string())?;
    let counting = start(&settings)?;
    if counting {
        watch(metrics);
    }
    Ok(counting)
}
