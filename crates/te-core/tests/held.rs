//! Held tasks, the engine's side of a runtime that decides itself where each task goes (te-tent):
//! a held task is counted, waited for, canceled, expired and announced as any task; an attempt
//! posted to fail over holds its task again when it fails, with the watcher told which; a
//! claimed task is stopped, never ended, by a cancel. Hostile calls (a place not held, named
//! twice, lists of unequal length, a state that is not an end) change nothing.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use te_core::transport::{Capabilities, SliceError};
use te_core::{
    BatchId, Config, Error, HeldTask, HostBuffer, Notification, Opcode, SubmitOptions, TaskWatcher,
    TransferEngine, TransferRequest, TransferState, TransferStatus,
};
use te_testkit::SimTransport;

const LEN: u64 = 64 << 10;

struct Rig {
    engine: TransferEngine,
    /// Fails what the test says; `mover`'s slices the test carries out.
    sim: Arc<SimTransport>,
    mover: Arc<SimTransport>,
    local: Arc<HostBuffer>,
    remote: Arc<HostBuffer>,
    segment: u64,
}

fn rig(retries: u32) -> Rig {
    let mut config = Config::from_lookup(|_| None).unwrap();
    config.tcp_bind_address = Some("127.0.0.1".parse().unwrap());
    config.retry_cnt = retries;
    let engine = TransferEngine::init(config, "P2PHANDSHAKE", "127.0.0.1").unwrap();
    let sim = Arc::new(SimTransport::named("sim", Capabilities::DRAM_REMOTE_HOST));
    let mover = Arc::new(SimTransport::named("mover", Capabilities::DRAM_REMOTE_HOST));
    engine.install_transport(sim.clone()).unwrap();
    engine.install_transport(mover.clone()).unwrap();
    let (local, remote, segment) = te_testkit::own_buffers(&engine, 4 * LEN as usize);
    local
        .write_at(0, &te_testkit::pattern(5, 4 * LEN as usize))
        .unwrap();
    Rig {
        engine,
        sim,
        mover,
        local,
        remote,
        segment,
    }
}

impl Rig {
    fn write(&self, i: u64) -> TransferRequest {
        TransferRequest {
            opcode: Opcode::Write,
            source: self.local.addr() + i * LEN,
            target_id: self.segment,
            target_offset: self.remote.addr() + i * LEN,
            length: LEN,
        }
    }

    fn held(&self, n: usize) -> Vec<HeldTask> {
        vec![
            HeldTask {
                opcode: Opcode::Write,
                length: LEN,
                deadline: None,
                transport: None,
            };
            n
        ]
    }

    fn fail_all(&self) {
        while let Some(s) = self.sim.take(|_| 0) {
            self.sim
                .complete(s, Err(SliceError::Path("link down".into())));
        }
    }

    /// Carries out every WRITE slice `mover` holds (a copy within this process), then reports it.
    fn move_all(&self) {
        self.mover.carry_writes(&self.local, &self.remote);
    }

    fn landed(&self, i: u64) -> bool {
        let (at, n) = ((i * LEN) as usize, LEN as usize);
        self.remote.to_vec(at, n).unwrap() == self.local.to_vec(at, n).unwrap()
    }
}

/// What a watched batch tells.
#[derive(Default)]
struct Told {
    ended: Mutex<Vec<bool>>,
    held: Mutex<Vec<(BatchId, usize)>>,
}

impl TaskWatcher for Told {
    fn task_ended(&self, _batch: BatchId, ran: bool) {
        self.ended.lock().unwrap().push(ran);
    }

    fn task_held(&self, batch: BatchId, task: usize) {
        self.held.lock().unwrap().push((batch, task));
    }
}

fn status(state: TransferState, transferred_bytes: u64) -> TransferStatus {
    TransferStatus {
        state,
        transferred_bytes,
    }
}

