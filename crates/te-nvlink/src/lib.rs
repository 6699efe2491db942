//! te-nvlink: GPU memory between processes over NVLink/PCIe through CUDA handles, and device
//! copies within one process (the staging hop of te-tent).
//!
//! - At install the CUDA driver is loaded (`te_cuda`); without it, or without a device,
//!   install fails with a clear error.
//! - A registered region on a GPU (`cuda:N`) is exported and published in the buffer's
//!   `shm_name` (as Mooncake's nvlink transport does): `cuMemAlloc` memory as a legacy CUDA IPC
//!   handle (`cuda-ipc:…`, same host), memory allocated with the fabric handle type
//!   ([`NvlinkTransport::allocate`] under `MC_USE_FABRIC` or `MC_FORCE_MNNVL`) as a fabric
//!   handle (`cuda-fabric:…`, TENT's MNNVL: any host of the NVLink domain). Memory it cannot
//!   export stays registered for the other transports, without a handle (a warning says why).
//! - A peer opens (IPC) or imports and maps (fabric) the handle once per buffer and copies on
//!   the local buffer's device: each slice queued on its worker's stream and reported done when
//!   the stream has finished it (so the bytes are in place). Slices are up to 64 MiB (a GPU
//!   copy gains nothing from being cut small) and run on copy workers, never the submitting
//!   thread; the workers' streams run side by side.
//! - A handle is opened only from a descriptor whose owner is proven (`Origin`): a process of
//!   this host that served it over the connection te used, or, for fabric handles on other
//!   hosts, a descriptor signed with the cluster key. Fabric handles serve other hosts only with
//!   `MC_FORCE_MNNVL` set (Mooncake's switch): only the operator knows which hosts share an
//!   NVLink domain. A peer outside it fails the import with the driver's error, and the engine
//!   retries elsewhere.
//! - Within one process (the own segment) nothing is opened: addresses are used as they are,
//!   host or device (unified addressing).
//!
//! Not here: the CUDA calls themselves (`te_cuda`), IMEX channel set-up (the system's).

#![deny(unsafe_code)]

mod handle;
pub mod settings;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use te_core::Opcode;
use te_core::memory::{Location, Region};
use te_core::segment::{BufferDesc, Origin, RemoteSegment, SegmentDesc};
use te_core::transport::{Capabilities, InstallContext, Rejection, SliceError, SliceOp, Transport};
use te_cuda::{Cuda, DeviceBuffer};
use te_sys::env::Env;
use te_workers::CopyWorkers;
use tracing::{debug, info, warn};

pub use handle::{GpuName, HandleKind};

/// Copy workers.
const WORKERS: usize = 2;
/// Slice size: one copy per slice, and a copy's fixed cost (a few microseconds) is small next
/// to 64 MiB even at HBM speed.
const SLICE: u64 = 64 << 20;

/// A peer's buffer opened into this process.
#[derive(Clone, Copy, Debug)]
struct Mapping {
    base: u64,
    kind: HandleKind,
}

/// Opened peer allocations: published name → mapping in this process.
type Opened = Mutex<HashMap<String, Mapping>>;

/// How the transport exports and allocates.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NvlinkOptions {
    /// Fabric handles serve peers on other hosts (`MC_FORCE_MNNVL`).
    pub mnnvl: bool,
    /// [`NvlinkTransport::allocate`] makes fabric allocations (`MC_USE_FABRIC`, or `mnnvl`).
    pub use_fabric: bool,
}

impl NvlinkOptions {
    /// The options from the environment (the variables named on each field).
    ///
    /// # Errors
    /// A variable set to something other than a switch, named.
    pub fn from_env() -> te_sys::Result<Self> {
        Self::from_lookup(&te_sys::env::process)
    }

