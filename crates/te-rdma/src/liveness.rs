//! Which initiators a target still keeps queue pairs for, and when to let them go.
//!
//! A target's queue pairs for an initiator (the groups its handshakes made) see no traffic of
//! their own: an RC responder never learns that the process at the other end exited or was
//! killed. Left alone they stay until the endpoint store evicts them at `MC_MAX_EP_PER_CTX`
//! groups per device, holding device and kernel memory for every initiator that ever came and
//! went. A sweep dials each initiator's listener now and then and reports here what it found.
//! An initiator whose port refuses twice in a row (its host answers, nothing listens: the
//! process is gone), or that does not answer four times in a row (its host is gone), loses its
//! groups; any answer or handshake in between starts the count again. Dropping the groups of
//! an initiator that is in fact alive costs it one failed attempt and a new handshake, never
//! a byte.
//!
//! Where an initiator listens ([`Listener`]): a te initiator announces its control address in
//! its handshake (`te_control`). A Mooncake initiator announces nothing, but its NIC path
//! starts with its name, and an engine started with `P2PHANDSHAKE` is named by the
//! `host:port` its handshake listener serves. Under a metadata service that port may be no
//! listener at all, so a Mooncake address is a guess until it has answered once: one that
//! never answers is not dialled again, and its groups are left to the store's eviction, as
//! before.
//!
//! Not here: the dialling (the sweep thread, `sweep.rs`) and the store itself. A te initiator
//! that is alive but closed the segment keeps its groups (it says nothing when it does; they
//! are bounded by its devices and lanes, and its next handshake replaces them).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};

/// Refusals in a row after which an initiator counts as gone.
pub const REFUSED_LIMIT: u32 = 2;
/// Unanswered dials in a row after which an initiator counts as gone.
pub const SILENT_LIMIT: u32 = 4;

/// The address to dial for an initiator that announced `announced` over a handshake that
/// came from `peer`: the announced port on the connection's IP. An announced IP must be that
/// IP (or unspecified, for a listener on every address), so a handshake cannot send the
/// sweep to dial someone else. One exception: a handshake from this host (`is_local`, asked
/// only then) may name another of this host's addresses, which is dialled as named (the
/// kernel gives a connection between two local addresses the destination's as its source).
/// Anything else, or no peer address, is not dialled.
pub fn control_address(
    announced: Option<&str>,
    peer: Option<SocketAddr>,
    is_local: impl Fn(IpAddr) -> bool,
) -> Option<SocketAddr> {
    let announced: SocketAddr = announced?.parse().ok()?;
    let from = peer?.ip().to_canonical();
    let ip = announced.ip().to_canonical();
    if ip.is_unspecified() || ip == from {
        return Some(SocketAddr::new(from, announced.port()));
    }
    (is_local(from) && is_local(ip)).then(|| SocketAddr::new(ip, announced.port()))
}

/// What dialling an initiator's listener found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Probe {
    /// It answered: accepted the connection (te), or answered the probe frame (Mooncake).
    Alive,
    /// Its host refused it: nothing listens there any more.
    Refused,
    /// No answer within the dial's timeout (or another error, or a Mooncake listener that
    /// accepted but did not answer the probe).
    Silent,
}

/// What listens at an initiator's address, and so how the sweep asks it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Listener {
    /// te's control listener, which the initiator announced (`te_control`): a connection is
    /// an answer.
    Te,
    /// A Mooncake engine's handshake listener, guessed from its name: asked with a probe
    /// frame, which it answers without logging, and a guess until it has answered once.
    Mooncake,
}

/// One initiator's address: how to ask it, whether it has answered yet, its misses in a row.
#[derive(Debug)]
struct Peer {
    listener: Listener,
    confirmed: bool,
    refused: u32,
    silent: u32,
}

impl Peer {
    /// A peer just heard from: a te listener is known to be there, a Mooncake one is a guess.
    fn new(listener: Listener) -> Peer {
        Peer {
            listener,
            confirmed: listener == Listener::Te,
            refused: 0,
            silent: 0,
        }
    }
}

/// The initiators behind the target's queue-pair groups: group key → listener address.
#[derive(Debug, Default)]
pub struct Initiators {
    by_key: HashMap<String, SocketAddr>,
    peers: HashMap<SocketAddr, Peer>,
}

