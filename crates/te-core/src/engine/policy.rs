//! [`Policy`]: a runtime that plans the engine's work (te-tent's TENT), installed into the
//! engine, so that every door (Rust, Python, C) reaches it through the one engine.

use std::sync::{Arc, Weak};

use super::{SubmitOptions, TransferEngine, TransferRequest};
use crate::batch::BatchId;
use crate::error::Result;
use crate::memory::Region;

/// What the engine a policy is installed in tells and asks it
/// ([`TransferEngine::install_policy`]). Called on the caller's thread with no lock of the
/// engine held.
pub trait Policy: Send + Sync {
    /// `regions` were just registered; an error undoes the registration and is the caller's.
    ///
    /// # Errors
    /// Whatever the policy refuses.
    fn registered(&self, regions: &[Arc<Region>]) -> Result<()>;

    /// `regions` were just unregistered.
    fn unregistered(&self, regions: &[Arc<Region>]);

    /// A batch of up to `capacity` tasks, allocated by the policy
    /// ([`TransferEngine::allocate_watched_batch`]).
    ///
    /// # Errors
    /// As [`TransferEngine::allocate_batch`].
    fn allocate(&self, capacity: usize) -> Result<BatchId>;

    /// Plans `requests` as new tasks of `batch` and posts them ([`SubmitOptions::planned`]),
    /// with `options` (a transport, a timeout, the batch's notification).
    ///
    /// # Errors
    /// As [`TransferEngine::submit_with`], and the policy's refusals.
    fn submit(
        &self,
        batch: BatchId,
        requests: &[TransferRequest],
        options: &SubmitOptions,
    ) -> Result<()>;

    /// `batch` was just freed.
    fn freed(&self, batch: BatchId);
}

impl TransferEngine {
    /// Installs `policy`: from now on, registrations and frees are told to it, and batches are
    /// allocated and submits planned by it. The engine keeps it weakly (its owner, which holds
    /// the engine, keeps it alive); once it is gone the engine plans as if none was installed.
    ///
    /// # Errors
    /// [`crate::Error::InvalidArgument`] when a policy is installed already.
    pub fn install_policy(&self, policy: Weak<dyn Policy>) -> Result<()> {
        self.policy.set(policy).map_err(|_| {
            crate::Error::InvalidArgument("this engine has a runtime policy already".into())
        })
    }

    /// The installed policy, while it lives.
    pub(super) fn policy(&self) -> Option<Arc<dyn Policy>> {
        self.policy.get().and_then(Weak::upgrade)
    }
}
