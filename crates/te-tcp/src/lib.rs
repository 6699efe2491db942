//! te-tcp: the TCP transport. Modules by role:
//!
//! - `native_target`: the target side in te's framing, on te-reactor's event loops: a data
//!   listener per rail, served by a fixed pool of threads however many peers connect; every
//!   request is checked (proof of the segment secret, bounds of one registered region,
//!   permission) before any byte of memory is touched, and a WRITE is acknowledged only once its
//!   bytes are in memory. `gpu_path`: the blocking path a connection on GPU memory takes, on a
//!   thread of its own; `staging`: the pinned host buffers GPU memory is staged through.
//! - `mooncake_target`: the target side in Mooncake's framing, for Mooncake initiators (opt-in).
//! - `initiator`: per peer, `MC_TCP_LANES_PER_PEER` persistent connections (lanes) and no thread
//!   of their own (`initiator::dialer`'s `MC_TE_CLIENT_THREADS` loops drive them all); slices go
//!   to the least-loaded lane and are pipelined; bytes move between the socket and registered
//!   memory with no copy of te's own.
//! - [`wire`]: te's framing, and Mooncake's ([`wire::mooncake`]). te's carries a proof of the
//!   segment secret. te's listeners are published in `te_rails`, never as Mooncake's
//!   `tcp_data_port`, so a Mooncake initiator never takes a refused WRITE for a done one.
//! - [`settings`], `config`: the variables te-tcp reads and [`TcpSettings`].
//!
//! Unsafe code is confined to `sys` (the raw socket calls) and the places that hand it
//! registered addresses (`initiator`, `native_target`, `gpu_path`, and `mooncake_target`'s
//! `conn` and `blocking`), each call with a `SAFETY:` comment.
#![deny(unsafe_code)]

mod config;
mod error;
mod gpu_path;
mod initiator;
mod mooncake_target;
mod native_target;
mod rails;
pub mod settings;
mod staging;
mod sys;
pub mod wire;

use std::sync::{Arc, Mutex, RwLock};

use te_core::config::EvictionPolicy;
use te_core::segment::{RailAddr, RemoteSegment, SegmentDesc};
use te_core::transport::{
    CompletionSink, InstallContext, Rail, RailStats, SliceError, SliceOp, Transport,
};
use te_reactor::Server;
use te_workers::EndpointStore;
use tracing::{debug, info, warn};

pub use config::TcpSettings;
pub use error::Error;
use gpu_path::TargetState;
use initiator::{Framing, Lane, LaneSettings, PeerKey, Shares};
use rails::CountingSink;
use te_metrics::rail::RailCounters;

/// Slices towards a Mooncake target: its server handles one request at a time per connection
/// and pays per request, and Mooncake's own initiator sends a request whole, so te's 64 KiB
/// slices would cost it 16 headers, round trips and acknowledgements per MiB.
const MOONCAKE_SLICE: u64 = 1 << 20;

struct Installed {
    sink: Arc<dyn CompletionSink>,
    settings: Arc<LaneSettings>,
    lanes_per_peer: usize,
    /// One data listener per local rail, in rail order.
    listeners: Vec<(Rail, Server)>,
    /// The listener for Mooncake initiators (`MC_TE_MOONCAKE_COMPAT=1`).
    mooncake: Option<Server>,
    counters: Arc<Vec<RailCounters>>,
    /// The event loops driving every lane.
    dialer: initiator::dialer::Dialer,
}

/// The lanes to one (local rail, remote rail address): te-tcp's endpoint.
type Endpoint = Arc<Vec<Lane>>;

