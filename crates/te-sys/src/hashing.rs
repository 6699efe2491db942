//! A hasher for ids te makes itself (segment ids, batch ids: counters, never chosen
//! by a peer, so nobody can pick colliding keys). The default SipHash guards maps against
//! keys an attacker chooses, and costs more than the rest of a lookup on paths run several
//! times per batch. Not for keys that come from the wire or from names.

use std::hash::{BuildHasherDefault, Hasher};

/// Hashes one integer with one multiply; bytes (other key types) fall back to FNV-1a.
#[derive(Clone, Copy, Debug, Default)]
pub struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    }

    fn write_u64(&mut self, n: u64) {
        // Fibonacci hashing: the high bits, which hashbrown uses, mix every bit of the id.
        self.0 = (n ^ self.0).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

/// Builds [`IdHasher`]s for `HashMap`s keyed by engine-made ids.
pub type IdHashing = BuildHasherDefault<IdHasher>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn consecutive_ids_spread_over_the_high_bits_and_maps_find_them() {
        let h = |n: u64| {
            let mut s = IdHasher::default();
            s.write_u64(n);
            s.finish() >> 57
        };
        let buckets: std::collections::HashSet<u64> = (1..=64).map(h).collect();
        assert!(
            buckets.len() > 32,
            "{} of 128 top-7-bit buckets",
            buckets.len()
        );
        let mut m: HashMap<u64, u64, IdHashing> = HashMap::default();
        for i in 0..1000 {
            m.insert(i, i * 3);
        }
        assert!((0..1000).all(|i| m.get(&i) == Some(&(i * 3))));
        assert_eq!(m.get(&1000), None);
    }
}
