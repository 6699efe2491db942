//! te-tent's runtime driven through simulated transports (te-core's `SimTransport`: slices
//! wait until the test reports them), so every decision is deterministic: policy order,
//! failover to the next transport, priorities under load, deadlines and cancellation.

use std::sync::Arc;
use std::time::Duration;

use te_core::transport::{Capabilities, SliceError};
use te_core::{HostBuffer, Opcode, Permission, SubmitOptions, TransferState};
use te_tent::{MemoryOptions, Priority, Request, TentBatchId};
use te_testkit::SimTransport;

mod common;

use common::*;

#[test]
fn the_policy_orders_transports_and_a_failed_task_moves_to_the_next() {
    let r = rig(
        r#"{"policy": [{"name": "b-first", "transports": ["sim-b", "sim-a"]}],
            "max_failover_attempts": 1}"#,
    );
    // The matrix lists both simulated transports with their moves.
    let matrix = r.tent.capability_matrix();
    assert_eq!(
        matrix.iter().map(|(n, _)| *n).collect::<Vec<_>>(),
        ["sim-a", "sim-b"]
    );
    let batch = r.tent.allocate_batch(4).unwrap();
    r.tent.submit(batch, &[r.write(0)]).unwrap();
    assert_eq!(
        (r.slots(&r.b), r.slots(&r.a)),
        (vec![0], vec![]),
        "the rule's first choice"
    );
    assert_eq!(r.tent.task_transport(batch, 0).unwrap(), "sim-b");
    // sim-b fails the slice (te-core retries within it first, up to MC_RETRY_CNT).
    for _ in 0..64 {
        r.finish_all(&r.b, Err(SliceError::Path("link down".into())));
        let _ = r.tent.task_status(batch, 0).unwrap();
        if !r.slots(&r.a).is_empty() {
            break;
        }
    }
    assert_eq!(r.slots(&r.a), vec![0], "failed over to sim-a");
    assert_eq!(r.tent.task_transport(batch, 0).unwrap(), "sim-a");
    assert!(
        !r.tent.task_status(batch, 0).unwrap().state.is_terminal(),
        "a failure being failed over is not the end"
    );
    r.finish_all(&r.a, Ok(()));
    let s = r.tent.wait(batch, Duration::from_secs(10)).unwrap();
    assert_eq!(s.state, TransferState::Completed);
    let errors = r.tent.task_errors(batch, 0).unwrap();
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(errors[0].starts_with("sim-b") && errors[0].contains("link down"));
    r.tent.free_batch(batch).unwrap();

    // With failover used up, the second failure is the task's end.
    let batch = r.tent.allocate_batch(1).unwrap();
    r.tent.submit(batch, &[r.write(1)]).unwrap();
    for _ in 0..128 {
        r.finish_all(&r.b, Err(SliceError::Path("down".into())));
        r.finish_all(&r.a, Err(SliceError::Path("down too".into())));
        if r.tent.task_status(batch, 0).unwrap().state.is_terminal() {
            break;
        }
    }
    assert_eq!(
        r.tent.batch_status(batch).unwrap().state,
        TransferState::Failed
    );
    assert_eq!(r.tent.task_errors(batch, 0).unwrap().len(), 2);
}

#[test]
fn a_hint_goes_first_and_the_default_order_follows() {
    let r = rig("{}");
    let batch = r.tent.allocate_batch(2).unwrap();
    r.tent
        .submit(batch, &[r.write(0).hint("sim-b"), r.write(1)])
        .unwrap();
    assert_eq!((r.slots(&r.b), r.slots(&r.a)), (vec![0], vec![1]));
    r.finish_all(&r.b, Ok(()));
    r.finish_all(&r.a, Ok(()));
    assert_eq!(
        r.tent.wait(batch, Duration::from_secs(5)).unwrap().state,
        TransferState::Completed
    );
    assert_eq!(r.tent.task_transport(batch, 0).unwrap(), "sim-b");
    assert_eq!(r.tent.task_transport(batch, 1).unwrap(), "sim-a");
}

