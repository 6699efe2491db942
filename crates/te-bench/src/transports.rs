//! Which transports a run installs for `--protocol`, and the memory or file its target is:
//! te-rdma alone for `rdma` (on `--device_name`'s verbs devices, or all); otherwise TCP (other
//! hosts); te-nvlink for `nvlink` (GPU memory); te-shm for `shm`; te-cxl for `cxl` (with a
//! stand-in device in `/dev/shm` for `--loopback` when `MC_CXL_DEV_PATH` is unset); te-uring's
//! io_uring or buffered-I/O transport for `uring` / `bufio`, whose target is a file.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use te_core::{Config, FileAccess, HostBuffer, SegmentId, TransferEngine};

use crate::flags::Flags;
use crate::memory::BenchMemory;
use crate::{BenchResult, TARGET_SEED, pattern};

/// What the transports installed give the target's memory: an allocator where one allocates
/// memory peers map (shared memory, a CXL device).
pub(crate) struct Installed {
    allocator: Option<te_catalog::Allocator>,
}

impl Installed {
    /// The target's buffer: GPU memory (`gpu`), shared memory, CXL device memory, or the heap.
    pub(crate) fn allocate(&self, size: usize, gpu: Option<u32>) -> BenchResult<BenchMemory> {
        let host = match (gpu, &self.allocator) {
            (Some(_), _) => return BenchMemory::new(gpu, size),
            (_, Some(allocate)) => allocate(size).map_err(|e| e.to_string())?,
            _ => Arc::new(HostBuffer::new(size).map_err(|e| e.to_string())?),
        };
        Ok(BenchMemory::Host(host))
    }
}

/// Counts the engine's requests and serves them where `--metrics_port` (or the variables of
/// te-metrics) ask.
pub(crate) fn meter(engine: &TransferEngine, flags: &Flags) -> BenchResult<()> {
    let counting = match flags.metrics {
        Some(addr) => te_metrics::start(&te_metrics::MetricsSettings {
            http: Some(addr),
            ..Default::default()
        })?,
        None => te_metrics::start_from_env(engine.metrics())?,
    };
    if counting {
        te_metrics::watch(engine.metrics());
        engine.set_metrics_enabled(true);
    }
    Ok(())
}

/// An engine named `name` with the transports `--protocol` needs, made by te-catalog: RDMA
/// alone for `rdma` (so the segment's protocol is rdma; the control channel needs no
/// transport), else TCP and the one `--protocol` names beside it.
pub(crate) fn start_engine(
    config: Config,
    flags: &Flags,
    name: &str,
) -> BenchResult<(TransferEngine, Installed)> {
    let devices = flags.devices();
    let make = |entry: &str, config: &Config| {
        let options = te_catalog::Options {
            config,
            lookup: &te_sys::env::process,
            devices: (!devices.is_empty()).then(|| devices.clone()),
            shm_dir: None,
        };
        te_catalog::make(entry, &options).map_err(|e| format!("{entry} transport: {e}"))
    };
    // The device is mapped before the engine takes the configuration.
    let cxl = match flags.protocol.as_str() {
        "cxl" => Some(make("cxl", &config)?),
        _ => None,
    };
    let engine = TransferEngine::init(config, &flags.metadata_server, name)
        .map_err(|e| format!("engine: {e}"))?;
    meter(&engine, flags)?;
    let entries: &[&str] = match flags.protocol.as_str() {
        "rdma" => &["rdma"],
        "nvlink" | "shm" | "uring" | "bufio" => &["tcp", flags.protocol.as_str()],
        _ => &["tcp"],
    };
    let mut made: Vec<te_catalog::Made> = Vec::new();
    for entry in entries {
        made.push(make(entry, engine.config())?);
    }
    made.extend(cxl);
    let mut installed = Installed { allocator: None };
    for m in made {
        let n = m.transport.name();
        engine
            .install_transport(m.transport)
            .map_err(|e| format!("{n} transport: {e}"))?;
        installed.allocator = installed.allocator.take().or(m.allocator);
    }
    Ok((engine, installed))
}

/// A stand-in CXL device for `--loopback` without `MC_CXL_DEV_PATH`: a file in `/dev/shm`
/// (memory, like the device), removed when dropped.
pub(crate) struct StandIn(PathBuf);

impl StandIn {
    pub(crate) fn make(config: &mut Config, bytes: u64) -> BenchResult<Option<StandIn>> {
        if config.cxl_dev_path.is_some() {
            return Ok(None);
        }
        let path = PathBuf::from(format!("/dev/shm/te-bench-cxl-{}", std::process::id()));
        let file = std::fs::File::create(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        file.set_len(bytes + te_cxl::HEADER_LEN + te_cxl::ALIGN)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        tracing::info!(path = %path.display(), "no MC_CXL_DEV_PATH: using a stand-in device file");
        config.cxl_dev_path = Some(path.clone());
        config.cxl_dev_size = None;
        Ok(Some(StandIn(path)))
    }
}

impl Drop for StandIn {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Opens `--file_path` as the target segment, created and sized to the working set when
/// short, and filled with the target pattern for a verified READ.
pub(crate) fn open_file_target(e: &TransferEngine, f: &Flags) -> BenchResult<(SegmentId, u64)> {
    use std::io::Write;
    let path = Path::new(&f.file_path);
    let ws = f.working_set();
    let fail = |e: std::io::Error| format!("{}: {e}", path.display());
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(path)
        .map_err(fail)?;
    if file.metadata().map_err(fail)?.len() < ws {
        file.set_len(ws).map_err(fail)?;
    }
    if f.verify && f.operation == "read" {
        let mut w = std::io::BufWriter::new(&file);
        let mut at = 0;
        while at < ws {
            let step = (1u64 << 20).min(ws - at);
            w.write_all(&pattern::bytes(TARGET_SEED, at, step as usize))
                .map_err(fail)?;
            at += step;
        }
        w.flush().map_err(fail)?;
        file.sync_all().map_err(fail)?;
    }
    let segment = e
        .open_file_segment(path, FileAccess::ReadWrite)
        .map_err(|e| e.to_string())?;
    Ok((segment, 0))
}
