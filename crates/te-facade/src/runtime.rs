//! [`Runtime`]: what a [`MooncakeEngine`](crate::MooncakeEngine) runs on. te's classic engine,
//! or te's TENT runtime over one (Mooncake's `MC_USE_TENT`, `te.Engine(backend="tent")`), which
//! picks a transport per request by capability and policy and fails over between them.
//! Both are te's one engine: under TENT, TENT's runtime is installed in it as its policy, and
//! the engine hands it registrations, batches and submits.
//!
//! Not here: Mooncake's conventions (ids handed out, sessions by name, return codes).

use std::sync::Arc;
use std::time::Duration;

use te_core::{
    BatchId, HostBuffer, Notification, Permission, SubmitOptions, TransferEngine, TransferRequest,
    TransferStatus,
};
#[cfg(feature = "tent")]
use te_tent::TentEngine;

use crate::error::Result;
use te_catalog::Protocol;

/// Which runtime an engine runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RuntimeKind {
    /// te's classic engine: the transports installed, routed by the topology.
    Classic,
    /// te's TENT runtime (`MC_TENT_CONF`): a transport chosen per request.
    Tent,
}

impl RuntimeKind {
    /// Mooncake's rule: TENT when `MC_USE_TENT` or `MC_USE_TEV1` is set (to any value, even
    /// empty or `0`, as Mooncake reads them), the classic engine otherwise.
    pub fn from_env() -> Self {
        Self::from_lookup(|name| te_sys::env::process(name).is_some())
    }

    /// As [`from_env`](Self::from_env), with `is_set` telling which variables are set.
    pub fn from_lookup(is_set: impl Fn(&str) -> bool) -> Self {
        match is_set(crate::settings::USE_TENT.name) || is_set(crate::settings::USE_TEV1.name) {
            true => RuntimeKind::Tent,
            false => RuntimeKind::Classic,
        }
    }
}

/// A running engine: te's one engine, with TENT's runtime installed in it as its policy
/// (`te_core::Policy`) when TENT runs. Every call goes to the engine; registrations, batches
/// and submits reach TENT through it.
pub(crate) struct Runtime {
    core: Arc<TransferEngine>,
    /// TENT's runtime, kept alive here (the engine holds it weakly); dropped after `core`'s
    /// handle, it stops its progress thread and shuts the engine down.
    #[cfg(feature = "tent")]
    tent: Option<TentEngine>,
}

/// How one submission runs.
#[derive(Debug, Default)]
pub(crate) struct Submission {
    /// Sent to the first request's target once every task of the batch completed.
    pub(crate) notify: Option<Notification>,
    /// Tasks not done this long after submission end TIMEOUT.
    pub(crate) within: Option<Duration>,
    /// The submitting thread waits for the batch at once (a synchronous call).
    pub(crate) waited: bool,
    /// The transport asked for (a `transport_hint`).
    pub(crate) hint: Option<Protocol>,
}

impl Runtime {
    /// te's classic engine: the installed transports, routed by the topology.
    pub(crate) fn classic(engine: TransferEngine) -> Self {
        Runtime {
            core: Arc::new(engine),
            #[cfg(feature = "tent")]
            tent: None,
        }
    }

    /// The engine TENT's runtime is installed in.
    #[cfg(feature = "tent")]
    pub(crate) fn tent(tent: TentEngine) -> Self {
        Runtime {
            core: tent.engine(),
            tent: Some(tent),
        }
    }

    /// TENT's runtime, when it runs.
    #[cfg(feature = "tent")]
    pub(crate) fn tent_runtime(&self) -> Option<&TentEngine> {
        self.tent.as_ref()
    }

    /// The engine.
    pub(crate) fn core(&self) -> &TransferEngine {
        &self.core
    }

    pub(crate) fn kind(&self) -> RuntimeKind {
        #[cfg(feature = "tent")]
        if self.tent.is_some() {
            return RuntimeKind::Tent;
        }
        RuntimeKind::Classic
    }

    /// Registers raw ranges, all or none.
    ///
    /// # Safety
    /// Every range is memory of this process that stays allocated until it is unregistered.
    #[allow(unsafe_code)]
    pub(crate) unsafe fn register(
        &self,
        ranges: &[(*mut u8, usize)],
        location: &str,
        permission: Permission,
    ) -> Result<()> {
        // SAFETY: forwarded from this function's contract.
        unsafe {
            Ok(self
                .core
                .register_memory_batch(ranges, location, permission)?)
        }
    }

