//! What the server did, for operators (`--metrics-addr`): requests by method and status,
//! connections held and turned away, keys and bytes stored, and how long each sync of
//! persisted changes took. Recording is atomics only; labels come from closed sets (a method
//! or status outside them is `other`), so a hostile client cannot grow the series.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use te_metrics::Exposition;
use te_metrics::counters::{Histogram, LATENCY_BUCKETS_US};

use crate::store::Store;

/// The `method` label's values.
const METHODS: [&str; 5] = ["GET", "PUT", "POST", "DELETE", "other"];
/// The `status` label's values (`other` last).
const STATUSES: [&str; 12] = [
    "200", "400", "401", "404", "405", "408", "413", "431", "500", "503", "507", "other",
];

/// Why a connection was turned away (the `reason` label).
#[derive(Clone, Copy, Debug)]
pub(crate) enum TurnedAway {
    /// Over `--max-connections`.
    Capacity = 0,
    /// Over `--max-connections-per-address`.
    Address = 1,
}

/// The server's counters.
pub(crate) struct ServerMetrics {
    requests: [[AtomicU64; STATUSES.len()]; METHODS.len()],
    turned_away: [AtomicU64; 2],
    sync_us: Histogram,
}

impl Default for ServerMetrics {
    fn default() -> Self {
        ServerMetrics {
            requests: Default::default(),
            turned_away: Default::default(),
            sync_us: Histogram::new(&LATENCY_BUCKETS_US),
        }
    }
}

impl ServerMetrics {
    /// A request answered with `status`.
    pub(crate) fn answered(&self, method: &str, status: u16) {
        let m = METHODS[..4]
            .iter()
            .position(|x| *x == method)
            .unwrap_or(METHODS.len() - 1);
        let code = status.to_string();
        let s = STATUSES
            .iter()
            .position(|x| *x == code)
            .unwrap_or(STATUSES.len() - 1);
        self.requests[m][s].fetch_add(1, Ordering::Relaxed);
    }

    /// A connection answered 503 and closed at once.
    pub(crate) fn turned_away(&self, why: TurnedAway) {
        self.turned_away[why as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// A sync of persisted changes took `us` microseconds.
    pub(crate) fn synced(&self, us: u64) {
        self.sync_us.observe(us);
    }

    fn requests(&self) -> Vec<(&'static str, &'static str, u64)> {
        let mut out = Vec::new();
        for (m, method) in METHODS.iter().enumerate() {
            for (s, status) in STATUSES.iter().enumerate() {
                let n = self.requests[m][s].load(Ordering::Relaxed);
                if n > 0 {
                    out.push((*method, *status, n));
                }
            }
        }
        out
    }
}

/// The pages `--metrics-addr` serves.
pub(crate) struct MetadataPages {
    pub(crate) metrics: Arc<ServerMetrics>,
    pub(crate) store: Arc<Store>,
    /// Connections held, as the caps count them.
    pub(crate) held: te_reactor::Held,
}

impl te_metrics::Pages for MetadataPages {
    fn prometheus(&self) -> String {
        let m = &self.metrics;
        let mut out = Exposition::default();
        let requests = m.requests();
        let labels: Vec<[(&str, &str); 2]> = (requests.iter())
            .map(|(method, status, _)| [("method", *method), ("status", *status)])
            .collect();
        let members: Vec<(&[(&str, &str)], u64)> = (labels.iter().zip(&requests))
            .map(|(l, (_, _, n))| (&l[..], *n))
            .collect();
        out.counter(
            "te_metadata_requests_total",
            "requests answered, by method and status (503: no room for the value in transit; 507: the store is full)",
            &members,
        );
        out.gauge(
            "te_metadata_connections",
            "client connections open",
            self.held.now() as f64,
        );
        let turned: Vec<(&[(&str, &str)], u64)> = [
            (&[("reason", "capacity")][..], &m.turned_away[0]),
            (&[("reason", "address")][..], &m.turned_away[1]),
        ]
        .into_iter()
        .map(|(l, n)| (l, n.load(Ordering::Relaxed)))
        .filter(|(_, n)| *n > 0)
        .collect();
        out.counter(
            "te_metadata_connections_refused_total",
            "connections answered 503 and closed: over --max-connections or --max-connections-per-address",
            &turned,
        );
        let (keys, bytes) = self.store.size();
        out.gauge("te_metadata_keys", "keys stored", keys as f64);
        out.gauge(
            "te_metadata_stored_bytes",
            "what the keys cost together: key and value bytes and 64 per key (--max-stored bounds it)",
            bytes as f64,
        );
        out.histogram_seconds(
            "te_metadata_sync_seconds",
            "time to make one event-loop turn's changes durable (one sync of the log)",
            &m.sync_us.snapshot(),
        );
        out.text()
    }

    fn json(&self) -> String {
        let m = &self.metrics;
        let (keys, bytes) = self.store.size();
        let requests: Vec<serde_json::Value> = (m.requests().into_iter())
            .map(|(method, status, n)| serde_json::json!({"method": method, "status": status, "count": n}))
            .collect();
        let sync = m.sync_us.snapshot();
        serde_json::json!({
            "requests": requests,
            "connections": self.held.now(),
            "connections_refused": {
                "capacity": m.turned_away[0].load(Ordering::Relaxed),
                "address": m.turned_away[1].load(Ordering::Relaxed),
            },
            "keys": keys,
            "stored_bytes": bytes,
            "sync_us": {"bounds": sync.bounds, "cumulative": sync.cumulative, "sum": sync.sum, "count": sync.count()},
        })
        .to_string()
    }

    fn summary(&self) -> String {
        let m = &self.metrics;
        let (keys, bytes) = self.store.size();
        let requests = m.requests();
        let total: u64 = requests.iter().map(|(_, _, n)| n).sum();
        let busy: u64 = (requests.iter())
            .filter(|(_, s, _)| matches!(*s, "503" | "507"))
            .map(|(_, _, n)| n)
            .sum();
        format!(
            "Requests: {total} ({busy} turned away) | Connections: {} | Keys: {keys} ({bytes} bytes)",
            self.held.now()
        )
    }
}
