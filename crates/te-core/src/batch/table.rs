//! The batch table of one engine: checked handles (tag, generation, slot), allocation and
//! reuse of freed batches, status, cancellation and waiting. What a batch and its tasks hold,
//! and how slices report into them, is in the parent module.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{
    BatchId, BatchShared, GENERATION_BITS, INDEX_BITS, STOP_CANCEL, TransferStatus, WAIT_SPIN,
    WAIT_SPIN_BYTES, lock,
};
use crate::error::{Error, Result};
use crate::outcome::SliceError;

/// Reused slot count kept before a freed slot is handed out again (spreads generations).
const REUSE_AFTER: usize = 1024;
/// Slots of one table: as many batches may be live at once.
const MAX_SLOTS: usize = 1 << INDEX_BITS;

struct Slot {
    generation: u16,
    batch: Option<Arc<BatchShared>>,
}

/// Freed batches kept for reuse (their allocation and task list), at most this many.
const SPARE_BATCHES: usize = 16;

#[derive(Default)]
struct Slots {
    slots: Vec<Slot>,
    /// Freed slot indices, oldest first.
    free: VecDeque<usize>,
    /// Freed batches nothing else refers to, emptied, ready to be handed out again.
    spare: Vec<Arc<BatchShared>>,
}

/// The batches of one engine.
pub(crate) struct BatchTable {
    clock: Arc<dyn crate::clock::Clock>,
    tag: u16,
    max_batch_size: usize,
    slots: Mutex<Slots>,
    /// Whether waits poll before they sleep.
    polls: super::spin::SpinGauge,
}

impl BatchTable {
    pub(crate) fn new(
        max_batch_size: usize,
        seed: u16,
        clock: Arc<dyn crate::clock::Clock>,
    ) -> Self {
        let tag = super::next_engine_tag(seed);
        BatchTable {
            clock,
            tag,
            max_batch_size,
            slots: Mutex::new(Slots::default()),
            polls: Default::default(),
        }
    }

    #[cfg(test)]
    pub(crate) fn allocate(&self, capacity: usize) -> Result<BatchId> {
        self.allocate_watched(capacity, None)
    }

