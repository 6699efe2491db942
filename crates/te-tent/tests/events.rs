//! TENT's runtime learns of ends as events: its progress thread sleeps while nothing happens,
//! idle, with a task waiting behind one in flight, or with a notification owed (te-core sends
//! it), and an end alone gets the waiting task posted. (A file of its own, its tests one at a time: the engine under test is the only one
//! in the process, so the progress thread counted is its.)

mod common;

use std::time::{Duration, Instant};

use common::*;
use te_core::{Notification, TransferState};

/// Held by each test: one engine at a time.
static ONE_ENGINE: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Context switches of this process's TENT progress threads so far.
fn progress_wakeups() -> u64 {
    let mut n = 0;
    for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if !comm.starts_with("te-tent-progres") {
            continue;
        }
        let status = std::fs::read_to_string(task.path().join("status")).unwrap();
        n += status
            .lines()
            .filter(|l| l.contains("ctxt_switches"))
            .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
            .sum::<u64>();
    }
    n
}

/// The progress thread's wake-ups over a quiet spell, after the last event has settled.
fn wakeups_over_a_spell() -> u64 {
    std::thread::sleep(Duration::from_millis(100));
    let before = progress_wakeups();
    std::thread::sleep(Duration::from_millis(300));
    progress_wakeups() - before
}

#[test]
fn the_progress_thread_sleeps_until_an_end_and_the_end_posts_what_waits() {
    let _one = ONE_ENGINE.lock().unwrap_or_else(|e| e.into_inner());
    let r = rig(r#"{"max_inflight_tasks": 1, "merge_requests": false}"#);
    assert!(progress_wakeups() > 0, "the progress thread is found");
    assert_eq!(wakeups_over_a_spell(), 0, "idle: no timer wakes it");
    // One task in flight (the simulated transport holds it), one waiting behind it.
    let batch = r.tent.allocate_batch(2).unwrap();
    r.tent.submit(batch, &[r.write(0), r.write(1)]).unwrap();
    assert_eq!(r.slots(&r.a), [0]);
    assert_eq!(
        wakeups_over_a_spell(),
        0,
        "a waiting task waits for an end, not a timer"
    );
    // The end alone (nobody asks for a status) gets the waiting task posted.
    let first = r.a.take(|_| 0).unwrap();
    r.a.complete(first, Ok(()));
    let until = Instant::now() + Duration::from_secs(10);
    while r.slots(&r.a).is_empty() {
        assert!(Instant::now() < until, "the waiting task was not posted");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(r.slots(&r.a), [1]);
    r.finish_all(&r.a, Ok(()));
    let s = r.tent.wait(batch, Duration::from_secs(5)).unwrap();
    assert_eq!(s.state, TransferState::Completed);
    r.tent.free_batch(batch).unwrap();
    assert_eq!(wakeups_over_a_spell(), 0, "idle again");
}

#[test]
fn a_notification_owed_goes_out_at_the_batch_end_with_the_progress_thread_asleep() {
    let _one = ONE_ENGINE.lock().unwrap_or_else(|e| e.into_inner());
    let r = rig(r#"{"merge_requests": false}"#);
    let batch = r.tent.allocate_batch(3).unwrap();
    let note = Notification {
        name: "kv".into(),
        notify_msg: "done".into(),
    };
    let writes = [r.write(0), r.write(1), r.write(2)];
    r.tent
        .submit_with_notification(batch, &writes, note)
        .unwrap();
    assert_eq!(r.slots(&r.a), [0, 1, 2]);
    // Ends do not wake it: the batch and its notification are te-core's.
    std::thread::sleep(Duration::from_millis(100));
    let before = progress_wakeups();
    for _ in 0..2 {
        let s = r.a.take(|_| 0).unwrap();
        r.a.complete(s, Ok(()));
    }
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(progress_wakeups(), before, "two ends that decide nothing");
    // The batch's end sends the notification, with no one asking.
    let s = r.a.take(|_| 0).unwrap();
    r.a.complete(s, Ok(()));
    let got = r.tent.receive_notification(Duration::from_secs(10));
    assert_eq!(got.map(|n| n.notify_msg), Some("done".to_string()));
    assert_eq!(
        progress_wakeups(),
        before,
        "the progress thread slept through"
    );
    assert_eq!(
        r.tent.wait(batch, Duration::from_secs(5)).unwrap().state,
        TransferState::Completed
    );
}
