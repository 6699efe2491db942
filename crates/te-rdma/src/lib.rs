//! te-rdma: one-sided RDMA READ and WRITE between registered memory over RC queue pairs.
//!
//! - Every verbs device (or those named) is opened at install ([`verbs::Nic`]): PD, one CQ, the
//!   port's GID (RoCEv2 over IPv4 first; `MC_GID_INDEX` overrides) and MTU.
//! - Each registered region gets a memory region per device with access from its permission;
//!   the descriptor publishes `devices[]` and each buffer's `rkey[]` (Mooncake's fields).
//! - Endpoints (one RC QP per local device, target segment and remote device) are set up on
//!   first use by the device's worker thread, never the submitting one, through the control
//!   channel's `Connection` frame. The target checks the segment secret before it makes its
//!   queue pair, and the cluster secret guards the channel when set. Each side's QPs carry only
//!   its own requests, so simultaneous connects from both ends simply make two pairs.
//! - Workers post slices as signalled READ/WRITE work requests, at most `max_wr` per device in
//!   flight, poll the CQ in batches, and report each slice. A worker sleeps when it has nothing
//!   in flight. A failed completion drops its endpoint, so the retry reconnects.
//!
//! Not done yet: routing slices by the priority matrix over several devices (the slice's rails
//! select a device by index), `MC_NUM_QP_PER_EP` > 1, async device events, and splitting regions
//! at `MC_MAX_MR_SIZE`.

#![deny(unsafe_code)]

pub mod failover;
pub mod verbs;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde_json::json;
use te_core::Config;
use te_core::control::frame::FrameType;
use te_core::control::{self, ControlState};
use te_core::endpoints::EndpointStore;
use te_core::memory::Region;
use te_core::segment::{DeviceDesc, RemoteSegment, SegmentDesc, SegmentSecret};
use te_core::transport::{
    Capabilities, CompletionSink, InstallContext, Rejection, SliceError, SliceOp, Transport,
};
use tracing::{debug, info, warn};
use verbs::{Endpoint, Mr, Nic, QpInfo, VerbsOptions, WcError};

/// Settings of the RDMA transport.
#[derive(Clone, Debug, Default)]
pub struct RdmaOptions {
    /// Devices to use (`rxe0`, `mlx5_0`); `None` means every device.
    pub devices: Option<Vec<String>>,
    /// The verbs layer's settings.
    pub verbs: VerbsOptions,
}

impl RdmaOptions {
    /// Defaults overridden by `MC_IB_PORT`, `MC_GID_INDEX`, `MC_MAX_WR`, `MC_IB_SL`, `MC_IB_TC`,
    /// `MC_MTU` and te's `MC_IB_TIMEOUT`.
    ///
    /// # Errors
    /// [`te_core::Error::InvalidConfig`] naming a bad variable.
    pub fn from_env() -> te_core::Result<Self> {
        let mut o = RdmaOptions::default();
        let num = |name: &str, lo: u64, hi: u64| -> te_core::Result<Option<u64>> {
            match std::env::var(name).ok().filter(|v| !v.trim().is_empty()) {
                None => Ok(None),
                Some(v) => match v.trim().parse::<u64>() {
                    Ok(n) if (lo..=hi).contains(&n) => Ok(Some(n)),
                    _ => Err(te_core::Error::InvalidConfig {
                        name: name.into(),
                        value: v,
                        reason: format!("expected {lo}..={hi}"),
                    }),
                },
            }
        };
        if let Some(p) = num("MC_IB_PORT", 1, 255)? {
            o.verbs.port = p as u8;
        }
        o.verbs.gid_index = num("MC_GID_INDEX", 0, 255)?.map(|g| g as u32);
        if let Some(w) = num("MC_MAX_WR", 1, 65536)? {
            o.verbs.max_wr = w as u32;
        }
        if let Some(t) = num("MC_IB_TIMEOUT", 1, 31)? {
            o.verbs.timeout = t as u8;
        }
        if let Some(sl) = num("MC_IB_SL", 0, 15)? {
            o.verbs.service_level = sl as u8;
        }
        if let Some(tc) = num("MC_IB_TC", 0, 255)? {
            o.verbs.traffic_class = tc as u8;
        }
        o.verbs.mtu = num("MC_MTU", 256, 4096)?.map(|m| m as u32);
        Ok(o)
    }
}

