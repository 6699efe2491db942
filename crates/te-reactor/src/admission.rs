//! Who gets a connection slot: the server-wide cap, and a cap per source address so that one
//! address cannot take every slot. A [`Slot`] holds a connection's place under both until it is
//! dropped. At the server-wide cap the accepting loop frees the place of its connection idle
//! longest ([`oldest_idle`]) before it turns a new peer away, so idle sockets cannot lock honest
//! peers out.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::Refusal;

/// A connection idle for less than this is never closed to make room: peers between two
/// requests of one transfer are not idle.
pub const EVICT_MIN_IDLE: Duration = Duration::from_secs(5);

/// Connections per source address, shared by every loop of a server.
type PerAddress = Arc<Mutex<HashMap<IpAddr, usize>>>;

/// A connection's place under the caps; dropping it frees the place.
#[derive(Debug)]
pub struct Slot {
    live: Arc<AtomicUsize>,
    address: Option<(PerAddress, IpAddr)>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.live.fetch_sub(1, Ordering::AcqRel);
        if let Some((counts, ip)) = &self.address {
            let mut counts = counts.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(n) = counts.get_mut(ip) {
                *n -= 1;
                if *n == 0 {
                    counts.remove(ip);
                }
            }
        }
    }
}

/// The cap per source address.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AddressCap {
    /// Connections one address may hold (0: no cap of its own).
    pub max: usize,
    /// Whether this host's own addresses (loopback) are capped too: its processes share the
    /// address, so by default they are not.
    pub loopback: bool,
}

/// The caps of one server.
#[derive(Debug)]
pub(super) struct Admission {
    live: Arc<AtomicUsize>,
    max: usize,
    per_address: AddressCap,
    counts: PerAddress,
    /// Connections turned away (its protocol's, process-wide: [`crate::connection_counts`]).
    refused: Arc<std::sync::atomic::AtomicU64>,
}

impl Admission {
    pub(super) fn new(
        live: Arc<AtomicUsize>,
        max: usize,
        per_address: AddressCap,
        refused: Arc<std::sync::atomic::AtomicU64>,
    ) -> Self {
        Admission {
            live,
            max: max.max(1),
            per_address,
            counts: PerAddress::default(),
            refused,
        }
    }

    /// Whether the server-wide cap is reached.
    pub(super) fn full(&self) -> bool {
        self.live.load(Ordering::Acquire) >= self.max
    }

    /// A place for a connection from `ip`, or why there is none.
    pub(super) fn admit(&self, ip: IpAddr) -> Result<Slot, Refusal> {
        let admitted = self.decide(ip);
        if admitted.is_err() {
            self.refused.fetch_add(1, Ordering::Relaxed);
        }
        admitted
    }

    fn decide(&self, ip: IpAddr) -> Result<Slot, Refusal> {
        let capped = self.per_address.max > 0 && (self.per_address.loopback || !ip.is_loopback());
        let address = match capped {
            false => None,
            true => {
                let cap = self.per_address.max;
                let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
                let n = counts.entry(ip).or_insert(0);
                if *n >= cap {
                    return Err(Refusal::AddressCap { max: cap });
                }
                *n += 1;
                Some((self.counts.clone(), ip))
            }
        };
        let held = self.live.fetch_add(1, Ordering::AcqRel) + 1;
        let slot = Slot {
            live: self.live.clone(),
            address,
        };
        match held > self.max {
            // Dropping the slot gives back both counts.
            true => Err(Refusal::AtCapacity { max: self.max }),
            false => Ok(slot),
        }
    }

    /// Connections held now.
    #[cfg(test)]
    pub(super) fn held(&self) -> usize {
        self.live.load(Ordering::Acquire)
    }
}

/// Among connections `(key, idle since)` (`None`: busy), the one idle longest, if it has been
/// idle for at least [`EVICT_MIN_IDLE`] at `now`.
pub(super) fn oldest_idle<K: Copy>(
    conns: impl Iterator<Item = (K, Option<Instant>)>,
    now: Instant,
) -> Option<K> {
    conns
        .filter_map(|(k, since)| since.map(|s| (k, s)))
        .filter(|(_, since)| now.saturating_duration_since(*since) >= EVICT_MIN_IDLE)
        .min_by_key(|(_, since)| *since)
        .map(|(k, _)| k)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn each_address_gets_its_share_and_slots_give_it_back() {
        let cap = AddressCap {
            max: 2,
            loopback: false,
        };
        let a = Admission::new(Arc::new(AtomicUsize::new(0)), 5, cap, Arc::default());
        let local: Vec<Slot> = (0..3).map(|_| a.admit(ip("127.0.0.1")).unwrap()).collect();
        assert_eq!(
            a.held(),
            3,
            "this host's processes are not capped per address"
        );
        drop(local);
        let one = a.admit(ip("10.0.0.1")).unwrap();
        let two = a.admit(ip("10.0.0.1")).unwrap();
        assert_eq!(
            a.admit(ip("10.0.0.1")).unwrap_err(),
            Refusal::AddressCap { max: 2 }
        );
        assert_eq!(a.held(), 2, "a refusal holds nothing");
        let other = a.admit(ip("10.0.0.2")).unwrap();
        drop(one);
        let again = a.admit(ip("10.0.0.1")).unwrap();
        assert_eq!(a.held(), 3);
        drop((two, other, again));
        assert_eq!(a.held(), 0);
        assert!(a.counts.lock().unwrap().is_empty(), "no entry left behind");
    }

    #[test]
    fn the_server_wide_cap_holds_whatever_the_addresses() {
        let a = Admission::new(
            Arc::new(AtomicUsize::new(0)),
            2,
            AddressCap::default(),
            Arc::default(),
        );
        let slots: Vec<Slot> = ["10.0.0.1", "10.0.0.2"]
            .iter()
            .map(|s| a.admit(ip(s)).unwrap())
            .collect();
        assert!(a.full());
        assert_eq!(
            a.admit(ip("10.0.0.3")).unwrap_err(),
            Refusal::AtCapacity { max: 2 }
        );
        assert_eq!(a.held(), 2);
        drop(slots);
        assert!(!a.full());
    }

    #[test]
    fn the_connection_idle_longest_goes_first_and_busy_or_fresh_ones_never() {
        let now = Instant::now() + Duration::from_secs(100);
        let ago = |s: u64| Some(now - Duration::from_secs(s));
        let conns = [(1, None), (2, ago(5)), (3, ago(50)), (4, ago(2))];
        assert_eq!(oldest_idle(conns.into_iter(), now), Some(3));
        let fresh = [(1, None), (2, Some(now - Duration::from_millis(200)))];
        assert_eq!(oldest_idle(fresh.into_iter(), now), None);
    }
}
