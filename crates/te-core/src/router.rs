//! Choosing the rail of each slice: a pure function of both sides' priority matrices, the
//! buffers' locations, the slice's sequence number, its attempt and rail health.
//!
//! A rail is a (local NIC, remote NIC) pair, named by indices into each side's rail list.
//! Slices of a task are striped over the preferred NICs of both sides (pairing the i-th local
//! with the i-th remote choice); a retry moves to the next pair; NICs listed as "other usable"
//! serve only when every preferred pair is paused.

use std::sync::Arc;

use te_topology::PriorityMatrix;

/// One side's NICs for one buffer location: preferred first, then the other usable ones,
/// as indices into that side's rail list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidates {
    /// Preferred rails.
    pub preferred: Vec<u16>,
    /// Usable when the preferred are not.
    pub other: Vec<u16>,
}

impl Candidates {
    /// The one rail of a side with a single candidate (no choice to make, nothing to retry on).
    pub fn single(&self) -> Option<u16> {
        match (self.preferred.as_slice(), self.other.is_empty()) {
            ([only], true) => Some(*only),
            _ => None,
        }
    }

    /// The candidates for `location` among `rails`. Names the matrix lists but the side does not
    /// serve are skipped; with no matrix, no entry, or nothing left, every rail is preferred.
    pub fn for_location(matrix: Option<&PriorityMatrix>, location: &str, rails: &[String]) -> Self {
        let index = |names: &[String]| -> Vec<u16> {
            names
                .iter()
                .filter_map(|n| rails.iter().position(|r| r == n))
                .map(|i| i as u16)
                .collect()
        };
        let (preferred, other) = match matrix.and_then(|m| m.entry(location)) {
            Some((p, a)) => (index(p), index(a)),
            None => (Vec::new(), Vec::new()),
        };
        match (preferred.is_empty(), other.is_empty()) {
            (true, true) => Candidates {
                preferred: (0..rails.len().max(1) as u16).collect(),
                other: Vec::new(),
            },
            (true, false) => Candidates {
                preferred: other,
                other: Vec::new(),
            },
            _ => Candidates { preferred, other },
        }
    }
}

/// The rail candidates of one task, kept for its slices' retries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskRoute {
    /// Local NICs for the source buffer's location (shared: worked out once per region).
    pub local: Arc<Candidates>,
    /// Remote NICs for the target buffer's location (shared: worked out once per buffer).
    pub remote: Arc<Candidates>,
    /// Where the task's stripe starts.
    pub salt: u64,
}

impl TaskRoute {
    /// The rail of slice `seq` on attempt `attempt`.
    pub fn choose(&self, seq: u64, attempt: u32, usable: impl Fn(u16, u16) -> bool) -> (u16, u16) {
        choose(
            &self.local,
            &self.remote,
            self.salt.wrapping_add(seq),
            attempt,
            usable,
        )
    }
}

/// Where a task's slices go: a fixed pair when each side has one rail (no choice to make, so
/// no shared candidate lists to hold or stripe to count), else a route striped per slice.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TaskRails {
    /// The one (local, remote) pair: every slice and every retry goes over it.
    Fixed(u16, u16),
    /// Chosen per slice and attempt among the candidates.
    Striped(TaskRoute),
}

impl TaskRails {
    /// The rails of a task from `local` to `remote` candidates; `salt` (called only when there
    /// is a choice) says where its stripe starts.
    pub fn between(
        local: &Arc<Candidates>,
        remote: &Arc<Candidates>,
        salt: impl FnOnce() -> u64,
    ) -> Self {
        match (local.single(), remote.single()) {
            (Some(l), Some(r)) => TaskRails::Fixed(l, r),
            _ => TaskRails::Striped(TaskRoute {
                local: local.clone(),
                remote: remote.clone(),
                salt: salt(),
            }),
        }
    }

    /// The rail of slice `seq` on attempt `attempt` (see [`choose`]; a fixed pair is what
    /// `choose` gives for single candidates, usable or not).
    pub fn choose(&self, seq: u64, attempt: u32, usable: impl Fn(u16, u16) -> bool) -> (u16, u16) {
        match self {
            TaskRails::Fixed(l, r) => (*l, *r),
            TaskRails::Striped(route) => route.choose(seq, attempt, usable),
        }
    }
}