#[test]
fn a_failed_attempt_holds_its_task_and_the_next_attempt_in_its_place_completes_it() {
    let r = rig(0);
    let told = Arc::new(Told::default());
    let b = r
        .engine
        .allocate_watched_batch(2, Some(told.clone()))
        .unwrap();
    let note = Notification {
        name: "kv".into(),
        notify_msg: "all in place".into(),
    };
    let first = r
        .engine
        .hold(b, &r.held(2), Some((r.segment, note)))
        .unwrap();
    assert_eq!(first, 0);
    assert_eq!(
        r.engine.task_status(b, 1).unwrap().state,
        TransferState::Waiting
    );
    // Task 1 first, on the simulated transport, failing over.
    let over = SubmitOptions::default().via("sim").failing_over(true);
    r.engine.post_held(b, &[1], &[r.write(1)], &over).unwrap();
    assert_eq!(r.sim.queued(), 1);
    r.fail_all();
    assert_eq!(
        *told.held.lock().unwrap(),
        [(b, 1)],
        "the watcher is told which"
    );
    assert_eq!(
        *told.ended.lock().unwrap(),
        Vec::<bool>::new(),
        "not an end"
    );
    let held = r.engine.task_status(b, 1).unwrap();
    assert_eq!(
        held.state,
        TransferState::Pending,
        "failed over is not failed"
    );
    assert!(matches!(
        r.engine.task_error(b, 1).unwrap(),
        Some(SliceError::Path(_))
    ));
    // The next attempt, in its place, on a transport that moves the bytes.
    let moving = SubmitOptions::default().via("mover");
    r.engine
        .post_held(b, &[1, 0], &[r.write(1), r.write(0)], &moving)
        .unwrap();
    assert!(!r.landed(0) && !r.landed(1));
    r.move_all();
    let s = r.engine.wait(b, Duration::from_secs(10)).unwrap();
    assert_eq!(s, status(TransferState::Completed, 2 * LEN));
    assert!(r.landed(0) && r.landed(1), "every byte in place");
    assert_eq!(*told.ended.lock().unwrap(), [true, true]);
    // The notification goes out once the whole batch completed.
    let got = r.engine.next_notify(Duration::from_secs(10)).unwrap();
    assert_eq!(got.notification.notify_msg, "all in place");
    r.engine.free_batch(b).unwrap();
}

#[test]
fn held_tasks_end_by_cancel_deadline_or_their_runtime_and_hostile_posts_change_nothing() {
    let r = rig(0);
    let told = Arc::new(Told::default());
    let b = r
        .engine
        .allocate_watched_batch(4, Some(told.clone()))
        .unwrap();
    let mut tasks = r.held(4);
    tasks[3].deadline = Some(std::time::Instant::now());
    r.engine.hold(b, &tasks, None).unwrap();
    let moving = SubmitOptions::default().via("mover");
    // Hostile posts: unequal lists, a place named twice, a place past the batch, a foreign
    // batch. Nothing is posted, nothing changes.
    let refused = [
        r.engine.post_held(b, &[0, 1], &[r.write(0)], &moving),
        r.engine
            .post_held(b, &[0, 0], &[r.write(0), r.write(0)], &moving),
        r.engine.post_held(b, &[9], &[r.write(0)], &moving),
        r.engine
            .post_held(BatchId::from_raw(1 << 40), &[0], &[r.write(0)], &moving),
    ];
    assert!(matches!(refused[0], Err(Error::InvalidArgument(_))));
    assert!(matches!(refused[1], Err(Error::InvalidArgument(_))));
    assert!(matches!(
        refused[2],
        Err(Error::InvalidTask { task: 9, .. })
    ));
    assert!(matches!(refused[3], Err(Error::InvalidBatch { .. })));
    assert!(!r.landed(0), "nothing moved");
    // A held task can still be posted after the refusals, and only once.
    r.engine.post_held(b, &[0], &[r.write(0)], &moving).unwrap();
    assert!(matches!(
        r.engine.post_held(b, &[0], &[r.write(0)], &moving),
        Err(Error::InvalidArgument(_))
    ));
    r.move_all();
    // Canceled while held: ends at once, and cannot be posted or ended after.
    r.engine.cancel_task(b, 1).unwrap();
    assert_eq!(
        r.engine.task_status(b, 1).unwrap().state,
        TransferState::Canceled
    );
    assert!(r.engine.post_held(b, &[1], &[r.write(1)], &moving).is_err());
    let done = status(TransferState::Completed, LEN);
    assert!(r.engine.end_held(b, 1, done, None).is_err());
    assert!(!r.landed(1));
    // Claimed: a cancel asks it to stop; its runtime ends it (and not with a non-end).
    r.engine.claim_held(b, 2).unwrap();
    assert!(!r.engine.stop_asked(b, 2).unwrap());
    r.engine.cancel_task(b, 2).unwrap();
    assert!(r.engine.stop_asked(b, 2).unwrap());
    assert_eq!(
        r.engine.task_status(b, 2).unwrap().state,
        TransferState::Waiting
    );
    let pending = status(TransferState::Pending, 0);
    assert!(matches!(
        r.engine.end_held(b, 2, pending, None),
        Err(Error::InvalidArgument(_))
    ));
    let canceled = status(TransferState::Canceled, 0);
    r.engine.end_held(b, 2, canceled, None).unwrap();
    // Held past its deadline: the wait ends it TIMEOUT.
    let s = r.engine.wait(b, Duration::from_secs(10)).unwrap();
    assert_eq!(s.state, TransferState::Timeout);
    assert_eq!(
        r.engine.task_status(b, 3).unwrap().state,
        TransferState::Timeout
    );
    assert_eq!(
        r.engine.task_status(b, 0).unwrap().state,
        TransferState::Completed
    );
    assert!(r.landed(0));
    // Ended while held: not ran; the posted one and the claimed one ran.
    let mut ended = told.ended.lock().unwrap().clone();
    ended.sort();
    assert_eq!(ended, [false, false, true, true]);
    r.engine.free_batch(b).unwrap();
}

