//! Mooncake's lower-level engine API, the one its C header exposes (`createTransferEngine`,
//! `openSegment`, `allocateBatchID`, `submitTransfer`, `getTransferStatus`, ...): engines made
//! with or without automatic transports, peers known by small segment ids (0 is the engine's
//! own segment, `LOCAL_SEGMENT`), batches filled by repeated submissions and read task by
//! task, and Mooncake's positive `Status` codes for those calls.
//!
//! Not here: C types, pointers and strings (te-capi converts them and catches panics).

use std::time::Duration;
use te_core::{Notification, Opcode, TransferRequest, TransferStatus};

use crate::engine::MooncakeEngine;
use crate::error::{FacadeError, Result};
use crate::runtime::{RuntimeKind, Submission};
use te_catalog::Protocol;

/// Mooncake's `LOCAL_SEGMENT`: the engine's own segment.
pub const LOCAL_SEGMENT: i32 = 0;

/// One request of a C-API batch: Mooncake's `transfer_request_t`, converted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentRequest {
    /// READ or WRITE.
    pub opcode: Opcode,
    /// Local address.
    pub source: u64,
    /// Segment id from [`MooncakeEngine::open_segment_id`], or [`LOCAL_SEGMENT`].
    pub target_id: i32,
    /// Address in the target segment.
    pub target_offset: u64,
    /// Bytes.
    pub length: u64,
}

/// A NIC's load: Mooncake's `nic_load_stat_t`.
#[derive(Clone, Debug, PartialEq)]
pub struct NicLoad {
    /// Device (rail) name.
    pub device_name: String,
    /// Bytes posted and not yet completed.
    pub inflight_bytes: u64,
    /// Completed bandwidth, bytes per second, smoothed.
    pub ewma_bandwidth_bps: f64,
}

impl FacadeError {
    /// Mooncake's positive `Status::Code` (0 is OK): what `submitTransfer`,
    /// `getTransferStatus` and `freeBatchID` return.
    pub fn status_code(&self) -> i32 {
        self.code().saturating_neg()
    }
}

impl MooncakeEngine {
    /// Mooncake's `createTransferEngine`: an engine named `local_server_name` (peer to peer,
    /// its host, the port picked; with a metadata service, the name as given, with
    /// `:rpc_port` added when it has no port and `rpc_port` is not 0). `ip_or_host_name`, when
    /// not empty, is the host peers reach peer to peer. `auto_discover` installs transports as
    /// Mooncake's discovery does (RDMA where there are devices and `MC_FORCE_TCP` is unset,
    /// TCP otherwise); without it the caller installs them
    /// ([`install_transport`](Self::install_transport)). Under `MC_USE_TENT` the engine runs
    /// on te's TENT runtime with the transports its configuration enables.
    ///
    /// # Errors
    /// A bad metadata string or name, a service that cannot be reached, no port to bind.
    pub fn create(
        metadata: &str,
        local_server_name: &str,
        ip_or_host_name: &str,
        rpc_port: u64,
        auto_discover: bool,
    ) -> Result<Self> {
        let p2p = matches!(
            te_core::metadata::MetadataKind::parse(metadata)?,
            te_core::metadata::MetadataKind::P2p
        );
        let name = match (p2p, ip_or_host_name.trim()) {
            (true, host) if !host.is_empty() => host.to_string(),
            (true, _) => local_server_name.to_string(),
            (false, _) if rpc_port != 0 && !local_server_name.contains(':') => {
                let port = u16::try_from(rpc_port).map_err(|_| {
                    te_core::Error::InvalidArgument(format!("rpc_port {rpc_port} is not a port"))
                })?;
                format!("{local_server_name}:{port}")
            }
            (false, _) => local_server_name.to_string(),
        };
        let engine = MooncakeEngine::new();
        let kind = RuntimeKind::from_env();
        // TENT starts the transports its configuration enables (Mooncake ignores
        // `auto_discover` there too).
        let transports = match kind {
            RuntimeKind::Classic => auto_discover.then_some(("rdma", "")),
            _ => None,
        };
        engine.start(kind, &name, metadata, transports)?;
        Ok(engine)
    }

