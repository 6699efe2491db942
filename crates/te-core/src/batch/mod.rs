//! Batches, tasks and their bookkeeping: checked handles, per-task slice counters, status,
//! cancellation and event-driven waiting.
//!
//! A [`BatchId`] packs an engine tag, a generation and a slot index, so a stale or foreign
//! handle is an error, never undefined behaviour. Completions update per-task atomics through
//! the [`SliceToken`] each slice carries; a finishing task takes a lock only when a waiter is
//! asleep or about to be (to wake it), never per slice. A freed batch that nothing else holds
//! is emptied and handed out again by a later `allocate` (under a new handle; the old one stays
//! stale), sparing an allocation and its task list per batch. This module does no I/O and
//! spawns nothing.

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::memory::Opcode;
use crate::memory::RegionPin;
use crate::notify::Notification;
use crate::outcome::SliceError;
use crate::segment::RemoteSegment;

mod held;
mod meter;
mod spin;
mod table;
pub use held::HeldTask;
pub(crate) use meter::Meter;
pub(crate) use table::BatchTable;

/// How long `wait` polls before it sleeps (bounded: never a busy wait for the whole transfer;
/// and only while most of the engine's recent polls saw their batch end).
pub const WAIT_SPIN: Duration = Duration::from_micros(50);
/// `wait` polls only for a batch with at most this many bytes left to move: a larger one takes
/// longer than [`WAIT_SPIN`] on any transport, and its poll would be CPU spent for nothing.
pub const WAIT_SPIN_BYTES: u64 = 256 << 10;

/// Bits of a [`BatchId`]'s slot index: at most 2^20 batches of one engine are live at once.
pub(crate) const INDEX_BITS: u32 = 20;
/// Bits of a [`BatchId`]'s generation (how often its slot was handed out).
pub(crate) const GENERATION_BITS: u32 = 13;
/// Bits of a [`BatchId`]'s engine tag (never zero).
pub const TAG_BITS: u32 = 15;
/// Every batch id is below `1 << BATCH_ID_BITS` and never zero, as Mooncake's are (heap
/// addresses): callers such as LMCache refuse ids of 2^63 and above as failures.
pub const BATCH_ID_BITS: u32 = TAG_BITS + GENERATION_BITS + INDEX_BITS;

/// A checked batch handle (Mooncake's `BatchID`, but validated): engine tag, generation and
/// slot index, in [`BATCH_ID_BITS`] bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BatchId(u64);

impl BatchId {
    /// The raw value, for C APIs and logs.
    pub fn raw(self) -> u64 {
        self.0
    }
    /// Wraps a raw value; it is checked when used.
    pub fn from_raw(raw: u64) -> Self {
        BatchId(raw)
    }
    fn compose(tag: u16, generation: u16, index: usize) -> Self {
        debug_assert!(tag != 0 && u32::from(tag) < 1 << TAG_BITS);
        debug_assert!(u32::from(generation) < 1 << GENERATION_BITS && index < 1 << INDEX_BITS);
        BatchId(
            (u64::from(tag) << (GENERATION_BITS + INDEX_BITS))
                | (u64::from(generation) << INDEX_BITS)
                | index as u64,
        )
    }
    /// The tag, or a value no engine has (0) when bits above the layout are set.
    fn tag(self) -> u16 {
        match self.0 >> BATCH_ID_BITS {
            0 => (self.0 >> (GENERATION_BITS + INDEX_BITS)) as u16,
            _ => 0,
        }
    }
    fn generation(self) -> u16 {
        ((self.0 >> INDEX_BITS) & ((1 << GENERATION_BITS) - 1)) as u16
    }
    fn index(self) -> usize {
        (self.0 & ((1 << INDEX_BITS) - 1)) as usize
    }
}

/// Engine tags, handed out in turn: never zero, and distinct for `2^TAG_BITS - 1` engines in a
/// row whatever `seed` is (so a foreign handle from a recent engine never passes).
pub fn next_engine_tag(seed: u16) -> u16 {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    tag_for(NEXT.fetch_add(1, Ordering::Relaxed), seed)
}

/// The `n`th tag from `seed`: `1..2^TAG_BITS`, cycling.
fn tag_for(n: u32, seed: u16) -> u16 {
    let span = (1u64 << TAG_BITS) - 1;
    ((u64::from(n) + u64::from(seed)) % span + 1) as u16
}

