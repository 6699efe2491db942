//! [`Owned`]: an initialized engine shared by every thread of a binding, and the process it
//! belongs to. A child forked after initialization gets [`FacadeError::Forked`] instead of the
//! parent's engine (its threads and listeners did not come along), and closing it there
//! forgets the engine without shutting down what belongs to the parent.

use std::sync::{Arc, RwLock};

use crate::error::{FacadeError, Result};

/// An engine slot: empty before initialization and after closing.
pub(crate) struct Owned<T> {
    slot: RwLock<Option<(Arc<T>, u32)>>,
}

impl<T> Default for Owned<T> {
    fn default() -> Self {
        Owned {
            slot: RwLock::new(None),
        }
    }
}

impl<T> Owned<T> {
    /// Holds `live` for this process (replacing what was there).
    pub(crate) fn set(&self, live: Arc<T>) {
        *self.slot.write().unwrap_or_else(|e| e.into_inner()) = Some((live, te_sys::process_id()));
    }

    /// The engine.
    ///
    /// # Errors
    /// [`FacadeError::NotInitialized`]; [`FacadeError::Forked`] in a forked child.
    pub(crate) fn get(&self) -> Result<Arc<T>> {
        let (live, owner) = self
            .slot
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .ok_or(FacadeError::NotInitialized)?;
        let this = te_sys::process_id();
        match owner == this {
            true => Ok(live),
            false => Err(FacadeError::Forked { owner, this }),
        }
    }

    /// Empties the slot; the engine to shut down, unless this is a forked child (which leaks
    /// it on purpose: its listeners belong to the parent).
    pub(crate) fn take(&self) -> Option<Arc<T>> {
        let taken = self.slot.write().unwrap_or_else(|e| e.into_inner()).take();
        match taken {
            Some((live, owner)) if owner == te_sys::process_id() => Some(live),
            Some((live, _)) => {
                std::mem::forget(live);
                None
            }
            None => None,
        }
    }
}
