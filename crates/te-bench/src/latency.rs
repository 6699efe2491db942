//! [`Latencies`]: the batch latencies of a run, kept as a histogram of fixed size, so a run of
//! any length measures every batch in the same memory (a list of samples grew by 8 bytes per
//! batch: 70 MB a minute at a million batches a second, and a sort at the end).
//!
//! Buckets are log-linear: exact below 256 ns, then 128 buckets per power of two, so a
//! percentile is reported within 0.4 % of the sample it stands for (the middle of its bucket).
//! The mean, the minimum and the maximum are exact. It does not time anything itself.

use std::time::Duration;

/// Mantissa bits kept per power of two (128 buckets each).
const MANTISSA: u32 = 7;
/// Values below this are their own bucket.
const EXACT: u64 = 2 << MANTISSA;
/// Buckets for every `u64` nanosecond value.
const BUCKETS: usize = ((64 - MANTISSA as usize - 1) << MANTISSA) + EXACT as usize;

/// A histogram of latencies, in nanoseconds.
#[derive(Clone, Debug, Default)]
pub(crate) struct Latencies {
    /// Samples per bucket; allocated at the first sample.
    counts: Vec<u64>,
    count: u64,
    sum_ns: u128,
    min_ns: u64,
    max_ns: u64,
}

/// The bucket of `ns`.
fn bucket(ns: u64) -> usize {
    if ns < EXACT {
        return ns as usize;
    }
    // The top MANTISSA + 1 bits of `ns` (a value in EXACT/2..EXACT) and how far they were
    // shifted down.
    let shift = 63 - ns.leading_zeros() - MANTISSA;
    let top = (ns >> shift) as usize;
    ((shift as usize) << MANTISSA) + top
}

/// The lowest value of bucket `i` and its width.
fn bucket_range(i: usize) -> (u64, u64) {
    if i < EXACT as usize {
        return (i as u64, 1);
    }
    let shift = (i >> MANTISSA) as u32 - 1;
    let top = (i as u64 & ((1 << MANTISSA) - 1)) | (1 << MANTISSA);
    (top << shift, 1 << shift)
}

