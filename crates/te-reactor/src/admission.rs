//! Who gets a connection slot: the server-wide cap, and a cap per source (an IPv4 address, or
//! an IPv6 /64: what one host is usually given) so that one source cannot take every slot. A
//! [`Slot`] holds a connection's place under both until it is dropped.
//!
//! For a protocol whose connections prove themselves ([`crate::Protocol::proves`]: a valid
//! request, the cluster's challenge), at a cap (server-wide, or a source's) the accepting loop
//! closes its oldest connection that has proved nothing yet, whatever its age, before it turns
//! a new peer away; and connections unproven for longer than [`SHARE_GRACE`] hold at most three
//! quarters of the places (past that share the oldest of them makes room even below the cap),
//! so a quarter stays for the proven while a burst of fresh connections, which prove within a
//! round trip, may fill the server. Otherwise, and for other protocols, the loop closes the
//! connection idle longest, once idle for [`EVICT_MIN_IDLE`].

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::Refusal;

/// A connection idle for less than this is never closed to make room: peers between two
/// requests of one transfer are not idle.
pub const EVICT_MIN_IDLE: Duration = Duration::from_secs(5);

/// Of the places, the unproven hold at most all but this fraction (1/4).
const RESERVED_FOR_PROVEN: usize = 4;
/// A connection unproven for less than this is left out of the unproven's share: an honest
/// peer proves itself within a round trip of connecting.
pub const SHARE_GRACE: Duration = Duration::from_secs(1);

/// Connections per source, shared by every loop of a server.
type PerSource = Arc<Mutex<HashMap<IpAddr, usize>>>;

/// The key a connection from `ip` is counted under: the IPv4 address (IPv4-mapped ones
/// included), or the IPv6 /64.
pub fn source_key(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => {
            let mut octets = v6.octets();
            octets[8..].fill(0);
            IpAddr::V6(octets.into())
        }
        v4 => v4,
    }
}

/// A connection's place under the caps; dropping it frees the place.
#[derive(Debug)]
pub struct Slot {
    live: Arc<AtomicUsize>,
    source: Option<(PerSource, IpAddr)>,
    /// Counted among the unproven until it proves itself ([`Slot::prove`]).
    unproven: Option<Arc<AtomicUsize>>,
}

impl Slot {
    /// The connection proved itself: it no longer counts among the unproven.
    pub fn prove(&mut self) {
        if let Some(u) = self.unproven.take() {
            u.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Whether it is counted among the unproven.
    pub fn is_unproven(&self) -> bool {
        self.unproven.is_some()
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.live.fetch_sub(1, Ordering::AcqRel);
        self.prove();
        if let Some((counts, key)) = &self.source {
            let mut counts = counts.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(n) = counts.get_mut(key) {
                *n -= 1;
                if *n == 0 {
                    counts.remove(key);
                }
            }
        }
    }
}

/// The cap per source.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AddressCap {
    /// Connections one source may hold (0: no cap of its own).
    pub max: usize,
    /// Whether this host's own addresses (loopback) are capped too. On by default for te's
    /// listeners (`MC_TE_CAP_LOOPBACK`): a local stranger is a stranger.
    pub loopback: bool,
}

/// What holds a new connection back, before any room is made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Pressure {
    /// Nothing: it may be admitted.
    None,
    /// Its source holds its cap: room is made among that source's connections.
    Source(IpAddr),
    /// The server holds its cap: room is made among all.
    Server,
    /// The unproven hold their share: one unproven for longer than [`SHARE_GRACE`] makes room,
    /// if any; the newcomer is admitted either way.
    Share,
}

/// The caps of one server.
#[derive(Debug)]
pub(super) struct Admission {
    live: Arc<AtomicUsize>,
    max: usize,
    per_address: AddressCap,
    counts: PerSource,
    /// Connections that have proved nothing yet, when the protocol's connections prove
    /// themselves.
    unproven: Option<Arc<AtomicUsize>>,
    /// Connections turned away (its protocol's, process-wide: [`crate::connection_counts`]).
    refused: Arc<std::sync::atomic::AtomicU64>,
}

impl Admission {
    pub(super) fn new(
        live: Arc<AtomicUsize>,
        max: usize,
        per_address: AddressCap,
        proves: bool,
        refused: Arc<std::sync::atomic::AtomicU64>,
    ) -> Self {
        Admission {
            live,
            max: max.max(1),
            per_address,
            counts: PerSource::default(),
            unproven: proves.then(Arc::default),
            refused,
        }
    }

    /// The key `ip` is capped under, or `None` when it has no cap of its own.
    fn capped(&self, ip: IpAddr) -> Option<IpAddr> {
        let exempt = !self.per_address.loopback && ip.to_canonical().is_loopback();
        (self.per_address.max > 0 && !exempt).then(|| source_key(ip))
    }

    /// The unproven's share of the places.
    fn unproven_share(&self) -> usize {
        (self.max - self.max / RESERVED_FOR_PROVEN).max(1)
    }