impl Initiators {
    /// Records that the group under `key` belongs to the initiator listening at `addr`.
    pub fn insert(&mut self, key: String, addr: SocketAddr, listener: Listener) {
        self.remove(&key);
        self.by_key.insert(key, addr);
        let peer = self.peers.entry(addr).or_insert(Peer::new(listener));
        if peer.listener != listener {
            // Another engine on that address now (a restart): what it is decides.
            *peer = Peer::new(listener);
        }
        // A handshake just came from it: misses counted before are no longer in a row.
        (peer.refused, peer.silent) = (0, 0);
    }

    /// Forgets the group under `key` (evicted or replaced by the store).
    pub fn remove(&mut self, key: &str) {
        if let Some(addr) = self.by_key.remove(key)
            && !self.by_key.values().any(|a| *a == addr)
        {
            self.peers.remove(&addr);
        }
    }

    /// The addresses to dial in a sweep, each once, with what listens there.
    pub fn addresses(&self) -> Vec<(SocketAddr, Listener)> {
        self.dial_list(true)
    }

    /// The guessed addresses not yet confirmed, to dial at once rather than at the next sweep.
    pub fn unconfirmed(&self) -> Vec<(SocketAddr, Listener)> {
        self.dial_list(false)
    }

    fn dial_list(&self, confirmed: bool) -> Vec<(SocketAddr, Listener)> {
        let mut all: Vec<_> = self
            .peers
            .iter()
            .filter(|(_, p)| p.confirmed == confirmed)
            .map(|(a, p)| (*a, p.listener))
            .collect();
        all.sort_unstable_by_key(|(a, _)| *a);
        all
    }

    /// Takes what dialling `addr` found; returns the keys of the groups to drop (and forgets
    /// them) when the initiator counts as gone. A guess that does not answer its first dial
    /// is forgotten with its keys, which are not returned: its groups stay in the store.
    pub fn observe(&mut self, addr: SocketAddr, probe: Probe) -> Vec<String> {
        let Some(p) = self.peers.get_mut(&addr) else {
            return Vec::new();
        };
        if !p.confirmed {
            if probe == Probe::Alive {
                p.confirmed = true;
            } else {
                self.forget(addr);
            }
            return Vec::new();
        }
        match probe {
            Probe::Alive => (p.refused, p.silent) = (0, 0),
            Probe::Refused => (p.refused, p.silent) = (p.refused + 1, 0),
            Probe::Silent => (p.refused, p.silent) = (0, p.silent + 1),
        }
        if p.refused < REFUSED_LIMIT && p.silent < SILENT_LIMIT {
            return Vec::new();
        }
        self.forget(addr)
    }