    /// A batch whose task ends `watcher` (if any) is told of.
    pub(crate) fn allocate_watched(
        &self,
        capacity: usize,
        watcher: Option<Arc<dyn super::TaskWatcher>>,
    ) -> Result<BatchId> {
        if capacity == 0 || capacity > self.max_batch_size {
            return Err(Error::InvalidArgument(format!(
                "batch size {capacity} not in 1..={}",
                self.max_batch_size
            )));
        }
        let mut guard = lock(&self.slots);
        let Slots { slots, free, spare } = &mut *guard;
        let index = if free.len() > REUSE_AFTER || slots.len() >= MAX_SLOTS {
            free.pop_front().ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "{MAX_SLOTS} batches are live: free some before allocating more"
                ))
            })?
        } else {
            slots.push(Slot {
                generation: 0,
                batch: None,
            });
            slots.len() - 1
        };
        let slot = &mut slots[index];
        slot.generation = (slot.generation + 1) & ((1 << GENERATION_BITS) - 1);
        let id = BatchId::compose(self.tag, slot.generation, index).raw();
        let reused = spare.pop().and_then(|mut b| {
            Arc::get_mut(&mut b)?.renew(id, capacity);
            Some(b)
        });
        let batch = reused.unwrap_or_else(|| Arc::new(BatchShared::new(id, capacity)));
        if let Some(watcher) = watcher {
            batch.watch(watcher);
        }
        slot.batch = Some(batch);
        Ok(BatchId(id))
    }

    pub(crate) fn get(&self, id: BatchId) -> Result<Arc<BatchShared>> {
        let guard = lock(&self.slots);
        Ok(self.live_slot(&guard.slots, id)?.clone())
    }

    /// `look(batch)` under the table's lock, taking no handle on the batch (two atomic
    /// operations fewer than [`get`](Self::get)): for short looks only, as the lock is held.
    fn look<R>(&self, id: BatchId, look: impl FnOnce(&BatchShared) -> R) -> Result<R> {
        let guard = lock(&self.slots);
        Ok(look(self.live_slot(&guard.slots, id)?))
    }

    /// The batch `id` names among `slots`: an error for a foreign, stale or malformed handle.
    fn live_slot<'a>(&self, slots: &'a [Slot], id: BatchId) -> Result<&'a Arc<BatchShared>> {
        let invalid = |reason| Error::InvalidBatch {
            id: id.raw(),
            reason,
        };
        if id.tag() != self.tag {
            return Err(invalid("foreign (not allocated by this engine)"));
        }
        match slots.get(id.index()) {
            Some(Slot {
                generation,
                batch: Some(b),
            }) if *generation == id.generation() => Ok(b),
            Some(_) => Err(invalid("stale (already freed)")),
            None => Err(invalid("malformed")),
        }
    }

    /// Frees batch `id` once none of its tasks is in flight, in one hold of the table's lock.
    pub(crate) fn free(&self, id: BatchId) -> Result<()> {
        let mut guard = lock(&self.slots);
        let Slots { slots, free, spare } = &mut *guard;
        let batch = self.live_slot(slots, id)?;
        {
            let tasks = lock(&batch.tasks);
            // A finishing task publishes its end before it counts itself out of `unfinished`:
            // a caller that saw every task end (polling task status, as Mooncake's callers
            // do) may free the batch in between. Busy is a task that has not ended.
            if batch.unfinished.load(Ordering::Acquire) > 0
                && !tasks.iter().all(|t| t.state().is_terminal())
            {
                return Err(Error::BatchBusy(id.raw()));
            }
            batch.freed.store(true, Ordering::Release);
        }
        // Ends no one asked about are counted now, once every task has ended (counted before
        // the check, an end published between the two went uncounted). Nothing to do with
        // metrics off.
        batch.count_ended(None);
        // Found above under this hold of the lock: it is there.
        let Some(mut batch) = slots[id.index()].batch.take() else {
            return Ok(());
        };
        free.push_back(id.index());
        // Kept only when nothing else holds it (a finished slice's token, a waiter that has
        // not returned yet): then no one can see it change.
        if spare.len() < SPARE_BATCHES
            && Arc::get_mut(&mut batch).is_some_and(|b| b.empty_for_reuse())
        {
            spare.push(batch);
        }
        Ok(())
    }

    /// Expires the batch's passed deadlines, reading the clock only if it has any.
    fn expire(&self, batch: &BatchShared) {
        if batch.has_deadlines.load(Ordering::Acquire) {
            batch.expire_deadlines(self.clock.now());
        }
    }

    pub(crate) fn task_status(&self, id: BatchId, task: usize) -> Result<TransferStatus> {
        let batch = self.get(id)?;
        self.expire(&batch);
        let status = batch.task(task)?.status();
        if status.state.is_terminal() {
            batch.count_ended(Some(task));
        }
        Ok(status)
    }

    pub(crate) fn batch_status(&self, id: BatchId) -> Result<TransferStatus> {
        // Without deadlines (nearly always) the status is read in one look.
        let quick = self.look(id, |b| {
            (!b.has_deadlines.load(Ordering::Acquire)).then(|| {
                let status = b.completed_status().unwrap_or_else(|| b.status());
                // The batch's ends are seen: counted (nothing to do with metrics off).
                if status.state.is_terminal() {
                    b.count_ended(None);
                }
                status
            })
        })?;
        if let Some(status) = quick {
            return Ok(status);
        }
        let batch = self.get(id)?;
        self.expire(&batch);
        let status = batch.status();
        if status.state.is_terminal() {
            batch.count_ended(None);
        }
        Ok(status)
    }

    pub(crate) fn cancel(&self, id: BatchId) -> Result<()> {
        self.get(id)?.cancel();
        Ok(())
    }

    pub(crate) fn cancel_task(&self, id: BatchId, task: usize) -> Result<()> {
        let batch = self.get(id)?;
        let t = batch.task(task)?;
        t.request_stop(STOP_CANCEL);
        // A held task has nothing in flight: it ends now (unless a post just took its place).
        if t.is_held() {
            batch.end_held_task(&t, super::TransferState::Canceled, (0, None));
        }
        Ok(())
    }

    /// Blocks until every task of the batch is terminal, or `timeout` passes.
    pub(crate) fn wait(&self, id: BatchId, timeout: Duration) -> Result<TransferStatus> {
        // A batch already completed (a copy made on the submitting thread, a poll that came
        // late) is answered in one look; any other is waited for below.
        let done = self.look(id, |b| {
            let status = b.completed_status();
            if status.is_some() {
                b.count_ended(None);
            }
            status
        })?;
        if let Some(status) = done {
            return Ok(status);
        }
        let batch = self.get(id)?;
        self.wait_until(&batch, timeout, || {
            batch.unfinished.load(Ordering::Acquire) == 0
        })?;
        batch.count_ended(None);
        Ok(batch.status())
    }

    /// Blocks until task `task` is terminal, or `timeout` passes.
    pub(crate) fn wait_task(
        &self,
        id: BatchId,
        task: usize,
        timeout: Duration,
    ) -> Result<TransferStatus> {
        let batch = self.get(id)?;
        let t = batch.task(task)?;
        // A task held again (its attempt failed over) ends in the attempt that takes its
        // place: then its place is looked at again.
        let ended = || {
            t.state().is_terminal()
                || t.was_held() && batch.task(task).is_ok_and(|now| now.state().is_terminal())
        };
        batch.task_waiters.fetch_add(1, Ordering::SeqCst);
        let waited = self.wait_until(&batch, timeout, ended);
        batch.task_waiters.fetch_sub(1, Ordering::SeqCst);
        waited?;
        batch.count_ended(Some(task));
        Ok(batch.task(task)?.status())
    }

    /// Sleeps on the batch's condition variable (woken whenever one of its tasks finishes, and
    /// at task deadlines) until `done()` holds or `timeout` passes. A short poll comes first
    /// ([`WAIT_SPIN`]) when little is left to move ([`WAIT_SPIN_BYTES`]) and this engine's
    /// recent polls paid ([`SpinGauge`](super::spin::SpinGauge)): a small transfer on a memory
    /// transport finishes within it, and a sleep and wake-up would cost more than the
    /// transfer.
    fn wait_until(
        &self,
        batch: &BatchShared,
        timeout: Duration,
        done: impl Fn() -> bool,
    ) -> Result<()> {
        // A batch already done costs no clock read (one costs more than the check in a VM).
        if done() {
            return Ok(());
        }
        let start = Instant::now();
        let end = start + timeout;
        if batch.bytes_left() <= WAIT_SPIN_BYTES && self.polls.should_poll() {
            let spin_end = start + WAIT_SPIN.min(timeout);
            // The clock is read every 32 polls: in a VM a clock read costs more than a poll.
            for polls in 0u32.. {
                if done() {
                    self.polls.record(true);
                    return Ok(());
                }
                if polls % 32 == 31 && Instant::now() >= spin_end {
                    self.polls.record(false);
                    break;
                }
                std::hint::spin_loop();
            }
        }
        loop {
            let now = Instant::now();
            // Deadlines are on the engine's clock; the sleep is in real time.
            let clock_now = self.clock.now();
            let wake = batch.expire_deadlines(clock_now).map_or(end, |d| {
                end.min(now + d.saturating_duration_since(clock_now))
            });
            let held = lock(&batch.sleep_lock);
            // Counted before the look at the tasks, fenced as a finishing task is (see
            // `finish_task`): no lost wake-up.
            batch.sleepers.fetch_add(1, Ordering::SeqCst);
            std::sync::atomic::fence(Ordering::SeqCst);
            let outcome = match (done(), now >= end) {
                (true, _) => Some(Ok(())),
                (false, true) => Some(Err(Error::WaitTimeout(timeout))),
                (false, false) => None,
            };
            if let Some(outcome) = outcome {
                batch.sleepers.fetch_sub(1, Ordering::SeqCst);
                return outcome;
            }
            let (held, _) = batch
                .finished_cv
                .wait_timeout(held, wake.saturating_duration_since(now))
                .unwrap_or_else(|e| e.into_inner());
            batch.sleepers.fetch_sub(1, Ordering::SeqCst);
            drop(held);
        }
    }

    /// The first slice error of a failed task, for diagnostics.
    pub(crate) fn task_error(&self, id: BatchId, task: usize) -> Result<Option<SliceError>> {
        let t = self.get(id)?.task(task)?;
        Ok(lock(&t.error).clone())
    }
}
