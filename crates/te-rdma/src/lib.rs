//! te-rdma: one-sided RDMA READ and WRITE between registered memory over RC queue pairs.
//!
//! - Every verbs device (or those named, or those `MC_TE_FILTERS` admits) is opened at install ([`verbs::Nic`]): PD, one
//!   completion lane per worker (`MC_WORKERS_PER_CTX`), each with a completion channel and its
//!   share of `MC_NUM_CQ_PER_CTX` CQs; the port's GID (the rail's interface and address,
//!   routable before link-local, RoCE v2 first: [`gid`]; `MC_GID_INDEX` overrides) and MTU. A thread per device reads its async events: a port down or a fatal
//!   error marks the device inactive and fails its queue pairs so their slices retry elsewhere;
//!   the port coming back reactivates it.
//! - Each registered region gets memory regions per device with access from its permission,
//!   split at `MC_MAX_MR_SIZE`; the descriptor publishes `devices[]` and each buffer's `rkey[]`
//!   (Mooncake's fields; a split buffer lists every piece's keys and its `te_mr_chunk`).
//! - Slices go to the device serving the local rail the engine chose from the priority matrix
//!   and rail health ([`route`]), skipping devices paused after errors or down ([`failover`]);
//!   the remote rail picks the remote device the same way.
//! - Endpoints (`MC_NUM_QP_PER_EP` RC QPs per local device, lane, target segment and remote
//!   device) are set up on first use by the lane's worker, never the submitting thread, through
//!   the control channel's `Connection` frame. The target checks the segment secret before it
//!   makes its queue pairs, and the cluster secret guards the channel when set. Each side's QPs
//!   carry only its own requests, so simultaneous connects from both ends make two pairs.
//! - Workers (the `worker` module) post slices as signalled READ/WRITE work requests, poll in batches,
//!   and sleep on the completion channel when nothing moves.
//! - Mooncake engines (`mooncake.rs`): their handshakes are answered in their dialect
//!   under the Mooncake opt-in (`MC_TE_MOONCAKE_COMPAT`, its allow-list), te handshakes with
//!   Mooncake targets in their dialect, QPs start at PSN 0, and one QP set per (device, peer
//!   NIC path) serves both directions, as in Mooncake. Published GIDs are in Mooncake's text
//!   form; with the opt-in, the priority matrix names every device at every location, in
//!   `devices[]` order, which is how Mooncake indexes devices and keys.
//! - A sweep thread (`sweep.rs`) dials the initiators a target keeps queue pairs for, te's and
//!   Mooncake's, and drops the queue pairs of those that are gone ([`liveness`]).

#![deny(unsafe_code)]

mod connect;
mod events;
pub mod failover;
pub mod gid;
mod handshake;
pub mod liveness;
mod mooncake;
mod refusals;
pub mod route;
pub mod settings;
mod sweep;
pub mod verbs;
mod worker;

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use handshake::{Handshake, MAX_QPS_PER_EP, Request, check_shape, parse_request, request_proof};
use serde_json::json;
use te_core::Config;
use te_core::control::ControlState;
use te_core::memory::Region;
use te_core::segment::{DeviceDesc, RemoteSegment, SegmentDesc, SegmentSecret};
use te_core::transport::{Capabilities, CompletionSink, InstallContext, SliceOp, Transport};
use te_workers::EndpointStore;
use tracing::{debug, info, warn};
use verbs::{Endpoint, Mr, Nic, QpInfo, VerbsOptions};

/// Settings of the RDMA transport.
#[derive(Clone, Debug)]
pub struct RdmaOptions {
    /// Devices to use (`rxe0`, `mlx5_0`); `None` means every device.
    pub devices: Option<Vec<String>>,
    /// The verbs layer's settings (its `lanes` come from `MC_WORKERS_PER_CTX` at install).
    pub verbs: VerbsOptions,
    /// Largest memory region (`MC_MAX_MR_SIZE`); larger regions register in pieces.
    pub max_mr_size: u64,
    /// How often a target dials the initiators it keeps queue pairs for, to let go of those
    /// that are gone (`MC_TE_RDMA_PEER_SWEEP_SECS`, default 30; [`liveness`]).
    pub peer_sweep: Duration,
}