/// Told when a task of a watched batch ends ([`TransferEngine::allocate_watched_batch`]): its state is
/// terminal and its pin released. Called on the thread that ended the task (a transport's, or
/// the submitter's), so it must be short and must not block: note the event, wake a thread.
///
/// [`TransferEngine::allocate_watched_batch`]: crate::TransferEngine::allocate_watched_batch
pub trait TaskWatcher: Send + Sync {
    /// A task of `batch` ended; `ran`: it had been posted or claimed (not ended while held).
    fn task_ended(&self, batch: BatchId, ran: bool);

    /// An attempt of task `task` of `batch`, posted to fail over ([`SubmitOptions::fail_over`]),
    /// failed: the task is held again, its pin released, waiting for its next attempt
    /// ([`TransferEngine::post_held`]) or its end ([`TransferEngine::end_held`]).
    ///
    /// [`SubmitOptions::fail_over`]: crate::SubmitOptions::fail_over
    /// [`TransferEngine::post_held`]: crate::TransferEngine::post_held
    /// [`TransferEngine::end_held`]: crate::TransferEngine::end_held
    fn task_held(&self, batch: BatchId, task: usize);
}

/// A task's or batch's state, numbered as Mooncake's `TransferStatusEnum`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum TransferState {
    /// Posted; no slice has finished yet.
    Waiting = 0,
    /// Some slices have finished.
    Pending = 1,
    /// Canceled by the application; no slice is in flight any more.
    Canceled = 3,
    /// Every slice succeeded: the bytes are at their destination.
    Completed = 4,
    /// The task's deadline (`MC_SLICE_TIMEOUT`) passed; no slice is in flight any more.
    Timeout = 5,
    /// A slice failed for good; no slice is in flight any more.
    Failed = 6,
}

impl TransferState {
    fn from_u8(v: u8) -> Self {
        match v {
            0 => TransferState::Waiting,
            1 => TransferState::Pending,
            3 => TransferState::Canceled,
            4 => TransferState::Completed,
            5 => TransferState::Timeout,
            _ => TransferState::Failed,
        }
    }
    /// Whether no slice of the task (or batch) is in flight any more.
    pub fn is_terminal(self) -> bool {
        !matches!(self, TransferState::Waiting | TransferState::Pending)
    }
}

/// A state with the bytes that reached their destination so far.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TransferStatus {
    /// The state.
    pub state: TransferState,
    /// Bytes of successful slices.
    pub transferred_bytes: u64,
}

/// A freed batch whose task list grew past this many entries is not kept for reuse.
const SPARE_TASKS: usize = 1024;

const RUN: u8 = 0;
const STOP_CANCEL: u8 = 1;
const STOP_TIMEOUT: u8 = 2;

pub(crate) struct TaskShared {
    opcode: Opcode,
    len: u64,
    slices_left: AtomicU64,
    transferred: AtomicU64,
    state: AtomicU8,
    failed: AtomicBool,
    skipped: AtomicBool,
    stop: AtomicU8,
    deadline: Option<Instant>,
    error: Mutex<Option<SliceError>>,
    pin: Mutex<Option<RegionPin>>,
    route: Option<crate::router::TaskRails>,
    /// The name of the transport its slices go to (retries go there too).
    transport: Option<&'static str>,
    /// The submitting thread waits for this task right after submitting it.
    caller_waits: bool,
    /// Its moments, when its end is counted (metrics on).
    metered: Option<Meter>,
    /// Its end was counted (read and written under its batch's task lock).
    counted: AtomicBool,
    /// Whether it was posted (`POSTED`) or is, or was, held (see [`held`]).
    hold: AtomicU8,
    /// A failure of this attempt holds the task again instead of ending it.
    fail_over: bool,
    /// Its place in its batch, for the watcher when it is held again (set for a task that may
    /// be: added failing over, or put in a held task's place).
    slot: AtomicUsize,
}

