//! The verbs layer: devices, protection domains, memory regions, completion queues and RC queue
//! pairs, over the `sideway` crate (which loads libibverbs at run time, so a machine without
//! rdma-core builds and runs everything else). All of te-rdma's `unsafe` code is here.
//!
//! Ownership keeps drop order safe: a [`Nic`] holds its context, PD and completion lanes (a
//! lane's CQs hold its completion channel); a [`Mr`] holds the sideway region, which holds the
//! PD; an [`Endpoint`] holds its QP (which holds its CQ) and the NIC it was made from. Every
//! completion event is acknowledged as soon as it is read, so destroying a CQ never waits.
//!
//! Besides verbs, this module owns the few raw calls around them: `poll(2)` on completion
//! channels, the async event fd and an eventfd that wakes a sleeping worker.
#![allow(unsafe_code)]

use std::net::Ipv6Addr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use sideway::ibverbs::AccessFlags;
use sideway::ibverbs::address::{AddressHandleAttribute, Gid, GidType};
use sideway::ibverbs::completion::WorkCompletionStatus;
use sideway::ibverbs::device::{DeviceInfo, DeviceList};
use sideway::ibverbs::device_context::{DeviceContext, Mtu, PortState};
use sideway::ibverbs::memory_region::MemoryRegion;
use sideway::ibverbs::protection_domain::ProtectionDomain;
use sideway::ibverbs::queue_pair::{
    GenericQueuePair, PostSendGuard, QueuePair, QueuePairAttribute, QueuePairState,
    SetScatterGatherEntry, WorkRequestFlags,
};
use te_core::Permission;

mod lane;

use lane::set_nonblocking;
pub use lane::{DeviceEvent, Lane, Signal};

/// Settings of the verbs layer (`MC_IB_PORT`, `MC_GID_INDEX`, `MC_MAX_WR`, te's
/// `MC_IB_TIMEOUT`).
#[derive(Clone, Debug)]
pub struct VerbsOptions {
    /// Port number on each device.
    pub port: u8,
    /// GID index; `None` probes (RoCEv2 with an IPv4 address first).
    pub gid_index: Option<u32>,
    /// Work requests in flight per queue pair (clamped to the device).
    pub max_wr: u32,
    /// Local ACK timeout exponent (4.096 µs × 2^timeout); Soft-RoCE wants 18 or more.
    pub timeout: u8,
    /// Retries on timeout and on RNR.
    pub retry_cnt: u8,
    /// Service level (`MC_IB_SL`).
    pub service_level: u8,
    /// Traffic class (`MC_IB_TC`; RoCE: the DSCP and ECN bits).
    pub traffic_class: u8,
    /// Path MTU in bytes (`MC_MTU`: 256–4096); `None` uses the port's active MTU. Never above it.
    pub mtu: Option<u32>,
    /// Completion lanes per device: one per worker thread (`MC_WORKERS_PER_CTX`), each with
    /// its own completion channel and CQs.
    pub lanes: u32,
    /// Completion queues per device (`MC_NUM_CQ_PER_CTX`), dealt over the lanes; every lane
    /// has at least one.
    pub cqs: u32,
}

impl Default for VerbsOptions {
    fn default() -> Self {
        use crate::settings as S;
        VerbsOptions {
            port: S::IB_PORT.initial(),
            gid_index: None,
            max_wr: S::MAX_WR.initial(),
            timeout: S::IB_TIMEOUT.initial(),
            retry_cnt: 7,
            service_level: S::IB_SL.initial(),
            traffic_class: S::IB_TC.initial(),
            mtu: None,
            lanes: 1,
            cqs: S::NUM_CQ_PER_CTX.initial(),
        }
    }
}

/// Where the engine is reached, for choosing each device's GID ([`crate::gid`]).
#[derive(Clone, Debug, Default)]
pub struct GidPlaces {
    /// The local rails: interface name and address.
    pub rails: Vec<(String, std::net::IpAddr)>,
    /// The address the engine binds to, when it is a specific one.
    pub bind: Option<std::net::IpAddr>,
}