impl Default for RdmaOptions {
    fn default() -> Self {
        RdmaOptions {
            devices: None,
            verbs: VerbsOptions::default(),
            max_mr_size: crate::settings::MAX_MR_SIZE.initial(),
            peer_sweep: Duration::from_secs(crate::settings::TE_RDMA_PEER_SWEEP_SECS.initial()),
        }
    }
}

impl RdmaOptions {
    /// Defaults overridden by `MC_IB_PORT`, `MC_GID_INDEX`, `MC_MAX_WR`, `MC_IB_SL`, `MC_IB_TC`,
    /// `MC_MTU`, `MC_NUM_CQ_PER_CTX`, `MC_MAX_MR_SIZE` and te's `MC_IB_TIMEOUT` and
    /// `MC_TE_RDMA_PEER_SWEEP_SECS`.
    ///
    /// # Errors
    /// [`te_core::Error::InvalidConfig`] naming a bad variable.
    pub fn from_env() -> te_core::Result<Self> {
        Self::from_lookup(te_sys::env::process)
    }

    /// As [`from_env`](Self::from_env), with `lookup` giving the variables (te-tent passes
    /// its configuration file's keys mapped onto them).
    ///
    /// # Errors
    /// As [`from_env`](Self::from_env).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> te_core::Result<Self> {
        let mut o = RdmaOptions::default();
        let num = |s: &te_sys::env::Setting| -> te_core::Result<Option<u64>> {
            match lookup(s.name).filter(|v| !v.trim().is_empty()) {
                None => Ok(None),
                Some(v) => Ok(Some(s.number(&v)?)),
            }
        };
        if let Some(p) = num(&crate::settings::IB_PORT)? {
            o.verbs.port = p as u8;
        }
        o.verbs.gid_index = num(&crate::settings::GID_INDEX)?.map(|g| g as u32);
        if let Some(w) = num(&crate::settings::MAX_WR)? {
            o.verbs.max_wr = w as u32;
        }
        if let Some(t) = num(&crate::settings::IB_TIMEOUT)? {
            o.verbs.timeout = t as u8;
        }
        if let Some(sl) = num(&crate::settings::IB_SL)? {
            o.verbs.service_level = sl as u8;
        }
        if let Some(tc) = num(&crate::settings::IB_TC)? {
            o.verbs.traffic_class = tc as u8;
        }
        o.verbs.mtu = num(&crate::settings::MTU)?.map(|m| m as u32);
        if let Some(c) = num(&crate::settings::NUM_CQ_PER_CTX)? {
            o.verbs.cqs = c as u32;
        }
        if let Some(m) = num(&crate::settings::MAX_MR_SIZE)? {
            o.max_mr_size = m;
        }
        if let Some(s) = num(&crate::settings::TE_RDMA_PEER_SWEEP_SECS)? {
            o.peer_sweep = Duration::from_secs(s);
        }
        Ok(o)
    }
}

/// The queue pairs of one endpoint (`MC_NUM_QP_PER_EP`), used in turn.
type Group = Arc<Vec<Arc<Endpoint>>>;

/// One lane's queue of slices.
type Queue = Mutex<VecDeque<SliceOp>>;

/// One registered region: its pieces' memory regions on each device.
struct LocalRegion {
    len: u64,
    /// Bytes per piece (`MC_MAX_MR_SIZE`); the last piece may be shorter.
    chunk: u64,
    /// `[device][piece]`.
    mrs: Vec<Vec<Mr>>,
}

/// Where a local range lies in its registered region (see [`State::local_keys`]).
struct LocalKeys {
    offset: u64,
    chunk: u64,
    first: usize,
    keys: Vec<u32>,
}

