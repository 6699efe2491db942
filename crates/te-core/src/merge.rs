//! Request merging: which requests of one submit travel as one, and which bytes of a merged
//! slice belong to which request.
//!
//! Requests that go the same way (same target segment and buffer, opcode, local region and
//! transport: the caller's key) and are contiguous in both local and remote memory become one
//! run, sliced as a single request: 128 adjacent 4 KiB blocks travel as two 256 KiB requests'
//! worth of 64 KiB slices instead of 128 requests. Every request keeps its own task; each slice
//! of a run says which tasks it carries and how many of its bytes are each one's, so status,
//! bytes moved, failure and cancellation stay per request.
//!
//! This module decides; it does no I/O and touches no task. `MC_TE_MERGE_REQUESTS=0` (TENT's
//! `merge_requests: false`) turns merging off.

/// One request as merging sees it: what it must share with a neighbour to merge (`key`), and
/// where its bytes are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece<K> {
    /// Everything two requests must share to travel together.
    pub key: K,
    /// Local start address.
    pub source: u64,
    /// Remote start address.
    pub target: u64,
    /// Bytes.
    pub len: u64,
}

/// The runs of `pieces`: indices into it, grouped (two allocations however many requests).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Runs {
    order: Vec<usize>,
    /// Where each run ends in `order`.
    ends: Vec<usize>,
}

impl Runs {
    /// Each run, in order: the indices of its requests, in address order.
    pub fn iter(&self) -> impl Iterator<Item = &[usize]> {
        let starts = std::iter::once(0).chain(self.ends.iter().copied());
        starts
            .zip(self.ends.iter().copied())
            .map(|(a, b)| &self.order[a..b])
    }

    /// How many runs.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }
}

/// The runs of `pieces`, each in address order. With `merge` false every request is a run of
/// its own, in submit order. Requests are sorted by key and target address first, so a batch
/// submitted out of order still merges; a request that overlaps its predecessor, or leaves a
/// gap in either memory, starts a new run.
pub fn runs<K: Ord + Copy>(pieces: &[Piece<K>], merge: bool) -> Runs {
    let mut order: Vec<usize> = (0..pieces.len()).collect();
    if !merge || pieces.len() < 2 {
        return Runs {
            ends: (1..=pieces.len()).collect(),
            order,
        };
    }
    order.sort_by_key(|&i| (pieces[i].key, pieces[i].target, pieces[i].source));
    let mut ends = Vec::new();
    for (at, pair) in order.windows(2).enumerate() {
        let (q, p) = (&pieces[pair[0]], &pieces[pair[1]]);
        let joins = q.key == p.key
            && q.source.checked_add(q.len) == Some(p.source)
            && q.target.checked_add(q.len) == Some(p.target);
        if !joins {
            ends.push(at + 1);
        }
    }
    ends.push(order.len());
    Runs { order, ends }
}

/// The requests of a run that bytes `offset..offset + len` of the run cover, as (position in
/// the run, bytes of theirs), in order. `lens` are the run's request lengths.
pub fn cover(lens: &[u64], offset: u64, len: u64) -> Vec<(usize, u64)> {
    let mut out = Vec::new();
    let end = offset.saturating_add(len);
    let mut start = 0u64;
    for (i, &l) in lens.iter().enumerate() {
        let stop = start.saturating_add(l);
        if stop > offset && start < end {
            out.push((i, stop.min(end) - start.max(offset)));
        }
        if stop >= end {
            break;
        }
        start = stop;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn piece(key: u8, source: u64, target: u64, len: u64) -> Piece<u8> {
        Piece {
            key,
            source,
            target,
            len,
        }
    }

    #[test]
    fn contiguous_requests_merge_in_address_order() {
        // Submitted out of order: 2, 0, 1 are adjacent in both memories.
        let p = [
            piece(0, 0x2000, 0x9000, 0x1000),
            piece(0, 0x0000, 0x7000, 0x1000),
            piece(0, 0x1000, 0x8000, 0x1000),
        ];
        let all = |r: Runs| r.iter().map(<[usize]>::to_vec).collect::<Vec<_>>();
        assert_eq!(all(runs(&p, true)), vec![vec![1, 2, 0]]);
        assert_eq!(all(runs(&p, false)), vec![vec![0], vec![1], vec![2]]);
    }

    #[test]
    fn gaps_keys_and_overlaps_split_runs() {
        let p = [
            piece(0, 0x0000, 0x0000, 0x1000),
            // Contiguous locally, a gap remotely.
            piece(0, 0x1000, 0x2000, 0x1000),
            // Contiguous with the one before in both, another key (another segment or opcode).
            piece(1, 0x2000, 0x3000, 0x1000),
            // The same target range again (overlap): never merged with its twin.
            piece(0, 0x0000, 0x0000, 0x1000),
        ];
        let r = runs(&p, true);
        assert_eq!(r.len(), 4, "{r:?}");
        let mut all: Vec<usize> = r.iter().flatten().copied().collect();
        all.sort_unstable();
        assert_eq!(all, vec![0, 1, 2, 3], "every request in exactly one run");
    }

    #[test]
    fn addresses_at_the_top_of_memory_do_not_wrap_into_a_merge() {
        let p = [
            piece(0, u64::MAX - 0xfff, 0x1000, 0x1000),
            piece(0, 0, 0x2000, 0x1000),
        ];
        assert_eq!(runs(&p, true).len(), 2);
    }

    #[test]
    fn a_slice_is_shared_out_by_bytes() {
        let lens = [4096, 4096, 100, 8000];
        assert_eq!(cover(&lens, 0, 4096), vec![(0, 4096)]);
        assert_eq!(cover(&lens, 2048, 4096), vec![(0, 2048), (1, 2048)]);
        assert_eq!(
            cover(&lens, 4000, 5000),
            vec![(0, 96), (1, 4096), (2, 100), (3, 708)]
        );
        assert_eq!(cover(&lens, 8292, 8000), vec![(3, 8000)]);
        let total: u64 = lens.iter().sum();
        // Slicing the whole run gives every request exactly its bytes.
        let mut got = [0u64; 4];
        let mut off = 0;
        while off < total {
            let len = 3000.min(total - off);
            for (i, n) in cover(&lens, off, len) {
                got[i] += n;
            }
            off += len;
        }
        assert_eq!(got, lens);
    }
}
