//! [`TentSession`]: the same calls as [`MooncakeEngine`](crate::MooncakeEngine)'s
//! [`Backend`] side, over te-tent's runtime (`te.Engine(backend="tent")`): transports chosen
//! per request by capability and policy (`MC_TENT_CONF`), failover between them, priorities.
//! Peers are named and cached as in the classic facade; asynchronous transfers are ids; a
//! synchronous call that outlives `MC_TRANSFER_TIMEOUT` is cancelled.
//!
//! Not here: Mooncake's integer conventions (`te.mooncake` runs on the classic engine).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use te_core::{Notification, Opcode, Permission, SegmentId, TransferState};
use te_tent::{Request, TentBatchId, TentConfig, TentEngine};

use crate::backend::{Backend, Lists};
use crate::engine::{budget, transfer_timeout, until_unpinned};
use crate::error::{FacadeError, Result};
use crate::owned::Owned;

/// A TENT engine with the facade's names, ids and time limits.
#[derive(Default)]
pub struct TentSession {
    live: Owned<TentLive>,
}

struct TentLive {
    tent: TentEngine,
    /// Segments opened by name.
    peers: Mutex<HashMap<String, SegmentId>>,
    /// Asynchronous batches handed out: their target and task count.
    batches: Mutex<HashMap<u64, (String, usize)>>,
    /// Batches whose handles were let go before they finished.
    abandoned: Mutex<Vec<u64>>,
    timeout: Duration,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl TentSession {
    /// Starts a TENT engine: `MC_TENT_CONF` and the `MC_*` variables configure it, then
    /// `metadata` and `local_hostname` name it as the classic `initialize` does. `protocol`
    /// `rdma` enables TENT's RDMA transport (on `devices`, comma-separated) besides the others.
    ///
    /// # Errors
    /// A bad configuration, metadata string or name; a transport that cannot install.
    pub fn start(
        local_hostname: &str,
        metadata: &str,
        protocol: &str,
        devices: &str,
    ) -> Result<Self> {
        let mut config = TentConfig::from_env()?;
        config.metadata_conn = metadata.to_string();
        config.local_segment_name = match te_core::metadata::MetadataKind::parse(metadata)? {
            te_core::metadata::MetadataKind::P2p => crate::session::p2p_host(local_hostname)?,
            _ => local_hostname.trim().to_string(),
        };
        if protocol.eq_ignore_ascii_case("rdma") {
            let rdma = config.transports.entry("rdma".into()).or_default();
            rdma.enable = Some(true);
            if let Some(named) = crate::engine::device_list(devices) {
                rdma.devices = Some(named);
            }
        }
        let tent = TentEngine::new(config)?;
        let live = TentLive {
            tent,
            peers: Mutex::new(HashMap::new()),
            batches: Mutex::new(HashMap::new()),
            abandoned: Mutex::new(Vec::new()),
            timeout: transfer_timeout(),
        };
        let session = TentSession::default();
        session.live.set(Arc::new(live));
        Ok(session)
    }

    fn live(&self) -> Result<Arc<TentLive>> {
        self.live.get()
    }
}

impl TentLive {
    /// The target and task count of outstanding batch `id`.
    fn known(&self, id: u64) -> Result<(String, usize)> {
        lock(&self.batches).get(&id).cloned().ok_or_else(|| {
            FacadeError::from(te_core::Error::InvalidBatch {
                id,
                reason: "not an outstanding transfer of this engine",
            })
        })
    }

    fn peer(&self, target: &str) -> Result<SegmentId> {
        if let Some(id) = lock(&self.peers).get(target) {
            return Ok(*id);
        }
        let id = self.tent.open_segment(target)?;
        lock(&self.peers).insert(target.to_string(), id);
        Ok(id)
    }

    /// Forgets `target` after a failure: the next call fetches its descriptor again.
    fn forget(&self, target: &str) {
        if let Some(id) = lock(&self.peers).remove(target) {
            let _ = self.tent.close_segment(id);
        }
    }

    /// One call's requests, each with the call's deadline.
    fn requests(
        &self,
        target: &str,
        opcode: Opcode,
        lists: Lists<'_>,
        deadline: Duration,
    ) -> Result<Vec<Request>> {
        let (sources, targets, lengths) = lists;
        let seg = self.peer(target)?;
        let reqs = crate::engine::requests(seg, opcode, sources, targets, lengths)?;
        Ok(reqs
            .into_iter()
            .map(|r| {
                Request::new(r.opcode, r.source, r.target_id, r.target_offset, r.length)
                    .deadline(deadline)
            })
            .collect())
    }

    fn submit(
        &self,
        target: &str,
        opcode: Opcode,
        lists: Lists<'_>,
        notify: Option<Notification>,
    ) -> Result<(TentBatchId, usize, Duration)> {
        let budget = budget(self.timeout, lists.2);
        let reqs = self.requests(target, opcode, lists, budget)?;
        let batch = self.tent.allocate_batch(reqs.len())?;
        let submitted = match notify {
            Some(n) => self.tent.submit_with_notification(batch, &reqs, n),
            None => self.tent.submit(batch, &reqs),
        };
        if let Err(e) = submitted {
            let _ = self.tent.free_batch(batch);
            self.forget(target);
            return Err(e.into());
        }
        Ok((batch, reqs.len(), budget))
    }

    /// The first error a task of `batch` met.
    fn first_error(&self, batch: TentBatchId, tasks: usize) -> Option<String> {
        (0..tasks).find_map(|t| {
            self.tent
                .task_errors(batch, t)
                .ok()
                .and_then(|e| e.into_iter().next())
        })
    }

