//! The connections every server of the process holds and has turned away, by protocol name
//! ([`Protocol::name`](crate::Protocol::name), a name from te's code), for the metrics
//! endpoint. A server registers when it starts; its refusals stay counted after it stops.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

/// One protocol's servers, summed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnectionCount {
    /// The protocol (`te-control`, `te-tcp`, ...).
    pub protocol: &'static str,
    /// Connections held now.
    pub open: usize,
    /// Connections turned away over a cap since the process started.
    pub refused: u64,
}

/// A protocol's refusals, and the live counts of its running servers.
struct Entry {
    protocol: &'static str,
    refused: Arc<AtomicU64>,
    servers: Vec<Weak<AtomicUsize>>,
}

static SERVERS: Mutex<Vec<Entry>> = Mutex::new(Vec::new());

/// Registers a server of `protocol` counting its connections in `live`; returns the
/// protocol's refusal counter.
pub(crate) fn register(protocol: &'static str, live: &Arc<AtomicUsize>) -> Arc<AtomicU64> {
    let mut all = SERVERS.lock().unwrap_or_else(|e| e.into_inner());
    let at = match all.iter().position(|e| e.protocol == protocol) {
        Some(at) => at,
        None => {
            all.push(Entry {
                protocol,
                refused: Arc::default(),
                servers: Vec::new(),
            });
            all.len() - 1
        }
    };
    let entry = &mut all[at];
    entry.servers.retain(|s| s.strong_count() > 0);
    entry.servers.push(Arc::downgrade(live));
    entry.refused.clone()
}

/// Every protocol that ran a server in this process: connections held now, refusals so far.
pub fn connection_counts() -> Vec<ConnectionCount> {
    let all = SERVERS.lock().unwrap_or_else(|e| e.into_inner());
    (all.iter())
        .map(|e| ConnectionCount {
            protocol: e.protocol,
            open: (e.servers.iter())
                .filter_map(Weak::upgrade)
                .map(|live| live.load(Ordering::Relaxed))
                .sum(),
            refused: e.refused.load(Ordering::Relaxed),
        })
        .collect()
}