/// The TCP transport. Create it, then hand it to `TransferEngine::install_transport`.
pub struct TcpTransport {
    installed: RwLock<Option<Installed>>,
    /// Endpoints by peer address, bounded by `MC_MAX_EP_PER_CTX` with `MC_ENDPOINT_STORE_TYPE`
    /// eviction. An evicted endpoint stops taking slices; its lanes finish what is in flight and
    /// then close their connections (the target's side ends with them).
    peers: Mutex<EndpointStore<PeerKey, Endpoint>>,
    /// The sink given at install, kept after shutdown so a late slice is still reported.
    sink: std::sync::OnceLock<Arc<dyn CompletionSink>>,
    /// GPU regions, whose slices are staged through host memory on both sides.
    staging: Arc<staging::GpuStaging>,
    /// Settings given at creation; otherwise read from the environment at install.
    settings: Option<TcpSettings>,
}

impl Default for TcpTransport {
    fn default() -> Self {
        TcpTransport {
            installed: RwLock::new(None),
            peers: Mutex::new(EndpointStore::new(65535, EvictionPolicy::Sieve)),
            sink: std::sync::OnceLock::new(),
            staging: Arc::default(),
            settings: None,
        }
    }
}

fn close_all(endpoints: Vec<(PeerKey, Endpoint)>) {
    for (_, lanes) in endpoints {
        lanes.iter().for_each(Lane::close);
    }
}

impl std::fmt::Debug for TcpTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpTransport")
            .field("port", &self.data_port())
            .finish()
    }
}

impl TcpTransport {
    /// A transport not yet installed.
    pub fn new() -> Self {
        Self::default()
    }

    /// A transport not yet installed, with `settings` instead of the environment's.
    pub fn with_settings(settings: TcpSettings) -> Self {
        TcpTransport {
            settings: Some(settings),
            ..Self::default()
        }
    }

    /// The first rail's data listener port, once installed.
    pub fn data_port(&self) -> Option<u16> {
        self.installed
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .and_then(|i| i.listeners.first())
            .map(|(_, l)| l.local_addr().port())
    }

    fn lanes_for(&self, key: &PeerKey) -> Result<Arc<Vec<Lane>>, String> {
        let known = self
            .peers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
            .cloned();
        if let Some(lanes) = known {
            // A connect failed since the address was resolved: the name may have moved (a
            // restarted peer), so it is resolved again here, never on a lane loop.
            if lanes.iter().any(Lane::address_stale) {
                match initiator::peer_address(key) {
                    Ok(to) => lanes.iter().for_each(|l| l.readdress(to)),
                    Err(e) => {
                        debug!(host = %key.host, error = %e, "peer address not resolved again")
                    }
                }
            }
            return Ok(lanes);
        }
        // A new peer: its address is resolved here, on the posting thread and outside the
        // peers' lock, so a slow name service holds up neither the lane loops nor posts to
        // other peers.
        let to = initiator::peer_address(key)?;
        let mut peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(lanes) = peers.get(key) {
            return Ok(lanes.clone());
        }
        let installed = self.installed.read().unwrap_or_else(|e| e.into_inner());
        let inst = installed.as_ref().ok_or("tcp transport is not installed")?;
        let placement = initiator::dialer::Placement::for_framing(key.framing);
        let placed = inst.dialer.place(inst.lanes_per_peer, placement);
        let lanes = placed
            .into_iter()
            .map(|home| {
                Lane::new(
                    key.clone(),
                    to,
                    inst.settings.clone(),
                    inst.sink.clone(),
                    home,
                )
            })
            .collect::<Vec<_>>();
        let lanes = Arc::new(lanes);
        close_all(peers.insert(key.clone(), lanes.clone()));
        Ok(lanes)
    }

    /// Reports `op` failed on its path. Every slice handed to `post` is reported, even after
    /// shutdown.
    fn fail(&self, op: SliceOp, reason: String) {
        self.report(op, SliceError::Path(reason));
    }

    fn report(&self, op: SliceOp, error: SliceError) {
        if let Some(sink) = self.sink.get() {
            sink.complete(op, Err(error));
        }
    }
}