impl TaskShared {
    /// A task of `slices` slices holding `pin` (none for a held task, which pins nothing).
    #[inline]
    pub(crate) fn new(
        opcode: Opcode,
        len: u64,
        slices: u64,
        deadline: Option<Instant>,
        pin: Option<RegionPin>,
    ) -> Self {
        TaskShared {
            opcode,
            len,
            slices_left: AtomicU64::new(slices),
            transferred: AtomicU64::new(0),
            state: AtomicU8::new(TransferState::Waiting as u8),
            failed: AtomicBool::new(false),
            skipped: AtomicBool::new(false),
            stop: AtomicU8::new(RUN),
            deadline,
            error: Mutex::new(None),
            pin: Mutex::new(pin),
            route: None,
            transport: None,
            caller_waits: false,
            metered: None,
            counted: AtomicBool::new(false),
            hold: AtomicU8::new(held::POSTED),
            fail_over: false,
            slot: AtomicUsize::new(0),
        }
    }

    /// Counts the task's end with `meter`.
    #[inline]
    pub(crate) fn metered(mut self, meter: Option<Meter>) -> Self {
        self.metered = meter;
        self
    }

    /// Counts `n` more slices carrying bytes of the task. Submit counts all of a task's slices
    /// before it posts any, so none can finish the task early.
    pub(crate) fn count_slices(&self, n: u64) {
        self.slices_left.fetch_add(n, Ordering::AcqRel);
    }

    /// Marks the task as one its submitter waits for at once ([`SliceToken::caller_waits`]).
    #[inline]
    pub(crate) fn waited(mut self, caller_waits: bool) -> Self {
        self.caller_waits = caller_waits;
        self
    }

    /// Names the transport the task's slices go to (retries go there too).
    #[inline]
    pub(crate) fn with_transport(mut self, transport: &'static str) -> Self {
        self.transport = Some(transport);
        self
    }

    /// Makes a failure of this attempt hold the task again ([`TaskWatcher::task_held`]).
    #[inline]
    pub(crate) fn failing_over(mut self, fail_over: bool) -> Self {
        self.fail_over = fail_over;
        self
    }

    /// Attaches the task's rail candidates.
    #[inline]
    pub(crate) fn with_route(mut self, route: crate::router::TaskRails) -> Self {
        self.route = Some(route);
        self
    }

    fn state(&self) -> TransferState {
        TransferState::from_u8(self.state.load(Ordering::Acquire))
    }

    fn status(&self) -> TransferStatus {
        TransferStatus {
            state: self.state(),
            transferred_bytes: self.transferred.load(Ordering::Acquire),
        }
    }

    /// Asks it to stop. Fenced as a task held again is (see `held.rs`): a stop and a hold
    /// that race both see the other, or one does.
    fn request_stop(&self, reason: u8) {
        let _ = self
            .stop
            .compare_exchange(RUN, reason, Ordering::AcqRel, Ordering::Acquire);
        std::sync::atomic::fence(Ordering::SeqCst);
    }
}

/// A notification to send once the batch completes.
pub(crate) struct PendingNotify {
    pub(crate) target: Arc<RemoteSegment>,
    pub(crate) notification: Notification,
}

