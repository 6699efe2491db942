//! [`MooncakeEngine`]: one engine with Mooncake's calling conventions. It may exist before it
//! is initialized (Mooncake's Python object does), every call checks that it is, transfers
//! resolve peers by segment name through a cache, synchronous calls block without spinning,
//! and asynchronous batches are known by checked ids.
//!
//! Not here: conversions of arguments from Python or C, and the return-code conventions of
//! each binding (Python collapses transfer failures to -1, C returns `Status` codes); the
//! bindings map [`FacadeError`] to those.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use te_core::notify::Received;
use te_core::{
    Config, Notification, Opcode, Permission, SegmentId, TransferEngine, TransferRequest,
    TransferState,
};
use tracing::{debug, error, warn};

use crate::error::{FacadeError, Result};
use crate::install::install_classic;
#[cfg(feature = "tent")]
use crate::install::start_tent;
use crate::managed::ManagedBuffers;
use crate::owned::Owned;
use crate::runtime::{Runtime, RuntimeKind, Submission};
use crate::session::{self, Sessions};
use crate::settings::FacadeSettings;
use te_catalog::Protocol;

/// Where an asynchronous batch stands ([`MooncakeEngine::check`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum BatchProgress {
    /// Still moving.
    Running,
    /// Every task completed; the id is freed.
    Done,
    /// A task failed or was cancelled; the id is freed.
    Failed,
    /// A task ran past its deadline; the id is freed (Mooncake keeps it, and leaks it).
    TimedOut,
}

/// One call's descriptor lists: local addresses, remote addresses, lengths.
pub type Lists<'a> = (&'a [u64], &'a [u64], &'a [u64]);

/// What a transfer carries besides its descriptors: a notification for the target, sent once
/// every byte has landed, and a transport hint. An `Option<Notification>` converts to the
/// notification alone.
#[derive(Clone, Debug, Default)]
pub struct TransferOptions {
    /// Delivered to the target after the data.
    pub notify: Option<Notification>,
    /// The transport to use (Mooncake's `transport_hint`), when not the engine's choice.
    pub hint: Option<Protocol>,
}

impl From<Option<Notification>> for TransferOptions {
    fn from(notify: Option<Notification>) -> Self {
        TransferOptions { notify, hint: None }
    }
}

/// One engine, initialized or not, shared by every thread of a binding.
#[derive(Default)]
pub struct MooncakeEngine {
    live: Owned<Live>,
}

/// An initialized engine and what the facade keeps beside it.
pub struct Live {
    runtime: Runtime,
    pub(crate) sessions: Sessions,
    /// Asynchronous batches handed out, by id, with their target's name.
    batches: Mutex<HashMap<u64, String>>,
    /// Batches whose handles were let go before they finished: freed once they have.
    abandoned: Mutex<Vec<u64>>,
    pub(crate) managed: ManagedBuffers,
    /// The bindings' variables as the engine started with them (`MC_TRANSFER_TIMEOUT`: a
    /// synchronous transfer's budget, plus a nanosecond per byte; `MC_FORCE_TCP`).
    pub(crate) settings: FacadeSettings,
}

impl Live {
    /// The classic te engine underneath (under TENT, the one TENT runs over): segments,
    /// rails, notifications.
    pub fn engine(&self) -> &TransferEngine {
        self.runtime.core()
    }

    /// The runtime it runs on.
    pub fn runtime_kind(&self) -> RuntimeKind {
        self.runtime.kind()
    }

    pub(crate) fn runtime(&self) -> &Runtime {
        &self.runtime
    }

    /// TENT's runtime, installed in this engine (TENT's C API: priorities, per-task status
    /// and cancels, memory by location).
    ///
    /// # Errors
    /// [`te_core::Error::InvalidArgument`] for an engine on the classic runtime.
    #[cfg(feature = "tent")]
    pub fn tent(&self) -> Result<&te_tent::TentEngine> {
        self.runtime.tent_runtime().ok_or_else(|| {
            te_core::Error::InvalidArgument("this engine does not run on TENT".into()).into()
        })
    }
}

impl Drop for MooncakeEngine {
    fn drop(&mut self) {
        self.close();
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        self.runtime.shutdown();
    }
}

/// How long unregistering waits for this engine's own transfers that still hold a region (an
/// abandoned batch still in flight); te-core itself waits for peers' requests being served.
pub const UNREGISTER_GRACE: Duration = Duration::from_secs(2);