/// Whom the sweep watches for a passive group ([`State::keep_passive`]).
enum Watch {
    /// As before (te's own use of a set it shares with a Mooncake peer).
    Unchanged,
    /// No one: the initiator named no listener that may be dialled.
    Nobody,
    /// The initiator listening there.
    At(std::net::SocketAddr, liveness::Listener),
}

/// Endpoint key: (segment id, local device, remote device, lane).
type EndpointKey = (u64, usize, usize, usize);

struct State {
    nics: Vec<Arc<Nic>>,
    /// `[device][lane]`.
    queues: Vec<Vec<Arc<Queue>>>,
    /// Where each device's next slice goes among its lanes.
    next_lane: Vec<AtomicUsize>,
    /// The device serving each local rail (by name or interface), if any.
    rail_devices: Vec<Option<usize>>,
    /// Region start → its memory regions.
    regions: Mutex<BTreeMap<u64, LocalRegion>>,
    max_mr_size: u64,
    /// Initiator endpoints. Bounded by `MC_MAX_EP_PER_CTX` per device, evicted by
    /// `MC_ENDPOINT_STORE_TYPE`.
    endpoints: Mutex<EndpointStore<EndpointKey, Group>>,
    /// Target-side endpoints by the initiator's NIC path, the target device's and the
    /// initiator's lane, bounded the same way.
    passive: Mutex<EndpointStore<String, Group>>,
    sink: Arc<dyn CompletionSink>,
    /// Each device's load, in `nics`' order (`nic_load_stats`).
    load: Vec<te_metrics::rail::RailCounters>,
    local_name: String,
    secret: SegmentSecret,
    control: Arc<ControlState>,
    config: Arc<Config>,
    stop: AtomicBool,
    /// Raised at shutdown: wakes the event readers out of their wait.
    stopping: verbs::Signal,
    /// Devices and remote devices paused after errors.
    pauses: Mutex<failover::Pauses>,
    /// Endpoint set-ups that failed, so the slices behind one do not each try again.
    refusals: Mutex<refusals::Refusals<RemoteSegment>>,
    /// This engine's control listener, which te's handshakes name (`te_control`).
    control_addr: std::net::SocketAddr,
    /// The initiators behind the passive groups, dialled by the sweep.
    initiators: Mutex<liveness::Initiators>,
}

/// The RDMA transport.
pub struct RdmaTransport {
    options: RdmaOptions,
    state: OnceLock<Arc<State>>,
    /// The workers and event readers, joined at shutdown: they hold the state, and with it
    /// every queue pair and memory region.
    threads: te_workers::Threads,
}

impl std::fmt::Debug for RdmaTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RdmaTransport")
            .field("options", &self.options)
            .finish()
    }
}

impl RdmaTransport {
    /// A transport with `options`; devices open at install.
    pub fn new(options: RdmaOptions) -> Self {
        RdmaTransport {
            options,
            state: OnceLock::new(),
            threads: te_workers::Threads::default(),
        }
    }

    /// Queue pairs this side has connected to targets (each endpoint has `MC_NUM_QP_PER_EP`).
    pub fn queue_pairs(&self) -> usize {
        self.state.get().map_or(0, |s| {
            let groups = s.endpoints.lock().unwrap_or_else(|e| e.into_inner()).len();
            groups * (s.config.num_qp_per_ep as usize).clamp(1, MAX_QPS_PER_EP)
        })
    }

    /// The devices this transport serves on (after install).
    pub fn devices(&self) -> Vec<String> {
        self.state
            .get()
            .map(|s| s.nics.iter().map(|n| n.name.clone()).collect())
            .unwrap_or_default()
    }

