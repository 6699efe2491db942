//! What a runtime over the engine (te-tent) uses to decide itself when and where each task of
//! a batch goes: tasks added held, attempts posted in their places, tasks it moves itself
//! (claimed) and ends. The batch stays the engine's: status, waits, cancels, deadlines and its
//! notification work on held tasks as on any other (see [`crate::batch`]'s held tasks).

use super::submit::Place;
use super::{SubmitOptions, TransferEngine, TransferRequest};
use crate::batch::{BatchId, HeldTask, PendingNotify, TransferStatus};
use crate::error::{Error, Result};
use crate::notify::Notification;
use crate::outcome::SliceError;
use crate::segment::SegmentId;

impl TransferEngine {
    /// Adds `tasks` to `batch` held, all or none: counted, waited for, canceled and expired as
    /// any task, but posted only by [`post_held`](Self::post_held). With `notify`, the
    /// notification goes to its segment once every task of the batch completed. The index of
    /// the first.
    ///
    /// # Errors
    /// [`Error::InvalidBatch`], [`Error::TooManyRequests`], [`Error::UnknownSegment`] (the
    /// notification's target).
    pub fn hold(
        &self,
        batch: BatchId,
        tasks: &[HeldTask],
        notify: Option<(SegmentId, Notification)>,
    ) -> Result<usize> {
        let notify = match notify {
            Some((target, notification)) => Some(PendingNotify {
                target: self.segment(target)?,
                notification,
            }),
            None => None,
        };
        let batch = self.batches.get(batch)?;
        // With metrics on, each is a request from now.
        let held = self.core.metering().then(|| {
            batch.count_into(&self.core.metrics);
            std::time::Instant::now()
        });
        batch.add_held(tasks, notify, held)
    }

    /// Posts `requests[i]` as an attempt in the place of held task `slots[i]`, validated as
    /// [`submit_with`](Self::submit_with) validates (all or none): nothing changes unless every
    /// request is valid and every place is held. With [`SubmitOptions::fail_over`], a failed
    /// attempt holds its task again.
    ///
    /// # Errors
    /// As [`submit_with`](Self::submit_with); [`Error::InvalidArgument`] for lists of unequal
    /// length or a place not held (posted, claimed, ended, or named twice).
    pub fn post_held(
        &self,
        batch: BatchId,
        slots: &[usize],
        requests: &[TransferRequest],
        options: &SubmitOptions,
    ) -> Result<()> {
        if slots.len() != requests.len() {
            return Err(Error::InvalidArgument(format!(
                "{} places for {} requests",
                slots.len(),
                requests.len()
            )));
        }
        self.submit_inner(batch, requests, Place::Held(slots), options)
    }

    /// Takes held task `task` to move its bytes outside the engine (te-tent's staging): a
    /// cancel or a deadline only asks it to stop ([`stop_asked`](Self::stop_asked)), and it
    /// ends with [`end_held`](Self::end_held).
    ///
    /// # Errors
    /// [`Error::InvalidBatch`], [`Error::InvalidTask`]; [`Error::InvalidArgument`] when it is
    /// not held.
    pub fn claim_held(&self, batch: BatchId, task: usize) -> Result<()> {
        self.batches.get(batch)?.claim_held(task)
    }

    /// Whether task `task` was asked to stop (canceled, or past its deadline).
    ///
    /// # Errors
    /// [`Error::InvalidBatch`], [`Error::InvalidTask`].
    pub fn stop_asked(&self, batch: BatchId, task: usize) -> Result<bool> {
        self.batches.get(batch)?.stop_asked(task)
    }

    /// Ends held or claimed task `task` with `status` (terminal) and, when it failed, `error`.
    /// A batch it finishes successfully sends its notification.
    ///
    /// # Errors
    /// [`Error::InvalidBatch`], [`Error::InvalidTask`]; [`Error::InvalidArgument`] for a state
    /// that is not terminal or a task neither held nor claimed.
    pub fn end_held(
        &self,
        batch: BatchId,
        task: usize,
        status: TransferStatus,
        error: Option<SliceError>,
    ) -> Result<()> {
        if !status.state.is_terminal() {
            return Err(Error::InvalidArgument(format!(
                "a held task ends in a terminal state, not {:?}",
                status.state
            )));
        }
        let batch = self.batches.get(batch)?;
        let notify = batch.end_held(task, status.state, status.transferred_bytes, error)?;
        self.core.recorded(notify);
        Ok(())
    }
}