/// Runs `unregister` again while it answers [`te_core::Error::RegionBusy`], for up to
/// [`UNREGISTER_GRACE`], sleeping between tries.
pub(crate) fn until_unpinned(mut unregister: impl FnMut() -> te_core::Result<()>) -> Result<()> {
    let deadline = std::time::Instant::now() + UNREGISTER_GRACE;
    loop {
        match unregister() {
            Err(te_core::Error::RegionBusy { .. }) if std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(1));
            }
            other => return Ok(other?),
        }
    }
}

/// The time one call's transfers may take: `timeout` (`MC_TRANSFER_TIMEOUT`) plus a
/// nanosecond per byte.
pub(crate) fn budget(timeout: Duration, lengths: &[u64]) -> Duration {
    let total = lengths.iter().fold(0u64, |a, &l| a.saturating_add(l));
    timeout + Duration::from_nanos(total)
}

/// Builds the requests of one call; lists of different lengths are refused.
pub(crate) fn requests(
    target_id: SegmentId,
    opcode: Opcode,
    sources: &[u64],
    targets: &[u64],
    lengths: &[u64],
) -> Result<Vec<TransferRequest>> {
    if sources.len() != targets.len() || sources.len() != lengths.len() {
        return Err(te_core::Error::InvalidArgument(format!(
            "{} buffers, {} peer addresses and {} lengths: the lists must be equally long",
            sources.len(),
            targets.len(),
            lengths.len()
        ))
        .into());
    }
    if sources.is_empty() {
        return Err(te_core::Error::InvalidArgument("no transfers given".into()).into());
    }
    Ok(sources
        .iter()
        .zip(targets)
        .zip(lengths)
        .map(|((&source, &target_offset), &length)| TransferRequest {
            opcode,
            source,
            target_id,
            target_offset,
            length,
        })
        .collect())
}

impl MooncakeEngine {
    /// An engine not initialized yet: every call but `initialize` answers
    /// [`FacadeError::NotInitialized`].
    pub fn new() -> Self {
        Self::default()
    }

    /// An engine started at once, on the classic engine: [`initialize_on`](Self::initialize_on)
    /// with `protocol` (`"auto"`: every transport this build has that can start here, the
    /// engine choosing per peer and buffer; or one Mooncake name) and every device.
    ///
    /// # Errors
    /// As [`initialize`](Self::initialize).
    pub fn started(local_hostname: &str, metadata_server: &str, protocol: &str) -> Result<Self> {
        let e = Self::new();
        e.initialize_on(
            RuntimeKind::Classic,
            local_hostname,
            metadata_server,
            protocol,
            "",
        )?;
        Ok(e)
    }

    /// Mooncake's `initialize(local_hostname, metadata_server, protocol, device_name)`, on
    /// te's TENT runtime when `MC_USE_TENT` or `MC_USE_TEV1` is set (as Mooncake), on the
    /// classic engine otherwise.
    ///
    /// With `P2PHANDSHAKE` the port in `local_hostname` is ignored and one is picked (the
    /// session name is `host:port`, [`session_name`](Self::session_name)); with a metadata
    /// server the name is `local_hostname` as given. `protocol` is one of Mooncake's names
    /// ([`Protocol`]): `rdma` installs te's RDMA transport on `device_name`'s devices
    /// (comma-separated; empty: all) when there are any and `MC_FORCE_TCP` is not set, and TCP
    /// otherwise, as Mooncake falls back. A name te cannot serve here is an error (logged at
    /// ERROR), never a TCP engine. Calling it again replaces the engine (Mooncake does the
    /// same).
    ///
    /// # Errors
    /// A protocol te cannot serve, a bad metadata string or name, a service that cannot be
    /// reached, no port to bind.
    pub fn initialize(
        &self,
        local_hostname: &str,
        metadata_server: &str,
        protocol: &str,
        device_name: &str,
    ) -> Result<()> {
        self.initialize_on(
            RuntimeKind::from_env(),
            local_hostname,
            metadata_server,
            protocol,
            device_name,
        )
    }

    /// [`initialize`](Self::initialize) on runtime `kind`, whatever `MC_USE_TENT` says (te's
    /// own `te.Engine(backend=...)`).
    ///
    /// # Errors
    /// As [`initialize`](Self::initialize).
    pub fn initialize_on(
        &self,
        kind: RuntimeKind,
        local_hostname: &str,
        metadata_server: &str,
        protocol: &str,
        device_name: &str,
    ) -> Result<()> {
        let started = self.start(
            kind,
            local_hostname,
            metadata_server,
            Some((protocol, device_name)),
        );
        if let Err(e) = &started {
            error!(error = %e, protocol, runtime = ?kind, "initialize failed");
        }
        started
    }

