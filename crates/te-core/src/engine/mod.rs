//! The classic batch API: [`TransferEngine`].
//!
//! It owns the local region table, the segment cache, the batches, the control listener and the
//! installed transports. `submit` validates every request against the local table and the
//! target's descriptor, cuts slices, pins regions and posts; it returns when posted. Transports
//! report slices back to the engine's sink, which retries path failures (up to `MC_RETRY_CNT`),
//! finishes tasks, wakes waiters and sends completion notifications from its own thread.
//! The engine itself moves no bytes.

use std::net::{IpAddr, SocketAddr};
use std::sync::mpsc;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tracing::{info, warn};

use crate::batch::{BatchId, BatchTable, PendingNotify, TransferStatus};
mod files;
mod held;
mod keeper;
mod policy;
mod registration;
mod segments;
mod submit;

pub use files::FileAccess;
pub use policy::Policy;
pub use submit::SubmitOptions;

use crate::completion::Core;
use crate::config::Config;
use crate::control::{self, ControlState, frame::FrameType};
use crate::error::{Error, Result};
use crate::health::RailHealth;
use crate::memory::RegionTable;
use crate::metadata::Metadata;
use crate::notify::{Notification, NotificationQueue, Received};
use crate::retry::RetryPolicy;
use crate::segment::{SegmentCache, SegmentDesc, SegmentId, SegmentSecret};
use crate::transport::{InstallContext, Opcode, Rail, RailStats, SliceError, Transport};
use te_reactor::Server;
use te_topology::bind as net;

/// A descriptor fetched for an unknown range that listed nothing new is not fetched again for
/// one until this old ([`TransferEngine::segment_for_range`]).
pub const DESCRIPTOR_MIN_AGE: Duration = Duration::from_millis(20);

/// One READ or WRITE (Mooncake's `TransferRequest`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TransferRequest {
    /// Direction.
    pub opcode: Opcode,
    /// Local address (inside a registered region).
    pub source: u64,
    /// Target segment, from `open_segment`.
    pub target_id: SegmentId,
    /// Absolute address in the target process (Mooncake's name; it is not an offset).
    pub target_offset: u64,
    /// Bytes to move (> 0).
    pub length: u64,
}

/// Answer of a liveness probe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PeerLiveness {
    /// The peer's control listener answered.
    Alive,
    /// It did not.
    Unreachable,
}

/// A transfer engine: one local segment, its registered memory, and transfers to peers.
pub struct TransferEngine {
    config: Arc<Config>,
    name: String,
    bind_ip: IpAddr,
    /// The control listener's address.
    control_addr: std::net::SocketAddr,
    rails: Vec<Rail>,
    rail_names: Vec<String>,
    local_matrix: te_topology::PriorityMatrix,
    stripe: std::sync::atomic::AtomicU64,
    secret: SegmentSecret,
    regions: Arc<RegionTable>,
    segments: Arc<SegmentCache>,
    /// What a fetched descriptor must pass before it is cached.
    vetting: Arc<segments::Vetting>,
    batches: BatchTable,
    metadata: Arc<dyn Metadata>,
    /// Set while a publication to a shared metadata service is owed (it was unreachable).
    publish_owed: Arc<std::sync::atomic::AtomicBool>,
    keeper: Option<keeper::Keeper>,
    control_state: Arc<ControlState>,
    control: std::sync::Mutex<Option<Server>>,
    notifications: Arc<NotificationQueue>,
    core: Arc<Core>,
    /// The runtime policy planning this engine's batches, if one is installed.
    policy: std::sync::OnceLock<std::sync::Weak<dyn policy::Policy>>,
}

impl std::fmt::Debug for TransferEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TransferEngine")
            .field("name", &self.name)
            .finish()
    }
}

fn name_host(local_server_name: &str) -> (Option<IpAddr>, Option<u16>) {
    let name = local_server_name.trim();
    if let Ok(addr) = name.parse::<SocketAddr>() {
        return (Some(addr.ip()), Some(addr.port()));
    }
    if let Ok(ip) = name
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse::<IpAddr>()
    {
        return (Some(ip), None);
    }
    match control::split_host_port(name) {
        Ok((host, port)) => {
            let ip = control::resolve(&host, port)
                .ok()
                .and_then(|a| a.into_iter().find(|a| a.is_ipv4()).map(|a| a.ip()));
            (ip, Some(port))
        }
        Err(_) => (None, None),
    }
}

