//! The endpoint store: which connections to peers are kept, with a capacity and an eviction
//! policy (SIEVE by default, or FIFO; `MC_ENDPOINT_STORE_TYPE`, capacity `MC_MAX_EP_PER_CTX`).
//!
//! A pure container: it decides what to evict and hands the evicted values back; the transport
//! closes them once their in-flight slices have settled. SIEVE keeps a queue (newest at the
//! head) and a hand that walks from the tail towards the head, clearing "visited" bits until it
//! finds an entry not used since the hand last passed, which it evicts.

use std::collections::HashMap;
use std::hash::Hash;

use te_core::config::EvictionPolicy;

/// Endpoints by key, at most `capacity` of them.
#[derive(Debug)]
pub struct EndpointStore<K, V> {
    capacity: usize,
    policy: EvictionPolicy,
    values: HashMap<K, (V, bool)>,
    /// Keys oldest first (index 0 is the tail, the last is the head).
    order: Vec<K>,
    /// SIEVE's hand: index into `order` where the next eviction search starts.
    hand: usize,
}

impl<K: Eq + Hash + Clone, V> EndpointStore<K, V> {
    /// An empty store holding at most `capacity` (≥ 1) endpoints.
    pub fn new(capacity: usize, policy: EvictionPolicy) -> Self {
        EndpointStore {
            capacity: capacity.max(1),
            policy,
            values: HashMap::new(),
            order: Vec::new(),
            hand: 0,
        }
    }

    /// The endpoint for `key`, marking it used.
    pub fn get(&mut self, key: &K) -> Option<&V> {
        self.values.get_mut(key).map(|(v, visited)| {
            *visited = true;
            &*v
        })
    }

    /// Adds an endpoint (replacing one under the same key); returns what had to make room.
    pub fn insert(&mut self, key: K, value: V) -> Vec<(K, V)> {
        let mut evicted = Vec::new();
        if let Some(old) = self.remove(&key) {
            evicted.push((key.clone(), old));
        }
        while self.order.len() >= self.capacity {
            match self.evict_one() {
                Some(e) => evicted.push(e),
                None => break,
            }
        }
        self.values.insert(key.clone(), (value, false));
        self.order.push(key);
        evicted
    }

    /// Removes an endpoint (a broken one, or its peer's segment closed).
    pub fn remove(&mut self, key: &K) -> Option<V> {
        let (value, _) = self.values.remove(key)?;
        if let Some(i) = self.order.iter().position(|k| k == key) {
            self.remove_at(i);
        }
        Some(value)
    }

    /// Removes every endpoint `pred` selects; returns them.
    pub fn remove_where(&mut self, pred: impl Fn(&K) -> bool) -> Vec<(K, V)> {
        let keys: Vec<K> = self.order.iter().filter(|k| pred(k)).cloned().collect();
        keys.into_iter()
            .filter_map(|k| self.remove(&k).map(|v| (k, v)))
            .collect()
    }

    /// Takes every endpoint out.
    pub fn drain(&mut self) -> Vec<(K, V)> {
        self.hand = 0;
        self.order
            .drain(..)
            .filter_map(|k| self.values.remove(&k).map(|(v, _)| (k, v)))
            .collect()
    }

    /// Endpoints held.
    pub fn len(&self) -> usize {
        self.order.len()
    }

    /// Whether none is held.
    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    fn remove_at(&mut self, i: usize) -> K {
        let k = self.order.remove(i);
        if self.hand > i {
            self.hand -= 1;
        }
        if self.hand >= self.order.len() {
            self.hand = 0;
        }
        k
    }

    fn evict_one(&mut self) -> Option<(K, V)> {
        if self.order.is_empty() {
            return None;
        }
        let i = match self.policy {
            EvictionPolicy::Fifo => 0,
            EvictionPolicy::Sieve => {
                let mut i = self.hand.min(self.order.len() - 1);
                // At most two sweeps: the first may only clear bits.
                for _ in 0..2 * self.order.len() {
                    let visited = &mut self.values.get_mut(&self.order[i])?.1;
                    if !*visited {
                        break;
                    }
                    *visited = false;
                    i = (i + 1) % self.order.len();
                }
                i
            }
        };
        let key = self.remove_at(i);
        self.hand = i.min(self.order.len().saturating_sub(1));
        self.values.remove(&key).map(|(v, _)| (key, v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys<V>(evicted: &[(u32, V)]) -> Vec<u32> {
        evicted.iter().map(|e| e.0).collect()
    }

    #[test]
    fn fifo_evicts_the_oldest() {
        let mut s = EndpointStore::new(2, EvictionPolicy::Fifo);
        assert!(s.insert(1, "a").is_empty() && s.insert(2, "b").is_empty());
        s.get(&1);
        assert_eq!(keys(&s.insert(3, "c")), vec![1], "FIFO ignores use");
        assert_eq!(s.len(), 2);
    }

    #[test]
    fn sieve_spares_recently_used_entries() {
        let mut s = EndpointStore::new(3, EvictionPolicy::Sieve);
        for k in 1..=3 {
            s.insert(k, k);
        }
        s.get(&1);
        s.get(&3);
        assert_eq!(
            keys(&s.insert(4, 4)),
            vec![2],
            "2 was never used since insertion"
        );
        // The hand continues after 2: 3 loses its bit, and the new, unused 4 goes (SIEVE
        // demotes new entries quickly).
        assert_eq!(keys(&s.insert(5, 5)), vec![4]);
        assert!(s.get(&1).is_some() && s.get(&3).is_some() && s.get(&5).is_some());
        assert_eq!(s.len(), 3);
        // Everything used: one full sweep clears the bits, then the hand's entry goes.
        assert_eq!(s.insert(6, 6).len(), 1);
        assert_eq!(s.len(), 3);
    }

    #[test]
    fn capacity_holds_under_churn_and_every_value_comes_back_once() {
        for policy in [EvictionPolicy::Sieve, EvictionPolicy::Fifo] {
            let mut s = EndpointStore::new(64, policy);
            let mut returned = 0usize;
            for k in 0..10_000u32 {
                if k % 3 == 0 {
                    s.get(&(k / 2));
                }
                returned += s.insert(k % 97, k).len();
                if k % 11 == 0 {
                    returned += s.remove(&(k % 89)).map_or(0, |_| 1);
                }
                assert!(s.len() <= 64);
            }
            returned += s.drain().len();
            assert_eq!(
                returned, 10_000,
                "{policy:?}: every inserted value is handed back exactly once"
            );
            assert!(s.is_empty());
        }
    }

    #[test]
    fn policies_parse() {
        assert_eq!(EvictionPolicy::parse("sieve"), Some(EvictionPolicy::Sieve));
        assert_eq!(EvictionPolicy::parse("FIFO"), Some(EvictionPolicy::Fifo));
        assert_eq!(EvictionPolicy::parse("LRU"), None);
    }
}