    /// Mooncake's `installTransport`: any protocol name (`rdma` on `devices`, comma-separated,
    /// empty for all; `auto` for every transport that can start here, not installed yet);
    /// with the `instant` feature (a bench's build) also `instant`, which moves no byte.
    /// One that is installed already stays as it is (a warning), as in Mooncake. On TENT,
    /// whose transports start with the engine, only those are "installed".
    ///
    /// # Errors
    /// A protocol te cannot serve here (named), RDMA without devices.
    pub fn install_transport(&self, protocol: &str, devices: &str) -> Result<()> {
        let live = self.live()?;
        let engine = live.engine();
        // Moves no byte: only in builds with the `instant` feature (the C API's cost bench).
        #[cfg(feature = "instant")]
        if protocol == "instant" && !live.runtime().has_transport("instant") {
            engine.install_transport(std::sync::Arc::new(te_instant::InstantTransport::new()))?;
            return Ok(());
        }
        let wanted = Protocol::parse(protocol)?;
        if wanted
            .transports()
            .iter()
            .any(|n| live.runtime().has_transport(n))
        {
            // Mooncake's answer too: a warning, and the transport that is there.
            tracing::warn!(protocol, "transport already installed");
            return Ok(());
        }
        match (live.runtime_kind(), wanted) {
            #[cfg(feature = "rdma")]
            (RuntimeKind::Classic, Protocol::Rdma) => engine
                .install_transport(crate::install::made(engine, Protocol::Rdma, devices, None)?)?,
            (RuntimeKind::Classic, other) => crate::install::install_classic(
                engine,
                other,
                devices,
                &live.settings,
                &live.managed.source,
            )?,
            (_, other) => {
                return Err(te_core::Error::NotSupportedTransport(format!(
                    "protocol {:?}: te's TENT runtime installs its transports when it starts (MC_TENT_CONF), and {} is not among them",
                    other.name(),
                    other.transport()
                ))
                .into());
            }
        }
        Ok(())
    }

    /// Opens segment `name` and returns its id (Mooncake's `openSegment`); the engine's own
    /// name gives [`LOCAL_SEGMENT`]. With `fresh`, the descriptor is fetched again even if
    /// cached (`openSegmentNoCache`).
    ///
    /// # Errors
    /// An unknown or unreachable peer; more segments than an `int32` counts.
    pub fn open_segment_id(&self, name: &str, fresh: bool) -> Result<i32> {
        let live = self.live()?;
        let engine = live.engine();
        if name.trim_start_matches('/') == engine.segment_name() {
            return Ok(LOCAL_SEGMENT);
        }
        let id = match fresh {
            true => engine.refresh_segment(name)?,
            false => engine.open_segment(name)?,
        };
        i32::try_from(id).map_err(|_| {
            te_core::Error::InvalidArgument(format!("segment id {id} does not fit an int32")).into()
        })
    }

    /// Opens the regular file at `path` as a segment (te's addition, on both runtimes): READs
    /// and WRITEs move bytes between registered memory and the file, the file offset taking
    /// the place of the remote address, through the same calls as a peer's memory. Returns the
    /// name those calls take (`file:` and the canonical path) and the segment's id (the C
    /// API's). A file segment is local: never published, and its path comes only from here.
    ///
    /// # Errors
    /// A missing, empty or irregular file, one `writable` cannot open for writing (the OS
    /// error named), or no file transport installed (`io_uring`, or `auto`).
    pub fn open_file(&self, path: &str, writable: bool) -> Result<(String, i32)> {
        let live = self.live()?;
        let engine = live.engine();
        let access = match writable {
            true => te_core::FileAccess::ReadWrite,
            false => te_core::FileAccess::ReadOnly,
        };
        let id = engine.open_file_segment(std::path::Path::new(path), access)?;
        let name = engine.segment(id)?.name().to_string();
        live.sessions.insert(&name, id);
        let id = i32::try_from(id).map_err(|_| {
            te_core::Error::InvalidArgument(format!("segment id {id} does not fit an int32"))
        })?;
        Ok((name, id))
    }