    /// Starts the engine on runtime `kind`; `transports` (protocol, devices) installs them as
    /// `initialize` does, `None` installs none on the classic engine (the C API's
    /// `auto_discover = 0`) and TENT's configured ones on TENT.
    pub(crate) fn start(
        &self,
        kind: RuntimeKind,
        local_hostname: &str,
        metadata_server: &str,
        transports: Option<(&str, &str)>,
    ) -> Result<()> {
        let wanted = transports
            .map(|(p, devices)| Protocol::parse(p).map(|p| (p, devices)))
            .transpose()?;
        let local = match te_core::metadata::MetadataKind::parse(metadata_server)? {
            te_core::metadata::MetadataKind::P2p => session::p2p_host(local_hostname)?,
            _ => local_hostname.trim().to_string(),
        };
        let settings = FacadeSettings::from_env().map_err(te_core::Error::from)?;
        let managed = ManagedBuffers::default();
        let runtime = match kind {
            RuntimeKind::Classic => {
                let engine = TransferEngine::init(Config::from_env()?, metadata_server, &local)?;
                if let Some((protocol, devices)) = wanted {
                    install_classic(&engine, protocol, devices, &settings, &managed.source)?;
                }
                Runtime::classic(engine)
            }
            #[cfg(feature = "tent")]
            RuntimeKind::Tent => Runtime::tent(start_tent(metadata_server, &local, wanted)?),
            #[cfg(not(feature = "tent"))]
            RuntimeKind::Tent => {
                return Err(te_core::Error::NotSupportedTransport(
                    "te's TENT runtime: te-facade was built without its `tent` feature".into(),
                )
                .into());
            }
        };
        self.go_live(runtime, managed, settings)
    }

    /// Starts on TENT's runtime made from `config` (TENT's C API, `tent_create_engine`), with
    /// the transports it enables.
    ///
    /// # Errors
    /// The configuration's or the engine's refusal.
    #[cfg(feature = "tent")]
    pub fn started_on_tent(config: te_tent::TentConfig) -> Result<Self> {
        let e = Self::new();
        let settings = FacadeSettings::from_env().map_err(te_core::Error::from)?;
        let runtime = Runtime::tent(te_tent::TentEngine::new(config)?);
        e.go_live(runtime, ManagedBuffers::default(), settings)?;
        Ok(e)
    }

    fn go_live(
        &self,
        runtime: Runtime,
        managed: ManagedBuffers,
        settings: FacadeSettings,
    ) -> Result<()> {
        let kind = runtime.kind();
        let live = Arc::new(Live {
            runtime,
            sessions: Sessions::default(),
            batches: Mutex::new(HashMap::new()),
            abandoned: Mutex::new(Vec::new()),
            managed,
            settings,
        });
        // TENT_METRICS_ENABLED, MC_TE_METRIC: count this engine's requests and show them (or
        // TENT's configuration file did already).
        let counting = te_metrics::start_from_env(live.engine().metrics())
            .map_err(|e| te_core::Error::InvalidArgument(format!("metrics: {e}")))?;
        let engine = live.engine();
        engine.set_metrics_enabled(counting || engine.metrics_enabled());
        debug!(segment = engine.segment_name(), runtime = ?kind, "engine initialized");
        self.live.set(live);
        Ok(())
    }

    /// Mooncake's `initialize_ext(..., metadata_type)`: `metadata_type://server` unless the
    /// server already names a scheme or is `P2PHANDSHAKE`.
    ///
    /// # Errors
    /// As [`initialize`](Self::initialize).
    pub fn initialize_ext(
        &self,
        local_hostname: &str,
        metadata_server: &str,
        protocol: &str,
        device_name: &str,
        metadata_type: &str,
    ) -> Result<()> {
        let server = match metadata_server.contains("://")
            || metadata_server.eq_ignore_ascii_case("P2PHANDSHAKE")
            || metadata_type.is_empty()
        {
            true => metadata_server.to_string(),
            false => format!("{metadata_type}://{metadata_server}"),
        };
        self.initialize(local_hostname, &server, protocol, device_name)
    }

