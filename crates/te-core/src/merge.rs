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

/// A run's requests shared out to its slices, slice by slice in order: each slice's shares are
/// found from where the previous slice's began, so slicing a run is one pass over its requests,
/// not one per slice.
#[derive(Debug)]
pub struct Cover<'a> {
    /// The run's request lengths, in run order.
    lens: &'a [u64],
    /// The first request not wholly before the last slice asked about, and its offset.
    at: usize,
    start: u64,
}

impl<'a> Cover<'a> {
    /// The cover of a run of requests of `lens` bytes.
    pub fn new(lens: &'a [u64]) -> Self {
        Cover {
            lens,
            at: 0,
            start: 0,
        }
    }

    /// Into `out` (emptied first): the requests that bytes `offset..offset + len` of the run
    /// cover, as (position in the run, bytes of theirs), in order. Slices must be asked about
    /// in order (`offset` never below the last call's); one that starts further back gets no
    /// share of the requests already passed.
    pub fn shares(&mut self, offset: u64, len: u64, out: &mut Vec<(usize, u64)>) {
        out.clear();
        while let Some(&l) = self.lens.get(self.at) {
            let stop = self.start.saturating_add(l);
            if stop > offset {
                break;
            }
            self.start = stop;
            self.at += 1;
        }
        let end = offset.saturating_add(len);
        let mut start = self.start;
        for (i, &l) in self.lens.iter().enumerate().skip(self.at) {
            if start >= end {
                break;
            }
            let stop = start.saturating_add(l);
            if stop > offset {
                out.push((i, stop.min(end) - start.max(offset)));
            }
            start = stop;
        }
    }
}

/// How many of a run's slices carry bytes of each of its requests (`lens`, in run order), for
/// the run cut as [`crate::slicer::plan`] cuts it into `slices` slices of `slice_size` bytes
/// (the last one taking the rest). Submit counts them all before it posts any slice, so no
/// slice can end a task while more of its slices are still to be made.
pub fn slices_per_request(
    lens: &[u64],
    slice_size: u64,
    slices: u64,
) -> impl Iterator<Item = u64> + '_ {
    let slice_size = slice_size.max(1);
    let last_slice = slices.saturating_sub(1);
    let index = move |byte: u64| (byte / slice_size).min(last_slice);
    let mut start = 0u64;
    lens.iter().map(move |&len| {
        let (first, last) = (index(start), index(start + len.max(1) - 1));
        start += len;
        last - first + 1
    })
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

    /// Every share of every slice, slicing the run of `lens` as submit does.
    fn shares_by_slice(
        lens: &[u64],
        slice_size: u64,
        fragment_limit: u64,
    ) -> Vec<Vec<(usize, u64)>> {
        let total: u64 = lens.iter().sum();
        let mut cover = Cover::new(lens);
        let mut out = Vec::new();
        crate::slicer::plan(total, slice_size, fragment_limit)
            .map(|s| {
                cover.shares(s.offset, s.len, &mut out);
                out.clone()
            })
            .collect()
    }

    #[test]
    fn a_slice_is_shared_out_by_bytes() {
        let lens = [4096, 4096, 100, 8000];
        let mut cover = Cover::new(&lens);
        let mut out = Vec::new();
        cover.shares(0, 4096, &mut out);
        assert_eq!(out, vec![(0, 4096)]);
        cover.shares(2048, 4096, &mut out);
        assert_eq!(out, vec![(0, 2048), (1, 2048)]);
        cover.shares(4000, 5000, &mut out);
        assert_eq!(out, vec![(0, 96), (1, 4096), (2, 100), (3, 708)]);
        cover.shares(8292, 8000, &mut out);
        assert_eq!(out, vec![(3, 8000)]);
        // Slicing the whole run gives every request exactly its bytes.
        for slice_size in [1000, 3000, 4096, 20000] {
            let mut got = [0u64; 4];
            for (i, n) in shares_by_slice(&lens, slice_size, 0).into_iter().flatten() {
                got[i] += n;
            }
            assert_eq!(got, lens, "slices of {slice_size}");
        }
    }

    #[test]
    fn slices_are_counted_per_request_as_they_are_shared_out() {
        let runs: [&[u64]; 6] = [
            &[4096; 128],
            &[1 << 20; 4],
            &[4096, 4096, 100, 8000],
            &[1, 65536, 1, 65535, 2, 131072],
            &[65536 + 16384],
            &[100_000, 7, 30_000, 65536 * 3 + 1],
        ];
        for lens in runs {
            for (slice_size, fragment_limit) in
                [(65536, 16384), (4096, 1024), (65536, 0), (1000, 0)]
            {
                let total: u64 = lens.iter().sum();
                let slices = crate::slicer::count(total, slice_size, fragment_limit);
                let mut seen = vec![0u64; lens.len()];
                for share in shares_by_slice(lens, slice_size, fragment_limit) {
                    assert!(!share.is_empty());
                    for (i, n) in share {
                        assert!(n > 0, "a share has bytes");
                        seen[i] += 1;
                    }
                }
                let counted: Vec<u64> = slices_per_request(lens, slice_size, slices).collect();
                assert_eq!(
                    counted, seen,
                    "{lens:?} in slices of {slice_size}/{fragment_limit}"
                );
            }
        }
    }
}