#[test]
fn plans_made_before_a_transport_is_installed_are_not_reused_after() {
    let r = rig(r#"{"policy": [{"name": "c-first", "transports": ["sim-c", "sim-a"]}]}"#);
    let run = |slot: u64| {
        let batch = r.tent.allocate_batch(1).unwrap();
        r.tent.submit(batch, &[r.write(slot)]).unwrap();
        batch
    };
    // Without sim-c the rule's next choice serves, twice (the second from the plan cache).
    for slot in 0..2 {
        let batch = run(slot);
        assert_eq!(r.tent.task_transport(batch, 0).unwrap(), "sim-a");
        r.finish_all(&r.a, Ok(()));
        let s = r.tent.wait(batch, Duration::from_secs(5)).unwrap();
        assert_eq!(s.state, TransferState::Completed);
        r.tent.free_batch(batch).unwrap();
    }
    let c = Arc::new(SimTransport::named("sim-c", Capabilities::DRAM_REMOTE_HOST));
    r.tent.install_transport(c.clone()).unwrap();
    let batch = run(2);
    assert_eq!(r.tent.task_transport(batch, 0).unwrap(), "sim-c");
    assert_eq!((r.slots(&c), r.slots(&r.a)), (vec![2], vec![]));
    r.finish_all(&c, Ok(()));
    let s = r.tent.wait(batch, Duration::from_secs(5)).unwrap();
    assert_eq!(s.state, TransferState::Completed);
}

#[test]
fn higher_priorities_are_posted_first_under_load() {
    // Each request its own slice, so the queue shows the posting order.
    let r = rig(r#"{"max_inflight_tasks": 2, "merge_requests": false}"#);
    let low = r.tent.allocate_batch(8).unwrap();
    let reqs: Vec<Request> = (0..4).map(|i| r.write(i).priority(Priority::Low)).collect();
    r.tent.submit(low, &reqs).unwrap();
    assert_eq!(r.slots(&r.a), vec![0, 1], "two in flight, the rest wait");
    let high = r.tent.allocate_batch(8).unwrap();
    r.tent
        .submit(high, &[r.write(10), r.write(11).priority(Priority::Medium)])
        .unwrap();
    let mut order = Vec::new();
    for _ in 0..6 {
        let s = r.a.take(|_| 0).expect("a slice in flight");
        order.push((s.remote_addr - r.target.addr()) / (4 * KIB));
        r.a.complete(s, Ok(()));
        let _ = r.tent.batch_status(low).unwrap();
    }
    assert_eq!(
        order,
        [0, 1, 10, 11, 2, 3],
        "high, then medium, went before the waiting lows"
    );
    for b in [low, high] {
        assert_eq!(
            r.tent.wait(b, Duration::from_secs(5)).unwrap().state,
            TransferState::Completed
        );
    }
}

#[test]
fn contiguous_requests_are_merged_unless_the_configuration_says_no() {
    for (conf, slices) in [("{}", 1), (r#"{"merge_requests": false}"#, 4)] {
        let r = rig(conf);
        let batch = r.tent.allocate_batch(4).unwrap();
        let reqs: Vec<Request> = (0..4).map(|i| r.write(i)).collect();
        r.tent.submit(batch, &reqs).unwrap();
        assert_eq!(r.a.queued(), slices, "{conf}");
        r.finish_all(&r.a, Ok(()));
        assert_eq!(
            r.tent.wait(batch, Duration::from_secs(5)).unwrap().state,
            TransferState::Completed
        );
        for i in 0..4 {
            let st = r.tent.task_status(batch, i).unwrap();
            assert_eq!(
                (st.state, st.transferred_bytes),
                (TransferState::Completed, 4 * KIB)
            );
        }
    }
}

#[test]
fn deadlines_end_tasks_timeout_and_cancellation_stops_them() {
    let r = rig(r#"{"max_inflight_tasks": 1}"#);
    let batch = r.tent.allocate_batch(4).unwrap();
    r.tent
        .submit(
            batch,
            &[
                r.write(0),
                r.write(1).deadline(Duration::from_millis(30)),
                r.write(2),
            ],
        )
        .unwrap();
    std::thread::sleep(Duration::from_millis(60));
    let statuses = r.tent.task_statuses(batch).unwrap();
    assert_eq!(
        statuses[1].state,
        TransferState::Timeout,
        "waited past its deadline"
    );
    assert_eq!(statuses[2].state, TransferState::Waiting);
    // Cancel the queued one, then the posted one: its slice, not yet started, sees the
    // cancellation and the transport reports it so.
    r.tent.cancel_task(batch, 2).unwrap();
    r.tent.cancel_task(batch, 0).unwrap();
    let s = r.a.take(|_| 0).unwrap();
    assert!(s.is_canceled());
    r.a.complete(s, Err(SliceError::Canceled));
    let s = r.tent.wait(batch, Duration::from_secs(5)).unwrap();
    let statuses = r.tent.task_statuses(batch).unwrap();
    assert_eq!(
        statuses.iter().map(|s| s.state).collect::<Vec<_>>(),
        [
            TransferState::Canceled,
            TransferState::Timeout,
            TransferState::Canceled
        ]
    );
    assert_eq!(s.state, TransferState::Timeout, "the worst ending");
    assert!(r.slots(&r.a).is_empty(), "tasks 1 and 2 were never posted");
    r.tent.free_batch(batch).unwrap();
    assert!(r.tent.free_batch(batch).is_err(), "freed once");
}

#[test]
fn bad_requests_are_refused_whole() {
    let r = rig("{}");
    let batch = r.tent.allocate_batch(2).unwrap();
    let past_end = Request::new(
        Opcode::Write,
        r.local.addr(),
        r.seg,
        r.target.addr() + (1 << 20) - 8,
        16,
    );
    assert!(r.tent.submit(batch, &[r.write(0), past_end]).is_err());
    let unregistered = Request::new(Opcode::Write, 4096, r.seg, r.target.addr(), 16);
    assert!(r.tent.submit(batch, &[unregistered]).is_err());
    assert!(
        r.tent
            .submit(batch, &[r.write(0), r.write(1), r.write(2)])
            .is_err(),
        "over capacity"
    );
    assert!(
        r.slots(&r.a).is_empty() && r.slots(&r.b).is_empty(),
        "nothing posted"
    );
    assert_eq!(r.tent.task_statuses(batch).unwrap().len(), 0);
}

#[test]
fn each_request_of_a_batch_is_checked_against_its_own_buffer_and_opcode() {
    let r = rig("{}");
    let read_only = Arc::new(HostBuffer::new(64 * KIB as usize).unwrap());
    let readable = MemoryOptions {
        permission: Permission::RemoteRead,
        ..MemoryOptions::default()
    };
    r.tent.register_memory(&read_only, &readable).unwrap();
    let batch = r.tent.allocate_batch(4).unwrap();
    let into_read_only = |op| Request::new(op, r.local.addr(), r.seg, read_only.addr(), 4 * KIB);
    // A WRITE into the writable buffer first, then one into the read-only buffer: the second
    // is refused, and with it the whole submit.
    assert!(
        r.tent
            .submit(batch, &[r.write(0), into_read_only(Opcode::Write)])
            .is_err()
    );
    // A READ of the read-only buffer is allowed; a WRITE after it, to the same place, is not.
    assert!(
        r.tent
            .submit(
                batch,
                &[into_read_only(Opcode::Read), into_read_only(Opcode::Write)]
            )
            .is_err()
    );
    // A source running past the end of the local region, after one inside it.
    let past_local = Request::new(
        Opcode::Write,
        r.local.addr() + (1 << 20) - 8,
        r.seg,
        r.target.addr(),
        16,
    );
    assert!(r.tent.submit(batch, &[r.write(0), past_local]).is_err());
    assert!(
        r.slots(&r.a).is_empty() && r.slots(&r.b).is_empty(),
        "nothing posted"
    );
    // All allowed together: a READ of the read-only buffer and WRITEs to the writable one.
    r.tent
        .submit(
            batch,
            &[r.write(0), into_read_only(Opcode::Read), r.write(1)],
        )
        .unwrap();
    assert_eq!(r.tent.task_statuses(batch).unwrap().len(), 3);
}

#[test]
fn a_batch_after_a_freed_one_starts_empty_with_its_own_capacity() {
    let r = rig("{}");
    let first = r.tent.allocate_batch(4).unwrap();
    r.tent.submit(first, &[r.write(0), r.write(1)]).unwrap();
    // Every try fails (te-core retries a while, with back-off, before the task fails).
    let until = std::time::Instant::now() + Duration::from_secs(30);
    while !r.tent.batch_status(first).unwrap().state.is_terminal() {
        assert!(std::time::Instant::now() < until, "the batch never failed");
        r.finish_all(&r.a, Err(SliceError::Path("down".into())));
        r.finish_all(&r.b, Err(SliceError::Path("down too".into())));
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(
        r.tent.wait(first, Duration::from_secs(10)).unwrap().state,
        TransferState::Failed
    );
    assert!(!r.tent.task_errors(first, 0).unwrap().is_empty());
    r.tent.free_batch(first).unwrap();
    assert!(r.tent.task_statuses(first).is_err(), "the freed handle");

    // The next batch (made from the freed one's lists) has no task, no error and the
    // capacity it was asked for.
    let second = r.tent.allocate_batch(1).unwrap();
    assert_ne!(second, first);
    assert!(r.tent.task_statuses(second).unwrap().is_empty());
    assert!(r.tent.task_errors(second, 0).is_err(), "no task 0 yet");
    assert!(
        r.tent.submit(second, &[r.write(2), r.write(3)]).is_err(),
        "capacity 1, not the freed batch's 4"
    );
    r.tent.submit(second, &[r.write(2)]).unwrap();
    assert_eq!(
        [r.slots(&r.a), r.slots(&r.b)].concat(),
        vec![2],
        "the new task alone is posted"
    );
    r.finish_all(&r.a, Ok(()));
    r.finish_all(&r.b, Ok(()));
    let done = r.tent.wait(second, Duration::from_secs(10)).unwrap();
    assert_eq!(
        (done.state, done.transferred_bytes),
        (TransferState::Completed, 4 * KIB)
    );
    assert!(r.tent.task_errors(second, 0).unwrap().is_empty());
    r.tent.free_batch(second).unwrap();
}

#[test]
fn a_protocol_named_at_start_goes_first_after_a_hint_and_the_rest_fail_over() {
    // The policy would take sim-b first; the protocol named puts sim-a first.
    let conf = r#"{"policy": [{"name": "b-first", "transports": ["sim-b", "sim-a"]}]}"#;
    let r = rig_with(conf, |c| c.plan_first = Some(vec!["sim-a".into()]));
    let batch = r.tent.allocate_batch(2).unwrap();
    r.tent
        .submit(batch, &[r.write(0), r.write(1).hint("sim-b")])
        .unwrap();
    assert_eq!(r.slots(&r.a), [0], "the protocol named goes first");
    assert_eq!(r.slots(&r.b), [1], "a hint is the caller's choice");
    // sim-a fails: the task moves on to sim-b, as failover does.
    r.finish_all(&r.a, Err(SliceError::Path("down".into())));
    let _ = r.tent.task_statuses(batch).unwrap();
    assert_eq!(r.slots(&r.b), [1, 0], "failed over to the rest");
    r.finish_all(&r.b, Ok(()));
    let s = r.tent.wait(batch, Duration::from_secs(5)).unwrap();
    assert_eq!(s.state, TransferState::Completed);
    // Without it, the same request goes where the policy says.
    let r = rig(conf);
    let batch = r.tent.allocate_batch(1).unwrap();
    r.tent.submit(batch, &[r.write(0)]).unwrap();
    assert_eq!(r.slots(&r.b), [0]);
    r.finish_all(&r.b, Ok(()));
    r.tent.wait(batch, Duration::from_secs(5)).unwrap();
}

#[test]
fn the_engines_own_calls_are_planned_by_tent() {
    let r = rig(
        r#"{"policy": [{"name": "b-first", "transports": ["sim-b", "sim-a"]}],
            "max_failover_attempts": 1}"#,
    );
    // Memory registered through the engine itself is TENT's to plan from.
    let engine = r.tent.engine();
    let source = Arc::new(HostBuffer::new(8 * 1024).unwrap());
    engine
        .register_buffer(&source, "*", Permission::LocalOnly)
        .unwrap();
    let write = |hint: Option<&'static str>, slot: u64| {
        let batch = engine.allocate_batch(1).unwrap();
        let request = te_core::TransferRequest {
            opcode: Opcode::Write,
            source: source.addr() + slot * 4096,
            target_id: r.seg,
            target_offset: r.target.addr() + slot * 4096,
            length: 4096,
        };
        let options = hint.map_or_else(SubmitOptions::default, |h| SubmitOptions::default().via(h));
        engine.submit_with(batch, &[request], &options).unwrap();
        batch
    };
    let batch = write(None, 0);
    let tent_batch = TentBatchId(batch.raw());
    assert_eq!(r.slots(&r.b), vec![0], "the rule's first choice");
    assert_eq!(r.tent.task_transport(tent_batch, 0).unwrap(), "sim-b");
    for _ in 0..64 {
        r.finish_all(&r.b, Err(SliceError::Path("link down".into())));
        if !r.slots(&r.a).is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(r.slots(&r.a), vec![0], "failed over to sim-a");
    r.finish_all(&r.a, Ok(()));
    let s = engine.wait(batch, Duration::from_secs(10)).unwrap();
    assert_eq!(s.state, TransferState::Completed);
    engine.free_batch(batch).unwrap();
    assert!(
        r.tent.task_status(tent_batch, 0).is_err(),
        "the runtime forgets a batch the engine freed"
    );
    // The engine's transport option is TENT's hint.
    let batch = write(Some("sim-a"), 1);
    assert_eq!((r.slots(&r.a), r.slots(&r.b)), (vec![1], vec![]));
    r.finish_all(&r.a, Ok(()));
    assert_eq!(
        engine.wait(batch, Duration::from_secs(10)).unwrap().state,
        TransferState::Completed
    );
    engine.free_batch(batch).unwrap();
    engine.unregister_memory(source.addr()).unwrap();
}

#[test]
fn the_own_descriptor_is_read_again_only_for_memory_peers_reach() {
    let r = rig("{}");
    let engine = r.tent.engine();
    let own = || engine.segment(r.seg).unwrap();
    let before = own();
    // Local-only memory (a staging buffer's kind) is not in the descriptor: no look-up.
    let private = Arc::new(HostBuffer::new(4096).unwrap());
    engine
        .register_buffer(&private, "*", Permission::LocalOnly)
        .unwrap();
    engine.unregister_memory(private.addr()).unwrap();
    let after_private = own();
    assert!(Arc::ptr_eq(&before, &after_private), "not read again");
    // Memory peers may reach is listed: the descriptor is read again, and lists it.
    let shared = Arc::new(HostBuffer::new(4096).unwrap());
    engine
        .register_buffer(&shared, "*", Permission::RemoteReadWrite)
        .unwrap();
    let after_shared = own();
    assert!(!Arc::ptr_eq(&before, &after_shared), "read again");
    assert!(
        after_shared
            .desc()
            .buffers
            .iter()
            .any(|b| b.addr == shared.addr()),
        "the new buffer is listed"
    );
    engine.unregister_memory(shared.addr()).unwrap();
}
