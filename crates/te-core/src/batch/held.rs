//! Held tasks: places in a batch that a runtime fills later. A runtime that decides when and
//! where each task goes (te-tent: priorities, failover across transports, staging) adds its
//! tasks held, so that the batch counts, waits for, cancels, expires and announces them as it
//! does any other; it posts each held task as an attempt on the transport it picks, and an
//! attempt posted to fail over goes back to held when it fails, with its watcher told.
//!
//! A task's `hold` moves POSTED → HELD when its failing-over attempt fails; HELD → REPLACED (its
//! place filled by a new attempt), → CLAIMED (the runtime moves its bytes itself), or → GONE
//! (ended without an attempt); CLAIMED → GONE. Each move from HELD or CLAIMED is one
//! compare-exchange, so a post, a cancel, an expiry and a runtime's end never both win; a stop
//! asked while a task is being held again is seen by one side or both (both fence).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use super::{BatchId, BatchShared, PendingNotify, TaskShared, TransferState, lock};
use crate::error::{Error, Result};
use crate::memory::Opcode;
use crate::outcome::SliceError;

/// Posted (or never held).
pub(super) const POSTED: u8 = 0;
/// Waiting for an attempt.
pub(super) const HELD: u8 = 1;
/// Its bytes are moved by the runtime itself, which ends it.
pub(super) const CLAIMED: u8 = 2;
/// Ended without an attempt.
const GONE: u8 = 3;
/// Its place went to an attempt.
const REPLACED: u8 = 4;

/// A task added to a batch without being posted ([`TransferEngine::hold`]).
///
/// [`TransferEngine::hold`]: crate::TransferEngine::hold
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeldTask {
    /// Its direction.
    pub opcode: Opcode,
    /// Its bytes.
    pub length: u64,
    /// Held past this, it ends TIMEOUT.
    pub deadline: Option<Instant>,
    /// The transport its request is counted on if it ends held (canceled or expired while
    /// held, or moved by its runtime).
    pub transport: Option<&'static str>,
}

impl TaskShared {
    fn placeholder(task: &HeldTask, held: Option<Instant>) -> Self {
        let mut t = TaskShared::new(task.opcode, task.length, 0, task.deadline, None)
            .metered(held.map(super::Meter::placeholder));
        t.transport = task.transport;
        t.hold.store(HELD, Ordering::Relaxed);
        t
    }

    /// Whether it ended (or is) the attempt posted last in its place, not ended held.
    pub(super) fn ran_last(&self) -> bool {
        self.hold.load(Ordering::Acquire) == POSTED
    }

    /// Whether it waits for an attempt.
    pub(super) fn is_held(&self) -> bool {
        self.hold.load(Ordering::Acquire) == HELD
    }

    /// Whether it was ever held (its place may now be another attempt's).
    pub(super) fn was_held(&self) -> bool {
        self.hold.load(Ordering::Acquire) != POSTED
    }

    /// Moves it from HELD (or CLAIMED too, with `claimed`) to `to`; false when it was not.
    fn leave_hold(&self, claimed: bool, to: u8) -> bool {
        let moved = |from| {
            self.hold
                .compare_exchange(from, to, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        };
        moved(HELD) || (claimed && moved(CLAIMED))
    }
}

impl BatchShared {
    fn not_held(&self, task: usize) -> Error {
        Error::InvalidArgument(format!(
            "task {task} of batch {:#x} is not held (posted, claimed or ended)",
            self.raw_id
        ))
    }

    /// Adds `tasks` held at `held` (with metrics on), all or none; the index of the first.
    pub(crate) fn add_held(
        &self,
        tasks: &[HeldTask],
        notify: Option<PendingNotify>,
        held: Option<Instant>,
    ) -> Result<usize> {
        let placeholders: Vec<Arc<TaskShared>> = tasks
            .iter()
            .map(|t| Arc::new(TaskShared::placeholder(t, held)))
            .collect();
        self.add_tasks(placeholders.iter(), notify)
    }