impl TransferEngine {
    /// Starts an engine: parses the metadata connection string, binds the control listener and
    /// names the local segment `host:port` (P2P). `local_server_name` may be `IP:PORT` (serve
    /// there), `IP` or a host name (pick a port in `MC_MIN_RPC_PORT..=MC_MAX_RPC_PORT`), or empty.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a bad connection string, [`Error::Metadata`] for a backend
    /// not available yet, [`Error::Socket`] when no port can be bound.
    pub fn init(config: Config, metadata_conn: &str, local_server_name: &str) -> Result<Self> {
        Self::init_with_clock(
            config,
            metadata_conn,
            local_server_name,
            Arc::new(crate::clock::SystemClock),
        )
    }

    /// As [`init`](Self::init), with task deadlines and rail health read from `clock` (the
    /// deterministic simulation passes te-testkit's `SimClock`).
    ///
    /// # Errors
    /// As [`init`](Self::init).
    pub fn init_with_clock(
        config: Config,
        metadata_conn: &str,
        local_server_name: &str,
        clock: Arc<dyn crate::clock::Clock>,
    ) -> Result<Self> {
        config.mooncake.check(config.cluster_secret.is_some())?;
        raise_open_files_once(&config.limits);
        let config = Arc::new(config);
        let metadata = crate::metadata::open(metadata_conn, &config)?;
        let (host_ip, port) = name_host(local_server_name);
        let topology = te_topology::Topology::discover().unwrap_or_default();
        let bind_ip = net::bind_ip_for(
            config.tcp_bind_address,
            host_ip,
            &topology,
            &te_sys::interface_addrs(),
        );
        let listener = match port.filter(|p| *p != 0) {
            Some(p) => std::net::TcpListener::bind((bind_ip, p)).map_err(|e| {
                Error::socket(format!("binding the control listener to {bind_ip}:{p}"), e)
            })?,
            None => te_sys::bind_in_range(bind_ip, config.rpc_min_port..=config.rpc_max_port)
                .map_err(|e| {
                    Error::socket(format!("binding the control listener on {bind_ip}"), e)
                })?,
        };
        let (rails, local_matrix) =
            crate::rails::plan(&config, bind_ip, &topology, &te_sys::interface_addrs())?;
        let addr = listener
            .local_addr()
            .map_err(|e| Error::socket("reading the control address", e))?;
        // In a shared service the segment is known by the name asked for (Mooncake's
        // local_server_name); peer to peer it must be the listener's address.
        let asked = local_server_name.trim();
        let name = match metadata.is_shared() && !asked.is_empty() && port != Some(0) {
            true => asked.to_string(),
            false => addr.to_string(),
        };
        let secret = SegmentSecret::random()?;
        let cluster_key = config
            .cluster_secret
            .as_ref()
            .map(|s| control::auth::cluster_key(s.expose()).map(Arc::new))
            .transpose()?;
        let notifications = Arc::new(NotificationQueue::new(config.notify));
        let mut first_desc = SegmentDesc::local(&name, "none", secret, &[]);
        if let Some(key) = &cluster_key {
            control::auth::seal(key, &mut first_desc)?;
            control::auth::sign(key, &mut first_desc)?;
        }
        let control_state = Arc::new(ControlState {
            local_desc: RwLock::new(Arc::new(first_desc.to_json())),
            notifications: notifications.clone(),
            max_payload: config.handshake_max_length,
            cluster_key: cluster_key.clone(),
            connection_handler: RwLock::new(None),
            mooncake: config.mooncake.clone(),
            public_desc: RwLock::new(None),
        });
        let control = control::start_server(listener, control_state.clone(), &config.limits)?;
        let (tx, rx) = mpsc::channel::<PendingNotify>();
        let notify_config = config.clone();
        let notify_key = cluster_key.clone();
        std::thread::Builder::new()
            .name("te-notifier".into())
            .spawn(move || {
                for job in rx {
                    if let Err(e) = send_notification(&notify_config, notify_key.as_deref(), job.target.host(), job.target.rpc_port(), &job.notification) {
                        warn!(target = job.target.name(), error = %e, "completion notification not delivered");
                    }
                }
            })
            .map_err(|e| Error::socket("spawning the notifier thread", e))?;
        let seed = u16::from_le_bytes([secret.to_bytes()[0], secret.to_bytes()[1]]);
        let core = Arc::new(Core {
            clock,
            retry: RetryPolicy::new(config.retry_cnt),
            health: std::sync::Mutex::new(RailHealth::new(
                config.rail_error_threshold,
                config.rail_error_window,
                config.rail_pause,
                config.rail_cooldown_max,
            )),
            health_clean: std::sync::atomic::AtomicBool::new(true),
            transports: RwLock::new(Vec::new()),
            transports_epoch: std::sync::atomic::AtomicU64::new(0),
            notifier: std::sync::Mutex::new(Some(tx)),
            metrics: Arc::default(),
            metrics_on: std::sync::atomic::AtomicBool::new(false),
        });
        let segments = Arc::new(SegmentCache::default());
        let vetting = Arc::new(segments::Vetting {
            metadata: metadata.clone(),
            key: cluster_key.clone(),
            own_name: name.clone(),
            connect_timeout: config.handshake_connect_timeout,
            max_payload: config.handshake_max_length,
        });
        let publish_owed = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let keeper = match metadata.is_shared() {
            true => {
                let ctx = keeper::KeeperCtx {
                    metadata: metadata.clone(),
                    name: name.clone(),
                    rpc: (addr.ip().to_string(), addr.port()),
                    control_state: control_state.clone(),
                    segments: segments.clone(),
                    core: core.clone(),
                    owed: publish_owed.clone(),
                    vetting: vetting.clone(),
                    refresh_batch: config.metadata_refresh_batch,
                };
                // A service that cannot be reached at start is a setup error: say so now.
                keeper::publish_all(&ctx)?;
                Some(keeper::Keeper::start(ctx, config.metadata_refresh)?)
            }
            false => None,
        };
        info!(segment = %name, "engine started");
        if let Some(why) = open_to_anyone(bind_ip, config.cluster_secret.is_some()) {
            warn!(segment = %name, "{why}");
        }
        Ok(TransferEngine {
            batches: BatchTable::new(config.max_batch_size, seed, core.clock.clone()),
            core,
            config,
            name,
            bind_ip,
            control_addr: addr,
            rail_names: rails.iter().map(|r| r.name.clone()).collect(),
            rails,
            local_matrix,
            stripe: std::sync::atomic::AtomicU64::new(u64::from(seed).wrapping_mul(0x9e37_79b9)),
            secret,
            regions: Arc::new(RegionTable::new()),
            segments,
            vetting,
            metadata,
            publish_owed,
            keeper,
            control_state,
            control: std::sync::Mutex::new(Some(control)),
            notifications,
            policy: std::sync::OnceLock::new(),
        })
    }