    /// Stops tracking `addr`; returns the keys of its groups.
    fn forget(&mut self, addr: SocketAddr) -> Vec<String> {
        self.peers.remove(&addr);
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

    fn te(ports: &[u16]) -> Vec<(SocketAddr, Listener)> {
        ports.iter().map(|p| (addr(*p), Listener::Te)).collect()
    }

    #[test]
    fn an_initiator_that_refuses_twice_in_a_row_loses_its_groups() {
        let mut i = Initiators::default();
        i.insert("a#0".into(), addr(1), Listener::Te);
        i.insert("a#1".into(), addr(1), Listener::Te);
        i.insert("b#0".into(), addr(2), Listener::Te);
        assert_eq!(i.addresses(), te(&[1, 2]), "each address once");
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
        assert_eq!(i.addresses(), te(&[2]), "the other initiator stays");
        assert!(i.observe(addr(2), Probe::Refused).is_empty());
        i.insert("b#1".into(), addr(2), Listener::Te);
        assert!(
            i.observe(addr(2), Probe::Refused).is_empty(),
            "a handshake in between starts the count again"
        );
        assert!(i.observe(addr(2), Probe::Alive).is_empty());
        assert_eq!(i.len(), 2);
    }

    #[test]
    fn a_silent_initiator_goes_after_four_dials_and_mixed_misses_reset() {
        let mut i = Initiators::default();
        i.insert("a#0".into(), addr(1), Listener::Te);
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
        let remote = |_: IpAddr| false;
        assert_eq!(
            control_address(Some("198.18.0.1:16001"), peer, remote),
            Some(addr(16001))
        );
        assert_eq!(
            control_address(Some("0.0.0.0:16001"), peer, remote),
            Some(addr(16001)),
            "a listener on every address: the connection's IP"
        );
        let mapped = Some("[::ffff:198.18.0.1]:40000".parse().unwrap());
        assert_eq!(
            control_address(Some("198.18.0.1:16001"), mapped, remote),
            Some(addr(16001))
        );
        assert_eq!(
            control_address(Some("10.0.0.9:16001"), peer, remote),
            None,
            "another host is never dialled"
        );
        assert_eq!(control_address(Some("not an address"), peer, remote), None);
        assert_eq!(control_address(None, peer, remote), None);
        assert_eq!(
            control_address(Some("198.18.0.1:16001"), None, remote),
            None
        );
    }

    #[test]
    fn a_handshake_from_this_host_may_name_another_of_its_addresses() {
        let here: [IpAddr; 3] = [
            "198.18.0.1".parse().unwrap(),
            "198.18.1.1".parse().unwrap(),
            "127.0.0.1".parse().unwrap(),
        ];
        let local = |ip: IpAddr| here.contains(&ip);
        let from_here = Some("198.18.0.1:40000".parse().unwrap());
        assert_eq!(
            control_address(Some("198.18.1.1:16001"), from_here, local),
            Some("198.18.1.1:16001".parse().unwrap()),
            "dialled as named"
        );
        assert_eq!(
            control_address(Some("10.0.0.9:16001"), from_here, local),
            None,
            "not an address of this host"
        );
        let from_elsewhere = Some("198.18.4.1:40000".parse().unwrap());
        assert_eq!(
            control_address(Some("198.18.1.1:16001"), from_elsewhere, local),
            None,
            "another host may not point the sweep at this one's other addresses"
        );
    }

    #[test]
    fn removed_groups_are_not_dialled() {
        let mut i = Initiators::default();
        i.insert("a#0".into(), addr(1), Listener::Te);
        i.insert("a#1".into(), addr(1), Listener::Te);
        i.remove("a#0");
        assert_eq!(i.addresses(), te(&[1]), "a#1 still needs it");
        assert!(i.observe(addr(1), Probe::Refused).is_empty());
        i.remove("a#1");
        assert!(i.addresses().is_empty());
        // A key handed to another initiator (a restart elsewhere) follows the new address.
        i.insert("a#0".into(), addr(1), Listener::Te);
        i.insert("a#0".into(), addr(3), Listener::Te);
        assert_eq!(i.addresses(), te(&[3]));
    }

    #[test]
    fn a_mooncake_address_is_a_guess_until_it_answers_once() {
        let mut i = Initiators::default();
        let mooncake = |p| vec![(addr(p), Listener::Mooncake)];
        i.insert("mooncake|a@rxe1|0".into(), addr(1), Listener::Mooncake);
        assert!(i.addresses().is_empty(), "not in a sweep yet");
        assert_eq!(i.unconfirmed(), mooncake(1), "dialled at once");
        assert!(i.observe(addr(1), Probe::Alive).is_empty());
        assert!(i.unconfirmed().is_empty());
        assert_eq!(i.addresses(), mooncake(1), "confirmed: swept from now on");
        assert!(i.observe(addr(1), Probe::Refused).is_empty());
        assert_eq!(i.observe(addr(1), Probe::Refused), ["mooncake|a@rxe1|0"]);

        // A name whose port is no listener (a metadata service's engine): never dropped.
        i.insert("mooncake|b@rxe1|0".into(), addr(2), Listener::Mooncake);
        i.insert("mooncake|b@rxe1|1".into(), addr(2), Listener::Mooncake);
        assert!(
            i.observe(addr(2), Probe::Refused).is_empty(),
            "a guess that does not answer drops nothing"
        );
        assert!(
            i.is_empty() && i.unconfirmed().is_empty(),
            "and is not dialled again"
        );
        i.insert("mooncake|c@rxe1|0".into(), addr(3), Listener::Mooncake);
        assert!(i.observe(addr(3), Probe::Silent).is_empty());
        assert!(i.is_empty());
        assert!(
            i.observe(addr(3), Probe::Refused).is_empty(),
            "an address no longer tracked: nothing"
        );
    }

    #[test]
    fn another_kind_of_engine_at_an_address_starts_over() {
        let mut i = Initiators::default();
        i.insert("mooncake|a@rxe1|0".into(), addr(1), Listener::Mooncake);
        assert!(i.observe(addr(1), Probe::Alive).is_empty());
        // The port now serves a te engine's control listener, announced: confirmed at once.
        i.insert("a@rxe1>t@rxe0#0".into(), addr(1), Listener::Te);
        assert_eq!(i.addresses(), te(&[1]));
        // And the other way round: the Mooncake engine's guess must answer again.
        i.insert("mooncake|a@rxe1|0".into(), addr(1), Listener::Mooncake);
        assert!(i.addresses().is_empty());
        assert_eq!(i.unconfirmed(), [(addr(1), Listener::Mooncake)]);
    }
}