    /// The devices that are up (their port active, no fatal event), as async events report.
    pub fn active_devices(&self) -> Vec<String> {
        self.state
            .get()
            .map(|s| {
                s.nics
                    .iter()
                    .filter(|n| n.is_active())
                    .map(|n| n.name.clone())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Memory regions registered on each device for the region at `addr` (after install).
    pub fn memory_regions(&self, addr: u64) -> usize {
        self.state.get().map_or(0, |s| {
            let regions = s.regions.lock().unwrap_or_else(|e| e.into_inner());
            regions
                .get(&addr)
                .map_or(0, |r| r.mrs.first().map_or(0, Vec::len))
        })
    }
}

impl State {
    /// Reports `op`, posted on device `nic`, to the engine, settling the device's load.
    fn settle(&self, nic: usize, op: SliceOp, outcome: Result<(), te_core::transport::SliceError>) {
        if let Some(load) = self.load.get(nic) {
            load.settled(op.len, te_core::transport::settled(&outcome));
        }
        self.sink.complete(op, outcome);
    }

    /// For `[addr, addr+len)`: its offset in the registered region holding it, the region's
    /// piece size, the index of the first piece it touches, and the local keys on device `nic`
    /// of the pieces it touches.
    fn local_keys(&self, nic: usize, addr: u64, len: u64) -> Option<LocalKeys> {
        let regions = self.regions.lock().unwrap_or_else(|e| e.into_inner());
        let (start, r) = regions.range(..=addr).next_back()?;
        if len == 0 || addr + len > start + r.len {
            return None;
        }
        let first = ((addr - start) / r.chunk) as usize;
        let last = ((addr + len - 1 - start) / r.chunk) as usize;
        let keys = r.mrs.get(nic)?.get(first..=last)?.iter().map(Mr::lkey);
        Some(LocalKeys {
            offset: addr - start,
            chunk: r.chunk,
            first,
            keys: keys.collect(),
        })
    }

    /// Answers a peer's handshake: checks its proof of the segment secret (te) or the Mooncake
    /// opt-in and its allow-list (Mooncake), makes and connects the QPs.
    fn accept(&self, payload: &[u8], peer: Option<std::net::SocketAddr>) -> Vec<u8> {
        let refuse = |why: &str| json!({"reply_msg": why}).to_string().into_bytes();
        let (req, proof) = match parse_request(payload) {
            Ok(Request::Te(req, proof)) => (req, proof),
            Ok(Request::Mooncake(req, qps)) => {
                return match self.accept_mooncake(req, &qps, peer) {
                    Ok(reply) => reply,
                    Err(why) => refuse(&why),
                };
            }
            Err(why) => return refuse(why),
        };
        if !te_core::control::auth::same_bytes(&request_proof(&self.secret, &req), &proof) {
            return refuse("bad segment secret proof");
        }
        if let Err(why) = check_shape(&req) {
            return refuse(why);
        }
        let dev = req
            .peer_nic_path
            .rsplit_once('@')
            .map_or("", |(_, d)| d)
            .to_string();
        let Some(nic) = self.nics.iter().find(|n| n.name == dev) else {
            return refuse(&format!("no device {dev} here"));
        };
        let mut group = Vec::with_capacity(req.te_qps.len());
        for remote in &req.te_qps {
            match nic
                .endpoint()
                .and_then(|ep| ep.connect(remote).map(|()| ep))
            {
                Ok(ep) => group.push(Arc::new(ep)),
                Err(e) => return refuse(&e),
            }
        }
        let infos: Vec<QpInfo> = group.iter().map(|e| e.info()).collect();
        let key = format!(
            "{}>{}#{}",
            req.local_nic_path, req.peer_nic_path, req.te_lane
        );
        let control = liveness::control_address(req.te_control.as_deref(), peer, is_local_ip);
        let watch = control.map_or(Watch::Nobody, |a| Watch::At(a, liveness::Listener::Te));
        self.keep_passive(key, Arc::new(group), watch);
        debug!(peer = %req.local_nic_path, qps = infos.len(), "accepted an RDMA endpoint");
        serde_json::to_vec(&Handshake {
            local_nic_path: req.peer_nic_path,
            peer_nic_path: req.local_nic_path,
            qp_num: infos.iter().map(|q| q.qp_num).collect(),
            reply_msg: String::new(),
            te_qps: infos,
            te_proof: None,
            te_lane: req.te_lane,
            ..Handshake::default()
        })
        .unwrap_or_default()
    }

    fn pause_remote(&self, segment: u64, dev: usize) {
        warn!(segment, dev, "pausing a remote RDMA device after an error");
        self.pauses
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pause_remote(segment, dev, std::time::Instant::now());
    }

    /// Keeps `group` in the passive store under `key`, with whom the sweep watches for it
    /// (`watch`); the groups the store evicts for it are no longer the sweep's concern. Both
    /// change under the initiators' lock, which the sweep holds while it drops groups, so it
    /// never drops a group that replaced the one it found gone.
    fn keep_passive(&self, key: String, group: Group, watch: Watch) {
        let evicted = {
            let mut initiators = self.initiators.lock().unwrap_or_else(|e| e.into_inner());
            let evicted = self
                .passive
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(key.clone(), group);
            for (k, _) in evicted.iter().filter(|(k, _)| *k != key) {
                initiators.remove(k);
            }
            match watch {
                Watch::Unchanged => {}
                Watch::Nobody => initiators.remove(&key),
                Watch::At(addr, listener) => initiators.insert(key, addr, listener),
            }
            evicted
        };
        // Out of the store and the sweep's sight: their queue pairs are destroyed here, with
        // no lock held, so handshakes and the sweep do not wait on the device.
        drop(evicted);
    }

    fn pause_local(&self, nic: usize) {
        warn!(device = %self.nics[nic].name, "pausing an RDMA device after an error");
        self.pauses
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pause_local(nic, std::time::Instant::now());
    }
}

/// The devices `MC_TE_FILTERS` and `MC_TE_FILTERS_EXCLUDE` leave: the exclusions always; the
/// allow-list only when it names a verbs device (it may list only interfaces, for TCP rails).
fn filtered(devices: Vec<String>, filter: &te_topology::NicFilter) -> Vec<String> {
    let allow = filter
        .allow
        .as_ref()
        .filter(|a| devices.iter().any(|d| a.contains(d)));
    devices
        .into_iter()
        .filter(|d| !filter.deny.contains(d) && allow.is_none_or(|a| a.contains(d)))
        .collect()
}

/// What a slice gets that is not posted because the transport shuts down.
fn shut_down() -> te_core::transport::SliceError {
    te_core::transport::SliceError::Path("rdma transport shut down".into())
}

/// Whether `ip` is one of this host's addresses (a loopback one, or an interface's).
fn is_local_ip(ip: std::net::IpAddr) -> bool {
    ip.is_loopback()
        || te_sys::interface_addrs()
            .iter()
            .any(|a| a.ip.to_canonical() == ip)
}

impl Transport for RdmaTransport {
    fn name(&self) -> &'static str {
        "rdma"
    }

    fn capabilities(&self) -> Capabilities {
        let host = Capabilities::DRAM_REMOTE_HOST | Capabilities::DRAM_SAME_HOST;
        // GPU memory registers through dma-buf where te-rdma is built with `cuda` and a CUDA
        // driver is present.
        #[cfg(feature = "cuda")]
        if te_cuda::driver().is_ok() {
            return host | Capabilities::GPU_REMOTE_HOST;
        }
        host
    }

    fn install(&self, ctx: InstallContext) -> te_core::Result<()> {
        let fail = |reason: String| te_core::Error::Transport {
            transport: "rdma",
            reason,
        };
        let names = match &self.options.devices {
            Some(named) => named.clone(),
            None => filtered(verbs::device_names(), &ctx.config.nic_filter),
        };
        if names.is_empty() {
            return Err(fail(
                "no RDMA device (is rdma-core installed and a device present?)".into(),
            ));
        }
        let mut verbs = self.options.verbs.clone();
        verbs.lanes = ctx.config.workers_per_ctx.max(1);
        let places = verbs::GidPlaces {
            rails: ctx.rails.iter().map(|r| (r.name.clone(), r.ip)).collect(),
            bind: Some(ctx.bind_ip).filter(|ip| !ip.is_unspecified() && !ip.is_loopback()),
        };
        let nics = names
            .iter()
            .map(|n| Nic::open(n, &verbs, &places))
            .collect::<Result<Vec<_>, _>>()
            .map_err(fail)?;
        let nics_len = nics.len();
        let load = nics
            .iter()
            .map(|n| te_metrics::rail::RailCounters::new(n.name.clone()))
            .collect();
        let devices = nics.iter().map(|n| (n.name.as_str(), n.netdev.as_deref()));
        let rail_devices = ctx
            .rails
            .iter()
            .map(|r| route::device_for_rail(&r.name, devices.clone()))
            .collect();
        let state = Arc::new(State {
            queues: nics
                .iter()
                .map(|n| (0..n.lanes()).map(|_| Arc::new(Queue::default())).collect())
                .collect(),
            next_lane: nics.iter().map(|_| AtomicUsize::new(0)).collect(),
            rail_devices,
            max_mr_size: self.options.max_mr_size.max(4096),
            nics,
            regions: Mutex::new(BTreeMap::new()),
            endpoints: Mutex::new(EndpointStore::new(
                ctx.config.max_ep_per_ctx as usize * nics_len,
                ctx.config.endpoint_store,
            )),
            passive: Mutex::new(EndpointStore::new(
                ctx.config.max_ep_per_ctx as usize * nics_len,
                ctx.config.endpoint_store,
            )),
            sink: ctx.sink,
            load,
            local_name: ctx.local_name.clone(),
            secret: ctx.secret,
            control: ctx.control.clone(),
            pauses: Mutex::new(failover::Pauses::new(nics_len, ctx.config.rail_pause)),
            refusals: Mutex::default(),
            control_addr: ctx.control_addr,
            initiators: Mutex::default(),
            config: ctx.config,
            stop: AtomicBool::new(false),
            stopping: verbs::Signal::new().map_err(fail)?,
        });
        let handler_state = Arc::downgrade(&state);
        ctx.control.set_connection_handler(Arc::new(
            move |payload: &[u8], peer| match handler_state.upgrade() {
                Some(s) => s.accept(payload, peer),
                None => br#"{"reply_msg":"rdma transport is shut down"}"#.to_vec(),
            },
        ));
        for (i, nic) in state.nics.iter().enumerate() {
            for lane in 0..nic.lanes() {
                let s = state.clone();
                let worker = std::thread::Builder::new()
                    .name(format!("te-rdma-{}-{lane}", nic.name))
                    .spawn(move || worker::run(s, i, lane))
                    .map_err(|e| fail(format!("spawning a worker: {e}")))?;
                self.threads.push(worker);
            }
            let s = state.clone();
            let reader = std::thread::Builder::new()
                .name(format!("te-rdma-{}-ev", nic.name))
                .spawn(move || events::watch(s, i))
                .map_err(|e| fail(format!("spawning an event reader: {e}")))?;
            self.threads.push(reader);
        }
        let (s, every) = (Arc::downgrade(&state), self.options.peer_sweep);
        std::thread::Builder::new()
            .name("te-rdma-sweep".into())
            .spawn(move || sweep::run(&s, every))
            .map_err(|e| fail(format!("spawning the initiator sweep: {e}")))?;
        info!(devices = ?names, lanes = verbs.lanes, "rdma transport installed");
        self.state
            .set(state)
            .map_err(|_| fail("already installed".into()))
    }

    fn describe(&self, desc: &mut SegmentDesc) {
        let Some(state) = self.state.get() else {
            return;
        };
        desc.devices = state
            .nics
            .iter()
            .map(|n| DeviceDesc {
                name: n.name.clone(),
                lid: n.lid,
                gid: n.gid_string(),
                te_netdev: n.netdev.clone(),
            })
            .collect();
        let regions = state.regions.lock().unwrap_or_else(|e| e.into_inner());
        for b in &mut desc.buffers {
            if let Some(r) = regions.get(&b.addr) {
                // Piece after piece, each with one key per device (Mooncake's layout for one).
                let pieces = r.mrs.first().map_or(0, Vec::len);
                let keys = |f: fn(&Mr) -> u32| -> Vec<u32> {
                    (0..pieces)
                        .flat_map(|p| r.mrs.iter().map(move |dev| f(&dev[p])))
                        .collect()
                };
                b.rkey = keys(Mr::rkey);
                b.lkey = keys(Mr::lkey);
                b.te_mr_chunk = (pieces > 1).then_some(r.chunk);
            }
        }
        drop(regions);
        if state.config.mooncake.enabled {
            let names: Vec<String> = state.nics.iter().map(|n| n.name.clone()).collect();
            desc.priority_matrix = Some(mooncake::matrix(desc, &names));
        }
    }

    fn register(&self, region: &Arc<Region>) -> te_core::Result<()> {
        let Some(state) = self.state.get() else {
            return Ok(());
        };
        // Large regions register on every device at once (pinning is the slow part).
        let chunk = state.max_mr_size;
        if state.config.mooncake.enabled && region.len() > chunk {
            warn!(
                addr = region.addr(),
                len = region.len(),
                "a region larger than MC_MAX_MR_SIZE registers in pieces, whose keys Mooncake \
                 peers cannot read: they will refuse this segment's descriptor"
            );
        }
        let results: Vec<Result<Vec<Mr>, String>> = std::thread::scope(|s| {
            let handles: Vec<_> = state
                .nics
                .iter()
                .map(|nic| s.spawn(move || nic.register_region(region, chunk)))
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err("registration thread panicked".into()))
                })
                .collect()
        });
        let mut mrs = Vec::with_capacity(results.len());
        for result in results {
            let mr = result.map_err(|reason| te_core::Error::Transport {
                transport: "rdma",
                reason,
            })?;
            mrs.push(mr);
        }
        state
            .regions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(
                region.addr(),
                LocalRegion {
                    len: region.len(),
                    chunk,
                    mrs,
                },
            );
        Ok(())
    }

    fn unregister(&self, region: &Region) {
        if let Some(state) = self.state.get() {
            state
                .regions
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&region.addr());
        }
    }

    fn post(&self, slices: Vec<SliceOp>) {
        let Some(state) = self.state.get() else {
            warn!(slices = slices.len(), "rdma transport not installed");
            return;
        };
        let n = state.nics.len();
        let mut per: Vec<Vec<Vec<SliceOp>>> = state
            .nics
            .iter()
            .map(|nic| (0..nic.lanes()).map(|_| Vec::new()).collect())
            .collect();
        {
            let pauses = state.pauses.lock().unwrap_or_else(|e| e.into_inner());
            let now = std::time::Instant::now();
            for op in slices {
                let mapped = state
                    .rail_devices
                    .get(op.local_rail as usize)
                    .copied()
                    .flatten();
                let preferred = route::device_index(mapped, op.local_rail, n);
                let nic = failover::pick(preferred, n, |i| {
                    pauses.local_paused(i, now) || !state.nics[i].is_active()
                });
                state.load[nic].posted(op.len);
                let lanes = per[nic].len();
                // A Mooncake peer shares one QP set per device both ways: its slices take lane
                // 0, whose completion queues that set reports to.
                let lane = match op.target.desc().is_mooncake() {
                    true => 0,
                    false => state.next_lane[nic].fetch_add(1, Ordering::Relaxed) % lanes,
                };
                per[nic][lane].push(op);
            }
        }
        for (i, lanes) in per.into_iter().enumerate() {
            for (lane, ops) in lanes.into_iter().enumerate().filter(|(_, o)| !o.is_empty()) {
                let queue = &state.queues[i][lane];
                queue.lock().unwrap_or_else(|e| e.into_inner()).extend(ops);
                state.nics[i].wake(lane);
                // Queued after the lane's worker left at shutdown: nobody else will fail them.
                if state.stop.load(Ordering::SeqCst) {
                    let left: Vec<SliceOp> = (queue.lock())
                        .unwrap_or_else(|e| e.into_inner())
                        .drain(..)
                        .collect();
                    for op in left {
                        state.settle(i, op, Err(shut_down()));
                    }
                }
            }
        }
    }

    fn rail_stats(&self) -> Vec<te_core::transport::RailStats> {
        let Some(state) = self.state.get() else {
            return Vec::new();
        };
        let pauses = state.pauses.lock().unwrap_or_else(|e| e.into_inner());
        let now = std::time::Instant::now();
        (state.load.iter().enumerate())
            .map(|(i, load)| te_core::transport::RailStats {
                paused: pauses.local_paused(i, now),
                ..load.stats()
            })
            .collect()
    }

    fn close_segment(&self, segment: &RemoteSegment) {
        if let Some(state) = self.state.get() {
            state
                .endpoints
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove_where(|k| k.0 == segment.id());
        }
    }

    /// Stops the transport and returns once its threads are gone: slices queued and not yet
    /// posted fail, every queue pair moves to the error state so what is in flight flushes at
    /// once (a dead peer's would otherwise wait out its retries), and the workers and event
    /// readers are joined (a worker whose requests do not flush within 5 s, a device no longer
    /// answering, reports them failed with an error logged, so the close cannot hang). The
    /// queue pairs, and with the last handle on the transport its memory regions, are then
    /// destroyed on the caller's thread, before it goes on: nothing of the engine touches
    /// registered memory after it closed. The sweep is not joined (it
    /// may be in a dial of up to two seconds); it holds the state only between dials.
    fn shutdown(&self) {
        let Some(state) = self.state.get() else {
            return;
        };
        state.stop.store(true, Ordering::SeqCst);
        let mut groups: Vec<Group> = (state.endpoints.lock())
            .unwrap_or_else(|e| e.into_inner())
            .drain()
            .into_iter()
            .map(|(_, g)| g)
            .collect();
        groups.extend(
            (state.passive.lock())
                .unwrap_or_else(|e| e.into_inner())
                .drain()
                .into_iter()
                .map(|(_, g)| g),
        );
        for ep in groups.iter().flat_map(|g| g.iter()) {
            ep.fail();
        }
        for nic in &state.nics {
            (0..nic.lanes()).for_each(|lane| nic.wake(lane));
        }
        state.stopping.raise();
        self.threads.join_all("rdma transport");
        // The groups' queue pairs are destroyed here, now that no worker polls them.
        drop(groups);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nic_filters_pick_devices_only_when_they_name_devices() {
        let all = || vec!["mlx5_0".to_string(), "mlx5_1".to_string()];
        let f = |allow: Option<&[&str]>, deny: &[&str]| te_topology::NicFilter {
            allow: allow.map(|a| a.iter().map(|s| s.to_string()).collect()),
            deny: deny.iter().map(|s| s.to_string()).collect(),
        };
        assert_eq!(filtered(all(), &f(None, &[])), all());
        assert_eq!(filtered(all(), &f(Some(&["mlx5_1"]), &[])), ["mlx5_1"]);
        assert_eq!(
            filtered(all(), &f(Some(&["eth0"]), &[])),
            all(),
            "interfaces only"
        );
        assert_eq!(filtered(all(), &f(None, &["mlx5_0"])), ["mlx5_1"]);
    }
}
