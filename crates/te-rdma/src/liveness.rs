//! Which initiators a target still keeps queue pairs for, and when to let them go.
//!
//! A target's queue pairs for an initiator (the groups its handshakes made) see no traffic of
//! their own: an RC responder never learns that the process at the other end exited or was
//! killed. Left alone they stay until the endpoint store evicts them at `MC_MAX_EP_PER_CTX`
//! groups per device, holding device and kernel memory for every initiator that ever came and
//! went. te's handshake carries the initiator's control address (`te_control`); a sweep
//! dials each such address now and then and reports here what it found. An initiator whose
//! port refuses twice in a row (its host answers, nothing listens: the process is gone), or
//! that does not answer four times in a row (its host is gone), loses its groups; any answer
//! in between starts the count again. Dropping the groups of an initiator that is in fact
//! alive costs it one failed attempt and a new handshake, never a byte.
//!
//! Not here: the dialling (the sweep thread in `lib.rs`) and the store itself. Mooncake
//! initiators publish no control address, so their groups are left to the store's eviction,
//! and so are those of a te initiator that is alive but closed the segment (it says nothing
//! when it does).

use std::collections::HashMap;
use std::net::SocketAddr;

/// Refusals in a row after which an initiator counts as gone.
pub const REFUSED_LIMIT: u32 = 2;
/// Unanswered dials in a row after which an initiator counts as gone.
pub const SILENT_LIMIT: u32 = 4;

/// The address to dial for an initiator that announced `announced` over a handshake that
/// came from `peer`: the announced port on the connection's IP. An announced IP must be that
/// IP (or unspecified, for a listener on every address), so a handshake cannot send the
/// sweep to dial someone else; anything else, or no peer address, is not dialled.
pub fn control_address(announced: Option<&str>, peer: Option<SocketAddr>) -> Option<SocketAddr> {
    let announced: SocketAddr = announced?.parse().ok()?;
    let from = peer?.ip().to_canonical();
    let ip = announced.ip().to_canonical();
    (ip.is_unspecified() || ip == from).then(|| SocketAddr::new(from, announced.port()))
}

/// What dialling an initiator's control address found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Probe {
    /// It accepted the connection.
    Alive,
    /// Its host refused it: nothing listens there any more.
    Refused,
    /// No answer within the dial's timeout (or another error).
    Silent,
}

/// Misses in a row for one initiator.
#[derive(Debug, Default)]
struct Misses {
    refused: u32,
    silent: u32,
}

/// The initiators behind the target's queue-pair groups: group key → control address.
#[derive(Debug, Default)]
pub struct Initiators {
    by_key: HashMap<String, SocketAddr>,
    misses: HashMap<SocketAddr, Misses>,
}

impl Initiators {
    /// Records that the group under `key` belongs to the initiator at `addr`.
    pub fn insert(&mut self, key: String, addr: SocketAddr) {
        self.remove(&key);
        self.by_key.insert(key, addr);
    }

    /// Forgets the group under `key` (evicted or replaced by the store).
    pub fn remove(&mut self, key: &str) {
        if let Some(addr) = self.by_key.remove(key)
            && !self.by_key.values().any(|a| *a == addr)
        {
            self.misses.remove(&addr);
        }
    }

    /// The addresses to dial, each once.
    pub fn addresses(&self) -> Vec<SocketAddr> {
        let mut all: Vec<SocketAddr> = self.by_key.values().copied().collect();
        all.sort_unstable();
        all.dedup();
        all
    }

    /// Takes what dialling `addr` found; returns the keys of the groups to drop (and forgets
    /// them) when the initiator counts as gone.
    pub fn observe(&mut self, addr: SocketAddr, probe: Probe) -> Vec<String> {
        let m = self.misses.entry(addr).or_default();
        match probe {
            Probe::Alive => *m = Misses::default(),
            Probe::Refused => {
                m.refused += 1;
                m.silent = 0;
            }
            Probe::Silent => {
                m.silent += 1;
                m.refused = 0;
            }
        }
        if m.refused < REFUSED_LIMIT && m.silent < SILENT_LIMIT {
            return Vec::new();
        }
        self.misses.remove(&addr);
        let gone: Vec<String> = self
            .by_key
            .iter()
            .filter(|(_, a)| **a == addr)
            .map(|(k, _)| k.clone())
            .collect();
        for k in &gone {
            self.by_key.remove(k);
        }
        gone
    }