    /// Cancels every task of `batch`.
    fn cancel(&self, batch: TentBatchId, tasks: usize) -> Result<()> {
        for t in 0..tasks {
            self.tent.cancel_task(batch, t)?;
        }
        Ok(())
    }

    /// Frees a finished batch, answering how it ended.
    fn settle(
        &self,
        batch: TentBatchId,
        tasks: usize,
        target: &str,
        state: TransferState,
    ) -> Result<()> {
        let detail = match state {
            TransferState::Completed => None,
            _ => self.first_error(batch, tasks),
        };
        if let Err(e) = self.tent.free_batch(batch) {
            tracing::warn!(error = %e, "freeing a finished TENT batch");
        }
        match state {
            TransferState::Completed => Ok(()),
            state => {
                self.forget(target);
                Err(FacadeError::Transfer {
                    target: target.to_string(),
                    state,
                    detail,
                })
            }
        }
    }

    fn sweep_abandoned(&self) {
        let mut abandoned = lock(&self.abandoned);
        abandoned.retain(|&id| {
            if !lock(&self.batches).contains_key(&id) {
                return false;
            }
            let batch = TentBatchId(id);
            match self.tent.batch_status(batch) {
                Ok(s) if !s.state.is_terminal() => true,
                _ => {
                    lock(&self.batches).remove(&id);
                    let _ = self.tent.free_batch(batch);
                    false
                }
            }
        });
    }
}

impl Drop for TentSession {
    fn drop(&mut self) {
        Backend::close(self);
    }
}

impl Backend for TentSession {
    fn name(&self) -> Result<String> {
        Ok(self.live()?.tent.segment_name().to_string())
    }

    #[allow(unsafe_code)]
    unsafe fn register(
        &self,
        addr: u64,
        len: u64,
        location: &str,
        permission: Permission,
    ) -> Result<()> {
        let live = self.live()?;
        let size = usize::try_from(len).map_err(|_| {
            te_core::Error::InvalidArgument(format!("length {len} does not fit memory"))
        })?;
        // SAFETY: forwarded from this function's contract (memory of this process, kept
        // allocated until unregistered).
        unsafe {
            live.tent.core().register_memory_batch(
                &[(addr as usize as *mut u8, size)],
                location,
                permission,
            )?;
        }
        if let Err(e) = live.tent.track_memory(addr, len, location) {
            let _ = live.tent.core().unregister_memory(addr);
            return Err(e.into());
        }
        Ok(())
    }

    fn unregister(&self, addr: u64) -> Result<()> {
        let live = self.live()?;
        until_unpinned(|| match live.tent.unregister_memory(addr) {
            Ok(()) => Ok(()),
            Err(te_tent::TentError::Engine(e)) => Err(e),
            Err(other) => Err(te_core::Error::InvalidArgument(other.to_string())),
        })
    }

    fn connect(&self, target: &str) -> Result<()> {
        self.live()?.peer(target).map(|_| ())
    }

    fn transfer(
        &self,
        target: &str,
        opcode: Opcode,
        lists: Lists<'_>,
        notify: Option<Notification>,
    ) -> Result<()> {
        let live = self.live()?;
        let (batch, tasks, budget) = live.submit(target, opcode, lists, notify)?;
        let mut status = live.tent.wait(batch, budget)?;
        if !status.state.is_terminal() {
            live.cancel(batch, tasks)?;
            status = live.tent.wait(batch, budget)?;
        }
        let state = match status.state {
            s if s.is_terminal() => s,
            _ => TransferState::Timeout,
        };
        live.settle(batch, tasks, target, state)
    }

    fn submit(
        &self,
        target: &str,
        opcode: Opcode,
        lists: Lists<'_>,
        notify: Option<Notification>,
    ) -> Result<u64> {
        let live = self.live()?;
        live.sweep_abandoned();
        let (batch, tasks, _) = live.submit(target, opcode, lists, notify)?;
        lock(&live.batches).insert(batch.0, (target.to_string(), tasks));
        Ok(batch.0)
    }

    fn wait(&self, id: u64, timeout: Duration) -> Result<bool> {
        let live = self.live()?;
        let (target, tasks) = live.known(id)?;
        let batch = TentBatchId(id);
        let status = live.tent.wait(batch, timeout)?;
        if !status.state.is_terminal() {
            return Ok(false);
        }
        lock(&live.batches).remove(&id);
        live.settle(batch, tasks, &target, status.state)
            .map(|()| true)
    }

    fn cancel(&self, id: u64) -> Result<()> {
        let live = self.live()?;
        let (_, tasks) = live.known(id)?;
        live.cancel(TentBatchId(id), tasks)
    }

    fn abandon(&self, id: u64) {
        if let Ok(live) = self.live()
            && lock(&live.batches).contains_key(&id)
        {
            lock(&live.abandoned).push(id);
        }
    }

    fn send_notify(&self, target: &str, notification: &Notification) -> Result<()> {
        let live = self.live()?;
        let seg = live.peer(target)?;
        Ok(live.tent.send_notification(seg, notification)?)
    }

    fn take_notifies(&self) -> Result<Vec<Notification>> {
        Ok(self.live()?.tent.receive_notifications())
    }

    fn next_notify(&self, timeout: Duration) -> Result<Option<Notification>> {
        Ok(self.live()?.tent.receive_notification(timeout))
    }

    fn probe(&self, target: &str) -> Result<bool> {
        Ok(self.live()?.tent.core().probe(target) == te_core::PeerLiveness::Alive)
    }

    fn close(&self) {
        if let Some(live) = self.live.take() {
            live.tent.core().shutdown();
        }
    }
}