    /// The options from `lookup` (a variable's value by name).
    ///
    /// # Errors
    /// As [`from_env`](Self::from_env).
    pub fn from_lookup(lookup: &dyn Fn(&str) -> Option<String>) -> te_sys::Result<Self> {
        let env = Env::new(lookup);
        let mnnvl = env.flag_or_initial(&crate::settings::FORCE_MNNVL)?;
        let fabric = env.flag_or_initial(&crate::settings::USE_FABRIC)?;
        Ok(NvlinkOptions {
            mnnvl,
            use_fabric: mnnvl || fabric,
        })
    }
}

/// The NVLink transport.
pub struct NvlinkTransport {
    workers: CopyWorkers,
    /// Exported regions: start → published name.
    exported: Mutex<HashMap<u64, GpuName>>,
    opened: Arc<Opened>,
    local_name: OnceLock<String>,
    options: NvlinkOptions,
    /// Why the environment's options were refused: install fails with it.
    refused: Option<te_sys::Error>,
}

impl std::fmt::Debug for NvlinkTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvlinkTransport")
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl Default for NvlinkTransport {
    fn default() -> Self {
        match NvlinkOptions::from_env() {
            Ok(options) => Self::with_options(options),
            Err(e) => Self {
                refused: Some(e),
                ..Self::with_options(NvlinkOptions::default())
            },
        }
    }
}

impl NvlinkTransport {
    /// A transport not yet installed, configured from the environment (a variable it cannot
    /// honour fails its install, named).
    pub fn new() -> Self {
        Self::default()
    }

    /// A transport not yet installed, with `options`.
    pub fn with_options(options: NvlinkOptions) -> Self {
        NvlinkTransport {
            workers: CopyWorkers::new("nvlink"),
            exported: Mutex::new(HashMap::new()),
            opened: Arc::new(Mutex::new(HashMap::new())),
            local_name: OnceLock::new(),
            options,
            refused: None,
        }
    }

    /// Its options.
    pub fn options(&self) -> NvlinkOptions {
        self.options
    }

    /// `len` bytes on GPU `device` that this transport can export: a fabric allocation when
    /// `use_fabric` is set and the device supports fabric handles, else `cuMemAlloc` memory
    /// (legacy IPC, same host; a warning says so when fabric was asked for). Mooncake's
    /// `allocatePinnedLocalMemory`.
    ///
    /// # Errors
    /// No driver or device, or the allocation failed.
    pub fn allocate(&self, device: u32, len: usize) -> te_core::Result<DeviceBuffer> {
        let cuda = te_cuda::driver()?;
        if self.options.use_fabric {
            if cuda.fabric_supported(device) {
                return Ok(DeviceBuffer::new_fabric(device, len)?);
            }
            warn!(
                device,
                "GPU {device} has no fabric handles: legacy IPC memory instead (same host only)"
            );
        }
        Ok(DeviceBuffer::new(device, len)?)
    }
}

/// The device whose context copies a slice: the local buffer's GPU, else the owner's ordinal
/// when this process has it, else device 0.
fn copy_device(cuda: &Cuda, local_addr: u64, owner: u32) -> u32 {
    cuda.device_of(local_addr)
        .unwrap_or(match (owner as i64) < i64::from(cuda.devices) {
            true => owner,
            false => 0,
        })
}