pub(crate) struct BatchShared {
    raw_id: u64,
    capacity: usize,
    tasks: Mutex<Vec<Arc<TaskShared>>>,
    /// Bytes of all its tasks (written under `tasks`' lock, before they are counted
    /// unfinished): a batch whose tasks all completed has moved exactly this many.
    total_len: AtomicU64,
    unfinished: AtomicUsize,
    any_failed: AtomicBool,
    freed: AtomicBool,
    /// Held by a waiter from its last look at the tasks until it sleeps on `finished_cv`, and
    /// taken by a finishing task before it wakes sleepers: no wake-up falls in between.
    sleep_lock: Mutex<()>,
    finished_cv: Condvar,
    /// Threads in `wait_task` on this batch: only they need a wake-up per finished task;
    /// `wait` needs one when the last task finishes.
    task_waiters: AtomicUsize,
    /// Waiters about to sleep or asleep on `finished_cv`: with none, finishing a task takes no
    /// lock and makes no wake-up system call.
    sleepers: AtomicUsize,
    notify: Mutex<Option<PendingNotify>>,
    /// A notification was handed to `add_tasks`: only then does the task that finishes the
    /// batch look at `notify` (and take its lock).
    has_notify: AtomicBool,
    /// Some task has a deadline: status queries then read the clock to expire it.
    has_deadlines: AtomicBool,
    /// Where its metered tasks are counted (set by the first submit with metrics on).
    metrics: std::sync::OnceLock<Arc<te_metrics::counters::Metrics>>,
    /// Every metered task's end has been counted (cleared when a metered task is added).
    all_counted: AtomicBool,
    /// With metrics on, each submit's moment and µs from it to its first slices handed to
    /// their transports.
    posted: Mutex<te_sys::small_list::SmallList<(Instant, u64)>>,
    /// Told of each task's end (set once, when the batch is allocated).
    watcher: std::sync::OnceLock<Arc<dyn TaskWatcher>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl BatchShared {
    fn new(raw_id: u64, capacity: usize) -> Self {
        BatchShared {
            raw_id,
            capacity,
            tasks: Mutex::new(Vec::new()),
            total_len: AtomicU64::new(0),
            unfinished: AtomicUsize::new(0),
            any_failed: AtomicBool::new(false),
            freed: AtomicBool::new(false),
            sleep_lock: Mutex::new(()),
            finished_cv: Condvar::new(),
            task_waiters: AtomicUsize::new(0),
            sleepers: AtomicUsize::new(0),
            notify: Mutex::new(None),
            has_notify: AtomicBool::new(false),
            has_deadlines: AtomicBool::new(false),
            metrics: std::sync::OnceLock::new(),
            all_counted: AtomicBool::new(true),
            posted: Mutex::new(te_sys::small_list::SmallList::Empty),
            watcher: std::sync::OnceLock::new(),
        }
    }

    /// Has `watcher` told of each task's end (a fresh batch, not watched yet).
    fn watch(&self, watcher: Arc<dyn TaskWatcher>) {
        let fresh = self.watcher.set(watcher).is_ok();
        debug_assert!(fresh, "a batch watched twice");
    }

    /// Empties a freed batch no one else holds, for reuse: drops its tasks (keeping the list's
    /// room). False when its task list is too large to keep.
    fn empty_for_reuse(&mut self) -> bool {
        let tasks = self.tasks.get_mut().unwrap_or_else(|e| e.into_inner());
        if tasks.capacity() > SPARE_TASKS {
            return false;
        }
        tasks.clear();
        *self.notify.get_mut().unwrap_or_else(|e| e.into_inner()) = None;
        true
    }

    /// A spare batch as new, under handle `raw_id` with room for `capacity` tasks: everything
    /// as [`new`](Self::new) makes it, but the (empty) task list keeps its room.
    fn renew(&mut self, raw_id: u64, capacity: usize) {
        let tasks = std::mem::take(self.tasks.get_mut().unwrap_or_else(|e| e.into_inner()));
        *self = BatchShared {
            tasks: Mutex::new(tasks),
            ..BatchShared::new(raw_id, capacity)
        };
    }

    /// Adds `tasks` (all or none), counting them unfinished before any is posted; the index
    /// of the first.
    pub(crate) fn add_tasks<'a, I>(&self, tasks: I, notify: Option<PendingNotify>) -> Result<usize>
    where
        I: ExactSizeIterator<Item = &'a Arc<TaskShared>> + Clone,
    {
        let mut list = lock(&self.tasks);
        if self.freed.load(Ordering::Acquire) {
            return Err(Error::InvalidBatch {
                id: self.raw_id,
                reason: "stale",
            });
        }
        let requested = list.len() + tasks.len();
        if requested > self.capacity {
            return Err(Error::TooManyRequests {
                capacity: self.capacity,
                requested,
            });
        }
        // Writers hold the lock: a load and a store, published by the count below.
        let added = tasks.clone().fold(0u64, |n, t| n.saturating_add(t.len));
        let total = self.total_len.load(Ordering::Relaxed).saturating_add(added);
        self.total_len.store(total, Ordering::Relaxed);
        self.unfinished.fetch_add(tasks.len(), Ordering::AcqRel);
        if tasks.clone().any(|t| t.deadline.is_some()) {
            self.has_deadlines.store(true, Ordering::Release);
        }
        if notify.is_some() {
            *lock(&self.notify) = notify;
            self.has_notify.store(true, Ordering::Release);
        }
        if tasks.clone().any(|t| t.metered.is_some()) {
            self.all_counted.store(false, Ordering::Release);
        }
        let first = list.len();
        // Only a task that may be held again tells its place.
        for (slot, t) in (first..).zip(tasks.clone()).filter(|(_, t)| t.fail_over) {
            t.slot.store(slot, Ordering::Relaxed);
        }
        list.extend(tasks.cloned());
        Ok(first)
    }

    /// Bytes of the batch's tasks not yet moved.
    fn bytes_left(&self) -> u64 {
        lock(&self.tasks)
            .iter()
            .filter(|t| !t.state().is_terminal())
            .map(|t| t.len.saturating_sub(t.transferred.load(Ordering::Acquire)))
            .fold(0u64, u64::saturating_add)
    }

    fn task(&self, index: usize) -> Result<Arc<TaskShared>> {
        // A match, not `ok_or`: the error is built only when it is returned (this runs per call).
        match lock(&self.tasks).get(index) {
            Some(task) => Ok(task.clone()),
            None => Err(Error::InvalidTask {
                batch: self.raw_id,
                task: index,
            }),
        }
    }

    /// Stops tasks past their deadline (a held one ends TIMEOUT at once); the next deadline.
    fn expire_deadlines(&self, now: Instant) -> Option<Instant> {
        let mut earliest: Option<Instant> = None;
        let mut held = Vec::new();
        for t in lock(&self.tasks).iter() {
            if let Some(d) = t.deadline {
                if t.state().is_terminal() {
                    continue;
                }
                if d <= now {
                    t.request_stop(STOP_TIMEOUT);
                    if t.is_held() {
                        held.push(t.clone());
                    }
                } else {
                    earliest = Some(earliest.map_or(d, |e| e.min(d)));
                }
            }
        }
        for t in held {
            self.end_held_task(&t, TransferState::Timeout, (0, None));
        }
        earliest
    }

    /// The status of a batch whose tasks have all completed, read without its tasks' lock;
    /// `None` while a task runs or when one did not complete (then [`status`](Self::status)
    /// tells which way it ended).
    fn completed_status(&self) -> Option<TransferStatus> {
        // Seeing no task unfinished (the last finishing task's count, or none added yet)
        // makes every task's end and `total_len` visible.
        if self.unfinished.load(Ordering::Acquire) != 0 || self.any_failed.load(Ordering::Acquire) {
            return None;
        }
        Some(TransferStatus {
            state: TransferState::Completed,
            transferred_bytes: self.total_len.load(Ordering::Relaxed),
        })
    }

    fn status(&self) -> TransferStatus {
        let tasks = lock(&self.tasks);
        let mut transferred = 0;
        let mut all_terminal = true;
        let mut progressed = false;
        let mut worst = TransferState::Completed;
        for t in tasks.iter() {
            let s = t.status();
            transferred += s.transferred_bytes;
            match s.state {
                TransferState::Waiting => all_terminal = false,
                TransferState::Pending => {
                    all_terminal = false;
                    progressed = true;
                }
                TransferState::Completed => progressed = true,
                other => {
                    progressed = true;
                    worst = match (worst, other) {
                        (TransferState::Failed, _) | (_, TransferState::Failed) => {
                            TransferState::Failed
                        }
                        (TransferState::Timeout, _) | (_, TransferState::Timeout) => {
                            TransferState::Timeout
                        }
                        _ => TransferState::Canceled,
                    };
                }
            }
        }
        let state = match (all_terminal, progressed) {
            (true, _) => worst,
            (false, true) => TransferState::Pending,
            (false, false) => TransferState::Waiting,
        };
        TransferStatus {
            state,
            transferred_bytes: transferred,
        }
    }

    /// Ends `task` (its slices all reported, its pin released) in `state`: publishes it,
    /// counts it out of the batch, wakes waiters and tells the watcher. The notification to
    /// send when it finished the whole batch successfully.
    fn settle(&self, task: &TaskShared, state: TransferState, ran: bool) -> Option<PendingNotify> {
        if state != TransferState::Completed {
            self.any_failed.store(true, Ordering::Release);
        }
        // Publish the terminal state after the pin is released: a waiter that sees it may unregister.
        task.state.store(state as u8, Ordering::Release);
        let last = self.unfinished.fetch_sub(1, Ordering::AcqRel) == 1;
        let notify = if last
            && self.has_notify.load(Ordering::Acquire)
            && !self.any_failed.load(Ordering::Acquire)
        {
            lock(&self.notify).take()
        } else {
            None
        };
        // The task's end is published above; a waiter counts itself in `sleepers` before it
        // looks at the tasks. With a full fence on both sides, either the waiter sees this
        // task ended, or this sees the waiter (and wakes it, under the lock it holds until it
        // sleeps).
        std::sync::atomic::fence(Ordering::SeqCst);
        let wake = (last || self.task_waiters.load(Ordering::SeqCst) > 0)
            && self.sleepers.load(Ordering::SeqCst) > 0;
        if wake {
            drop(lock(&self.sleep_lock));
            self.finished_cv.notify_all();
        }
        if let Some(watcher) = self.watcher.get() {
            watcher.task_ended(BatchId(self.raw_id), ran);
        }
        notify
    }

    /// Stops every task; a held one ends CANCELED at once.
    fn cancel(&self) {
        let mut held = Vec::new();
        for t in lock(&self.tasks).iter() {
            t.request_stop(STOP_CANCEL);
            if t.is_held() {
                held.push(t.clone());
            }
        }
        // Outside the task lock: ending takes the waiters' lock.
        for t in held {
            self.end_held_task(&t, TransferState::Canceled, (0, None));
        }
    }
}

/// The further tasks of a merged slice, with their bytes of it.
struct Riders(Vec<(Arc<TaskShared>, u64)>);

/// The engine's handle on one posted slice; transports carry it and hand it back.
pub struct SliceToken {
    batch: Arc<BatchShared>,
    task: Arc<TaskShared>,
    /// A merged slice's further tasks and the bytes of the slice that are theirs (the first
    /// task's share is the rest of the slice); none for a slice of one task (boxed: a thin
    /// pointer keeps every slice small).
    riders: Option<Box<Riders>>,
    seq: u64,
    attempt: u32,
}

impl SliceToken {
    pub(crate) fn new(batch: Arc<BatchShared>, task: Arc<TaskShared>, seq: u64) -> Self {
        SliceToken {
            batch,
            task,
            riders: None,
            seq,
            attempt: 0,
        }
    }