    /// Closes segment `id` (Mooncake's `closeSegment`); the own segment stays open.
    ///
    /// # Errors
    /// An id that is not an open segment.
    pub fn close_segment_id(&self, id: i32) -> Result<()> {
        let live = self.live()?;
        match id {
            LOCAL_SEGMENT => Ok(()),
            _ => Ok(live.engine().close_segment(segment_of(id)?)?),
        }
    }

    /// Fetches every open segment's descriptor again (Mooncake's `syncSegmentCache`).
    ///
    /// # Errors
    /// The first peer that could not be fetched (the others are fetched still).
    pub fn sync_segments(&self) -> Result<()> {
        let live = self.live()?;
        let engine = live.engine();
        let mut first = None;
        let peers = engine.open_segment_names();
        for name in peers
            .iter()
            .filter(|n| !n.starts_with(crate::session::FILE_PREFIX))
        {
            if let Err(e) = engine.refresh_segment(name) {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), |e| Err(e.into()))
    }

    /// Allocates a batch of `capacity` tasks (Mooncake's `allocateBatchID`).
    ///
    /// # Errors
    /// A capacity of 0 or over `MC_MAX_BATCH_SIZE`.
    pub fn allocate_batch_id(&self, capacity: usize) -> Result<u64> {
        self.live()?.runtime().allocate(capacity)
    }

    /// Adds `requests` to batch `id` (Mooncake's `submitTransfer`; repeatable until the batch
    /// is full); with `notify`, the target of the first request receives it once every task
    /// of the batch has completed. The requests come as the caller converts them (one pass,
    /// one list), and the first that failed to convert fails the submit.
    ///
    /// # Errors
    /// A request that failed to convert, an unknown batch or segment, a full batch, a range
    /// not registered on either side.
    pub fn submit_to_batch<I>(
        &self,
        id: u64,
        requests: I,
        notify: Option<Notification>,
    ) -> Result<()>
    where
        I: IntoIterator<Item = Result<SegmentRequest>>,
    {
        let live = self.live()?;
        let engine = live.engine();
        // Looked up at the first request for the engine's own segment, if any.
        let mut own = None;
        let requests = requests.into_iter();
        let (low, high) = requests.size_hint();
        let mut reqs = Vec::with_capacity(high.unwrap_or(low));
        for r in requests {
            let r = r?;
            let target_id = match (r.target_id, own) {
                (LOCAL_SEGMENT, Some(own)) => own,
                (LOCAL_SEGMENT, None) => *own.insert(engine.open_segment(engine.segment_name())?),
                (id, _) => segment_of(id)?,
            };
            reqs.push(TransferRequest {
                opcode: r.opcode,
                source: r.source,
                target_id,
                target_offset: r.target_offset,
                length: r.length,
            });
        }
        let how = Submission {
            notify,
            ..Submission::default()
        };
        live.runtime().submit(id, &reqs, how)
    }

    /// Task `task` of batch `id` (Mooncake's `getTransferStatus`).
    ///
    /// # Errors
    /// An unknown batch or task.
    pub fn batch_task_status(&self, id: u64, task: usize) -> Result<TransferStatus> {
        self.live()?.runtime().task_status(id, task)
    }

    /// Waits up to `timeout` for every task of batch `id` to end, sleeping (never spinning),
    /// and returns the batch's status: terminal when it ended, WAITING or PENDING when the time
    /// ran out first. The batch is not freed (te's C extension `te_waitBatch`; Mooncake's C API
    /// has only per-task polling).
    ///
    /// # Errors
    /// An unknown or freed batch.
    pub fn wait_batch_status(&self, id: u64, timeout: Duration) -> Result<TransferStatus> {
        self.live()?.runtime().wait(id, timeout)
    }

