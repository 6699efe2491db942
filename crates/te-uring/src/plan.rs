//! Decisions about file I/O, kept apart from the I/O: which queued slices go out as one request
//! (neighbours in memory and in the file, same segment and direction, up to a size cap), and
//! whether a request goes `O_DIRECT` or buffered. Pure functions over extents.

use std::collections::VecDeque;

use te_core::Opcode;
use te_core::segment::SegmentId;
use te_core::transport::SliceOp;

/// What coalescing needs to know of a queued slice.
pub trait Extent {
    /// Target segment, direction, local address, file offset, length.
    fn extent(&self) -> (SegmentId, Opcode, u64, u64, u64);
}

impl Extent for SliceOp {
    fn extent(&self) -> (SegmentId, Opcode, u64, u64, u64) {
        (
            self.target.id(),
            self.opcode,
            self.local_addr,
            self.remote_addr,
            self.len,
        )
    }
}

/// Slices that go out as one I/O request: contiguous in memory and in the file.
#[derive(Debug)]
pub struct Group<T> {
    /// The slices, in order.
    pub ops: Vec<T>,
    /// Direction.
    pub opcode: Opcode,
    /// Local start address.
    pub local: u64,
    /// File offset.
    pub offset: u64,
    /// Total bytes.
    pub len: u64,
}

/// Takes the front slice and every following one that continues it (same segment and
/// direction, next in memory and in the file) while the total stays within `max_io`.
pub fn take_group<T: Extent>(queue: &mut VecDeque<T>, max_io: u64) -> Option<Group<T>> {
    let first = queue.pop_front()?;
    let (segment, opcode, local, offset, mut len) = first.extent();
    let mut ops = vec![first];
    while let Some(next) = queue.front() {
        let (s, o, l, f, n) = next.extent();
        let continues = s == segment && o == opcode && l == local + len && f == offset + len;
        if !continues || len + n > max_io {
            break;
        }
        len += n;
        ops.extend(queue.pop_front());
    }
    Some(Group {
        ops,
        opcode,
        local,
        offset,
        len,
    })
}

/// Whether a request may go `O_DIRECT`: a direct descriptor exists and address, offset and
/// length are all multiples of `align`.
pub fn goes_direct(has_direct: bool, local: u64, offset: u64, len: u64, align: u64) -> bool {
    has_direct && (local | offset | len) % align == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq)]
    struct E(SegmentId, Opcode, u64, u64, u64);
    impl Extent for E {
        fn extent(&self) -> (SegmentId, Opcode, u64, u64, u64) {
            (self.0, self.1, self.2, self.3, self.4)
        }
    }

    #[test]
    fn neighbours_merge_up_to_the_cap() {
        let mut q: VecDeque<E> = (0..6)
            .map(|i| E(1, Opcode::Write, 0x1000 + i * 100, 5000 + i * 100, 100))
            .collect();
        let g = take_group(&mut q, 400).unwrap();
        assert_eq!(
            (g.ops.len(), g.local, g.offset, g.len),
            (4, 0x1000, 5000, 400)
        );
        let g = take_group(&mut q, 400).unwrap();
        assert_eq!(
            (g.ops.len(), g.local, g.offset, g.len),
            (2, 0x1000 + 400, 5400, 200)
        );
        assert!(take_group(&mut q, 400).is_none());
    }

    #[test]
    fn gaps_direction_and_segment_break_a_group() {
        let mut q = VecDeque::from(vec![
            E(1, Opcode::Read, 0, 0, 10),
            E(1, Opcode::Read, 10, 20, 10),  // file gap
            E(1, Opcode::Write, 20, 30, 10), // direction
            E(2, Opcode::Write, 30, 40, 10), // segment
            E(2, Opcode::Write, 41, 50, 10), // memory gap
        ]);
        let sizes: Vec<usize> = std::iter::from_fn(|| take_group(&mut q, 1 << 20))
            .map(|g| g.ops.len())
            .collect();
        assert_eq!(sizes, vec![1, 1, 1, 1, 1]);
    }

    #[test]
    fn a_slice_larger_than_the_cap_still_goes_alone() {
        let mut q = VecDeque::from(vec![
            E(1, Opcode::Read, 0, 0, 1000),
            E(1, Opcode::Read, 1000, 1000, 1),
        ]);
        assert_eq!(take_group(&mut q, 10).unwrap().len, 1000);
        assert_eq!(take_group(&mut q, 10).unwrap().len, 1);
    }

    #[test]
    fn direct_needs_every_field_aligned() {
        assert!(goes_direct(true, 4096, 8192, 1 << 20, 4096));
        assert!(!goes_direct(false, 4096, 8192, 1 << 20, 4096));
        assert!(!goes_direct(true, 4097, 8192, 1 << 20, 4096));
        assert!(!goes_direct(true, 4096, 512, 1 << 20, 4096));
        assert!(!goes_direct(true, 4096, 8192, 100, 4096));
    }
}
