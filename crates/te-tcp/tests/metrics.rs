//! The engine's request counters (te-metrics' `Metrics`) over real TCP loopback transfers:
//! completed WRITEs and READs count their bytes, latency and size under `tcp`; a READ the
//! target refuses counts as a failure of kind `refused`, with no bytes; nothing is counted while the
//! counters are off.

mod common;

use te_core::{Opcode, SubmitOptions, TransferRequest, TransferState};
use te_metrics::counters::{FailureKind, Operation, TransportLabel};
use te_testkit::{own_buffers, transfer_one};

#[test]
fn requests_are_counted_by_transport_operation_and_outcome() {
    let e = common::engine_with(common::config());
    let len = 256 << 10;
    let (local, remote, seg) = own_buffers(&e, len);
    let request = |opcode, offset: u64, length: u64| TransferRequest {
        opcode,
        source: local.addr(),
        target_id: seg,
        target_offset: remote.addr() + offset,
        length,
    };
    let run = |r| transfer_one(&e, r, &SubmitOptions::default()).0;
    // Off: nothing counted.
    assert_eq!(
        run(request(Opcode::Write, 0, 4096)),
        TransferState::Completed
    );
    assert!(e.metrics().snapshot().series.is_empty());

    e.set_metrics_enabled(true);
    assert_eq!(
        run(request(Opcode::Write, 0, len as u64)),
        TransferState::Completed
    );
    assert_eq!(
        run(request(Opcode::Read, 0, 65536)),
        TransferState::Completed
    );
    // The peer's buffer unregistered behind the descriptor the initiator holds: the target
    // refuses the READ, nothing moves.
    e.unregister_memory(remote.addr()).unwrap();
    assert_eq!(run(request(Opcode::Read, 0, 4096)), TransferState::Failed);

    let s = e.metrics().snapshot();
    let of = |op| {
        (s.series.iter())
            .find(|x| x.transport == TransportLabel::Tcp && x.op == op)
            .unwrap_or_else(|| panic!("no tcp {op:?} in {s:?}"))
    };
    let w = of(Operation::Write);
    assert_eq!((w.requests, w.bytes, w.failed()), (1, len as u64, 0));
    assert_eq!((w.latency_us.count(), w.size.sum), (1, len as u64));
    let r = of(Operation::Read);
    assert_eq!((r.requests, r.bytes), (2, 65536));
    assert_eq!(r.failures, vec![(FailureKind::Refused, 1)]);
    assert_eq!(r.latency_us.count(), 1, "a failure has no latency");
    assert_eq!(s.series.len(), 2, "{s:?}");
}