#[test]
fn a_batch_with_a_held_task_is_busy_and_a_stopped_attempt_is_not_held_again() {
    let r = rig(0);
    let told = Arc::new(Told::default());
    let b = r
        .engine
        .allocate_watched_batch(2, Some(told.clone()))
        .unwrap();
    r.engine.hold(b, &r.held(2), None).unwrap();
    assert!(matches!(r.engine.free_batch(b), Err(Error::BatchBusy(_))));
    // An attempt canceled, then failing, ends FAILED: a cancel is not failed over.
    let over = SubmitOptions::default().via("sim").failing_over(true);
    r.engine.post_held(b, &[0], &[r.write(0)], &over).unwrap();
    r.engine.cancel_task(b, 0).unwrap();
    r.fail_all();
    assert!(told.held.lock().unwrap().is_empty());
    assert!(r.engine.task_status(b, 0).unwrap().state.is_terminal());
    // A waiter of a task sees it through its failed-over attempt to the next one's end.
    r.engine.post_held(b, &[1], &[r.write(1)], &over).unwrap();
    std::thread::scope(|scope| {
        let waiter = scope.spawn(|| r.engine.wait_task(b, 1, Duration::from_secs(30)));
        r.fail_all();
        assert_eq!(*told.held.lock().unwrap(), [(b, 1)]);
        let next = SubmitOptions::default().via("mover");
        r.engine.post_held(b, &[1], &[r.write(1)], &next).unwrap();
        r.move_all();
        let s = waiter.join().unwrap().unwrap();
        assert_eq!(s, status(TransferState::Completed, LEN));
    });
    assert!(r.landed(1));
    r.engine.free_batch(b).unwrap();
}

#[test]
fn a_held_task_is_one_request_however_many_attempts_it_took() {
    use te_metrics::counters::FailureKind;
    let r = rig(0);
    r.engine.set_metrics_enabled(true);
    let b = (r.engine)
        .allocate_watched_batch(2, Some(Arc::new(Told::default())))
        .unwrap();
    r.engine.hold(b, &r.held(2), None).unwrap();
    // Task 0: a failed attempt, then one that completes. Task 1: canceled while held.
    let over = SubmitOptions::default().via("sim").failing_over(true);
    r.engine.post_held(b, &[0], &[r.write(0)], &over).unwrap();
    r.fail_all();
    let moving = SubmitOptions::default().via("mover");
    r.engine.post_held(b, &[0], &[r.write(0)], &moving).unwrap();
    r.move_all();
    r.engine.cancel_task(b, 1).unwrap();
    assert_eq!(
        r.engine.wait(b, Duration::from_secs(10)).unwrap().state,
        TransferState::Canceled
    );
    let snap = r.engine.metrics().snapshot();
    let sum = |f: &dyn Fn(&te_metrics::counters::Series) -> u64| -> u64 {
        snap.series.iter().map(f).sum()
    };
    assert_eq!(sum(&|s| s.requests), 2, "one request per task");
    assert_eq!(sum(&|s| s.bytes), LEN, "the completed one's bytes, once");
    assert_eq!(sum(&|s| s.attempts), 2, "the canceled task never ran");
    assert_eq!(sum(&|s| s.attempt_failures), 1);
    let canceled = |s: &te_metrics::counters::Series| {
        (s.failures.iter())
            .filter(|(k, _)| *k == FailureKind::Canceled)
            .map(|(_, n)| n)
            .sum()
    };
    assert_eq!(sum(&canceled), 1);
    // The completed request's time held before its first attempt is its queue wait.
    assert_eq!(sum(&|s| s.stages[0].count()), 1);
    r.engine.free_batch(b).unwrap();
}