    /// The initialized engine.
    ///
    /// # Errors
    /// [`FacadeError::NotInitialized`]; [`FacadeError::Forked`] in a child forked after
    /// `initialize` (the engine's threads did not come along).
    pub fn live(&self) -> Result<Arc<Live>> {
        self.live.get()
    }

    /// Shuts the engine down (listeners closed, ports released, memory unregistered); later
    /// calls answer [`FacadeError::NotInitialized`]. Idempotent.
    pub fn close(&self) {
        if let Some(live) = self.live.take() {
            live.runtime.shutdown();
        }
    }

    /// This engine's segment name (`host:port` peer to peer): what peers pass as a target.
    ///
    /// # Errors
    /// [`FacadeError::NotInitialized`].
    pub fn session_name(&self) -> Result<String> {
        Ok(self.live()?.engine().segment_name().to_string())
    }

    /// The port of this engine's handshake listener (Mooncake's `get_rpc_port`).
    ///
    /// # Errors
    /// [`FacadeError::NotInitialized`].
    pub fn rpc_port(&self) -> Result<u16> {
        let name = self.session_name()?;
        Ok(te_core::control::parse_segment_name(&name, 0)?.1)
    }

    /// Registers `[addr, addr+len)` for local use and remote reads and writes.
    ///
    /// # Safety
    /// The range must be memory of this process that stays allocated until it is unregistered
    /// (Mooncake's contract for raw addresses): peers write into it from other threads.
    ///
    /// # Errors
    /// Mooncake's: -1 for a null address or zero length, -7 for an overlap.
    #[allow(unsafe_code)]
    pub unsafe fn register(&self, addr: u64, len: u64, location: &str) -> Result<()> {
        // SAFETY: forwarded from this function's contract.
        unsafe { self.register_batch(&[addr], &[len], location) }
    }

    /// Registers several ranges, all or none.
    ///
    /// # Safety
    /// As [`register`](Self::register), for every range.
    ///
    /// # Errors
    /// As [`register`](Self::register); lists of different lengths are -1.
    #[allow(unsafe_code)]
    pub unsafe fn register_batch(&self, addrs: &[u64], lens: &[u64], location: &str) -> Result<()> {
        // SAFETY: forwarded from this function's contract.
        unsafe { self.register_batch_with(addrs, lens, location, Permission::RemoteReadWrite) }
    }

    /// As [`register_batch`](Self::register_batch), with the permission peers get
    /// (te's addition: read-only memory is registered [`Permission::RemoteRead`]).
    ///
    /// # Safety
    /// As [`register`](Self::register), for every range.
    ///
    /// # Errors
    /// As [`register`](Self::register).
    #[allow(unsafe_code)]
    pub unsafe fn register_batch_with(
        &self,
        addrs: &[u64],
        lens: &[u64],
        location: &str,
        permission: Permission,
    ) -> Result<()> {
        if addrs.len() != lens.len() {
            return Err(te_core::Error::InvalidArgument(format!(
                "{} addresses and {} capacities",
                addrs.len(),
                lens.len()
            ))
            .into());
        }
        let live = self.live()?;
        let ranges = addrs
            .iter()
            .zip(lens)
            .map(|(&a, &l)| {
                let len = usize::try_from(l).map_err(|_| {
                    te_core::Error::InvalidArgument(format!("capacity {l} does not fit memory"))
                })?;
                Ok((a as usize as *mut u8, len))
            })
            .collect::<Result<Vec<_>>>()?;
        // SAFETY: forwarded from this function's contract.
        unsafe { live.runtime.register(&ranges, location, permission) }
    }

    /// Unregisters the regions starting at `addrs`, all or none. A region a peer's request
    /// still holds (its reply just sent) is waited for by te-core, and one a transfer of this
    /// engine still holds for up to [`UNREGISTER_GRACE`]: Mooncake's callers unregister right
    /// after their transfers complete, or give up on them.
    ///
    /// # Errors
    /// -3 for an address that starts no region, -4 while transfers still use one after
    /// [`UNREGISTER_GRACE`].
    pub fn unregister_batch(&self, addrs: &[u64]) -> Result<()> {
        let live = self.live()?;
        until_unpinned(|| live.runtime.unregister(addrs))
    }