/// The handshake request and reply (Mooncake's `HandShakeDesc` fields plus te's).
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Handshake {
    local_nic_path: String,
    peer_nic_path: String,
    #[serde(default)]
    qp_num: Vec<u32>,
    #[serde(default)]
    reply_msg: String,
    #[serde(default)]
    te_qps: Vec<QpInfo>,
    #[serde(default)]
    te_secret: Option<String>,
}

/// The queue pairs of one endpoint (`MC_NUM_QP_PER_EP`), used in turn.
type Group = Arc<Vec<Arc<Endpoint>>>;

/// Queue pairs one handshake may ask for.
const MAX_QPS_PER_EP: usize = 64;

/// One device's worker queue.
#[derive(Default)]
struct Queue {
    ops: Mutex<VecDeque<SliceOp>>,
    ready: Condvar,
}

struct State {
    nics: Vec<Arc<Nic>>,
    queues: Vec<Arc<Queue>>,
    /// Region start → (length, one MR per device).
    regions: Mutex<BTreeMap<u64, (u64, Vec<Mr>)>>,
    /// Initiator endpoints by (segment id, local device, remote device).
    /// Bounded by `MC_MAX_EP_PER_CTX` per device, evicted by `MC_ENDPOINT_STORE_TYPE`.
    endpoints: Mutex<EndpointStore<(u64, usize, usize), Group>>,
    /// Target-side endpoints by the initiator's NIC path, bounded the same way.
    passive: Mutex<EndpointStore<String, Group>>,
    sink: Arc<dyn CompletionSink>,
    local_name: String,
    secret: SegmentSecret,
    control: Arc<ControlState>,
    config: Arc<Config>,
    stop: AtomicBool,
    /// Devices and remote devices paused after errors.
    pauses: Mutex<failover::Pauses>,
}

/// The RDMA transport.
pub struct RdmaTransport {
    options: RdmaOptions,
    state: OnceLock<Arc<State>>,
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
}

impl State {
    fn lkey(&self, nic: usize, addr: u64, len: u64) -> Option<u32> {
        let regions = self.regions.lock().unwrap_or_else(|e| e.into_inner());
        let (start, (rlen, mrs)) = regions.range(..=addr).next_back()?;
        (addr + len <= start + rlen).then(|| mrs.get(nic).map(Mr::lkey))?
    }

    /// Answers a peer's handshake: checks the secret, makes and connects a QP.
    fn accept(&self, payload: &[u8]) -> Vec<u8> {
        let refuse = |why: &str| json!({"reply_msg": why}).to_string().into_bytes();
        let Ok(req) = serde_json::from_slice::<Handshake>(payload) else {
            return refuse("malformed handshake");
        };
        let secret_ok = req
            .te_secret
            .as_deref()
            .and_then(unhex16)
            .is_some_and(|s| self.secret.matches(&s));
        if !secret_ok {
            return refuse("bad segment secret");
        }
        let Some(dev) = req.peer_nic_path.rsplit_once('@').map(|(_, d)| d) else {
            return refuse("handshake without a device");
        };
        if req.te_qps.is_empty() || req.te_qps.len() > MAX_QPS_PER_EP {
            return refuse("handshake asks for no queue pair, or too many");
        }
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
        let _evicted = self
            .passive
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(req.local_nic_path.clone(), Arc::new(group));
        debug!(peer = %req.local_nic_path, qps = infos.len(), "accepted an RDMA endpoint");
        serde_json::to_vec(&Handshake {
            local_nic_path: req.peer_nic_path,
            peer_nic_path: req.local_nic_path,
            qp_num: infos.iter().map(|q| q.qp_num).collect(),
            reply_msg: String::new(),
            te_qps: infos,
            te_secret: None,
        })
        .unwrap_or_default()
    }