/// One opened device: context, PD, completion lanes, and its port addressing.
pub struct Nic {
    /// Device name.
    pub name: String,
    /// The network interface under the device's GID (RoCE), from sysfs.
    pub netdev: Option<String>,
    /// Keeps the device open for the PD, CQ and QPs made from it.
    ctx: Arc<DeviceContext>,
    pd: Arc<ProtectionDomain>,
    lanes: Vec<Lane>,
    /// False while the port is down or after a fatal device event.
    active: AtomicBool,
    /// Port number.
    pub port: u8,
    /// The GID used, and its index.
    pub gid: Gid,
    gid_index: u8,
    /// Port LID (0 on RoCE).
    pub lid: u16,
    mtu: Mtu,
    /// Work requests per QP, clamped to the device.
    pub max_wr: u32,
    timeout: u8,
    retry_cnt: u8,
    service_level: u8,
    traffic_class: u8,
}

impl std::fmt::Debug for Nic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nic")
            .field("name", &self.name)
            .field("gid", &self.gid.to_string())
            .finish()
    }
}

/// The verbs device names on this machine (empty without rdma-core or devices).
pub fn device_names() -> Vec<String> {
    DeviceList::new()
        .map(|l| l.iter().map(|d| d.name()).collect())
        .unwrap_or_default()
}

/// Access flags from a region's permission: no remote access for local-only memory, remote
/// read for read-only, remote read and write otherwise; plus relaxed ordering where the device
/// takes it (an optional flag, ignored elsewhere: a completion still means every byte is
/// visible).
fn access_of(permission: Permission) -> AccessFlags {
    let access = match permission {
        Permission::LocalOnly => AccessFlags::LocalWrite,
        Permission::RemoteRead => AccessFlags::LocalWrite | AccessFlags::RemoteRead,
        _ => AccessFlags::LocalWrite | AccessFlags::RemoteRead | AccessFlags::RemoteWrite,
    };
    access | AccessFlags::RelaxedOrdering
}

/// The path MTU: the one asked for, never above the port's active MTU.
fn clamp_mtu(asked: Option<u32>, active: Mtu) -> Mtu {
    let bytes = |m: Mtu| match m {
        Mtu::Mtu256 => 256,
        Mtu::Mtu512 => 512,
        Mtu::Mtu1024 => 1024,
        Mtu::Mtu2048 => 2048,
        Mtu::Mtu4096 => 4096,
    };
    let want = match asked {
        Some(b) if b >= 4096 => Mtu::Mtu4096,
        Some(b) if b >= 2048 => Mtu::Mtu2048,
        Some(b) if b >= 1024 => Mtu::Mtu1024,
        Some(b) if b >= 512 => Mtu::Mtu512,
        Some(_) => Mtu::Mtu256,
        None => active,
    };
    if bytes(want) <= bytes(active) {
        want
    } else {
        active
    }
}

/// The port's GID table as [`crate::gid`] weighs it.
fn gid_table(ctx: &DeviceContext, port: u8) -> Result<Vec<crate::gid::Candidate>, String> {
    let table = ctx
        .query_gid_table()
        .map_err(|e| format!("querying GIDs: {e}"))?;
    Ok(table
        .iter()
        .filter(|g| g.port_num() == u32::from(port))
        .map(|g| crate::gid::Candidate {
            index: g.gid_index(),
            gid: Ipv6Addr::from(g.gid()),
            roce_v2: g.gid_type() == GidType::RoceV2,
            netdev: g.netdev_name().ok().filter(|n| !n.is_empty()),
        })
        .collect())
}

fn pick_gid(
    ctx: &DeviceContext,
    name: &str,
    port: u8,
    want: &crate::gid::Want<'_>,
) -> Result<(Gid, u8), String> {
    let table = gid_table(ctx, port)?;
    let choice = crate::gid::choose(&table, want).map_err(|e| format!("port {port}: {e}"))?;
    tracing::info!(device = name, port, index = choice.index, gid = %choice.gid, why = %choice.why, "GID chosen");
    let index = u8::try_from(choice.index).map_err(|_| "GID index over 255".to_string())?;
    Ok((Gid::from(choice.gid), index))
}