    /// Moves bytes to or from `target` and returns when every byte has landed (or not): no
    /// spinning while it waits. `options` carry a notification the target receives after the
    /// data, and a transport hint (Mooncake's `transport_hint`); `None` for neither.
    ///
    /// # Errors
    /// Bad lists, an unknown or unreachable peer, unregistered ranges on either side, a hint
    /// for a transport that is not installed or cannot reach the peer's memory, or a transfer
    /// that ends in another state than COMPLETED.
    pub fn transfer_sync(
        &self,
        target: &str,
        opcode: Opcode,
        lists: Lists<'_>,
        options: impl Into<TransferOptions>,
    ) -> Result<()> {
        let TransferOptions { notify, hint } = options.into();
        let live = self.live()?;
        let (reqs, budget) = live.prepare(target, opcode, lists)?;
        let batch = live.runtime.allocate(reqs.len())?;
        let how = Submission {
            notify,
            within: Some(budget),
            waited: true,
            hint,
        };
        let outcome = live.run(batch, target, &reqs, how, budget);
        if let Err(e) = live.runtime.free(batch) {
            warn!(error = %e, "freeing a finished batch");
        }
        outcome
    }

    /// As [`transfer_sync`](Self::transfer_sync), returning a batch id at once (never 0);
    /// [`check`](Self::check), [`wait_batch`](Self::wait_batch) or
    /// [`wait_all`](Self::wait_all) frees it. A notification is sent once every byte of the
    /// batch has landed.
    ///
    /// # Errors
    /// As [`transfer_sync`](Self::transfer_sync), for what can be known at submission.
    pub fn submit(
        &self,
        target: &str,
        opcode: Opcode,
        lists: Lists<'_>,
        options: impl Into<TransferOptions>,
    ) -> Result<u64> {
        let TransferOptions { notify, hint } = options.into();
        let live = self.live()?;
        live.sweep_abandoned();
        let (reqs, budget) = live.prepare(target, opcode, lists)?;
        let batch = live.runtime.allocate(reqs.len())?;
        let how = Submission {
            notify,
            within: Some(budget),
            waited: false,
            hint,
        };
        if let Err(e) = live.runtime.submit(batch, &reqs, how) {
            let _ = live.runtime.free(batch);
            live.sessions.forget(live.engine(), target);
            return Err(e);
        }
        live.lock_batches().insert(batch, target.to_string());
        Ok(batch)
    }

    /// Where asynchronous batch `id` stands, without waiting; a finished batch is freed.
    ///
    /// # Errors
    /// -1 for an id this engine did not hand out, or has freed already.
    pub fn check(&self, id: u64) -> Result<BatchProgress> {
        let live = self.live()?;
        let batch = live.known_batch(id)?;
        let progress = match live.runtime.status(batch)?.state {
            TransferState::Waiting | TransferState::Pending => return Ok(BatchProgress::Running),
            TransferState::Completed => BatchProgress::Done,
            TransferState::Timeout => BatchProgress::TimedOut,
            _ => BatchProgress::Failed,
        };
        live.release(batch);
        Ok(progress)
    }

