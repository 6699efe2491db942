//! Asynchronous batches behind a binding's handles (te's Python `Transfer`, beyond Mooncake's
//! ids): waiting with a time limit without freeing a batch that still runs, cancelling, and
//! letting go of a handle without waiting (the batch runs to its end and a later submission
//! frees it).
//!
//! Not here: Mooncake's own calls on ids (`check`, `wait_all`), which live with the engine.

use std::time::Duration;

use te_core::TransferState;

use crate::engine::MooncakeEngine;
use crate::error::{FacadeError, Result};

impl MooncakeEngine {
    /// Waits up to `timeout` for batch `id`: `true` when it completed (and is freed), `false`
    /// while it still runs (it is kept).
    ///
    /// # Errors
    /// An id this engine did not hand out or has freed; [`FacadeError::Transfer`] (with the
    /// first slice error) when the batch ended otherwise than COMPLETED, and is freed.
    pub fn wait_batch(&self, id: u64, timeout: Duration) -> Result<bool> {
        let live = self.live()?;
        let batch = live.known_batch(id)?;
        let status = live.runtime().wait(batch, timeout)?;
        if !status.state.is_terminal() {
            return Ok(false);
        }
        let detail = match status.state {
            TransferState::Completed => None,
            _ => live.first_error(batch),
        };
        let target = live.release(batch).unwrap_or_default();
        match status.state {
            TransferState::Completed => Ok(true),
            state => Err(FacadeError::Transfer {
                target,
                state,
                detail,
            }),
        }
    }

    /// Cancels batch `id`: no more of its slices start, those on the wire finish, and it ends
    /// CANCELED (or COMPLETED, when nothing was left). Wait for it to free it.
    ///
    /// # Errors
    /// An id this engine did not hand out or has freed.
    pub fn cancel_batch(&self, id: u64) -> Result<()> {
        let live = self.live()?;
        let batch = live.known_batch(id)?;
        live.runtime().cancel(batch)
    }

    /// Lets go of batch `id` without waiting: it runs to its end, and a later submission frees
    /// it. Unknown ids are ignored (the handle's owner may already have waited for it).
    pub fn abandon(&self, id: u64) {
        if let Ok(live) = self.live()
            && live.known_batch(id).is_ok()
        {
            live.abandon(id);
        }
    }
}

impl MooncakeEngine {
    /// Opens the peer `target` now (the handshake), so that the first transfer does not pay
    /// for it. A file segment's name (`file:…`) is refused: peers' names may come from anyone.
    ///
    /// # Errors
    /// An unknown or unreachable peer, or a file segment's name.
    pub fn connect(&self, target: &str) -> Result<()> {
        let live = self.live()?;
        live.open_peer(target).map(|_| ())
    }

    /// The oldest notification received, waiting up to `timeout` for one; `None` when none
    /// came.
    ///
    /// # Errors
    /// [`FacadeError::NotInitialized`].
    pub fn next_notify(&self, timeout: Duration) -> Result<Option<te_core::notify::Received>> {
        Ok(self.live()?.engine().next_notify(timeout))
    }
}