    /// Cancels batch `id` (te's C extension `te_cancelBatch`): no more of its slices start,
    /// those on the wire finish, and it ends CANCELED (COMPLETED when nothing was left). The
    /// batch is not freed: wait for its end, then free it.
    ///
    /// # Errors
    /// An unknown or freed batch.
    pub fn cancel_batch_id(&self, id: u64) -> Result<()> {
        self.live()?.runtime().cancel(id)
    }

    /// Frees batch `id` (Mooncake's `freeBatchID`).
    ///
    /// # Errors
    /// An unknown batch; one with tasks still moving (`BatchBusy`).
    pub fn free_batch_id(&self, id: u64) -> Result<()> {
        self.live()?.runtime().free(id)
    }

    /// Sends `notification` to the owner of segment `id` without a transfer (Mooncake's
    /// `genNotifyInEngine`).
    ///
    /// # Errors
    /// An unknown segment; an unreachable peer.
    pub fn notify_segment(&self, id: u64, notification: &Notification) -> Result<()> {
        let live = self.live()?;
        let engine = live.engine();
        let name = match i32::try_from(id) {
            Ok(LOCAL_SEGMENT) => engine.segment_name().to_string(),
            _ => engine.segment(id)?.name().to_string(),
        };
        Ok(engine.send_notify(&name, notification)?)
    }

    /// Each rail's load (Mooncake's `getNicLoadStats`).
    ///
    /// # Errors
    /// [`FacadeError::NotInitialized`].
    pub fn nic_loads(&self) -> Result<Vec<NicLoad>> {
        Ok(self
            .live()?
            .engine()
            .nic_load_stats()
            .into_iter()
            .map(|s| NicLoad {
                device_name: s.name,
                inflight_bytes: s.inflight_bytes,
                ewma_bandwidth_bps: s.ewma_bandwidth_bps,
            })
            .collect())
    }

    /// The transports installed, in the order the engine asks them (the first is the protocol
    /// its descriptor publishes), each with what it can move (capability names).
    ///
    /// # Errors
    /// [`FacadeError::NotInitialized`].
    pub fn transports(&self) -> Result<Vec<(&'static str, Vec<&'static str>)>> {
        Ok(self
            .live()?
            .engine()
            .transport_capabilities()
            .into_iter()
            .map(|(name, caps)| (name, caps.names()))
            .collect())
    }

    /// The link table (Mooncake's `showLinks`): one line per rail, or a JSON array; the text
    /// ends with a line naming the transports installed.
    ///
    /// # Errors
    /// [`FacadeError::NotInitialized`].
    pub fn links(&self, json: bool) -> Result<String> {
        let live = self.live()?;
        let stats = live.engine().nic_load_stats();
        Ok(match json {
            true => {
                let rows: Vec<String> = stats
                    .iter()
                    .map(|s| {
                        format!(
                            "{{\"device\":{:?},\"inflight_bytes\":{},\"bytes_done\":{},\"errors\":{},\"ewma_bandwidth_bps\":{},\"paused\":{}}}",
                            s.name, s.inflight_bytes, s.bytes_done, s.errors, s.ewma_bandwidth_bps, s.paused
                        )
                    })
                    .collect();
                format!("[{}]", rows.join(","))
            }
            false => stats
                .iter()
                .map(|s| {
                    format!(
                        "{} inflight={} done={} errors={} bandwidth={:.0}B/s{}\n",
                        s.name,
                        s.inflight_bytes,
                        s.bytes_done,
                        s.errors,
                        s.ewma_bandwidth_bps,
                        if s.paused { " paused" } else { "" }
                    )
                })
                .chain(std::iter::once(format!(
                    "transports: {}\n",
                    live.engine()
                        .transport_capabilities()
                        .iter()
                        .map(|(n, caps)| format!("{n} ({})", caps.names().join(" ")))
                        .collect::<Vec<_>>()
                        .join(", ")
                )))
                .collect(),
        })
    }
}

/// A C segment id as te's.
fn segment_of(id: i32) -> Result<te_core::SegmentId> {
    u64::try_from(id)
        .map_err(|_| FacadeError::from(te_core::Error::UnknownSegment(id as i64 as u64)))
}