    /// What stands in the way of a connection from `ip` now.
    pub(super) fn pressure(&self, ip: IpAddr) -> Pressure {
        if let Some(key) = self.capped(ip) {
            let counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
            if counts.get(&key).copied().unwrap_or(0) >= self.per_address.max {
                return Pressure::Source(key);
            }
        }
        if self.live.load(Ordering::Acquire) >= self.max {
            return Pressure::Server;
        }
        match self
            .unproven
            .as_ref()
            .is_some_and(|u| u.load(Ordering::Acquire) >= self.unproven_share())
        {
            true => Pressure::Share,
            false => Pressure::None,
        }
    }

    /// What a connection closed to make room under `pressure` is told.
    pub(super) fn refusal(&self, pressure: Pressure) -> Refusal {
        match pressure {
            Pressure::Source(_) => Refusal::AddressCap {
                max: self.per_address.max,
            },
            _ => Refusal::AtCapacity { max: self.max },
        }
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
        let source = match self.capped(ip) {
            None => None,
            Some(key) => {
                let cap = self.per_address.max;
                let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
                let n = counts.entry(key).or_insert(0);
                if *n >= cap {
                    return Err(Refusal::AddressCap { max: cap });
                }
                *n += 1;
                Some((self.counts.clone(), key))
            }
        };
        let held = self.live.fetch_add(1, Ordering::AcqRel) + 1;
        let unproven = self.unproven.clone();
        if let Some(u) = &unproven {
            u.fetch_add(1, Ordering::AcqRel);
        }
        let slot = Slot {
            live: self.live.clone(),
            source,
            unproven,
        };
        match held > self.max {
            // Dropping the slot gives back every count.
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

/// One connection as room is made: its key, its source, since when it has been unproven (if
/// it has), and since when idle (if it is).
pub(super) struct Candidate<K> {
    pub(super) key: K,
    pub(super) source: IpAddr,
    pub(super) unproven_since: Option<Instant>,
    pub(super) idle_since: Option<Instant>,
}

/// The connection to close to make room for one that `pressure` holds back, at `now`: the
/// oldest unproven one (of the pressing source, when a source is at its cap) whatever its age
/// (past the unproven's share: unproven for longer than [`SHARE_GRACE`]); else, at the
/// server's cap, the one idle longest if idle for at least [`EVICT_MIN_IDLE`].
pub(super) fn victim<K: Copy>(
    conns: impl Iterator<Item = Candidate<K>>,
    pressure: Pressure,
    now: Instant,
) -> Option<K> {
    let mut unproven: Option<(K, Instant)> = None;
    let mut idle: Option<(K, Instant)> = None;
    for c in conns {
        if let Pressure::Source(key) = pressure
            && source_key(c.source) != key
        {
            continue;
        }
        let stale = pressure != Pressure::Share
            || c.unproven_since
                .is_some_and(|since| now.saturating_duration_since(since) >= SHARE_GRACE);
        if let Some(since) = c.unproven_since
            && stale
            && unproven.is_none_or(|(_, oldest)| since < oldest)
        {
            unproven = Some((c.key, since));
        }
        if let Some(since) = c.idle_since
            && now.saturating_duration_since(since) >= EVICT_MIN_IDLE
            && idle.is_none_or(|(_, oldest)| since < oldest)
        {
            idle = Some((c.key, since));
        }
    }
    match (unproven, pressure) {
        (Some((k, _)), _) => Some(k),
        (None, Pressure::Server) => idle.map(|(k, _)| k),
        (None, _) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn admission(max: usize, per_address: usize, proves: bool) -> Admission {
        let cap = AddressCap {
            max: per_address,
            loopback: false,
        };
        Admission::new(
            Arc::new(AtomicUsize::new(0)),
            max,
            cap,
            proves,
            Arc::default(),
        )
    }

    #[test]
    fn each_source_gets_its_share_and_slots_give_it_back() {
        let a = admission(5, 2, false);
        let local: Vec<Slot> = (0..3).map(|_| a.admit(ip("127.0.0.1")).unwrap()).collect();
        assert_eq!(a.held(), 3, "loopback exempt where so configured");
        drop(local);
        let one = a.admit(ip("10.0.0.1")).unwrap();
        let two = a.admit(ip("10.0.0.1")).unwrap();
        assert_eq!(a.pressure(ip("10.0.0.1")), Pressure::Source(ip("10.0.0.1")));
        assert_eq!(
            a.admit(ip("10.0.0.1")).unwrap_err(),
            Refusal::AddressCap { max: 2 }
        );
        assert_eq!(
            a.admit(ip("::ffff:10.0.0.1")).unwrap_err(),
            Refusal::AddressCap { max: 2 },
            "an IPv4-mapped address is its IPv4 address"
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
    fn an_ipv6_slash_64_is_one_source_and_loopback_is_capped_when_asked() {
        let a = admission(10, 2, false);
        let _x = a.admit(ip("2001:db8:1:2::1")).unwrap();
        let _y = a.admit(ip("2001:db8:1:2:ffff::9")).unwrap();
        assert_eq!(
            a.admit(ip("2001:db8:1:2::77")).unwrap_err(),
            Refusal::AddressCap { max: 2 }
        );
        let _z = a.admit(ip("2001:db8:1:3::1")).unwrap();
        let capped = Admission::new(
            Arc::new(AtomicUsize::new(0)),
            10,
            AddressCap {
                max: 1,
                loopback: true,
            },
            false,
            Arc::default(),
        );
        let _l = capped.admit(ip("127.0.0.1")).unwrap();
        assert!(capped.admit(ip("127.0.0.1")).is_err());
        assert!(capped.admit(ip("::1")).is_ok(), "another source");
    }

    #[test]
    fn the_server_wide_cap_holds_whatever_the_sources() {
        let a = admission(2, 0, false);
        let slots: Vec<Slot> = ["10.0.0.1", "10.0.0.2"]
            .iter()
            .map(|s| a.admit(ip(s)).unwrap())
            .collect();
        assert_eq!(a.pressure(ip("10.0.0.3")), Pressure::Server);
        assert_eq!(
            a.admit(ip("10.0.0.3")).unwrap_err(),
            Refusal::AtCapacity { max: 2 }
        );
        assert_eq!(a.held(), 2);
        drop(slots);
        assert_eq!(a.pressure(ip("10.0.0.3")), Pressure::None);
    }

    #[test]
    fn the_unproven_share_presses_below_the_cap_and_proving_frees_it() {
        let a = admission(8, 0, true);
        let mut slots: Vec<Slot> = (0..6)
            .map(|i| a.admit(ip(&format!("10.0.0.{i}"))).unwrap())
            .collect();
        assert!(slots.iter().all(Slot::is_unproven));
        assert_eq!(
            a.pressure(ip("10.0.1.1")),
            Pressure::Share,
            "their share is held"
        );
        slots.push(
            a.admit(ip("10.0.1.1"))
                .expect("below the cap, admitted all the same"),
        );
        slots[0].prove();
        slots[0].prove();
        assert!(!slots[0].is_unproven());
        assert_eq!(a.pressure(ip("10.0.1.2")), Pressure::Share);
        slots[1].prove();
        assert_eq!(a.pressure(ip("10.0.1.2")), Pressure::None);
        slots.push(a.admit(ip("10.0.1.2")).unwrap());
        assert_eq!(a.pressure(ip("10.0.1.3")), Pressure::Server, "the cap");
        assert!(a.admit(ip("10.0.1.3")).is_err());
        drop(slots);
        assert_eq!(a.held(), 0);
        assert_eq!(a.unproven.as_ref().unwrap().load(Ordering::Acquire), 0);
    }

    #[test]
    fn room_is_made_from_the_oldest_unproven_then_the_idlest_and_never_the_busy() {
        let now = Instant::now() + Duration::from_secs(100);
        let ago = |s: u64| Some(now - Duration::from_secs(s));
        let c = |key, src: &str, unproven, idle| Candidate {
            key,
            source: ip(src),
            unproven_since: unproven,
            idle_since: idle,
        };
        let conns = || {
            [
                c(1, "10.0.0.1", None, None),
                c(2, "10.0.0.1", None, ago(50)),
                c(3, "10.0.0.2", ago(1), None),
                c(4, "10.0.0.1", ago(2), ago(2)),
                c(5, "10.0.0.3", None, ago(3)),
            ]
            .into_iter()
        };
        assert_eq!(
            victim(conns(), Pressure::Server, now),
            Some(4),
            "unproven, any age"
        );
        assert_eq!(
            victim(conns(), Pressure::Source(ip("10.0.0.2")), now),
            Some(3),
            "of the pressing source"
        );
        let proven = [
            c(1, "10.0.0.1", None, None),
            c(2, "10.0.0.1", None, ago(50)),
        ];
        assert_eq!(victim(proven.into_iter(), Pressure::Server, now), Some(2));
        let fresh = [c(1, "10.0.0.1", None, ago(1))];
        assert_eq!(victim(fresh.into_iter(), Pressure::Server, now), None);
        // Past the unproven's share, only one unproven past the grace makes room.
        let just = |ms| Some(now - Duration::from_millis(ms));
        let share = [
            c(1, "10.0.0.1", just(200), None),
            c(2, "10.0.0.2", just(1500), None),
        ];
        assert_eq!(victim(share.into_iter(), Pressure::Share, now), Some(2));
        let young = [
            c(1, "10.0.0.1", just(200), None),
            c(3, "10.0.0.1", None, ago(60)),
        ];
        assert_eq!(
            victim(young.into_iter(), Pressure::Share, now),
            None,
            "a burst of fresh connections, and no proven one for the share"
        );
        let proven = [c(2, "10.0.0.1", None, ago(50))];
        assert_eq!(
            victim(proven.into_iter(), Pressure::Source(ip("10.0.0.1")), now),
            None,
            "a source's proven connections are never closed for it"
        );
    }
}