    /// Groups tracked.
    pub fn len(&self) -> usize {
        self.by_key.len()
    }

    /// Whether none is tracked.
    pub fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([198, 18, 0, 1], port))
    }

    #[test]
    fn an_initiator_that_refuses_twice_in_a_row_loses_its_groups() {
        let mut i = Initiators::default();
        i.insert("a#0".into(), addr(1));
        i.insert("a#1".into(), addr(1));
        i.insert("b#0".into(), addr(2));
        assert_eq!(i.addresses(), [addr(1), addr(2)], "each address once");
        assert!(
            i.observe(addr(1), Probe::Refused).is_empty(),
            "once is not enough"
        );
        assert!(i.observe(addr(1), Probe::Alive).is_empty());
        assert!(
            i.observe(addr(1), Probe::Refused).is_empty(),
            "an answer in between starts the count again"
        );
        let mut gone = i.observe(addr(1), Probe::Refused);
        gone.sort();
        assert_eq!(gone, ["a#0", "a#1"]);
        assert_eq!(i.addresses(), [addr(2)], "the other initiator stays");
        assert!(i.observe(addr(2), Probe::Alive).is_empty());
        assert_eq!(i.len(), 1);
    }

    #[test]
    fn a_silent_initiator_goes_after_four_dials_and_mixed_misses_reset() {
        let mut i = Initiators::default();
        i.insert("a#0".into(), addr(1));
        for _ in 0..SILENT_LIMIT - 1 {
            assert!(i.observe(addr(1), Probe::Silent).is_empty());
        }
        // A refusal after silences is a new run of misses, and the other way round.
        assert!(i.observe(addr(1), Probe::Refused).is_empty());
        for _ in 0..SILENT_LIMIT - 1 {
            assert!(i.observe(addr(1), Probe::Silent).is_empty());
        }
        assert_eq!(i.observe(addr(1), Probe::Silent), ["a#0"]);
        assert!(i.is_empty());
    }

    #[test]
    fn only_the_handshakes_own_host_is_dialled() {
        let peer = Some(SocketAddr::from(([198, 18, 0, 1], 40_000)));
        assert_eq!(
            control_address(Some("198.18.0.1:16001"), peer),
            Some(addr(16001))
        );
        assert_eq!(
            control_address(Some("0.0.0.0:16001"), peer),
            Some(addr(16001)),
            "a listener on every address: the connection's IP"
        );
        let mapped = Some("[::ffff:198.18.0.1]:40000".parse().unwrap());
        assert_eq!(
            control_address(Some("198.18.0.1:16001"), mapped),
            Some(addr(16001))
        );
        assert_eq!(
            control_address(Some("10.0.0.9:16001"), peer),
            None,
            "another host is never dialled"
        );
        assert_eq!(control_address(Some("not an address"), peer), None);
        assert_eq!(control_address(None, peer), None);
        assert_eq!(control_address(Some("198.18.0.1:16001"), None), None);
    }

    #[test]
    fn removed_groups_are_not_dialled() {
        let mut i = Initiators::default();
        i.insert("a#0".into(), addr(1));
        i.insert("a#1".into(), addr(1));
        i.remove("a#0");
        assert_eq!(i.addresses(), [addr(1)], "a#1 still needs it");
        assert!(i.observe(addr(1), Probe::Refused).is_empty());
        i.remove("a#1");
        assert!(i.addresses().is_empty());
        // A key handed to another initiator (a restart elsewhere) follows the new address.
        i.insert("a#0".into(), addr(1));
        i.insert("a#0".into(), addr(3));
        assert_eq!(i.addresses(), [addr(3)]);
    }
}