    /// The endpoint for `op` from device `nic` to remote device `rdev`, connecting on first use.
    fn endpoint(
        &self,
        nic: usize,
        rdev: usize,
        target: &RemoteSegment,
    ) -> Result<Group, SliceError> {
        let key = (target.id(), nic, rdev);
        if let Some(group) = self
            .endpoints
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
        {
            return Ok(group.clone());
        }
        let remote_dev = &target.desc().devices[rdev].name;
        let count = (self.config.num_qp_per_ep as usize).clamp(1, MAX_QPS_PER_EP);
        let group = (0..count)
            .map(|_| self.nics[nic].endpoint())
            .collect::<Result<Vec<_>, _>>()
            .map_err(SliceError::LocalPath)?;
        let infos: Vec<QpInfo> = group.iter().map(Endpoint::info).collect();
        let req = Handshake {
            local_nic_path: format!("{}@{}", self.local_name, self.nics[nic].name),
            peer_nic_path: format!("{}@{remote_dev}", target.name()),
            qp_num: infos.iter().map(|q| q.qp_num).collect(),
            reply_msg: String::new(),
            te_qps: infos,
            te_secret: Some(hex(&target.secret().to_bytes())),
        };
        let payload = serde_json::to_vec(&req).map_err(|e| SliceError::Path(e.to_string()))?;
        let reply = control::request(
            target.host(),
            target.rpc_port(),
            FrameType::Connection,
            &payload,
            self.config.handshake_connect_timeout,
            self.config.handshake_max_length,
            self.control.cluster_key.as_deref(),
        )
        .map_err(|e| SliceError::Path(format!("RDMA handshake with {}: {e}", target.name())))?;
        let reply: Handshake = serde_json::from_slice(&reply)
            .map_err(|e| SliceError::Path(format!("RDMA handshake reply: {e}")))?;
        let remote = match (reply.reply_msg.is_empty(), reply.te_qps) {
            (true, qps) if qps.len() == group.len() => qps,
            _ if reply.reply_msg.contains("secret") => {
                return Err(SliceError::Rejected(Rejection::BadSecret));
            }
            _ => {
                return Err(SliceError::Path(format!(
                    "RDMA handshake refused: {}",
                    reply.reply_msg
                )));
            }
        };
        for (ep, r) in group.iter().zip(&remote) {
            // Connecting is local work (the route from this device, the QP's transitions): a
            // failure here blames this device.
            ep.connect(r).map_err(SliceError::LocalPath)?;
        }
        let group: Group = Arc::new(group.into_iter().map(Arc::new).collect());
        let evicted = self
            .endpoints
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, group.clone());
        // Slices in flight on an evicted endpoint keep its queue pairs until they complete.
        if !evicted.is_empty() {
            debug!(evicted = evicted.len(), "RDMA endpoints evicted");
        }
        info!(target = target.name(), local = %self.nics[nic].name, remote = %remote_dev, qps = group.len(), "RDMA endpoint connected");
        Ok(group)
    }

    fn pause_remote(&self, segment: u64, dev: usize) {
        warn!(segment, dev, "pausing a remote RDMA device after an error");
        self.pauses
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pause_remote(segment, dev, std::time::Instant::now());
    }

    fn pause_local(&self, nic: usize) {
        warn!(device = %self.nics[nic].name, "pausing an RDMA device after an error");
        self.pauses
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pause_local(nic, std::time::Instant::now());
    }

    /// Drops the endpoint `key` (its QPs are in error, or were refused): the next slice
    /// reconnects.
    fn forget(&self, key: (u64, usize, usize)) {
        self.endpoints
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&key);
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex16(s: &str) -> Option<[u8; 16]> {
    let mut out = [0u8; 16];
    if s.len() != 32 || !s.is_ascii() {
        return None;
    }
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

/// Posts `op` on device `nic`; `Err` gives the slice back with its error.
fn start(
    state: &State,
    nic: usize,
    op: &SliceOp,
    wr_id: u64,
) -> Result<(Arc<Endpoint>, usize), SliceError> {
    let desc = op.target.desc();
    if desc.devices.is_empty() {
        return Err(SliceError::Path(format!(
            "segment {} publishes no RDMA device",
            desc.name
        )));
    }
    let rdev = {
        let pauses = state.pauses.lock().unwrap_or_else(|e| e.into_inner());
        let now = std::time::Instant::now();
        let m = desc.devices.len();
        failover::pick(op.remote_rail as usize % m, m, |j| {
            pauses.remote_paused(op.target.id(), j, now)
        })
    };
    let buffer = op
        .target
        .check_access(op.remote_addr, op.len, op.opcode)
        .map_err(|_| SliceError::Rejected(Rejection::OutOfBounds))?;
    let rkey = *buffer
        .rkey
        .get(rdev)
        .ok_or(SliceError::Rejected(Rejection::Malformed))?;
    let lkey = state.lkey(nic, op.local_addr, op.len).ok_or_else(|| {
        SliceError::LocalPath(format!(
            "{:#x}+{} is not registered with RDMA",
            op.local_addr, op.len
        ))
    })?;
    if op.len > u64::from(u32::MAX) {
        return Err(SliceError::Rejected(Rejection::Malformed));
    }
    let group = state
        .endpoint(nic, rdev, &op.target)
        .inspect_err(|e| match e {
            // The handshake failed: the remote device (or its owner) is suspect.
            SliceError::Path(_) => state.pause_remote(op.target.id(), rdev),
            // This device could not make or connect a QP (a port down, no route from it).
            SliceError::LocalPath(_) => state.pause_local(nic),
            _ => {}
        })?;
    // Queue pairs in turn: each keeps its own order, together they fill the device.
    let ep = group[(wr_id % group.len() as u64) as usize].clone();
    let posted = ep.post_slice(op, wr_id, lkey, rkey);
    posted.map_err(|e| {
        state.forget((op.target.id(), nic, rdev));
        SliceError::Path(e)
    })?;
    Ok((ep, rdev))
}

fn worker(state: Arc<State>, nic: usize) {
    let queue = state.queues[nic].clone();
    let max = state.nics[nic].max_wr as usize;
    let mut inflight: HashMap<u64, (SliceOp, Arc<Endpoint>, usize, Instant)> = HashMap::new();
    let mut done = Vec::new();
    let mut next_wr: u64 = 0;
    loop {
        let batch: Vec<SliceOp> = {
            let mut ops = queue.ops.lock().unwrap_or_else(|e| e.into_inner());
            while ops.is_empty() && inflight.is_empty() && !state.stop.load(Ordering::Acquire) {
                ops = queue
                    .ready
                    .wait_timeout(ops, Duration::from_millis(200))
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
            if state.stop.load(Ordering::Acquire) && ops.is_empty() && inflight.is_empty() {
                return;
            }
            let room = max.saturating_sub(inflight.len());
            let n = room.min(ops.len());
            ops.drain(..n).collect()
        };
        for op in batch {
            if op.is_canceled() {
                state.sink.complete(op, Err(SliceError::Canceled));
                continue;
            }
            next_wr = next_wr.wrapping_add(1);
            match start(&state, nic, &op, next_wr) {
                Ok((ep, rdev)) => {
                    inflight.insert(next_wr, (op, ep, rdev, Instant::now()));
                }
                Err(e) => state.sink.complete(op, Err(e)),
            }
        }
        if inflight.is_empty() {
            continue;
        }
        done.clear();
        state.nics[nic].poll(&mut done);
        if done.is_empty() {
            // A path that stopped answering (a device whose port went down may never complete
            // what it holds): past the QP's own retry budget, fail the QP so its requests flush.
            let now = Instant::now();
            let mut stalled: Vec<(Arc<Endpoint>, u64, usize)> = Vec::new();
            for (op, ep, rdev, at) in inflight.values() {
                let seen = stalled.iter().any(|(e, _, _)| Arc::ptr_eq(e, ep));
                if !seen && now.duration_since(*at) > ep.stall_limit() {
                    stalled.push((ep.clone(), op.target.id(), *rdev));
                }
            }
            for (ep, segment, rdev) in stalled {
                warn!(device = %state.nics[nic].name, "RDMA requests stalled; failing the queue pair");
                state.pause_local(nic);
                state.pause_remote(segment, rdev);
                state.forget((segment, nic, rdev));
                ep.fail();
                for entry in inflight.values_mut().filter(|e| Arc::ptr_eq(&e.1, &ep)) {
                    entry.3 = now;
                }
            }
            std::thread::yield_now();
            continue;
        }
        for (wr_id, outcome) in done.drain(..) {
            let Some((op, _ep, rdev, _)) = inflight.remove(&wr_id) else {
                continue;
            };
            let outcome = outcome.map_err(|e| {
                // A QP with an error completion flushes everything after it: reconnect.
                state.forget((op.target.id(), nic, rdev));
                match e {
                    WcError::RemoteAccess => SliceError::Rejected(Rejection::PermissionDenied),
                    WcError::RemoteInvalid => SliceError::Rejected(Rejection::Malformed),
                    // Flushed behind another error: retried quietly, nothing to blame.
                    WcError::Flushed => SliceError::Path("work request flushed".into()),
                    // The local device failed: the retry leaves it.
                    WcError::Local(m) => {
                        state.pause_local(nic);
                        SliceError::LocalPath(m)
                    }
                    // No answer (retries exhausted, timeouts): either end may be gone, so the
                    // retry leaves this device and this remote device.
                    WcError::Path(m) => {
                        state.pause_local(nic);
                        state.pause_remote(op.target.id(), rdev);
                        SliceError::Path(m)
                    }
                }
            });
            state.sink.complete(op, outcome);
        }
    }
}

impl Transport for RdmaTransport {
    fn name(&self) -> &'static str {
        "rdma"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::DRAM_REMOTE_HOST | Capabilities::DRAM_SAME_HOST
    }

    fn install(&self, ctx: InstallContext) -> te_core::Result<()> {
        let fail = |reason: String| te_core::Error::Transport {
            transport: "rdma",
            reason,
        };
        let names = self
            .options
            .devices
            .clone()
            .unwrap_or_else(verbs::device_names);
        if names.is_empty() {
            return Err(fail(
                "no RDMA device (is rdma-core installed and a device present?)".into(),
            ));
        }
        let nics = names
            .iter()
            .map(|n| Nic::open(n, &self.options.verbs))
            .collect::<Result<Vec<_>, _>>()
            .map_err(fail)?;
        let nics_len = nics.len();
        let state = Arc::new(State {
            queues: nics.iter().map(|_| Arc::new(Queue::default())).collect(),
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
            local_name: ctx.local_name.clone(),
            secret: ctx.secret,
            control: ctx.control.clone(),
            pauses: Mutex::new(failover::Pauses::new(nics_len, ctx.config.rail_pause)),
            config: ctx.config,
            stop: AtomicBool::new(false),
        });
        let handler_state = Arc::downgrade(&state);
        ctx.control
            .set_connection_handler(Arc::new(move |payload: &[u8]| {
                match handler_state.upgrade() {
                    Some(s) => s.accept(payload),
                    None => br#"{"reply_msg":"rdma transport is shut down"}"#.to_vec(),
                }
            }));
        for i in 0..state.nics.len() {
            let s = state.clone();
            std::thread::Builder::new()
                .name(format!("te-rdma-{}", state.nics[i].name))
                .spawn(move || worker(s, i))
                .map_err(|e| fail(format!("spawning a worker: {e}")))?;
        }
        info!(devices = ?names, "rdma transport installed");
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
            })
            .collect();
        let regions = state.regions.lock().unwrap_or_else(|e| e.into_inner());
        for b in &mut desc.buffers {
            if let Some((_, mrs)) = regions.get(&b.addr) {
                b.rkey = mrs.iter().map(Mr::rkey).collect();
                b.lkey = mrs.iter().map(Mr::lkey).collect();
            }
        }
    }

    fn register(&self, region: &Arc<Region>) -> te_core::Result<()> {
        let Some(state) = self.state.get() else {
            return Ok(());
        };
        // Large regions register on every device at once (pinning is the slow part).
        let results: Vec<Result<Mr, String>> = std::thread::scope(|s| {
            let handles: Vec<_> = state
                .nics
                .iter()
                .map(|nic| s.spawn(move || nic.register_region(region)))
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
            .insert(region.addr(), (region.len(), mrs));
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
        let mut per: Vec<Vec<SliceOp>> = (0..n).map(|_| Vec::new()).collect();
        {
            let pauses = state.pauses.lock().unwrap_or_else(|e| e.into_inner());
            let now = std::time::Instant::now();
            for op in slices {
                let nic = failover::pick(op.local_rail as usize % n, n, |i| {
                    pauses.local_paused(i, now)
                });
                per[nic].push(op);
            }
        }
        for (i, ops) in per.into_iter().enumerate().filter(|(_, o)| !o.is_empty()) {
            let q = &state.queues[i];
            q.ops.lock().unwrap_or_else(|e| e.into_inner()).extend(ops);
            q.ready.notify_one();
        }
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

    fn shutdown(&self) {
        if let Some(state) = self.state.get() {
            state.stop.store(true, Ordering::Release);
            for q in &state.queues {
                q.ready.notify_all();
            }
        }
    }
}