    /// A slice of merged requests: its first `first_len` bytes are `task`'s, then each rider's
    /// bytes in order (see [`crate::merge`]). Each task counts this slice among its own.
    pub(crate) fn merged(
        batch: Arc<BatchShared>,
        task: Arc<TaskShared>,
        riders: Vec<(Arc<TaskShared>, u64)>,
        seq: u64,
    ) -> Self {
        SliceToken {
            batch,
            task,
            riders: (!riders.is_empty()).then(|| Box::new(Riders(riders))),
            seq,
            attempt: 0,
        }
    }

    /// How many tasks share this slice (more than one for merged requests).
    pub fn tasks(&self) -> usize {
        1 + self.riders().len()
    }

    fn riders(&self) -> &[(Arc<TaskShared>, u64)] {
        self.riders.as_ref().map_or(&[], |r| &r.0)
    }

    /// The slice's position in its task.
    pub fn seq(&self) -> u64 {
        self.seq
    }

    pub(crate) fn route(&self) -> Option<&crate::router::TaskRails> {
        self.task.route.as_ref()
    }

    /// The name of the transport the slice's task goes to.
    pub(crate) fn transport(&self) -> Option<&'static str> {
        self.task.transport
    }

    /// Whether the task was canceled or ran past its deadline.
    /// A merged slice counts as canceled only when every task it carries is: the others still
    /// want its bytes.
    pub fn is_canceled(&self) -> bool {
        self.task.stop.load(Ordering::Acquire) != RUN
            && self
                .riders()
                .iter()
                .all(|(t, _)| t.stop.load(Ordering::Acquire) != RUN)
    }