/// Where slice `op` goes, from the local rail's address: a te target's remote rail (te's
/// framing), or a Mooncake target's `tcp_data_host:tcp_data_port` (Mooncake's acknowledged
/// framing). A target is Mooncake's when its descriptor has no `te_wire_version`. A WRITE to a
/// Mooncake target without the acknowledged framing (`tcp_proto_version` below 2) is refused
/// before anything is sent: its completion could not be known.
fn peer_key(op: &SliceOp, rails: &[(Rail, Server)]) -> Result<PeerKey, SliceError> {
    let local_ip = rails
        .get(usize::from(op.local_rail))
        .map(|(r, _)| r.ip)
        .ok_or_else(|| SliceError::Path(format!("no local rail {}", op.local_rail)))?;
    let seg = &op.target;
    let desc = seg.desc();
    if !desc.is_mooncake() {
        if desc.te_wire_version < Some(2) {
            return Err(SliceError::Unsupported(format!(
                "segment {} speaks te's wire version {} (the segment secret in every request), \
                 which this te no longer sends: upgrade its engine",
                seg.name(),
                desc.te_wire_version.unwrap_or(0)
            )));
        }
        let rail = desc
            .te_rails
            .get(usize::from(op.remote_rail))
            .ok_or_else(|| {
                SliceError::Path(format!(
                    "segment {} publishes no tcp rail {}",
                    seg.name(),
                    op.remote_rail
                ))
            })?;
        return Ok(PeerKey {
            local_ip,
            host: rail.ip.clone(),
            port: rail.port,
            framing: Framing::Te,
        });
    }
    let port = desc.tcp_data_port.filter(|p| *p != 0).ok_or_else(|| {
        SliceError::Path(format!("segment {} publishes no tcp_data_port", seg.name()))
    })?;
    let acked = desc.tcp_proto_version.unwrap_or(1) >= 2;
    if !acked && op.opcode != te_core::Opcode::Read {
        return Err(SliceError::Unsupported(format!(
            "segment {} is a Mooncake target without acknowledged TCP writes \
             (tcp_proto_version {}): a WRITE could not be confirmed, so te does not send it",
            seg.name(),
            desc.tcp_proto_version.unwrap_or(1)
        )));
    }
    let host = desc
        .tcp_data_host
        .as_deref()
        .filter(|h| !h.is_empty())
        .unwrap_or(seg.host());
    Ok(PeerKey {
        local_ip,
        host: host.to_string(),
        port,
        framing: Framing::Mooncake { acked },
    })
}

/// Starts the listener for Mooncake initiators on the engine's bind address (the host a
/// Mooncake peer reaches the engine's control listener at), and says loudly what it opens.
fn start_mooncake_listener(
    ctx: &InstallContext,
    tcp: &TcpSettings,
    staging: &Arc<staging::GpuStaging>,
) -> Result<Server, String> {
    let state = Arc::new(mooncake_target::CompatState {
        regions: ctx.regions.clone(),
        compat: ctx.config.mooncake.clone(),
        tcp: tcp.clone(),
        stall_timeout: tcp.status_timeout,
        staging: staging.clone(),
    });
    let listener = std::net::TcpListener::bind((ctx.bind_ip, 0)).map_err(|e| {
        format!(
            "binding the Mooncake-compatible listener on {}: {e}",
            ctx.bind_ip
        )
    })?;
    let listener = mooncake_target::start(listener, state, &ctx.config.limits, &tcp.congestion)
        .map_err(|e| format!("starting the Mooncake-compatible listener: {e}"))?;
    let allow = ctx.config.mooncake.allow.as_ref().map_or_else(
        || "ANY address that reaches it (no MC_TE_MOONCAKE_ALLOW)".to_string(),
        ToString::to_string,
    );
    warn!(
        addr = %listener.local_addr(),
        segment = %ctx.local_name,
        allowed = %allow,
        v1 = ctx.config.mooncake.allow_v1,
        "MC_TE_MOONCAKE_COMPAT: this listener serves Mooncake initiators WITHOUT ANY CREDENTIAL: \
         every remotely accessible region can be read (and, where writable, written) by whoever \
         is allowed to connect; te still checks bounds, permissions and pins"
    );
    Ok(listener)
}