/// Picks the (local, remote) rail for slice number `seq` of a task on its attempt `attempt`,
/// skipping pairs `usable` refuses. When every pair is refused, the striped choice is kept.
pub fn choose(
    local: &Candidates,
    remote: &Candidates,
    seq: u64,
    attempt: u32,
    usable: impl Fn(u16, u16) -> bool,
) -> (u16, u16) {
    let turn = seq.wrapping_add(u64::from(attempt));
    let pick =
        |list: &[u16], extra: u64| list[(turn.wrapping_add(extra) % list.len() as u64) as usize];
    let first = (pick(&local.preferred, 0), pick(&remote.preferred, 0));
    if usable(first.0, first.1) {
        return first;
    }
    // Every preferred pair, then pairs involving the other usable NICs. Within a tier the
    // aligned pairs (i-th local with i-th remote, as rails on separate subnets need) come
    // before crossed ones.
    let all_local: Vec<u16> = local
        .preferred
        .iter()
        .chain(&local.other)
        .copied()
        .collect();
    let all_remote: Vec<u16> = remote
        .preferred
        .iter()
        .chain(&remote.other)
        .copied()
        .collect();
    let tiers = [
        (&local.preferred[..], &remote.preferred[..]),
        (&all_local[..], &all_remote[..]),
    ];
    for (ls, rs) in tiers {
        for j in 0..rs.len() as u64 {
            for i in 0..ls.len() as u64 {
                let pair = (pick(ls, i), pick(rs, i + j));
                if usable(pair.0, pair.1) {
                    return pair;
                }
            }
        }
    }
    first
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rails(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn candidates_follow_the_matrix_and_skip_unserved_nics() {
        let m = PriorityMatrix::parse(
            "t",
            r#"{"cpu:0":[["eth1","ethX"],["eth0"]],"cpu:1":[[],["eth2"]]}"#,
        )
        .unwrap();
        let r = rails(&["eth0", "eth1", "eth2"]);
        assert_eq!(
            Candidates::for_location(Some(&m), "cpu:0", &r),
            Candidates {
                preferred: vec![1],
                other: vec![0]
            }
        );
        assert_eq!(
            Candidates::for_location(Some(&m), "cpu:1", &r).preferred,
            vec![2],
            "other-only becomes preferred"
        );
        assert_eq!(
            Candidates::for_location(Some(&m), "cuda:0", &r).preferred,
            vec![0, 1, 2],
            "no entry: all"
        );
        assert_eq!(
            Candidates::for_location(None, "cpu:0", &[]).preferred,
            vec![0],
            "no rails: rail 0"
        );
    }

    #[test]
    fn slices_stripe_over_preferred_pairs() {
        let l = Candidates {
            preferred: vec![0, 1],
            other: vec![],
        };
        let r = Candidates {
            preferred: vec![0, 1],
            other: vec![],
        };
        let picks: Vec<_> = (0..4).map(|s| choose(&l, &r, s, 0, |_, _| true)).collect();
        assert_eq!(picks, vec![(0, 0), (1, 1), (0, 0), (1, 1)]);
        assert_eq!(
            choose(&l, &r, 0, 1, |_, _| true),
            (1, 1),
            "a retry moves on"
        );
        // With (1, 1) paused, the aligned (0, 0) serves before any crossed pair.
        for seq in 0..4 {
            assert_eq!(choose(&l, &r, seq, 0, |a, b| (a, b) != (1, 1)), (0, 0));
        }
        assert_eq!(choose(&l, &r, u64::MAX, 3, |_, _| true).0, 0, "no overflow");
    }

    #[test]
    fn paused_pairs_are_avoided_and_other_nics_serve_last() {
        let l = Candidates {
            preferred: vec![0, 1],
            other: vec![2],
        };
        let r = Candidates {
            preferred: vec![0],
            other: vec![],
        };
        assert_eq!(choose(&l, &r, 0, 0, |a, _| a != 0), (1, 0));
        assert_eq!(
            choose(&l, &r, 0, 0, |a, _| a == 2),
            (2, 0),
            "other usable NIC when preferred are down"
        );
        assert_eq!(
            choose(&l, &r, 3, 0, |_, _| false),
            (1, 0),
            "all paused: keep the striped choice"
        );
        for seq in 0..20 {
            let (a, b) = choose(&l, &r, seq, 0, |a, _| a != 1);
            assert!(a != 1 && b == 0);
        }
    }

    #[test]
    fn single_rails_on_both_sides_make_a_fixed_pair_that_choose_agrees_with() {
        let one = |rail: u16| {
            Arc::new(Candidates {
                preferred: vec![rail],
                other: Vec::new(),
            })
        };
        let (local, remote) = (one(2), one(5));
        let mut salted = false;
        let rails = TaskRails::between(&local, &remote, || {
            salted = true;
            7
        });
        assert_eq!(rails, TaskRails::Fixed(2, 5));
        assert!(!salted, "no stripe is counted when there is no choice");
        for (seq, attempt) in [(0, 0), (3, 1), (9, 4)] {
            for usable in [true, false] {
                let expected = choose(&local, &remote, seq, attempt, |_, _| usable);
                assert_eq!(rails.choose(seq, attempt, |_, _| usable), expected);
            }
        }
        // A choice on either side stripes.
        let two = Arc::new(Candidates {
            preferred: vec![0],
            other: vec![1],
        });
        let striped = TaskRails::between(&two, &remote, || 7);
        assert!(matches!(
            striped,
            TaskRails::Striped(TaskRoute { salt: 7, .. })
        ));
        assert_eq!(striped.choose(0, 0, |l, _| l == 1), (1, 5));
    }
}