    /// Waits for every batch in `ids` to finish (without spinning) and frees them.
    ///
    /// # Errors
    /// An unknown id, or any batch that did not complete.
    pub fn wait_all(&self, ids: &[u64]) -> Result<()> {
        let live = self.live()?;
        let mut first_error = None;
        for &id in ids {
            let outcome = live.known_batch(id).and_then(|batch| {
                let state = live.finish(batch, live.settings.transfer_timeout * 2)?;
                let target = live.release(batch).unwrap_or_default();
                match state {
                    TransferState::Completed => Ok(()),
                    state => Err(FacadeError::Transfer {
                        target,
                        state,
                        detail: None,
                    }),
                }
            });
            if let Err(e) = outcome {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// The notifications received so far, oldest first (drained), each with the connection it
    /// came on.
    ///
    /// # Errors
    /// [`FacadeError::NotInitialized`].
    pub fn take_notifies(&self) -> Result<Vec<Received>> {
        Ok(self.live()?.engine().take_notifies())
    }

    /// Sends a notification to `target` without a transfer.
    ///
    /// # Errors
    /// An unknown or unreachable peer.
    pub fn send_notify(&self, target: &str, notification: &Notification) -> Result<()> {
        Ok(self.live()?.engine().send_notify(target, notification)?)
    }

    /// Whether `target`'s handshake listener answers.
    ///
    /// # Errors
    /// [`FacadeError::NotInitialized`].
    pub fn probe(&self, target: &str) -> Result<bool> {
        let live = self.live()?;
        Ok(live.engine().probe(target) == te_core::PeerLiveness::Alive)
    }

    /// The address of `target`'s first registered buffer (opening it if needed).
    ///
    /// # Errors
    /// An unknown or unreachable peer, or one with no buffer registered.
    pub fn first_buffer_address(&self, target: &str) -> Result<u64> {
        let live = self.live()?;
        let seg = live.sessions.open(live.engine(), target)?;
        let desc = live.engine().segment(seg)?;
        desc.desc().buffers.first().map(|b| b.addr).ok_or_else(|| {
            te_core::Error::RemoteAddressNotRegistered {
                segment: target.to_string(),
                addr: 0,
                len: 0,
            }
            .into()
        })
    }
}

/// This host's topology as JSON (Mooncake's `get_local_topology`); empty when it cannot be
/// read.
pub fn local_topology() -> String {
    te_topology::Topology::discover()
        .unwrap_or_default()
        .to_json()
}

impl Live {
    /// One call's requests to `target` (opened now if it was not) and the time they may take:
    /// `MC_TRANSFER_TIMEOUT` plus a nanosecond per byte.
    fn prepare(
        &self,
        target: &str,
        opcode: Opcode,
        (sources, targets, lengths): (&[u64], &[u64], &[u64]),
    ) -> Result<(Vec<TransferRequest>, Duration)> {
        let seg = self.sessions.open(self.engine(), target)?;
        let reqs = requests(seg, opcode, sources, targets, lengths)?;
        Ok((reqs, budget(self.settings.transfer_timeout, lengths)))
    }

    pub(crate) fn lock_batches(&self) -> std::sync::MutexGuard<'_, HashMap<u64, String>> {
        self.batches.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Batch `id` if this facade handed it out and has not freed it.
    pub(crate) fn known_batch(&self, id: u64) -> Result<u64> {
        match self.lock_batches().contains_key(&id) {
            true => Ok(id),
            false => Err(te_core::Error::InvalidBatch {
                id,
                reason: "not an outstanding asynchronous batch of this engine",
            }
            .into()),
        }
    }

    /// Forgets and frees a finished batch; its target's name.
    pub(crate) fn release(&self, id: u64) -> Option<String> {
        let target = self.lock_batches().remove(&id);
        if let Err(e) = self.runtime.free(id) {
            warn!(error = %e, "freeing a finished batch");
        }
        target
    }

    /// Waits until batch `id` is terminal; one that outlives `budget` is cancelled and waited
    /// for again, so it can be freed.
    pub(crate) fn finish(&self, id: u64, budget: Duration) -> Result<TransferState> {
        let state = self.runtime.wait(id, budget)?.state;
        if state.is_terminal() {
            return Ok(state);
        }
        self.runtime.cancel(id)?;
        Ok(match self.runtime.wait(id, budget)?.state {
            TransferState::Completed => TransferState::Completed,
            _ => TransferState::Timeout,
        })
    }

    /// The first slice error recorded among batch `id`'s tasks.
    pub(crate) fn first_error(&self, id: u64) -> Option<String> {
        self.runtime.first_error(id)
    }

    /// Keeps batch `id` until it has finished, then frees it (see `sweep_abandoned`).
    pub(crate) fn abandon(&self, id: u64) {
        self.abandoned
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(id);
    }

    /// The peer named `target`, opened (the handshake) if it was not; never a file segment.
    pub(crate) fn open_peer(&self, target: &str) -> Result<SegmentId> {
        self.sessions.open_peer(self.engine(), target)
    }

    /// Frees the abandoned batches that have finished.
    fn sweep_abandoned(&self) {
        let mut abandoned = self.abandoned.lock().unwrap_or_else(|e| e.into_inner());
        abandoned.retain(|&id| match self.runtime.status(id) {
            Ok(s) if !s.state.is_terminal() => true,
            _ => {
                self.release(id);
                false
            }
        });
    }

    /// Submits and waits for one synchronous call's batch.
    fn run(
        &self,
        batch: u64,
        target: &str,
        reqs: &[TransferRequest],
        how: Submission,
        budget: Duration,
    ) -> Result<()> {
        if let Err(e) = self.runtime.submit(batch, reqs, how) {
            self.sessions.forget(self.engine(), target);
            return Err(e);
        }
        let state = self.finish(batch, budget)?;
        if state == TransferState::Completed {
            return Ok(());
        }
        let detail = self.first_error(batch);
        // The peer may have restarted or gone: the next call fetches its descriptor afresh.
        self.sessions.forget(self.engine(), target);
        Err(FacadeError::Transfer {
            target: target.to_string(),
            state,
            detail,
        })
    }
}