impl Nic {
    /// Opens device `name` with `options`.
    ///
    /// # Errors
    /// The device is missing, its port is down, or a verbs call fails (the message says which).
    pub fn open(
        name: &str,
        options: &VerbsOptions,
        places: &GidPlaces,
    ) -> Result<Arc<Nic>, String> {
        let list = DeviceList::new().map_err(|e| format!("{name}: listing verbs devices: {e}"))?;
        let device = list
            .iter()
            .find(|d| d.name() == name)
            .ok_or_else(|| format!("no verbs device {name}"))?;
        let ctx = device.open().map_err(|e| format!("{name}: opening: {e}"))?;
        let port = ctx
            .query_port(options.port)
            .map_err(|e| format!("{name}: port {}: {e}", options.port))?;
        let dev = ctx.query_device().map_err(|e| format!("{name}: {e}"))?;
        let want = crate::gid::Want {
            device: name,
            asked: options.gid_index,
            rails: &places.rails,
            bind: places.bind,
        };
        let (gid, gid_index) =
            pick_gid(&ctx, name, options.port, &want).map_err(|e| format!("{name}: {e}"))?;
        let pd = ctx
            .alloc_pd()
            .map_err(|e| format!("{name}: allocating a PD: {e}"))?;
        let max_wr = options.max_wr.clamp(1, dev.max_qp_wr().max(1) as u32);
        let lanes = options.lanes.clamp(1, 64) as usize;
        let cqs = (options.cqs.clamp(1, 256) as usize).max(lanes);
        let lanes = (0..lanes)
            .map(|l| {
                let count = (l..cqs).step_by(lanes).count();
                Lane::new(&ctx, count, max_wr * 16).map_err(|e| format!("{name}: {e}"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        set_nonblocking(
            // SAFETY: the context is open while `ctx` lives; only its fd is read.
            unsafe { ctx.context().as_ref().async_fd },
        )
        .map_err(|e| format!("{name}: async event fd: {e}"))?;
        let gid_index_u32 = u32::from(gid_index);
        Ok(Arc::new(Nic {
            name: name.to_string(),
            netdev: std::fs::read_to_string(format!(
                "/sys/class/infiniband/{name}/ports/{}/gid_attrs/ndevs/{gid_index_u32}",
                options.port
            ))
            .ok()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty()),
            active: AtomicBool::new(port.port_state() == PortState::Active),
            ctx,
            pd,
            lanes,
            port: options.port,
            gid,
            gid_index,
            lid: port.lid(),
            mtu: clamp_mtu(options.mtu, port.active_mtu()),
            max_wr,
            timeout: options.timeout,
            retry_cnt: options.retry_cnt,
            service_level: options.service_level,
            traffic_class: options.traffic_class,
        }))
    }

    /// The GID as Mooncake writes and strictly parses it: 16 two-digit hex bytes joined by
    /// colons (`fe:80:00:…`). te reads this and the 8-group form alike.
    pub fn gid_string(&self) -> String {
        mooncake_gid(&self.gid.raw)
    }

    /// Registers `[addr, addr+len)` with access flags from `permission`: no remote access for
    /// local-only memory, remote read for read-only, remote read and write otherwise.
    ///
    /// # Safety
    /// The range must stay mapped until the returned region is dropped.
    ///
    /// # Errors
    /// The device refused the registration.
    pub unsafe fn register(
        &self,
        addr: u64,
        len: u64,
        permission: Permission,
    ) -> Result<Mr, String> {
        let access = access_of(permission);
        // SAFETY: the caller keeps the range mapped while the region lives.
        let mr = unsafe { self.pd.reg_mr(addr as usize, len as usize, access) }
            .map_err(|e| format!("{}: registering {addr:#x}+{len}: {e}", self.name))?;
        Ok(Mr { inner: mr })
    }

    /// Registers `[addr, addr+len)` of GPU memory through its dma-buf (GPUDirect RDMA without
    /// peer-memory modules), with access from `permission`.
    ///
    /// # Safety
    /// The range must stay allocated until the returned region is dropped.
    ///
    /// # Errors
    /// No CUDA driver, a driver or kernel without dma-buf export, or a device refusing
    /// `ibv_reg_dmabuf_mr` (the message says which).
    pub unsafe fn register_gpu(
        &self,
        addr: u64,
        len: u64,
        permission: Permission,
    ) -> Result<Mr, String> {
        let (fd, offset) = self.dmabuf_of(addr, len)?;
        // SAFETY: `fd` is a dma-buf the driver just exported for the pages holding this range,
        // which starts `offset` bytes in (iova = its address); the caller keeps the memory
        // allocated while the MR lives.
        let mr = unsafe {
            self.pd
                .reg_dmabuf_mr(offset, len as usize, addr, fd, access_of(permission))
        };
        // SAFETY: the registration holds its own reference to the dma-buf; ours is closed.
        unsafe { libc::close(fd) };
        let mr = mr.map_err(|e| {
            format!(
                "{}: ibv_reg_dmabuf_mr for GPU memory {addr:#x}+{len}: {e} (the device or rdma-core may lack dma-buf support)",
                self.name
            )
        })?;
        Ok(Mr { inner: mr })
    }

    /// The dma-buf the CUDA driver exports for the pages of `addr..addr+len`, and the range's
    /// offset in it.
    #[cfg(feature = "cuda")]
    fn dmabuf_of(&self, addr: u64, len: u64) -> Result<(i32, u64), String> {
        let cuda = te_cuda::driver().map_err(|e| e.to_string())?;
        cuda.dmabuf_fd(addr, len as usize)
            .map_err(|e| format!("{}: GPU memory {addr:#x}+{len}: {e}", self.name))
    }

    /// Without `cuda` there is no driver to export a dma-buf.
    #[cfg(not(feature = "cuda"))]
    fn dmabuf_of(&self, addr: u64, len: u64) -> Result<(i32, u64), String> {
        Err(format!(
            "{}: GPU memory {addr:#x}+{len} needs te-rdma built with its `cuda` feature",
            self.name
        ))
    }

    /// Registers an engine region as memory regions of at most `chunk` bytes each
    /// (`MC_MAX_MR_SIZE`), in address order (see [`register`](Self::register)).
    ///
    /// # Errors
    /// The device refused a registration (those made are released).
    pub fn register_region(
        &self,
        region: &te_core::memory::Region,
        chunk: u64,
    ) -> Result<Vec<Mr>, String> {
        let chunk = chunk.max(1);
        let mut mrs = Vec::with_capacity(region.len().div_ceil(chunk) as usize);
        let mut at = 0;
        while at < region.len() {
            let len = chunk.min(region.len() - at);
            // SAFETY: a region in the engine's table stays mapped until the engine unregisters
            // it, and te-rdma drops these MRs in `Transport::unregister`, before that completes.
            let addr = region.addr() + at;
            mrs.push(match region.location() {
                // SAFETY: as above.
                te_core::Location::Cuda(_) => unsafe {
                    self.register_gpu(addr, len, region.permission())
                },
                // SAFETY: as above.
                _ => unsafe { self.register(addr, len, region.permission()) },
            }?);
            at += len;
        }
        Ok(mrs)
    }

    /// A new RC queue pair on this device, in INIT, completing on lane 0.
    ///
    /// # Errors
    /// A verbs call failed.
    pub fn endpoint(self: &Arc<Self>) -> Result<Endpoint, String> {
        self.endpoint_on(0)
    }

    /// A new RC queue pair in INIT whose completions arrive on lane `lane` (one of its CQs in
    /// turn).
    ///
    /// # Errors
    /// A verbs call failed.
    pub fn endpoint_on(self: &Arc<Self>, lane: usize) -> Result<Endpoint, String> {
        self.endpoint_with(lane, None)
    }

    /// As [`endpoint_on`](Self::endpoint_on), starting its send queue at `psn`: Mooncake's
    /// queue pairs start at 0 on both sides and exchange no PSN, so te's towards Mooncake peers
    /// do too. `None` derives one from the QP number (exchanged with te peers).
    ///
    /// # Errors
    /// A verbs call failed.
    pub fn endpoint_with(
        self: &Arc<Self>,
        lane: usize,
        psn: Option<u32>,
    ) -> Result<Endpoint, String> {
        let lane_ref = &self.lanes[lane % self.lanes.len()];
        let cq = lane_ref.cqs
            [lane_ref.next_cq.fetch_add(1, Ordering::Relaxed) % lane_ref.cqs.len()]
        .clone();
        let mut builder = self.pd.create_qp_builder();
        builder
            .setup_max_send_wr(self.max_wr)
            .setup_max_recv_wr(1)
            .setup_max_send_sge(1)
            .setup_max_recv_sge(1)
            .setup_send_cq(cq.clone())
            .setup_recv_cq(cq);
        let mut qp: GenericQueuePair = builder
            .build()
            .map_err(|e| format!("{}: creating a QP: {e}", self.name))?
            .into();
        let mut attr = QueuePairAttribute::new();
        attr.setup_state(QueuePairState::Init)
            .setup_pkey_index(0)
            .setup_port(self.port)
            .setup_access_flags(
                AccessFlags::LocalWrite | AccessFlags::RemoteRead | AccessFlags::RemoteWrite,
            );
        qp.modify(&attr)
            .map_err(|e| format!("{}: QP to INIT: {e}", self.name))?;
        let psn = psn.unwrap_or_else(|| qp.qp_number().wrapping_mul(2_654_435_761)) & 0xff_ffff;
        Ok(Endpoint {
            nic: self.clone(),
            qp: Mutex::new(qp),
            psn,
        })
    }

    /// Polls lane 0's CQs (see [`poll_lane`](Self::poll_lane)).
    pub fn poll(&self, out: &mut Vec<(u64, Result<(), WcError>)>) {
        self.poll_lane(0, out);
    }

    /// Polls lane `lane`'s CQs: up to one batch of (wr_id, outcome) from each.
    pub fn poll_lane(&self, lane: usize, out: &mut Vec<(u64, Result<(), WcError>)>) {
        let lane = &self.lanes[lane % self.lanes.len()];
        let _guard = lane.poll.lock().unwrap_or_else(|e| e.into_inner());
        for cq in &lane.cqs {
            let Ok(poller) = cq.start_poll() else {
                continue;
            };
            for wc in poller {
                let status = WorkCompletionStatus::from(wc.status());
                let outcome = match status {
                    WorkCompletionStatus::Success => Ok(()),
                    s => Err(WcError::from_status(s, wc.vendor_err())),
                };
                out.push((wc.wr_id(), outcome));
            }
        }
    }
}

/// How a work request failed, in te's terms.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WcError {
    /// The target's memory region refused the access (permission or bounds).
    RemoteAccess,
    /// The target refused the request as invalid.
    RemoteInvalid,
    /// The QP was torn down with the request queued (retry quietly elsewhere).
    Flushed,
    /// The local side failed (protection, length, QP): the local NIC is suspect.
    Local(String),
    /// The path failed (retries exhausted, timeout, remote operation error).
    Path(String),
}

impl WcError {
    fn from_status(s: WorkCompletionStatus, vendor: u32) -> Self {
        match s {
            WorkCompletionStatus::RemoteAccessError => WcError::RemoteAccess,
            WorkCompletionStatus::RemoteInvalidRequestError => WcError::RemoteInvalid,
            WorkCompletionStatus::WorkRequestFlushedError => WcError::Flushed,
            WorkCompletionStatus::LocalLengthError
            | WorkCompletionStatus::LocalQueuePairOperationError
            | WorkCompletionStatus::LocalProtectionError
            | WorkCompletionStatus::LocalAccessError => {
                WcError::Local(format!("{s:?} (vendor {vendor:#x})"))
            }
            other => WcError::Path(format!("{other:?} (vendor {vendor:#x})")),
        }
    }
}

/// A registered memory region on one device.
pub struct Mr {
    inner: Arc<MemoryRegion>,
}

impl Mr {
    /// Local key.
    pub fn lkey(&self) -> u32 {
        self.inner.lkey()
    }
    /// Remote key.
    pub fn rkey(&self) -> u32 {
        self.inner.rkey()
    }
}

/// What one side tells the other to connect an RC queue pair.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QpInfo {
    /// Queue pair number.
    pub qp_num: u32,
    /// Starting packet sequence number.
    pub psn: u32,
    /// GID, colon-separated hex.
    pub gid: String,
    /// LID.
    pub lid: u16,
}

/// A GID in Mooncake's text form: 16 two-digit hex bytes joined by colons.
pub fn mooncake_gid(raw: &[u8; 16]) -> String {
    raw.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// Parses a GID in Mooncake's form (16 × `xx`) or the 8-group IPv6 form (`fe80:0000:…`), each
/// group written out in full.
pub fn parse_gid(s: &str) -> Option<Gid> {
    let hex: String = s.chars().filter(|c| *c != ':').collect();
    if hex.len() != 32 {
        return None;
    }
    let mut raw = [0u8; 16];
    for (i, b) in raw.iter_mut().enumerate() {
        *b = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(Gid { raw })
}

/// One RDMA READ or WRITE to post.
#[derive(Clone, Copy, Debug)]
pub struct WorkRequest {
    /// Tag returned in the work completion.
    pub id: u64,
    /// WRITE (local → remote) or READ (remote → local).
    pub write: bool,
    /// Local address.
    pub local: u64,
    /// Local key of the region holding it.
    pub lkey: u32,
    /// Bytes.
    pub len: u32,
    /// Remote address.
    pub remote: u64,
    /// Remote key.
    pub rkey: u32,
}

impl Endpoint {
    /// Posts bytes `[offset, offset+len)` of slice `op` as one signalled work request tagged
    /// `id`, with the keys of the memory regions holding that piece on each side.
    ///
    /// # Errors
    /// As [`post`](Self::post); a piece over 4 GiB cannot be one request.
    pub fn post_piece(
        &self,
        op: &te_core::transport::SliceOp,
        offset: u64,
        len: u64,
        id: u64,
        lkey: u32,
        rkey: u32,
    ) -> Result<(), String> {
        let len = u32::try_from(len).map_err(|_| format!("a work request of {len} bytes"))?;
        if offset + u64::from(len) > op.len {
            return Err(format!(
                "piece {offset}+{len} outside a slice of {}",
                op.len
            ));
        }
        let wr = WorkRequest {
            id,
            write: op.opcode == te_core::Opcode::Write,
            local: op.local_addr + offset,
            lkey,
            len,
            remote: op.remote_addr + offset,
            rkey,
        };
        // SAFETY: a posted slice's local range lies in a region the engine pinned for its task
        // (its pieces registered under the lkeys given) until the slice is reported, which
        // te-rdma does only after polling every work request of the slice.
        unsafe { self.post(&wr) }
    }
}

/// One RC queue pair.
pub struct Endpoint {
    nic: Arc<Nic>,
    qp: Mutex<GenericQueuePair>,
    psn: u32,
}

impl Endpoint {
    /// This side's connection data.
    pub fn info(&self) -> QpInfo {
        QpInfo {
            qp_num: self
                .qp
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .qp_number(),
            psn: self.psn,
            gid: self.nic.gid_string(),
            lid: self.nic.lid,
        }
    }

    /// Moves the queue pair to ERROR: every request still queued on it completes with a flush
    /// error, so its slices are reported (and retried elsewhere) instead of waiting forever on
    /// a path that stopped answering.
    pub fn fail(&self) {
        let mut qp = self.qp.lock().unwrap_or_else(|e| e.into_inner());
        let mut attr = QueuePairAttribute::new();
        attr.setup_state(QueuePairState::Error);
        if let Err(e) = qp.modify(&attr) {
            tracing::warn!(device = %self.nic.name, error = %e, "could not move a QP to ERROR");
        }
    }

    /// How long a signalled request may stay without a completion before the path counts as
    /// dead: the QP's own retry budget (4.096 µs × 2^timeout per try, `retry_cnt` + 1 tries),
    /// doubled, and at least 5 s.
    pub fn stall_limit(&self) -> std::time::Duration {
        let per_try = 4.096e-6 * f64::from(1u32 << self.nic.timeout.min(31));
        let budget = per_try * f64::from(u32::from(self.nic.retry_cnt) + 1) * 2.0;
        std::time::Duration::from_secs_f64(budget.clamp(5.0, 600.0))
    }

    /// Connects to `remote` (INIT → RTR → RTS).
    ///
    /// # Errors
    /// A bad GID, or the device refused a transition.
    pub fn connect(&self, remote: &QpInfo) -> Result<(), String> {
        let nic = &self.nic;
        let gid =
            parse_gid(&remote.gid).ok_or_else(|| format!("bad remote GID {:?}", remote.gid))?;
        let mut qp = self.qp.lock().unwrap_or_else(|e| e.into_inner());
        let mut ah = AddressHandleAttribute::new();
        ah.setup_dest_lid(remote.lid)
            .setup_port(nic.port)
            .setup_service_level(nic.service_level)
            .setup_grh(&gid, 0, nic.gid_index, 64, nic.traffic_class);
        let mut attr = QueuePairAttribute::new();
        attr.setup_state(QueuePairState::ReadyToReceive)
            .setup_path_mtu(nic.mtu)
            .setup_dest_qp_num(remote.qp_num)
            .setup_rq_psn(remote.psn)
            .setup_max_dest_read_atomic(16)
            .setup_min_rnr_timer(12)
            .setup_address_vector(&ah);
        qp.modify(&attr)
            .map_err(|e| format!("{}: QP to RTR: {e}", nic.name))?;
        let mut attr = QueuePairAttribute::new();
        attr.setup_state(QueuePairState::ReadyToSend)
            .setup_sq_psn(self.psn)
            .setup_timeout(nic.timeout)
            .setup_retry_cnt(nic.retry_cnt)
            .setup_rnr_retry(nic.retry_cnt)
            .setup_max_read_atomic(16);
        qp.modify(&attr)
            .map_err(|e| format!("{}: QP to RTS: {e}", nic.name))
    }

    /// Posts `wr` as one signalled RDMA WRITE or READ.
    ///
    /// # Safety
    /// `[wr.local, wr.local+wr.len)` must lie in the region `wr.lkey` names and stay valid until
    /// the work completion for `wr.id` is polled.
    ///
    /// # Errors
    /// The send queue refused the request (full, or the QP is in error).
    pub unsafe fn post(&self, wr: &WorkRequest) -> Result<(), String> {
        let mut qp = self.qp.lock().unwrap_or_else(|e| e.into_inner());
        let mut guard = qp.start_post_send();
        let handle = guard.construct_wr(wr.id, WorkRequestFlags::Signaled);
        let handle = match wr.write {
            true => handle.setup_write(wr.rkey, wr.remote),
            false => handle.setup_read(wr.rkey, wr.remote),
        };
        // SAFETY: the caller guarantees the local range and its key until the completion.
        unsafe { handle.setup_sge(wr.lkey, wr.local, wr.len) };
        guard
            .post()
            .map_err(|e| format!("posting a work request: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gids_parse_and_mtus_never_exceed_the_port() {
        let g = parse_gid("0000:0000:0000:0000:0000:ffff:c612:0001").unwrap();
        assert_eq!(g.raw[10..], [0xff, 0xff, 0xc6, 0x12, 0, 1]);
        assert_eq!(g.to_string(), "0000:0000:0000:0000:0000:ffff:c612:0001");
        assert!(parse_gid("zz").is_none() && parse_gid("0000:0000").is_none());
        let mooncake = mooncake_gid(&g.raw);
        assert_eq!(mooncake, "00:00:00:00:00:00:00:00:00:00:ff:ff:c6:12:00:01");
        assert_eq!(parse_gid(&mooncake).unwrap().raw, g.raw);
        assert_eq!(clamp_mtu(Some(4096), Mtu::Mtu1024), Mtu::Mtu1024);
        assert_eq!(clamp_mtu(Some(512), Mtu::Mtu1024), Mtu::Mtu512);
        assert_eq!(clamp_mtu(None, Mtu::Mtu2048), Mtu::Mtu2048);
        assert_eq!(clamp_mtu(Some(100), Mtu::Mtu4096), Mtu::Mtu256);
    }
}