/// The address for `op`'s remote range in this process — the own segment's as it is, a peer's
/// through its opened handle — and the handle's owner device.
fn remote_address(
    cuda: &Cuda,
    opened: &Opened,
    own: bool,
    op: &SliceOp,
) -> Result<(u64, u32), SliceError> {
    let buffer = op
        .target
        .check_access(op.remote_addr, op.len, op.opcode)
        .map_err(|_| SliceError::Rejected(Rejection::OutOfBounds))?;
    let name = buffer
        .shm_name
        .as_deref()
        .and_then(GpuName::parse)
        .filter(|n| n.holds(buffer.length))
        .ok_or(SliceError::Rejected(Rejection::Malformed))?;
    let into = op.remote_addr - buffer.addr;
    if own {
        return Ok((op.remote_addr, name.device));
    }
    let key = buffer.shm_name.clone().unwrap_or_default();
    let mut map = opened.lock().unwrap_or_else(|e| e.into_inner());
    let base = match map.get(&key) {
        Some(m) => m.base,
        None => {
            let opening = match name.kind {
                HandleKind::Ipc => cuda.ipc_open(&name.handle, copy_device(cuda, 0, name.device)),
                HandleKind::Fabric { size } => cuda.fabric_import(&name.handle, size),
            };
            let base =
                opening.map_err(|e| SliceError::Path(format!("{}: {e}", op.target.name())))?;
            debug!(
                segment = op.target.name(),
                device = name.device,
                kind = ?name.kind,
                "opened a peer's GPU memory"
            );
            map.insert(
                key,
                Mapping {
                    base,
                    kind: name.kind,
                },
            );
            base
        }
    };
    Ok((base + name.offset + into, name.device))
}

/// The published name of a GPU region: its allocation's fabric handle when it has one, else a
/// legacy IPC handle.
fn export(region: &Region) -> te_core::Result<GpuName> {
    let cuda = te_cuda::driver()?;
    let addr = region.addr();
    let device = cuda.device_of(addr).ok_or_else(|| {
        te_core::Error::InvalidArgument(format!(
            "{addr:#x} is registered as {} but is not GPU memory",
            region.location()
        ))
    })?;
    let name = match cuda.fabric_export(addr)? {
        Some(x) => GpuName {
            kind: HandleKind::Fabric { size: x.size },
            device,
            offset: x.offset,
            handle: x.handle,
        },
        None => {
            let (handle, offset) = cuda.ipc_handle(addr)?;
            GpuName {
                kind: HandleKind::Ipc,
                device,
                offset,
                handle,
            }
        }
    };
    match name.holds(region.len()) {
        true => Ok(name),
        false => Err(te_core::Error::InvalidArgument(format!(
            "{addr:#x}+{} runs past its GPU allocation",
            region.len()
        ))),
    }
}

fn close(cuda: &Cuda, m: Mapping) {
    match m.kind {
        HandleKind::Ipc => cuda.ipc_close(m.base),
        HandleKind::Fabric { size } => cuda.fabric_close(m.base, size),
    }
}

fn execute(opened: &Opened, own_name: &str, op: &SliceOp) -> Result<(), SliceError> {
    let own = op.target.name() == own_name;
    let cuda = te_cuda::driver().map_err(|e| SliceError::LocalPath(e.to_string()))?;
    let (remote, owner) = remote_address(cuda, opened, own, op)?;
    let (dst, src) = match op.opcode {
        Opcode::Read => (op.local_addr, remote),
        _ => (remote, op.local_addr),
    };
    let device = copy_device(cuda, op.local_addr, owner);
    let len = op.len as usize;
    // The local range was checked against the engine's pinned region, the remote one against
    // the peer's published buffer (and lies in its opened allocation).
    let copied = handle::copy(cuda, (device, dst, src, len));
    copied.map_err(|e| SliceError::Path(e.to_string()))
}

