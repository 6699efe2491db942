//! The engine's request counters (te-metrics' `Metrics`) over real TCP loopback transfers:
//! completed WRITEs and READs count their bytes, latency and size under `tcp`; a READ the
//! target refuses counts as a failure of kind `refused`, with no bytes; nothing is counted while the
//! counters are off. A task is counted once, when its end is first seen: a status polled many
//! times counts it once, and a batch freed without anyone asking counts its tasks then.

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
    // The target side releases the region once its last READ's bytes are handed to the
    // kernel, which may be just after this side saw the READ complete: busy only briefly.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while let Err(e) = e.unregister_memory(remote.addr()) {
        assert!(
            matches!(e, te_core::Error::RegionBusy { .. }) && std::time::Instant::now() < deadline,
            "{e}"
        );
        std::thread::yield_now();
    }
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

#[test]
fn a_task_is_counted_once_when_its_end_is_first_seen() {
    let e = common::engine_with(common::config());
    let (local, remote, seg) = own_buffers(&e, 1 << 20);
    e.set_metrics_enabled(true);
    let requests: Vec<TransferRequest> = (0..4u64)
        .map(|i| TransferRequest {
            opcode: Opcode::Write,
            source: local.addr() + i * 65536,
            target_id: seg,
            target_offset: remote.addr() + i * 65536,
            length: 65536,
        })
        .collect();
    let writes = |e: &te_core::TransferEngine| {
        (e.metrics().snapshot().series.iter())
            .find(|x| x.op == Operation::Write)
            .map_or(0, |x| x.requests)
    };
    // Polled task by task, as Mooncake's callers poll: each end counted once.
    let b = e.allocate_batch(4).unwrap();
    assert_eq!(e.metrics().snapshot().batches, 1, "one batch allocated");
    e.submit(b, &requests).unwrap();
    for task in 0..4 {
        while !e.task_status(b, task).unwrap().state.is_terminal() {
            std::thread::yield_now();
        }
        for _ in 0..3 {
            e.task_status(b, task).unwrap();
        }
        assert_eq!(
            writes(&e),
            task as u64 + 1,
            "after task {task}'s end was seen"
        );
    }
    e.wait(b, std::time::Duration::from_secs(60)).unwrap();
    e.batch_status(b).unwrap();
    e.free_batch(b).unwrap();
    assert_eq!(writes(&e), 4);
    assert_eq!(e.metrics().snapshot().batches, 0, "freed");
    // Never asked about: counted when the batch is freed (after its tasks ended).
    let b = e.allocate_batch(4).unwrap();
    e.submit(b, &requests).unwrap();
    while e.free_batch(b).is_err() {
        std::thread::yield_now();
    }
    let s = e.metrics().snapshot();
    let w = (s.series.iter())
        .find(|x| x.op == Operation::Write)
        .unwrap();
    assert_eq!((w.requests, w.bytes, w.attempts), (8, 8 * 65536, 8));
    assert_eq!(w.latency_us.count(), 8);
    assert_eq!(
        w.stages[2].count(),
        8,
        "every completed request has its stages"
    );
}