impl Transport for TcpTransport {
    fn name(&self) -> &'static str {
        "tcp"
    }

    fn capabilities(&self) -> te_core::transport::Capabilities {
        use te_core::transport::Capabilities as C;
        let host = C::DRAM_REMOTE_HOST | C::DRAM_SAME_HOST;
        // GPU memory moves too, staged through host memory, where te-tcp is built with `cuda`
        // and a CUDA driver is present.
        match staging::driver_present() {
            true => host | C::GPU_REMOTE_HOST | C::GPU_SAME_HOST,
            false => host,
        }
    }

    fn register(&self, region: &Arc<te_core::memory::Region>) -> te_core::Result<()> {
        self.staging.add(region);
        Ok(())
    }

    fn unregister(&self, region: &te_core::memory::Region) {
        self.staging.remove(region.addr());
    }

    fn install(&self, ctx: InstallContext) -> te_core::Result<()> {
        let err = |reason: String| te_core::Error::Transport {
            transport: "tcp",
            reason,
        };
        let tcp = match &self.settings {
            Some(s) => s.clone(),
            None => TcpSettings::from_env()?,
        };
        let protocol = Arc::new(native_target::TargetProtocol {
            state: TargetState {
                regions: ctx.regions.clone(),
                secret: ctx.secret,
                stall_timeout: tcp.status_timeout,
                staging: self.staging.clone(),
            },
            reply_bytes: ctx.config.limits.conn_reply_bytes,
        });
        let mut listeners = Vec::with_capacity(ctx.rails.len());
        for rail in &ctx.rails {
            let listener = std::net::TcpListener::bind((rail.ip, 0)).map_err(|e| {
                err(format!(
                    "binding the data listener of rail {} on {}: {e}",
                    rail.name, rail.ip
                ))
            })?;
            let listener = native_target::start(
                listener,
                protocol.clone(),
                &ctx.config.limits,
                &tcp.congestion,
            )
            .map_err(|e| {
                err(format!(
                    "starting the data listener of rail {}: {e}",
                    rail.name
                ))
            })?;
            info!(rail = %rail.name, addr = %listener.local_addr(), segment = %ctx.local_name, "tcp rail serving");
            listeners.push((rail.clone(), listener));
        }
        let mooncake = match ctx.config.mooncake.enabled {
            true => Some(start_mooncake_listener(&ctx, &tcp, &self.staging).map_err(err)?),
            false => None,
        };
        let counters = Arc::new(
            ctx.rails
                .iter()
                .map(|r| RailCounters::new(r.name.clone()))
                .collect::<Vec<_>>(),
        );
        let sink: Arc<dyn CompletionSink> = Arc::new(CountingSink {
            inner: ctx.sink,
            rails: counters.clone(),
        });
        *self.peers.lock().unwrap_or_else(|e| e.into_inner()) = EndpointStore::new(
            ctx.config.max_ep_per_ctx as usize,
            ctx.config.endpoint_store,
        );
        let _ = self.sink.set(sink.clone());
        let limits = &ctx.config.limits;
        let dialer = initiator::dialer::Dialer::start(limits.client_threads)
            .map_err(|e| err(format!("starting the lane loops: {e}")))?;
        *self.installed.write().unwrap_or_else(|e| e.into_inner()) = Some(Installed {
            sink,
            settings: Arc::new(LaneSettings {
                connect_timeout: ctx.config.handshake_connect_timeout,
                status_timeout: tcp.status_timeout,
                staging: self.staging.clone(),
                congestion: tcp.congestion.clone(),
            }),
            lanes_per_peer: tcp.lanes_per_peer,
            listeners,
            mooncake,
            counters,
            dialer,
        });
        Ok(())
    }

    fn describe(&self, desc: &mut SegmentDesc) {
        let installed = self.installed.read().unwrap_or_else(|e| e.into_inner());
        let Some(inst) = installed.as_ref() else {
            return;
        };
        desc.te_rails = inst
            .listeners
            .iter()
            .map(|(rail, l)| RailAddr {
                name: rail.name.clone(),
                ip: rail.ip.to_string(),
                port: l.local_addr().port(),
            })
            .collect();
        // te's listeners are published in `te_rails` only, never as Mooncake's `tcp_data_port`:
        // a Mooncake initiator that found one would speak its own framing to it, and in its
        // unacknowledged framing take an unapplied WRITE for done. With no port to reach it
        // fails loudly instead. Mooncake's port is the opt-in listener, when there is one.
        let mooncake = inst.mooncake.as_ref().map(Server::local_addr);
        desc.tcp_data_port = mooncake.map(|a| a.port());
        desc.tcp_data_host = mooncake.map(|a| a.ip().to_string());
        desc.tcp_proto_version = mooncake.map(|_| 2);
    }

    fn post(&self, slices: Vec<SliceOp>) {
        // A lone slice may be carried out on this thread (its caller waits for it at once).
        let lone = slices.len() == 1;
        let keys: Vec<Result<PeerKey, SliceError>> = {
            let installed = self.installed.read().unwrap_or_else(|e| e.into_inner());
            let Some(inst) = installed.as_ref() else {
                drop(installed);
                slices
                    .into_iter()
                    .for_each(|op| self.fail(op, "tcp transport is not installed".into()));
                return;
            };
            for op in &slices {
                if let Some(c) = inst.counters.get(usize::from(op.local_rail)) {
                    c.posted(op.len);
                }
            }
            slices
                .iter()
                .map(|op| peer_key(op, &inst.listeners))
                .collect()
        };
        let mut groups: Vec<Shares> = Vec::new();
        let mut current: Option<(PeerKey, usize)> = None;
        for (op, key) in slices.into_iter().zip(keys) {
            let key = match key {
                Ok(k) => k,
                Err(error) => {
                    self.report(op, error);
                    continue;
                }
            };
            if current.as_ref().is_none_or(|(k, _)| *k != key) {
                match self.lanes_for(&key) {
                    Ok(lanes) => {
                        let at = match groups.iter().position(|g| g.is_for(&lanes)) {
                            Some(at) => at,
                            None => {
                                groups.push(Shares::new(lanes));
                                groups.len() - 1
                            }
                        };
                        current = Some((key, at));
                    }
                    Err(reason) => {
                        self.fail(op, reason);
                        continue;
                    }
                }
            }
            if let Some((_, at)) = current.as_ref() {
                groups[*at].add(op, lone);
            }
        }
        for group in groups {
            for op in group.hand_off() {
                self.fail(op, "lane closed".into());
            }
        }
    }

    fn slice_size(&self, target: &RemoteSegment) -> Option<u64> {
        target.desc().is_mooncake().then_some(MOONCAKE_SLICE)
    }

    fn rail_stats(&self) -> Vec<RailStats> {
        let installed = self.installed.read().unwrap_or_else(|e| e.into_inner());
        installed.as_ref().map_or_else(Vec::new, |i| {
            i.counters.iter().map(RailCounters::stats).collect()
        })
    }

    fn close_segment(&self, segment: &RemoteSegment) {
        let desc = segment.desc();
        let serves = |k: &PeerKey| {
            desc.te_rails
                .iter()
                .any(|r| r.ip == k.host && r.port == k.port)
                || (Some(k.port) == desc.tcp_data_port
                    && (k.host == segment.host()
                        || Some(k.host.as_str()) == desc.tcp_data_host.as_deref()))
        };
        let closed = self
            .peers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove_where(serves);
        close_all(closed);
    }

    fn shutdown(&self) {
        let all = self.peers.lock().unwrap_or_else(|e| e.into_inner()).drain();
        close_all(all);
        // Taken out first: the lock must not be held while the loops are joined, since a loop
        // failing its lanes' slices reports them, and the engine posts retries back here.
        let installed = self
            .installed
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(inst) = installed {
            inst.dialer.shutdown();
            inst.listeners.iter().for_each(|(_, l)| l.shutdown());
            if let Some(l) = inst.mooncake.as_ref() {
                l.shutdown();
            }
        }
    }
}