    /// The local segment's name (P2P: `ip:port` of the control listener).
    pub fn segment_name(&self) -> &str {
        &self.name
    }

    /// The descriptor this engine publishes, as its transports describe it now (with the
    /// segment secret in the clear: the published form seals it when there is a cluster key).
    pub fn local_descriptor(&self) -> SegmentDesc {
        self.local_desc()
    }

    /// The engine's configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The engine's counters (they count while [`metrics_enabled`](Self::metrics_enabled)).
    pub fn metrics(&self) -> &Arc<te_metrics::counters::Metrics> {
        &self.core.metrics
    }

    /// Whether requests are counted in [`metrics`](Self::metrics).
    #[inline]
    pub fn metrics_enabled(&self) -> bool {
        self.core
            .metrics_on
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Starts or stops counting requests (off at start; te-metrics turns it on where asked).
    pub fn set_metrics_enabled(&self, on: bool) {
        self.core
            .metrics_on
            .store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// The local rails, in index order.
    pub fn rails(&self) -> &[Rail] {
        &self.rails
    }

    /// The local priority matrix (published in the descriptor).
    pub fn priority_matrix(&self) -> &te_topology::PriorityMatrix {
        &self.local_matrix
    }

    /// Load and health of each local rail (Mooncake's `getNicLoadStats`, with te's counters):
    /// the rails the installed transports report (TCP's the engine's rails, RDMA's its
    /// devices), in the order they report them; a rail two report is one entry.
    pub fn nic_load_stats(&self) -> Vec<RailStats> {
        let mut stats: Vec<RailStats> = Vec::new();
        for t in self.core.transports() {
            for s in t.rail_stats() {
                match stats.iter_mut().find(|m| m.name == s.name) {
                    Some(mine) => {
                        mine.inflight_bytes += s.inflight_bytes;
                        mine.bytes_done += s.bytes_done;
                        mine.errors += s.errors;
                        mine.ewma_bandwidth_bps += s.ewma_bandwidth_bps;
                        mine.paused |= s.paused;
                    }
                    None => stats.push(s),
                }
            }
        }
        let now = self.core.clock.now();
        let health = self.core.health.lock().unwrap_or_else(|e| e.into_inner());
        for s in &mut stats {
            if let Some(i) = self.rails.iter().position(|r| r.name == s.name) {
                s.paused |= health.local_paused(i as u16, now);
            }
        }
        stats
    }

    /// The installed transport named `name`.
    pub fn transport(&self, name: &str) -> Option<Arc<dyn Transport>> {
        self.core.transport_for(name).ok()
    }

    /// Installs a transport; every registered region is registered on it too.
    ///
    /// # Errors
    /// The transport failed to start or to register a region.
    pub fn install_transport(&self, transport: Arc<dyn Transport>) -> Result<()> {
        transport.install(InstallContext {
            config: self.config.clone(),
            local_name: self.name.clone(),
            bind_ip: self.bind_ip,
            control_addr: self.control_addr,
            regions: self.regions.clone(),
            secret: self.secret,
            sink: self.core.clone(),
            rails: self.rails.clone(),
            control: self.control_state.clone(),
        })?;
        let regions = self.regions.snapshot();
        for (i, region) in regions.iter().enumerate() {
            if let Err(e) = transport.register(region) {
                regions[..i]
                    .iter()
                    .for_each(|done| transport.unregister(done));
                transport.shutdown();
                return Err(e);
            }
        }
        self.core.change_transports(|list| list.push(transport));
        self.publish()
    }

    fn local_desc(&self) -> SegmentDesc {
        let transports = self.core.transports();
        let protocol = transports.first().map_or("none", |t| t.name());
        let mut desc =
            SegmentDesc::local(&self.name, protocol, self.secret, &self.regions.snapshot());
        desc.priority_matrix = Some(self.local_matrix.clone());
        for t in transports.iter() {
            t.describe(&mut desc);
        }
        desc
    }

    fn publish(&self) -> Result<()> {
        let mut desc = self.local_desc();
        if let Some(key) = &self.control_state.cluster_key {
            if self.config.mooncake.enabled {
                // What Mooncake peers, which cannot prove the cluster secret, may see.
                let public = SegmentDesc {
                    te_secret: None,
                    ..desc.clone()
                };
                *self
                    .control_state
                    .public_desc
                    .write()
                    .unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(public.to_json()));
            }
            control::auth::seal(key, &mut desc)?;
            control::auth::sign(key, &mut desc)?;
        }
        *self
            .control_state
            .local_desc
            .write()
            .unwrap_or_else(|e| e.into_inner()) = Arc::new(desc.to_json());
        match self.metadata.publish_segment(&desc) {
            // A shared service that is down must not fail local work: the keeper publishes
            // what is owed when it returns.
            Err(e) if self.metadata.is_shared() => {
                if !self
                    .publish_owed
                    .swap(true, std::sync::atomic::Ordering::AcqRel)
                {
                    warn!(error = %e, "metadata service unreachable; descriptor will be re-published");
                }
                Ok(())
            }
            other => other,
        }
    }

    /// Allocates a batch that will hold up to `capacity` tasks.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for 0 or more than `Config::max_batch_size`.
    pub fn allocate_batch(&self, capacity: usize) -> Result<BatchId> {
        match self.policy() {
            Some(policy) => policy.allocate(capacity),
            None => self.allocate_watched_batch(capacity, None),
        }
    }

    /// A batch of the engine's own (the policy, if any, is not asked); `watcher`, if any, is
    /// told whenever a task of the batch ends (a runtime over this engine learns of ends as
    /// events instead of asking) and is dropped with the batch.
    ///
    /// # Errors
    /// As [`allocate_batch`](Self::allocate_batch).
    pub fn allocate_watched_batch(
        &self,
        capacity: usize,
        watcher: Option<Arc<dyn crate::batch::TaskWatcher>>,
    ) -> Result<BatchId> {
        let id = self.batches.allocate_watched(capacity, watcher)?;
        self.core.metrics.batch_allocated();
        Ok(id)
    }

    /// Frees a batch.
    ///
    /// # Errors
    /// [`Error::BatchBusy`] while a slice of it is in flight; [`Error::InvalidBatch`] for a stale
    /// (double free) or foreign handle.
    pub fn free_batch(&self, batch: BatchId) -> Result<()> {
        self.batches.free(batch)?;
        self.core.metrics.batch_freed();
        if let Some(policy) = self.policy() {
            policy.freed(batch);
        }
        Ok(())
    }

    /// Status of task `task` (its index in submission order) of `batch`.
    ///
    /// # Errors
    /// [`Error::InvalidBatch`], [`Error::InvalidTask`].
    pub fn task_status(&self, batch: BatchId, task: usize) -> Result<TransferStatus> {
        self.batches.task_status(batch, task)
    }

    /// Aggregate status: terminal once every task is; then COMPLETED only if all completed.
    ///
    /// # Errors
    /// [`Error::InvalidBatch`].
    pub fn batch_status(&self, batch: BatchId) -> Result<TransferStatus> {
        self.batches.batch_status(batch)
    }

    /// Blocks (without spinning) until every task of `batch` is terminal.
    ///
    /// # Errors
    /// [`Error::WaitTimeout`] when `timeout` passes first (the transfer goes on);
    /// [`Error::InvalidBatch`].
    pub fn wait(&self, batch: BatchId, timeout: Duration) -> Result<TransferStatus> {
        self.batches.wait(batch, timeout)
    }

    /// Blocks until task `task` of `batch` is terminal.
    ///
    /// # Errors
    /// As [`wait`](Self::wait), and [`Error::InvalidTask`].
    pub fn wait_task(
        &self,
        batch: BatchId,
        task: usize,
        timeout: Duration,
    ) -> Result<TransferStatus> {
        self.batches.wait_task(batch, task, timeout)
    }

    /// Cancels the batch's unfinished tasks: slices not yet on the wire are dropped, slices on
    /// the wire finish. Tasks end CANCELED (or COMPLETED if every slice had already gone).
    ///
    /// # Errors
    /// [`Error::InvalidBatch`].
    pub fn cancel(&self, batch: BatchId) -> Result<()> {
        self.batches.cancel(batch)
    }

    /// Cancels task `task` of `batch` as [`cancel`](Self::cancel) does a whole batch: no more
    /// of its slices are posted, those on the wire finish, and it ends CANCELED (or COMPLETED).
    ///
    /// # Errors
    /// [`Error::InvalidBatch`], [`Error::InvalidTask`].
    pub fn cancel_task(&self, batch: BatchId, task: usize) -> Result<()> {
        self.batches.cancel_task(batch, task)
    }

    /// The first slice error of a task, if it failed.
    ///
    /// # Errors
    /// [`Error::InvalidBatch`], [`Error::InvalidTask`].
    pub fn task_error(&self, batch: BatchId, task: usize) -> Result<Option<SliceError>> {
        self.batches.task_error(batch, task)
    }

    /// Sends a notification to segment `name`.
    ///
    /// # Errors
    /// [`Error::Socket`] when unreachable; [`Error::PeerRefused`] when its queue is full.
    pub fn send_notify(&self, name: &str, notification: &Notification) -> Result<()> {
        let (host, port) = self.metadata.rpc_address(name)?;
        send_notification(
            &self.config,
            self.control_state.cluster_key.as_deref(),
            &host,
            port,
            notification,
        )
    }

    /// Takes every notification received so far, oldest first, each with the connection it
    /// came on (the sender's address, and whether it proved the cluster secret): the `name`
    /// inside is only what the sender wrote.
    pub fn take_notifies(&self) -> Vec<Received> {
        self.notifications.drain()
    }

    /// Takes the oldest notification, waiting up to `timeout` for one.
    pub fn next_notify(&self, timeout: Duration) -> Option<Received> {
        self.notifications.recv(timeout)
    }

    /// Asks segment `name`'s control listener whether it is alive.
    pub fn probe(&self, name: &str) -> PeerLiveness {
        let alive = self.metadata.rpc_address(name).and_then(|(host, port)| {
            control::request(
                &host,
                port,
                FrameType::Probe,
                b"{}",
                self.config.handshake_connect_timeout,
                4096,
                self.control_state.cluster_key.as_deref(),
            )
        });
        match alive {
            Ok(reply) if reply.windows(7).any(|w| w == b"success") => PeerLiveness::Alive,
            _ => PeerLiveness::Unreachable,
        }
    }

    /// Stops the control listener and the transports; queued slices fail. Idempotent.
    pub fn shutdown(&self) {
        if let Some(k) = &self.keeper {
            k.stop();
        }
        // Taken out first, so no lock is held while the server's threads are joined.
        let control = self
            .control
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(c) = control {
            c.shutdown();
        }
        let transports = self.core.change_transports(std::mem::take);
        for t in &transports {
            t.shutdown();
        }
        self.core
            .notifier
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        let _ = self.metadata.remove_segment(&self.name);
    }
}

impl Drop for TransferEngine {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn send_notification(
    config: &Config,
    key: Option<&control::auth::ClusterKey>,
    host: &str,
    port: u16,
    n: &Notification,
) -> Result<()> {
    let payload = serde_json::to_vec(n).map_err(|e| Error::InvalidArgument(e.to_string()))?;
    let reply = control::request(
        host,
        port,
        FrameType::Notify,
        &payload,
        config.handshake_connect_timeout,
        4096,
        key,
    )?;
    let v: serde_json::Value = serde_json::from_slice(&reply)
        .map_err(|e| Error::MalformedMessage(format!("notify reply: {e}")))?;
    match v.get("error").and_then(|e| e.as_str()) {
        Some(reason) => Err(Error::PeerRefused {
            peer: format!("{host}:{port}"),
            reason: reason.to_string(),
        }),
        None => Ok(()),
    }
}

/// Raises the open-file limit for the servers' connection caps, once per process.
fn raise_open_files_once(limits: &te_reactor::limits::ServerLimits) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        if let Err(e) = te_reactor::limits::raise_open_files(
            limits.open_files_wanted(),
            "MC_TE_MAX_DATA_CONNECTIONS + MC_TE_MAX_CONTROL_CONNECTIONS",
        ) {
            warn!(error = %e, "open-file limit unknown");
        }
    });
}