    /// Whether the thread posting this slice submitted it for a synchronous call and will wait
    /// for it at once (and this is the first try, posted from that thread): a transport may
    /// then carry a small slice out on the posting thread itself, sparing the hand-offs to its
    /// own threads and back.
    pub fn caller_waits(&self) -> bool {
        self.task.caller_waits && self.attempt == 0
    }

    /// How many times this slice was posted before (0 on the first try).
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    pub(crate) fn next_attempt(&mut self) {
        self.attempt += 1;
    }

    /// Records one slice's outcome, for each task it carries. Returns the notification to send
    /// if this slice finished the whole batch successfully.
    pub(crate) fn record(
        &self,
        len: u64,
        outcome: std::result::Result<(), SliceError>,
    ) -> Option<PendingNotify> {
        let error = match outcome {
            Ok(()) => return self.record_ok(len),
            Err(e) => e,
        };
        let riders = self.riders();
        if riders.is_empty() {
            return self.record_error(&self.task, error);
        }
        let mut notify = self.record_error(&self.task, error.clone());
        for (task, _) in riders {
            if let Some(n) = self.record_error(task, error.clone()) {
                notify = Some(n);
            }
        }
        notify
    }

    /// As [`record`](Self::record) for a slice that succeeded. No outcome value is passed: a
    /// copy made on this thread may have left its stores on their way to the cache, and
    /// reading a just-made value back from memory would wait for all of them (see
    /// [`CompletionSink::complete_ok`](crate::transport::CompletionSink::complete_ok)).
    #[inline]
    pub(crate) fn record_ok(&self, len: u64) -> Option<PendingNotify> {
        let riders = self.riders();
        if riders.is_empty() {
            self.task.transferred.fetch_add(len, Ordering::AcqRel);
            return self.count_out(&self.task);
        }
        let theirs: u64 = riders.iter().map(|(_, n)| n).sum();
        self.task
            .transferred
            .fetch_add(len.saturating_sub(theirs), Ordering::AcqRel);
        let mut notify = self.count_out(&self.task);
        for (task, n) in riders {
            task.transferred.fetch_add(*n, Ordering::AcqRel);
            if let Some(n) = self.count_out(task) {
                notify = Some(n);
            }
        }
        notify
    }