impl Latencies {
    /// Counts one sample.
    pub(crate) fn record(&mut self, latency: Duration) {
        let ns = u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX);
        if self.counts.is_empty() {
            self.counts = vec![0; BUCKETS];
            self.min_ns = ns;
        }
        self.counts[bucket(ns)] += 1;
        self.count += 1;
        self.sum_ns += u128::from(ns);
        self.min_ns = self.min_ns.min(ns);
        self.max_ns = self.max_ns.max(ns);
    }

    /// Adds `other`'s samples (another thread's).
    pub(crate) fn merge(&mut self, other: &Latencies) {
        if other.count == 0 {
            return;
        }
        if self.count == 0 {
            *self = other.clone();
            return;
        }
        for (mine, theirs) in self.counts.iter_mut().zip(&other.counts) {
            *mine += theirs;
        }
        self.count += other.count;
        self.sum_ns += other.sum_ns;
        self.min_ns = self.min_ns.min(other.min_ns);
        self.max_ns = self.max_ns.max(other.max_ns);
    }

    /// How many samples.
    #[cfg(test)]
    fn count(&self) -> u64 {
        self.count
    }

    /// The mean, in µs (0 without samples).
    pub(crate) fn mean_us(&self) -> f64 {
        match self.count {
            0 => 0.0,
            n => self.sum_ns as f64 / n as f64 / 1e3,
        }
    }

    /// The sample at quantile `q` (the one a sorted list would hold at `round((n - 1) × q)`),
    /// in µs: the middle of its bucket, kept within the smallest and largest samples (which
    /// are exact). 0 without samples.
    pub(crate) fn percentile_us(&self, q: f64) -> f64 {
        if self.count == 0 {
            return 0.0;
        }
        let rank = ((self.count - 1) as f64 * q.clamp(0.0, 1.0)).round() as u64;
        if rank == 0 {
            return self.min_ns as f64 / 1e3;
        }
        if rank == self.count - 1 {
            return self.max_ns as f64 / 1e3;
        }
        let mut seen = 0;
        for (i, &n) in self.counts.iter().enumerate() {
            seen += n;
            if seen > rank {
                let (low, width) = bucket_range(i);
                let middle = low + width / 2;
                return middle.clamp(self.min_ns, self.max_ns) as f64 / 1e3;
            }
        }
        self.max_ns as f64 / 1e3
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sorted list's sample at `q`, as the histogram defines it.
    fn exact(sorted: &[u64], q: f64) -> f64 {
        sorted[((sorted.len() - 1) as f64 * q).round() as usize] as f64 / 1e3
    }

    #[test]
    fn buckets_cover_every_value_in_order_without_gaps() {
        let mut next = 0;
        for i in 0..BUCKETS {
            let (low, width) = bucket_range(i);
            assert_eq!(low, next, "bucket {i}");
            assert_eq!(bucket(low), i);
            assert_eq!(bucket(low + (width - 1)), i);
            next = low.wrapping_add(width);
        }
        assert_eq!(next, 0, "the last bucket ends at u64::MAX");
        assert_eq!(bucket(u64::MAX), BUCKETS - 1);
    }

    #[test]
    fn percentiles_are_within_half_a_percent_of_the_sorted_samples() {
        // A spread of latencies from 100 ns to 100 ms, with a tail.
        let mut state = 0x9e37_79b9_7f4a_7c15_u64;
        let mut samples: Vec<u64> = (0..100_000)
            .map(|i| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                let base = 100 + state % 50_000;
                if i % 100 == 0 { base * 2_000 } else { base }
            })
            .collect();
        let mut h = Latencies::default();
        for &ns in &samples {
            h.record(Duration::from_nanos(ns));
        }
        samples.sort_unstable();
        for q in [0.0, 0.001, 0.5, 0.9, 0.99, 0.999, 1.0] {
            let (got, want) = (h.percentile_us(q), exact(&samples, q));
            assert!(
                (got - want).abs() <= want * 0.005,
                "q {q}: {got} us against {want} us"
            );
        }
        let mean = samples.iter().map(|&n| n as f64).sum::<f64>() / samples.len() as f64 / 1e3;
        assert!((h.mean_us() - mean).abs() < 1e-6);
        assert_eq!(h.count(), 100_000);
        assert_eq!(
            h.percentile_us(0.0),
            samples[0] as f64 / 1e3,
            "the minimum is exact"
        );
        assert_eq!(
            h.percentile_us(1.0),
            samples[samples.len() - 1] as f64 / 1e3,
            "the maximum is exact"
        );
    }

    #[test]
    fn small_values_are_exact_and_merging_equals_recording_together() {
        let mut a = Latencies::default();
        let mut b = Latencies::default();
        let mut both = Latencies::default();
        for ns in [1_u64, 2, 3, 4, 200, 255] {
            a.record(Duration::from_nanos(ns));
            both.record(Duration::from_nanos(ns));
        }
        for ns in [7_u64, 9_000, 1 << 40] {
            b.record(Duration::from_nanos(ns));
            both.record(Duration::from_nanos(ns));
        }
        a.merge(&b);
        a.merge(&Latencies::default());
        for q in [0.0, 0.25, 0.5, 0.75, 1.0] {
            assert_eq!(a.percentile_us(q), both.percentile_us(q), "q {q}");
        }
        assert_eq!((a.count(), a.mean_us()), (both.count(), both.mean_us()));
        assert_eq!(
            a.percentile_us(0.25),
            0.003,
            "2 of 9 below: the third smallest, 3 ns"
        );
        let mut empty = Latencies::default();
        assert_eq!((empty.percentile_us(0.99), empty.mean_us()), (0.0, 0.0));
        empty.merge(&b);
        assert_eq!(empty.count(), 3);
    }
}
