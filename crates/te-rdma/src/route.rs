//! Where a slice goes on the verbs layer, kept apart from the verbs calls so it tests without a
//! device: which device serves a rail the engine chose, and how a slice splits into work
//! requests where either side's memory is registered in pieces (`MC_MAX_MR_SIZE`).
//!
//! The engine picks each slice's (local rail, remote rail) from both sides' priority matrices
//! and its rail health; rails are named by network interface or by device. This module maps
//! such a name to a device; [`crate::failover`] then skips devices that are paused or down.

/// The device among `devices` (name, network interface under it) that serves rail `rail`: the
/// device of that name, else the device over that interface.
pub fn device_for_rail<'a>(
    rail: &str,
    devices: impl Iterator<Item = (&'a str, Option<&'a str>)> + Clone,
) -> Option<usize> {
    devices
        .clone()
        .position(|(name, _)| name == rail)
        .or_else(|| {
            devices
                .into_iter()
                .position(|(_, netdev)| netdev == Some(rail))
        })
}

/// The device for rail index `rail`: the one [`device_for_rail`] maps it to, else the index
/// modulo the device count (rails that name no device still spread over them).
pub fn device_index(mapped: Option<usize>, rail: u16, devices: usize) -> usize {
    mapped.unwrap_or(rail as usize % devices.max(1))
}

/// One work request of a slice: `len` bytes at `offset` into the slice, within local memory
/// region piece `local` and remote piece `remote`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    /// Offset into the slice.
    pub offset: u64,
    /// Bytes.
    pub len: u64,
    /// Index of the local memory region piece.
    pub local: usize,
    /// Index of the remote memory region piece.
    pub remote: usize,
}

/// Splits a slice of `len` bytes that starts `local_off` bytes into a local region registered
/// in pieces of `local_chunk` bytes, and `remote_off` bytes into a remote buffer registered in
/// pieces of `remote_chunk` bytes, at every piece boundary of either side.
pub fn pieces(
    local_off: u64,
    local_chunk: u64,
    remote_off: u64,
    remote_chunk: u64,
    len: u64,
) -> Vec<Piece> {
    let (lc, rc) = (local_chunk.max(1), remote_chunk.max(1));
    let mut out = Vec::with_capacity(1);
    let mut at = 0;
    while at < len {
        let (l, r) = (local_off + at, remote_off + at);
        let room = (lc - l % lc).min(rc - r % rc).min(len - at);
        out.push(Piece {
            offset: at,
            len: room,
            local: (l / lc) as usize,
            remote: (r / rc) as usize,
        });
        at += room;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rails_map_to_devices_by_name_then_interface() {
        let devs = [
            ("rxe0", Some("eth0")),
            ("rxe1", Some("eth1")),
            ("mlx5_0", None),
        ];
        assert_eq!(device_for_rail("rxe1", devs.iter().copied()), Some(1));
        assert_eq!(device_for_rail("eth0", devs.iter().copied()), Some(0));
        assert_eq!(device_for_rail("mlx5_0", devs.iter().copied()), Some(2));
        assert_eq!(device_for_rail("eth7", devs.iter().copied()), None);
        assert_eq!(device_index(None, 5, 3), 2, "unmapped rails spread");
        assert_eq!(device_index(Some(1), 5, 3), 1);
        assert_eq!(device_index(None, 5, 0), 0);
    }

    #[test]
    fn a_slice_splits_at_every_piece_boundary_of_either_side() {
        // One region each side, the usual case: one work request.
        assert_eq!(
            pieces(100, u64::MAX, 7, u64::MAX, 65536),
            vec![Piece {
                offset: 0,
                len: 65536,
                local: 0,
                remote: 0
            }]
        );
        // Local pieces of 1000, remote of 600: boundaries at local 1000 and remote 600, 1200.
        let p = pieces(900, 1000, 500, 600, 800);
        assert_eq!(
            p.iter()
                .map(|p| (p.offset, p.len, p.local, p.remote))
                .collect::<Vec<_>>(),
            vec![(0, 100, 0, 0), (100, 600, 1, 1), (700, 100, 1, 2)]
        );
        // Every byte is covered once, in order, and no piece crosses a boundary.
        for (lo, lc, ro, rc, len) in [(0, 1, 0, 1, 5), (3, 4, 1, 3, 50), (4095, 4096, 0, 7, 9000)] {
            let p = pieces(lo, lc, ro, rc, len);
            let mut at = 0;
            for q in &p {
                assert_eq!(q.offset, at);
                assert!(q.len > 0);
                assert_eq!((lo + at) / lc, q.local as u64);
                assert_eq!((lo + at + q.len - 1) / lc, q.local as u64);
                assert_eq!((ro + at + q.len - 1) / rc, q.remote as u64);
                at += q.len;
            }
            assert_eq!(at, len);
        }
    }
}
