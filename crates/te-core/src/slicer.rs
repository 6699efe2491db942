//! Cutting a task into slices: a pure function of the task length and the slice settings.
//!
//! Slices are `slice_size` bytes; a remainder up to `slice_size + fragment_limit` becomes one
//! final slice (Mooncake's rule), so no tiny tail slice is sent. A task never spans two regions
//! (the engine validates that before slicing), so no slice crosses a region boundary.

/// A slice's place in its task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlicePlan {
    /// Offset from the task's start.
    pub offset: u64,
    /// Length in bytes (> 0).
    pub len: u64,
}

/// Number of slices [`plan`] yields for a task of `len` bytes.
pub fn count(len: u64, slice_size: u64, fragment_limit: u64) -> u64 {
    let slice_size = slice_size.max(1);
    if len == 0 {
        return 0;
    }
    if len <= slice_size + fragment_limit {
        return 1;
    }
    // Full slices while more than `slice_size + fragment_limit` remains, then one tail slice.
    (len - fragment_limit - 1) / slice_size + 1
}

/// The slices of a task of `len` bytes, in order, covering it exactly.
pub fn plan(len: u64, slice_size: u64, fragment_limit: u64) -> impl Iterator<Item = SlicePlan> {
    let slice_size = slice_size.max(1);
    let n = count(len, slice_size, fragment_limit);
    (0..n).map(move |i| {
        let offset = i * slice_size;
        let len = if i + 1 == n { len - offset } else { slice_size };
        SlicePlan { offset, len }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_cover_the_task_exactly_with_a_merged_tail() {
        for slice_size in [1u64, 7, 4096, 65536] {
            for fragment_limit in [0, 1, slice_size / 4, slice_size] {
                let big: &[u64] = if slice_size >= 4096 { &[1 << 26] } else { &[] };
                for len in (0..3 * slice_size + 5)
                    .chain([10 * slice_size + 3])
                    .chain(big.iter().copied())
                {
                    let slices: Vec<_> = plan(len, slice_size, fragment_limit).collect();
                    assert_eq!(slices.len() as u64, count(len, slice_size, fragment_limit));
                    let mut next = 0;
                    for (i, s) in slices.iter().enumerate() {
                        assert_eq!(s.offset, next, "contiguous");
                        assert!(s.len > 0);
                        if i + 1 < slices.len() {
                            assert_eq!(s.len, slice_size);
                        } else {
                            assert!(s.len <= slice_size + fragment_limit, "tail merged");
                            if slices.len() > 1 {
                                assert!(s.len > fragment_limit, "no tiny tail");
                            }
                        }
                        next += s.len;
                    }
                    assert_eq!(next, len, "covers {len} with {slice_size}/{fragment_limit}");
                }
            }
        }
    }

    #[test]
    fn mooncake_defaults() {
        let sizes = |len| plan(len, 65536, 16384).map(|s| s.len).collect::<Vec<_>>();
        assert_eq!(sizes(1), vec![1]);
        assert_eq!(sizes(65536 + 16384), vec![81920]);
        assert_eq!(sizes(65536 + 16385), vec![65536, 16385]);
        assert_eq!(sizes(1 << 20).len(), 16);
    }
}