    /// Puts attempts `tasks` in the places of held tasks `slots` (all or none): each place is
    /// held, and named once.
    pub(crate) fn fill_held<'a>(
        &self,
        slots: &[usize],
        tasks: impl ExactSizeIterator<Item = &'a Arc<TaskShared>>,
    ) -> Result<()> {
        debug_assert_eq!(slots.len(), tasks.len());
        let mut list = lock(&self.tasks);
        if self.freed.load(Ordering::Acquire) {
            return Err(Error::InvalidBatch {
                id: self.raw_id,
                reason: "stale",
            });
        }
        for (k, &slot) in slots.iter().enumerate() {
            let Some(held) = list.get(slot) else {
                self.restore(&list, &slots[..k]);
                return Err(Error::InvalidTask {
                    batch: self.raw_id,
                    task: slot,
                });
            };
            // A place named twice fails here the second time.
            if !held.leave_hold(false, REPLACED) {
                self.restore(&list, &slots[..k]);
                return Err(self.not_held(slot));
            }
        }
        for (&slot, task) in slots.iter().zip(tasks) {
            if let (Some(before), Some(now)) = (&list[slot].metered, &task.metered) {
                now.follow(before);
            }
            task.slot.store(slot, Ordering::Relaxed);
            if task.deadline.is_some() {
                self.has_deadlines.store(true, Ordering::Release);
            }
            if task.metered.is_some() {
                self.all_counted.store(false, Ordering::Release);
            }
            list[slot] = task.clone();
        }
        Ok(())
    }

    /// Holds `slots`' tasks again after a refused fill (under the task lock).
    fn restore(&self, list: &[Arc<TaskShared>], slots: &[usize]) {
        for &slot in slots {
            list[slot].hold.store(HELD, Ordering::Release);
        }
    }

    /// Marks held task `task` as moved by the runtime itself (it ends it with
    /// [`end_held`](Self::end_held)); a cancel or a deadline then only asks it to stop.
    pub(crate) fn claim_held(&self, task: usize) -> Result<()> {
        match self.task(task)?.leave_hold(false, CLAIMED) {
            true => Ok(()),
            false => Err(self.not_held(task)),
        }
    }

    /// Whether task `task` was asked to stop (canceled, or past its deadline).
    pub(crate) fn stop_asked(&self, task: usize) -> Result<bool> {
        Ok(self.task(task)?.stop.load(Ordering::Acquire) != super::RUN)
    }

    /// Ends held or claimed task `task` in `state` with `moved` bytes and `error`; the
    /// notification to send if it finished the batch successfully.
    pub(crate) fn end_held(
        &self,
        task: usize,
        state: TransferState,
        moved: u64,
        error: Option<SliceError>,
    ) -> Result<Option<PendingNotify>> {
        let t = self.task(task)?;
        self.end_held_task(&t, state, (moved, error))
            .ok_or_else(|| self.not_held(task))
    }

    /// Ends `task`, held or claimed, in terminal `state` with the bytes it moved and its
    /// error; `None` when it is neither (it was posted, or another end came first).
    pub(super) fn end_held_task(
        &self,
        task: &TaskShared,
        state: TransferState,
        (moved, error): (u64, Option<SliceError>),
    ) -> Option<Option<PendingNotify>> {
        debug_assert!(state.is_terminal());
        let claimed = task.hold.load(Ordering::Acquire) == CLAIMED;
        if !task.leave_hold(claimed, GONE) {
            return None;
        }
        task.transferred.store(moved, Ordering::Release);
        if let Some(e) = error {
            *lock(&task.error) = Some(e);
        }
        Some(self.settle(task, state, claimed))
    }

    /// Holds `task` again: its failing-over attempt failed (its slices all reported, its pin
    /// released). It stays unfinished; its attempt is counted now, waiters of the task look
    /// again, and the watcher is told.
    pub(super) fn hold_again(&self, task: &TaskShared) {
        if let Some(metrics) = self.metrics.get() {
            task.count_failed_attempt(metrics);
        }
        task.state
            .store(TransferState::Pending as u8, Ordering::Release);
        task.hold.store(HELD, Ordering::Release);
        std::sync::atomic::fence(Ordering::SeqCst);
        // A stop asked meanwhile (it may not have seen the task held) ends it as a stopped
        // attempt ends: FAILED, not moved on. A cancel that did see it ended it already.
        if task.stop.load(Ordering::Acquire) != super::RUN {
            if task.leave_hold(false, GONE) {
                // The notification is sent only by a batch that completed: not this one.
                let _ = self.settle(task, TransferState::Failed, true);
            }
            return;
        }
        if self.task_waiters.load(Ordering::SeqCst) > 0 && self.sleepers.load(Ordering::SeqCst) > 0
        {
            drop(lock(&self.sleep_lock));
            self.finished_cv.notify_all();
        }
        if let Some(watcher) = self.watcher.get() {
            watcher.task_held(BatchId(self.raw_id), task.slot.load(Ordering::Relaxed));
        }
    }
}
