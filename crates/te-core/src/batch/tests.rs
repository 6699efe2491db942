//! Unit tests of batch bookkeeping, driven without any transport.

use super::*;
use crate::memory::{Location, Permission, Region, RegionTable};

fn table_with_region() -> RegionTable {
    let t = RegionTable::new();
    t.insert_all(vec![Region::new(
        0x1000,
        1 << 20,
        Location::Cpu(0),
        Permission::LocalOnly,
        None,
    )])
    .unwrap();
    t
}

fn add(
    table: &BatchTable,
    regions: &RegionTable,
    id: BatchId,
    slices: &[u64],
    notify: bool,
) -> Vec<Arc<TaskShared>> {
    let batch = table.get(id).unwrap();
    let tasks: Vec<Arc<TaskShared>> = slices
        .iter()
        .map(|&n| {
            Arc::new(TaskShared::new(
                Opcode::Write,
                n * 10,
                n,
                None,
                Some(regions.pin_local(0x1000, 16).unwrap()),
            ))
        })
        .collect();
    let notify = notify.then(|| PendingNotify {
        target: Arc::new(RemoteSegment::new(
            1,
            "h".into(),
            1,
            crate::segment::SegmentDesc::from_json(br#"{"name":"h:1","protocol":"tcp"}"#).unwrap(),
        )),
        notification: Notification {
            name: "n".into(),
            notify_msg: "m".into(),
        },
    });
    batch.add_tasks(tasks.iter(), notify).unwrap();
    tasks
}

/// A table of batches of up to 16 tasks on the system clock.
fn system_table() -> BatchTable {
    BatchTable::new(16, 0, Arc::new(crate::clock::SystemClock))
}

fn token(table: &BatchTable, id: BatchId, task: &Arc<TaskShared>) -> SliceToken {
    SliceToken::new(table.get(id).unwrap(), task.clone(), 0)
}

#[test]
fn a_batch_whose_tasks_all_ended_frees_while_the_last_is_still_counting_itself_out() {
    let regions = table_with_region();
    let t = system_table();
    let id = t.allocate(2).unwrap();
    let tasks = add(&t, &regions, id, &[1, 1], false);
    assert!(token(&t, id, &tasks[0]).record(10, Ok(())).is_none());
    // The second task as its finishing thread leaves it between publishing its end and
    // counting itself out of the batch: ended, pin released, still counted unfinished.
    lock(&tasks[1].pin).take();
    tasks[1]
        .state
        .store(TransferState::Completed as u8, Ordering::Release);
    assert_eq!(
        t.task_status(id, 1).unwrap().state,
        TransferState::Completed
    );
    t.free(id).unwrap();
    // A task that has not ended keeps its batch busy.
    let busy = t.allocate(2).unwrap();
    let more = add(&t, &regions, busy, &[1, 1], false);
    assert!(token(&t, busy, &more[0]).record(10, Ok(())).is_none());
    assert!(matches!(t.free(busy), Err(Error::BatchBusy(_))));
}

#[test]
fn handles_are_checked() {
    let a = system_table();
    let b = system_table();
    let id = a.allocate(4).unwrap();
    assert!(
        matches!(b.get(id), Err(Error::InvalidBatch { reason, .. }) if reason.starts_with("foreign"))
    );
    a.free(id).unwrap();
    assert!(
        matches!(a.get(id), Err(Error::InvalidBatch { reason, .. }) if reason.starts_with("stale"))
    );
    assert!(
        matches!(a.free(id), Err(Error::InvalidBatch { .. })),
        "double free"
    );
    let made_up = BatchId::from_raw((id.raw() & !0xffff_ffff) | 999);
    assert!(matches!(
        a.get(made_up),
        Err(Error::InvalidBatch {
            reason: "malformed",
            ..
        })
    ));
    assert!(matches!(a.allocate(0), Err(Error::InvalidArgument(_))));
    assert!(matches!(a.allocate(17), Err(Error::InvalidArgument(_))));
    // A reused slot gets a new generation, so the old handle stays stale.
    let ids: Vec<_> = (0..2000).map(|_| a.allocate(1).unwrap()).collect();
    for id in &ids {
        a.free(*id).unwrap();
    }
    let again = a.allocate(1).unwrap();
    assert!(!ids.contains(&again));
    assert!(ids.iter().all(|i| a.get(*i).is_err()));
}

#[test]
fn capacity_is_enforced_across_submits() {
    let regions = table_with_region();
    let t = system_table();
    let id = t.allocate(3).unwrap();
    add(&t, &regions, id, &[1, 1], false);
    let batch = t.get(id).unwrap();
    let extra: Vec<Arc<TaskShared>> = (0..2)
        .map(|_| {
            Arc::new(TaskShared::new(
                Opcode::Read,
                1,
                1,
                None,
                Some(regions.pin_local(0x1000, 1).unwrap()),
            ))
        })
        .collect();
    assert!(matches!(
        batch.add_tasks(extra.iter(), None),
        Err(Error::TooManyRequests {
            capacity: 3,
            requested: 4
        })
    ));
}

#[test]
fn a_batch_completes_when_every_slice_succeeds() {
    let regions = table_with_region();
    let t = system_table();
    let id = t.allocate(2).unwrap();
    let tasks = add(&t, &regions, id, &[3, 1], true);
    assert_eq!(t.batch_status(id).unwrap().state, TransferState::Waiting);
    assert!(matches!(t.free(id), Err(Error::BatchBusy(_))));
    assert!(
        regions.remove_all(&[0x1000]).is_err(),
        "pinned while in flight"
    );
    assert!(token(&t, id, &tasks[0]).record(10, Ok(())).is_none());
    assert_eq!(t.task_status(id, 0).unwrap().state, TransferState::Pending);
    assert_eq!(t.batch_status(id).unwrap().state, TransferState::Pending);
    assert!(token(&t, id, &tasks[0]).record(10, Ok(())).is_none());
    assert!(token(&t, id, &tasks[1]).record(10, Ok(())).is_none());
    assert!(matches!(
        t.wait(id, Duration::from_millis(20)),
        Err(Error::WaitTimeout(_))
    ));
    let notify = token(&t, id, &tasks[0]).record(10, Ok(()));
    assert_eq!(
        notify.unwrap().notification.notify_msg,
        "m",
        "last slice releases the notify"
    );
    let s = t.wait(id, Duration::from_secs(1)).unwrap();
    assert_eq!(
        s,
        TransferStatus {
            state: TransferState::Completed,
            transferred_bytes: 40
        }
    );
    assert_eq!(t.task_status(id, 1).unwrap().transferred_bytes, 10);
    assert!(matches!(
        t.task_status(id, 2),
        Err(Error::InvalidTask { task: 2, .. })
    ));
    t.free(id).unwrap();
    assert_eq!(
        regions.remove_all(&[0x1000]).unwrap().len(),
        1,
        "pins released"
    );
}

#[test]
fn a_failed_slice_fails_its_task_and_withholds_the_notify() {
    let regions = table_with_region();
    let t = system_table();
    let id = t.allocate(2).unwrap();
    let tasks = add(&t, &regions, id, &[2, 1], true);
    token(&t, id, &tasks[0]).record(10, Err(SliceError::Path("reset".into())));
    assert_eq!(t.task_status(id, 0).unwrap().state, TransferState::Pending);
    assert!(token(&t, id, &tasks[0]).record(10, Ok(())).is_none());
    assert_eq!(t.task_status(id, 0).unwrap().state, TransferState::Failed);
    assert_eq!(
        t.batch_status(id).unwrap().state,
        TransferState::Pending,
        "task 1 still in flight"
    );
    assert!(
        token(&t, id, &tasks[1]).record(10, Ok(())).is_none(),
        "no notify after a failure"
    );
    assert_eq!(t.batch_status(id).unwrap().state, TransferState::Failed);
    assert_eq!(
        t.task_error(id, 0).unwrap(),
        Some(SliceError::Path("reset".into()))
    );
    t.free(id).unwrap();
}

#[test]
fn a_freed_batch_is_handed_out_again_as_new() {
    let regions = table_with_region();
    let t = system_table();
    let old = t.allocate(3).unwrap();
    let tasks = add(&t, &regions, old, &[1, 1], true);
    token(&t, old, &tasks[0]).record(10, Err(SliceError::Path("reset".into())));
    token(&t, old, &tasks[1]).record(10, Ok(()));
    t.get(old).unwrap().cancel();
    assert_eq!(t.batch_status(old).unwrap().state, TransferState::Failed);
    let kept = Arc::as_ptr(&t.get(old).unwrap());
    t.free(old).unwrap();

    let id = t.allocate(1).unwrap();
    assert_eq!(
        Arc::as_ptr(&t.get(id).unwrap()),
        kept,
        "the freed batch was reused"
    );
    assert!(t.get(old).is_err(), "the old handle stays stale");
    assert!(
        matches!(t.task_status(id, 0), Err(Error::InvalidTask { .. })),
        "no task of the old batch is left"
    );
    let batch = t.get(id).unwrap();
    assert_eq!(batch.raw_id, id.raw());
    let fresh = add(&t, &regions, id, &[1], false);
    let extra = [Arc::new(TaskShared::new(
        Opcode::Read,
        1,
        1,
        None,
        Some(regions.pin_local(0x1000, 1).unwrap()),
    ))];
    assert!(
        matches!(
            batch.add_tasks(extra.iter(), None),
            Err(Error::TooManyRequests {
                capacity: 1,
                requested: 2
            })
        ),
        "the new capacity holds"
    );
    assert_eq!(t.task_status(id, 0).unwrap().state, TransferState::Waiting);
    assert!(
        !token(&t, id, &fresh[0]).is_canceled(),
        "the old cancel is gone"
    );
    assert!(
        token(&t, id, &fresh[0]).record(10, Ok(())).is_none(),
        "the old batch's notification is gone"
    );
    assert_eq!(
        t.wait(id, Duration::from_secs(1)).unwrap(),
        TransferStatus {
            state: TransferState::Completed,
            transferred_bytes: 10
        },
        "the old failure is gone"
    );
    t.free(id).unwrap();
}

#[test]
fn a_batch_something_still_holds_is_not_reused() {
    let regions = table_with_region();
    let t = system_table();
    let old = t.allocate(1).unwrap();
    let tasks = add(&t, &regions, old, &[1], false);
    // A transport that has reported its slice but not yet dropped the token.
    let late = token(&t, old, &tasks[0]);
    late.record(10, Ok(()));
    t.free(old).unwrap();
    let id = t.allocate(1).unwrap();
    assert!(
        !Arc::ptr_eq(&t.get(id).unwrap(), &late.batch),
        "a batch a token still holds is not handed out again"
    );
    assert_eq!(late.batch.raw_id, old.raw(), "and it is left as it was");
    assert!(late.batch.freed.load(Ordering::Acquire));
}

#[test]
fn cancel_is_seen_by_tokens_and_ends_canceled() {
    let regions = table_with_region();
    let t = system_table();
    let id = t.allocate(1).unwrap();
    let tasks = add(&t, &regions, id, &[2], false);
    let first = token(&t, id, &tasks[0]);
    assert!(!first.is_canceled());
    first.record(10, Ok(()));
    t.cancel(id).unwrap();
    let second = token(&t, id, &tasks[0]);
    assert!(second.is_canceled());
    second.record(10, Err(SliceError::Canceled));
    let s = t.wait(id, Duration::from_secs(1)).unwrap();
    assert_eq!(
        s,
        TransferStatus {
            state: TransferState::Canceled,
            transferred_bytes: 10
        }
    );
}

#[test]
fn a_passed_deadline_stops_the_task_and_ends_in_timeout() {
    let regions = table_with_region();
    let t = system_table();
    let id = t.allocate(1).unwrap();
    let past = Instant::now() - Duration::from_millis(1);
    let tasks = [Arc::new(TaskShared::new(
        Opcode::Read,
        10,
        1,
        Some(past),
        Some(regions.pin_local(0x1000, 1).unwrap()),
    ))];
    t.get(id).unwrap().add_tasks(tasks.iter(), None).unwrap();
    assert_eq!(t.task_status(id, 0).unwrap().state, TransferState::Waiting);
    let tok = token(&t, id, &tasks[0]);
    assert!(tok.is_canceled(), "status query expired the deadline");
    tok.record(10, Err(SliceError::Canceled));
    assert_eq!(
        t.wait_task(id, 0, Duration::from_secs(1)).unwrap().state,
        TransferState::Timeout
    );
}

#[test]
fn waiters_wake_without_polling() {
    let regions = table_with_region();
    let t = Arc::new(system_table());
    let id = t.allocate(1).unwrap();
    let tasks = add(&t, &regions, id, &[1], false);
    let tok = token(&t, id, &tasks[0]);
    let waiter = {
        let t = t.clone();
        std::thread::spawn(move || t.wait(id, Duration::from_secs(30)))
    };
    std::thread::sleep(Duration::from_millis(20));
    tok.record(10, Ok(()));
    assert_eq!(
        waiter.join().unwrap().unwrap().state,
        TransferState::Completed
    );
}

#[test]
fn a_task_waiter_wakes_when_its_task_ends_and_a_batch_waiter_when_the_last_does() {
    let regions = table_with_region();
    let t = Arc::new(system_table());
    let id = t.allocate(2).unwrap();
    let tasks = add(&t, &regions, id, &[1, 1], false);
    let (first, second) = (token(&t, id, &tasks[0]), token(&t, id, &tasks[1]));
    let spawn_wait = |task: Option<usize>| {
        let t = t.clone();
        std::thread::spawn(move || match task {
            Some(i) => t.wait_task(id, i, Duration::from_secs(30)),
            None => t.wait(id, Duration::from_secs(30)),
        })
    };
    let task_waiter = spawn_wait(Some(0));
    let batch_waiter = spawn_wait(None);
    // Both are past their poll and asleep.
    std::thread::sleep(Duration::from_millis(50));
    first.record(10, Ok(()));
    assert_eq!(
        task_waiter.join().unwrap().unwrap().state,
        TransferState::Completed,
        "woken by its own task although the batch is unfinished"
    );
    std::thread::sleep(Duration::from_millis(20));
    assert!(!batch_waiter.is_finished(), "the batch waiter sleeps on");
    second.record(10, Ok(()));
    assert_eq!(
        batch_waiter.join().unwrap().unwrap().state,
        TransferState::Completed
    );
}

#[test]
fn batch_ids_are_non_zero_and_below_2_pow_48_for_every_engine_tag() {
    // Every seed an engine can draw, and more tables than there are tags (the tags wrap).
    let mut tags = std::collections::HashSet::new();
    for seed in (0..=u16::MAX).step_by(7).chain([u16::MAX - 1, u16::MAX]) {
        let t = BatchTable::new(4, seed, Arc::new(crate::clock::SystemClock));
        let id = t.allocate(1).unwrap();
        assert!(
            id.raw() != 0 && id.raw() < 1 << BATCH_ID_BITS,
            "{:#x}",
            id.raw()
        );
        assert!(id.raw() < 1 << 48, "Mooncake's range");
        tags.insert(id.tag());
        // The same handle with a bit above the layout set is nobody's.
        for bit in [BATCH_ID_BITS, 63] {
            let forged = BatchId::from_raw(id.raw() | 1 << bit);
            assert!(
                matches!(t.get(forged), Err(Error::InvalidBatch { reason, .. }) if reason.starts_with("foreign")),
                "bit {bit}"
            );
        }
    }
    assert!(!tags.contains(&0));
    assert!(
        tags.len() > 9000,
        "tags spread over the range: {}",
        tags.len()
    );
}

#[test]
fn engine_tags_cycle_through_every_non_zero_value() {
    let top = (1u16 << TAG_BITS) - 1;
    assert_eq!(tag_for(0, top - 1), top);
    assert_eq!(tag_for(1, top - 1), 1, "wraps past zero");
    assert_eq!(
        tag_for(u32::MAX, u16::MAX),
        tag_for(u32::MAX % u32::from(top), u16::MAX)
    );
    let seen: std::collections::HashSet<u16> =
        (0..u32::from(top)).map(|n| tag_for(n, 1234)).collect();
    assert_eq!(
        seen.len(),
        usize::from(top),
        "distinct for 2^15 - 1 engines in a row"
    );
    assert!(!seen.contains(&0));
}

#[test]
fn consecutive_tables_never_share_a_tag() {
    let tables: Vec<BatchTable> = (0..64)
        .map(|_| BatchTable::new(4, 0, Arc::new(crate::clock::SystemClock)))
        .collect();
    let ids: Vec<BatchId> = tables.iter().map(|t| t.allocate(1).unwrap()).collect();
    for (i, t) in tables.iter().enumerate() {
        for (j, id) in ids.iter().enumerate() {
            assert_eq!(t.get(*id).is_ok(), i == j, "table {i} and handle {j}");
        }
    }
}

#[test]
fn a_merged_slice_counts_for_every_task_it_carries() {
    let regions = table_with_region();
    let t = system_table();
    let id = t.allocate(3).unwrap();
    // Tasks of 10, 20 and 10 bytes: task 0 in one slice, task 1 split over two, task 2 in one;
    // the first slice carries 10 + 4 bytes, the second 16 + 10.
    let tasks = add(&t, &regions, id, &[1, 2, 1], true);
    let batch = t.get(id).unwrap();
    let first = SliceToken::merged(
        batch.clone(),
        tasks[0].clone(),
        vec![(tasks[1].clone(), 4)],
        0,
    );
    let second = SliceToken::merged(
        batch.clone(),
        tasks[1].clone(),
        vec![(tasks[2].clone(), 10)],
        1,
    );
    assert_eq!((first.tasks(), second.tasks()), (2, 2));
    assert!(first.record(14, Ok(())).is_none());
    assert_eq!(
        t.task_status(id, 0).unwrap().state,
        TransferState::Completed
    );
    assert_eq!(
        t.task_status(id, 1).unwrap(),
        TransferStatus {
            state: TransferState::Pending,
            transferred_bytes: 4
        }
    );
    assert_eq!(t.task_status(id, 2).unwrap().state, TransferState::Waiting);
    assert_eq!(
        t.batch_status(id).unwrap(),
        TransferStatus {
            state: TransferState::Pending,
            transferred_bytes: 14
        }
    );
    let notify = second.record(26, Ok(()));
    assert!(
        notify.is_some(),
        "the slice that ends the batch hands back its notification"
    );
    for (i, len) in [10, 20, 10].into_iter().enumerate() {
        assert_eq!(
            t.task_status(id, i).unwrap(),
            TransferStatus {
                state: TransferState::Completed,
                transferred_bytes: len
            }
        );
    }
    // Every task completed: the batch's status (read without its tasks' lock) and its wait
    // give all 40 bytes.
    let all = TransferStatus {
        state: TransferState::Completed,
        transferred_bytes: 40,
    };
    assert_eq!(t.batch_status(id).unwrap(), all);
    assert_eq!(t.wait(id, Duration::from_secs(1)).unwrap(), all);
    t.free(id).unwrap();
}

#[test]
fn a_failed_merged_slice_fails_every_task_it_carries_and_counts_no_bytes() {
    let regions = table_with_region();
    let t = system_table();
    let id = t.allocate(2).unwrap();
    // Tasks of 10 bytes each in one merged slice, which fails.
    let tasks = add(&t, &regions, id, &[1, 1], false);
    let batch = t.get(id).unwrap();
    let slice = SliceToken::merged(batch, tasks[0].clone(), vec![(tasks[1].clone(), 10)], 0);
    assert!(
        slice
            .record(20, Err(SliceError::Path("reset".into())))
            .is_none()
    );
    for i in 0..2 {
        assert_eq!(
            t.task_status(id, i).unwrap(),
            TransferStatus {
                state: TransferState::Failed,
                transferred_bytes: 0
            },
            "task {i}"
        );
        assert_eq!(
            t.task_error(id, i).unwrap(),
            Some(SliceError::Path("reset".into()))
        );
    }
    assert_eq!(
        t.wait(id, Duration::from_secs(1)).unwrap(),
        TransferStatus {
            state: TransferState::Failed,
            transferred_bytes: 0
        }
    );
    assert_eq!(t.batch_status(id).unwrap().state, TransferState::Failed);
    t.free(id).unwrap();
}

/// Counts the ends a watched batch tells of, and the tasks it holds again.
#[derive(Default)]
struct Ends(
    std::sync::Mutex<Vec<(BatchId, bool)>>,
    std::sync::Mutex<Vec<(BatchId, usize)>>,
);

impl super::TaskWatcher for Ends {
    fn task_ended(&self, batch: BatchId, ran: bool) {
        self.0.lock().unwrap().push((batch, ran));
    }

    fn task_held(&self, batch: BatchId, task: usize) {
        self.1.lock().unwrap().push((batch, task));
    }
}

#[test]
fn a_watched_batch_tells_of_each_task_end_once_after_its_pin_is_released() {
    let regions = table_with_region();
    let t = system_table();
    let ends = Arc::new(Ends::default());
    let id = t.allocate_watched(3, Some(ends.clone())).unwrap();
    let tasks = add(&t, &regions, id, &[2, 1, 1], false);
    // A slice of a task of two slices: not an end.
    assert!(token(&t, id, &tasks[0]).record(10, Ok(())).is_none());
    assert!(ends.0.lock().unwrap().is_empty());
    token(&t, id, &tasks[0]).record(10, Ok(()));
    token(&t, id, &tasks[1]).record(10, Err(SliceError::Path("down".into())));
    // Each end once, as one of a task that ran (was posted).
    assert_eq!(*ends.0.lock().unwrap(), [(id, true), (id, true)]);
    assert_eq!(t.task_status(id, 1).unwrap().state, TransferState::Failed);
    token(&t, id, &tasks[2]).record(10, Ok(()));
    assert_eq!(ends.0.lock().unwrap()[2], (id, true), "the batch's last");
    // Every pin is released by the time its end is told.
    assert!(regions.snapshot().iter().all(|r| r.pins() == 0));
    // An unwatched batch tells no one.
    let quiet = t.allocate(1).unwrap();
    let one = add(&t, &regions, quiet, &[1], false);
    token(&t, quiet, &one[0]).record(10, Ok(()));
    assert_eq!(ends.0.lock().unwrap().len(), 3);
    // A freed watched batch, reused, is not watched any more.
    t.free(id).unwrap();
    t.free(quiet).unwrap();
    let reused = t.allocate(1).unwrap();
    let one = add(&t, &regions, reused, &[1], false);
    token(&t, reused, &one[0]).record(10, Ok(()));
    assert_eq!(ends.0.lock().unwrap().len(), 3);
}