/// What an engine serving on `bind_ip` exposes when it has no cluster secret, or `None` when
/// only this host reaches it or peers must prove the secret.
fn open_to_anyone(bind_ip: std::net::IpAddr, cluster_secret: bool) -> Option<String> {
    (!cluster_secret && !bind_ip.is_loopback()).then(|| {
        format!(
            "serving on {bind_ip} with no cluster secret (MC_TE_CLUSTER_SECRET): any peer that \
             reaches this address can fetch the segment's descriptor, its secret included, and \
             then read (and write, where registered read-write) its remote-accessible memory"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::open_to_anyone;

    #[test]
    fn a_reachable_engine_without_a_cluster_secret_says_what_peers_can_do() {
        let lan: std::net::IpAddr = "10.1.2.3".parse().unwrap();
        let why = open_to_anyone(lan, false).expect("a warning");
        assert!(
            why.contains("MC_TE_CLUSTER_SECRET") && why.contains("10.1.2.3"),
            "{why}"
        );
        assert!(open_to_anyone(lan, true).is_none());
        assert!(open_to_anyone("127.0.0.1".parse().unwrap(), false).is_none());
        assert!(open_to_anyone("::1".parse().unwrap(), false).is_none());
        assert!(open_to_anyone("0.0.0.0".parse().unwrap(), false).is_some());
    }
}
