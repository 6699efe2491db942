//! TENT as te-core's runtime [`Policy`]: the engine asks it to allocate and plan its batches
//! and tells it of registrations and frees, so that a submit through the one engine (the
//! facade's, the C API's, te-core's own) is planned by TENT.

use std::sync::Arc;

use te_core::memory::Region;
use te_core::{BatchId, Location, Policy, SubmitOptions, TransferRequest};
use tracing::warn;

use crate::TentError;
use crate::capability::MemoryKind;
use crate::engine::Inner;
use crate::request::{Request, TentBatchId};

impl Policy for Inner {
    fn registered(&self, regions: &[Arc<Region>]) -> te_core::Result<()> {
        let mut s = self.lock();
        for r in regions {
            let kind = match r.location() {
                Location::Cuda(_) => MemoryKind::Gpu,
                _ => MemoryKind::Dram,
            };
            s.memory.insert(r.addr(), (r.len(), kind));
        }
        drop(s);
        match published(regions) {
            true => self.refresh_own().map_err(into_core),
            false => Ok(()),
        }
    }

    fn unregistered(&self, regions: &[Arc<Region>]) {
        let mut s = self.lock();
        for r in regions {
            s.memory.remove(&r.addr());
        }
        drop(s);
        if published(regions)
            && let Err(e) = self.refresh_own()
        {
            warn!(error = %e, "own descriptor not re-read after unregistering");
        }
    }

    fn allocate(&self, capacity: usize) -> te_core::Result<BatchId> {
        let mut s = self.lock();
        let id = (self.core).allocate_watched_batch(capacity, Some(self.bell.clone()))?;
        let run = s.fresh_run(capacity);
        s.runs.insert(id.raw(), run);
        Ok(id)
    }

    /// Each request planned as a TENT request of medium priority, `options`' transport its
    /// hint and `options`' timeout its deadline.
    fn submit(
        &self,
        batch: BatchId,
        requests: &[TransferRequest],
        options: &SubmitOptions,
    ) -> te_core::Result<()> {
        let planned: Vec<Request> = requests
            .iter()
            .map(|r| {
                let mut req =
                    Request::new(r.opcode, r.source, r.target_id, r.target_offset, r.length);
                if let Some(within) = options.timeout {
                    req = req.deadline(within);
                }
                if let Some(hint) = &options.transport {
                    req = req.hint(hint);
                }
                req
            })
            .collect();
        let notify = (options.notify.clone())
            .zip(requests.first())
            .map(|(n, r)| (r.target_id, n));
        self.submit_requests(TentBatchId(batch.raw()), &planned, notify)
            .map_err(into_core)
    }

    fn freed(&self, batch: BatchId) {
        let mut s = self.lock();
        let Some(run) = s.runs.remove(&batch.raw()) else {
            return;
        };
        // Tasks te-core ended while they waited in the queue leave it with their batch.
        if s.dispatcher.waiting() > 0 {
            s.dispatcher.remove_where(|(b, _)| *b == batch.raw());
        }
        s.keep_spare(run);
    }
}

/// Whether any of `regions` is in the own descriptor (memory peers may reach): only then is
/// the descriptor read again (a staging buffer, local only, costs no look-up).
fn published(regions: &[Arc<Region>]) -> bool {
    regions
        .iter()
        .any(|r| r.permission() != te_core::Permission::LocalOnly)
}

/// te-tent's error as the engine's.
fn into_core(e: TentError) -> te_core::Error {
    use te_core::Error as E;
    match e {
        TentError::Engine(e) => e,
        TentError::NoTransport(why) => {
            E::NotSupportedTransport(format!("no transport for this request: {why}"))
        }
        TentError::InvalidBatch(id) => E::InvalidBatch {
            id,
            reason: "stale",
        },
        TentError::InvalidTask { batch, task } => E::InvalidTask { batch, task },
        TentError::TooManyRequests {
            capacity,
            requested,
            ..
        } => E::TooManyRequests {
            capacity,
            requested,
        },
        TentError::BatchBusy(id) => E::BatchBusy(id),
        e @ (TentError::Config(_) | TentError::Metrics(_) | TentError::InvalidArgument(_)) => {
            E::InvalidArgument(e.to_string())
        }
    }
}