    /// Records a failed (or canceled) slice on `task`.
    fn record_error(&self, task: &TaskShared, error: SliceError) -> Option<PendingNotify> {
        match error {
            SliceError::Canceled => task.skipped.store(true, Ordering::Release),
            e => {
                lock(&task.error).get_or_insert(e);
                task.failed.store(true, Ordering::Release);
            }
        }
        self.count_out(task)
    }

    /// Counts one of `task`'s slices as done (its outcome recorded); the task ends with its
    /// last.
    #[inline]
    fn count_out(&self, task: &TaskShared) -> Option<PendingNotify> {
        let left = task.slices_left.fetch_sub(1, Ordering::AcqRel);
        debug_assert!(left != 0, "a slice of a task was reported twice");
        if left != 1 {
            // Some slices are done, not all. (A task's last slice goes straight to its end.)
            let _ = task.state.compare_exchange(
                TransferState::Waiting as u8,
                TransferState::Pending as u8,
                Ordering::AcqRel,
                Ordering::Acquire,
            );
            return None;
        }
        self.finish_task(task)
    }

    fn finish_task(&self, task: &TaskShared) -> Option<PendingNotify> {
        let state = if task.failed.load(Ordering::Acquire) {
            TransferState::Failed
        } else if task.skipped.load(Ordering::Acquire) {
            if task.stop.load(Ordering::Acquire) == STOP_TIMEOUT {
                TransferState::Timeout
            } else {
                TransferState::Canceled
            }
        } else {
            debug_assert_eq!(task.transferred.load(Ordering::Acquire), task.len);
            TransferState::Completed
        };
        debug_assert_eq!(
            task.slices_left.load(Ordering::Acquire),
            0,
            "a task ends with slices in flight"
        );
        let pin = lock(&task.pin).take();
        debug_assert!(pin.is_some(), "a task's pin released twice");
        drop(pin);
        // A task asked to stop (canceled, past its deadline) is not moved on.
        if state == TransferState::Failed
            && task.fail_over
            && task.stop.load(Ordering::Acquire) == RUN
        {
            self.batch.hold_again(task);
            return None;
        }
        self.batch.settle(task, state, true)
    }

    /// The task's opcode (for logs).
    pub fn opcode(&self) -> Opcode {
        self.task.opcode
    }
}

#[cfg(test)]
mod tests;