    /// Registers a buffer the facade allocated.
    pub(crate) fn register_buffer(&self, buffer: &Arc<HostBuffer>) -> Result<()> {
        let permission = Permission::RemoteReadWrite;
        Ok(self.core.register_buffer(buffer, "*", permission)?)
    }

    /// Unregisters the regions at `addrs`, all or none (te-core's error, for retrying while a
    /// region is busy).
    pub(crate) fn unregister(&self, addrs: &[u64]) -> te_core::Result<()> {
        self.core.unregister_memory_batch(addrs)
    }

    /// Whether transport `name` (te's name) is installed.
    pub(crate) fn has_transport(&self, name: &str) -> bool {
        self.core
            .transport_capabilities()
            .iter()
            .any(|(n, _)| *n == name)
    }

    /// A new batch of up to `capacity` tasks: its raw id (non-zero, below 2^48).
    pub(crate) fn allocate(&self, capacity: usize) -> Result<u64> {
        Ok(self.core.allocate_batch(capacity)?.raw())
    }

    /// Adds `requests` to batch `id`.
    pub(crate) fn submit(
        &self,
        id: u64,
        requests: &[TransferRequest],
        how: Submission,
    ) -> Result<()> {
        let mut options = SubmitOptions::default();
        if let Some(within) = how.within {
            options = options.within(within);
        }
        if how.waited {
            options = options.waited();
        }
        if let Some(hint) = how.hint {
            options = options.via(hint.transport());
        }
        if let Some(n) = how.notify {
            options = options.notifying(n);
        }
        Ok(self
            .core
            .submit_with(BatchId::from_raw(id), requests, &options)?)
    }

    /// Batch `id`'s status, without waiting.
    pub(crate) fn status(&self, id: u64) -> Result<TransferStatus> {
        Ok(self.core.batch_status(BatchId::from_raw(id))?)
    }

    /// Task `task` of batch `id`.
    pub(crate) fn task_status(&self, id: u64, task: usize) -> Result<TransferStatus> {
        Ok(self.core.task_status(BatchId::from_raw(id), task)?)
    }

    /// Waits up to `timeout` (sleeping) for every task of batch `id` to end: the batch's
    /// status, terminal unless the time ran out first. Under TENT, its progress thread posts
    /// queued tasks and moves failed attempts on meanwhile.
    pub(crate) fn wait(&self, id: u64, timeout: Duration) -> Result<TransferStatus> {
        let batch = BatchId::from_raw(id);
        match self.core.wait(batch, timeout) {
            Err(te_core::Error::WaitTimeout(_)) => Ok(self.core.batch_status(batch)?),
            other => Ok(other?),
        }
    }

    /// Cancels every task of batch `id` (under TENT, queued ones end at once).
    pub(crate) fn cancel(&self, id: u64) -> Result<()> {
        Ok(self.core.cancel(BatchId::from_raw(id))?)
    }

    /// The first error a task of batch `id` ended with, if any.
    pub(crate) fn first_error(&self, id: u64) -> Option<String> {
        (0..)
            .map_while(|task| self.core.task_error(BatchId::from_raw(id), task).ok())
            .flatten()
            .map(|e| e.to_string())
            .next()
    }

    /// Frees batch `id`.
    pub(crate) fn free(&self, id: u64) -> Result<()> {
        Ok(self.core.free_batch(BatchId::from_raw(id))?)
    }

    /// Stops the engine (listeners closed, ports released); idempotent.
    pub(crate) fn shutdown(&self) {
        self.core.shutdown();
    }
}

#[cfg(test)]
mod tests {
    use super::RuntimeKind;

    #[test]
    fn mooncakes_variables_choose_tent_whatever_their_value() {
        let with = |set: &'static [&'static str]| RuntimeKind::from_lookup(|n| set.contains(&n));
        assert_eq!(with(&[]), RuntimeKind::Classic);
        assert_eq!(with(&["MC_USE_TENT"]), RuntimeKind::Tent);
        assert_eq!(with(&["MC_USE_TEV1"]), RuntimeKind::Tent);
        assert_eq!(with(&["MC_TENT_CONF"]), RuntimeKind::Classic);
    }
}