impl Transport for NvlinkTransport {
    fn name(&self) -> &'static str {
        "nvlink"
    }

    fn capabilities(&self) -> Capabilities {
        let same_host = Capabilities::GPU_SAME_HOST | Capabilities::GPU_LOCAL;
        match self.options.mnnvl {
            true => same_host | Capabilities::GPU_REMOTE_HOST,
            false => same_host,
        }
    }

    fn install(&self, ctx: InstallContext) -> te_core::Result<()> {
        if let Some(e) = &self.refused {
            return Err(e.clone().into());
        }
        let cuda = te_cuda::driver().map_err(|e| te_core::Error::Transport {
            transport: "nvlink",
            reason: e.to_string(),
        })?;
        let _ = self.local_name.set(ctx.local_name.clone());
        let (opened, own) = (self.opened.clone(), ctx.local_name.clone());
        self.workers.start(
            WORKERS,
            ctx.sink,
            Arc::new(move |op: &SliceOp| execute(&opened, &own, op)),
        )?;
        info!(
            devices = cuda.devices,
            driver = cuda.version,
            mnnvl = self.options.mnnvl,
            "nvlink transport installed"
        );
        Ok(())
    }

    fn register(&self, region: &Arc<Region>) -> te_core::Result<()> {
        let Location::Cuda(_) = region.location() else {
            return Ok(());
        };
        // Memory this transport cannot export stays registered for the others (te-rdma's
        // dma-buf, te-tcp's staging): nvlink just publishes no handle for it, and says why.
        match export(region) {
            Ok(name) => {
                self.exported
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(region.addr(), name);
            }
            Err(why) => warn!(
                addr = format_args!("{:#x}", region.addr()),
                "nvlink publishes no handle for this region: {why}"
            ),
        }
        Ok(())
    }

    fn unregister(&self, region: &Region) {
        self.exported
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&region.addr());
    }

    fn describe(&self, desc: &mut SegmentDesc) {
        let exported = self.exported.lock().unwrap_or_else(|e| e.into_inner());
        for b in &mut desc.buffers {
            if let Some(name) = exported.get(&b.addr) {
                b.shm_name = Some(name.to_string());
            }
        }
    }

    /// A handle of a segment whose owner is proven to run on this host, or, for a fabric
    /// handle under `MC_FORCE_MNNVL`, one signed with the cluster key: a handle in anyone
    /// else's descriptor could name another process's GPU memory.
    fn serves(&self, target: &RemoteSegment, buffer: &BufferDesc) -> bool {
        let signed = matches!(target.origin(), Origin::Signed { .. });
        match buffer.shm_name.as_deref().and_then(GpuName::parse) {
            Some(n) if matches!(n.kind, HandleKind::Fabric { .. }) => {
                target.same_host() || (self.options.mnnvl && signed)
            }
            Some(_) => target.same_host(),
            None => false,
        }
    }

    fn slice_size(&self, _target: &te_core::segment::RemoteSegment) -> Option<u64> {
        Some(SLICE)
    }

    fn post(&self, slices: Vec<SliceOp>) {
        self.workers.post(slices);
    }

    fn close_segment(&self, segment: &RemoteSegment) {
        let Ok(cuda) = te_cuda::driver() else {
            return;
        };
        let mut map = self.opened.lock().unwrap_or_else(|e| e.into_inner());
        for b in &segment.desc().buffers {
            if let Some(m) = b.shm_name.as_ref().and_then(|n| map.remove(n)) {
                close(cuda, m);
            }
        }
    }

    fn shutdown(&self) {
        self.workers.shutdown();
        if let Ok(cuda) = te_cuda::driver() {
            let mut map = self.opened.lock().unwrap_or_else(|e| e.into_inner());
            map.drain().for_each(|(_, m)| close(cuda, m));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_read_mooncakes_switches() {
        let opts = |vars: &[(&str, &str)]| NvlinkOptions::from_lookup(&te_sys::env::table(vars));
        let o = opts(&[]).unwrap();
        assert_eq!((o.mnnvl, o.use_fabric), (false, false));
        let t = NvlinkTransport::with_options(o);
        assert!(!t.capabilities().contains(Capabilities::GPU_REMOTE_HOST));
        let o = opts(&[("MC_USE_FABRIC", "1")]).unwrap();
        assert_eq!((o.mnnvl, o.use_fabric), (false, true));
        let o = opts(&[("MC_FORCE_MNNVL", "True")]).unwrap();
        assert_eq!(
            (o.mnnvl, o.use_fabric),
            (true, true),
            "MNNVL needs fabric memory"
        );
        let t = NvlinkTransport::with_options(o);
        assert!(t.capabilities().contains(Capabilities::GPU_REMOTE_HOST));
        // Mooncake takes any value as on; te takes "False" as off, and refuses nonsense by name.
        assert!(!opts(&[("MC_FORCE_MNNVL", "False")]).unwrap().mnnvl);
        let e = opts(&[("MC_FORCE_MNNVL", "maybe")])
            .unwrap_err()
            .to_string();
        assert!(e.contains("MC_FORCE_MNNVL") && e.contains("maybe"), "{e}");
        let e = opts(&[("MC_USE_FABRIC", "2")]).unwrap_err().to_string();
        assert!(e.contains("MC_USE_FABRIC"), "{e}");
    }

    fn buffer_of(shm_name: &str, origin: Origin) -> (RemoteSegment, BufferDesc) {
        let mut desc: SegmentDesc = serde_json::from_value(serde_json::json!({
            "name": "peer:1", "protocol": "tcp", "te_host_id": te_core::segment::host_id(),
            "buffers": [{"name": "cuda:0", "addr": 1 << 20, "length": 4096, "shm_name": shm_name}],
        }))
        .unwrap();
        desc.origin = origin;
        let buffer = desc.buffers[0].clone();
        (RemoteSegment::new(1, "127.0.0.1".into(), 1, desc), buffer)
    }

    #[test]
    fn handles_are_opened_only_from_proven_owners_and_fabric_ones_elsewhere_only_signed() {
        let name = |kind| {
            GpuName {
                kind,
                device: 0,
                offset: 0,
                handle: [7; 64],
            }
            .to_string()
        };
        let (ipc, fabric) = (
            name(HandleKind::Ipc),
            name(HandleKind::Fabric { size: 2 << 20 }),
        );
        let here = Origin::Served {
            pid: std::process::id(),
        };
        let signed_elsewhere = Origin::Signed { pid: None };
        let plain = NvlinkTransport::with_options(NvlinkOptions::default());
        let mnnvl = NvlinkTransport::with_options(
            NvlinkOptions::from_lookup(&te_sys::env::table(&[("MC_FORCE_MNNVL", "1")])).unwrap(),
        );
        let serves = |t: &NvlinkTransport, n: &str, origin: Origin| {
            let (seg, b) = buffer_of(n, origin);
            t.serves(&seg, &b)
        };
        for t in [&plain, &mnnvl] {
            assert!(
                serves(t, &ipc, here) && serves(t, &fabric, here),
                "a proven owner on this host"
            );
            assert!(
                !serves(t, &ipc, Origin::Unproven) && !serves(t, &fabric, Origin::Unproven),
                "a descriptor claiming this host, unproven (a forged one)"
            );
            assert!(
                !serves(t, &ipc, signed_elsewhere),
                "IPC handles stay on their host"
            );
            assert!(
                !serves(t, "/dev/shm/te-1", here),
                "shared memory is te-shm's"
            );
        }
        assert!(!serves(&plain, &fabric, signed_elsewhere));
        assert!(serves(&mnnvl, &fabric, signed_elsewhere));
        assert!(
            !serves(&mnnvl, &fabric, Origin::Unproven),
            "another host's fabric handle, unsigned"
        );
    }

    #[test]
    fn memory_it_cannot_export_stays_registered_without_a_handle() {
        // Host memory labelled as a GPU's (or any GPU memory on a machine where export fails):
        // registration succeeds for the other transports, and nvlink publishes nothing for it.
        let host = vec![0u8; 4096];
        let region = Arc::new(Region::new(
            host.as_ptr() as u64,
            4096,
            Location::Cuda(0),
            te_core::Permission::RemoteReadWrite,
            None,
        ));
        let t = NvlinkTransport::with_options(NvlinkOptions::default());
        t.register(&region).unwrap();
        let mut desc: SegmentDesc = serde_json::from_value(serde_json::json!({
            "name": "me:1", "protocol": "tcp",
            "buffers": [{"name": "cuda:0", "addr": host.as_ptr() as u64, "length": 4096}],
        }))
        .unwrap();
        t.describe(&mut desc);
        assert_eq!(desc.buffers[0].shm_name, None);
    }
}
