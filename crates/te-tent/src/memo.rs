//! A memo of one submit's look-ups: the local region and the target buffer the previous
//! request was found in, so that the next request in the same places is planned without
//! looking them up again. Not here: the checks themselves (te-core makes them all again when
//! a task is posted) or anything kept between submits.

use te_core::SegmentId;

use crate::capability::{MemoryKind, Scope};
use crate::request::Request;

/// What planning the previous requests of one submit found about their memory, so that a
/// request in the same local region and the same target buffer skips the look-ups (requests
/// of a batch nearly always share both). Reused only for a request inside the same local
/// region, or inside the same target buffer with the same opcode, where a look-up would give
/// the same answer; kept for one submit only; and te-core checks every request again when its
/// task is posted.
#[derive(Default)]
pub(crate) struct PlanMemo {
    /// The last local region: (start, end, kind).
    pub(crate) source: Option<(u64, u64, MemoryKind)>,
    /// The last target buffer.
    pub(crate) target: Option<TargetMemo>,
}

/// A target buffer found to admit an opcode, and what it means for the plan.
pub(crate) struct TargetMemo {
    pub(crate) id: SegmentId,
    pub(crate) opcode: te_core::Opcode,
    pub(crate) start: u64,
    pub(crate) end: u64,
    pub(crate) to: MemoryKind,
    pub(crate) scope: Scope,
    /// The installed transports (bit per position) that cannot reach this buffer.
    pub(crate) unreachable: u32,
}

impl PlanMemo {
    /// The memory kind of `r`'s source, when it lies in the local region last looked up.
    pub(crate) fn source_for(&self, r: &Request) -> Option<MemoryKind> {
        let (start, end, kind) = self.source?;
        let stop = r.source.checked_add(r.length)?;
        (r.source >= start && stop <= end).then_some(kind)
    }

    /// The memory kind and scope of `r`'s target, and the transports that cannot reach it,
    /// when it lies in the buffer last looked up for the same segment and opcode.
    pub(crate) fn target_for(&self, r: &Request) -> Option<(MemoryKind, Scope, u32)> {
        let t = self.target.as_ref()?;
        let end = r.target_offset.checked_add(r.length)?;
        (t.id == r.target_id && t.opcode == r.opcode && r.target_offset >= t.start && end <= t.end)
            .then_some((t.to, t.scope, t.unreachable))
    }
}
