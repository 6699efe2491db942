//! The seam between the engine and the transports: [`Transport`], the slices it is handed
//! ([`SliceOp`]) and how it reports them back ([`CompletionSink`]).
//!
//! A transport executes slices on its own threads and reports each one exactly once.
//! It knows nothing about batches or tasks beyond the opaque [`SliceToken`] it carries back,
//! and must never block the submitting thread on a connect or a handshake.

use std::fmt;
use std::sync::Arc;

use crate::batch::SliceToken;
use crate::config::Config;
use crate::error::Result;
use crate::memory::{Region, RegionTable};
use crate::segment::{RemoteSegment, SegmentDesc, SegmentSecret};

pub use crate::memory::Opcode;

/// One slice to move: `len` bytes between `local_addr` and `remote_addr` of `target`.
pub struct SliceOp {
    /// Direction.
    pub opcode: Opcode,
    /// Address in this process (inside a pinned local region).
    pub local_addr: u64,
    /// Address in the target process (inside one of its published buffers).
    pub remote_addr: u64,
    /// Bytes to move (> 0).
    pub len: u64,
    /// Local rail (index into the rails given at install).
    pub local_rail: u16,
    /// Remote rail (index into the target's `te_rails`).
    pub remote_rail: u16,
    /// The target segment, as opened.
    pub target: Arc<RemoteSegment>,
    /// The engine's handle for this slice; hand it back through the sink.
    pub token: SliceToken,
    /// `[local_addr, local_addr+len)` as made, kept apart from the public fields (which a
    /// transport may change); of no bytes when it is GPU memory (slices are never empty).
    pub(crate) host: (u64, usize),
}

impl fmt::Debug for SliceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SliceOp")
            .field("opcode", &self.opcode)
            .field("local_addr", &format_args!("{:#x}", self.local_addr))
            .field("remote_addr", &format_args!("{:#x}", self.remote_addr))
            .field("len", &self.len)
            .field("rails", &(self.local_rail, self.remote_rail))
            .field("target", &self.target.name())
            .finish()
    }
}

impl SliceOp {
    /// Whether the application canceled the slice's task (or its deadline passed);
    /// a transport checks this before putting the slice on the wire.
    pub fn is_canceled(&self) -> bool {
        self.token.is_canceled()
    }

    /// The slice's local memory, for the kernel or a copy to move its bytes: `None` when it is
    /// GPU memory (which the host cannot address).
    pub fn local_range(&self) -> Option<te_sys::PinnedRange<'_>> {
        let (addr, len) = self.host;
        if len == 0 {
            return None;
        }
        // SAFETY: the range lies in a host region that the slice's task pinned at submit (the
        // engine checked it, and the registration contract makes registered memory valid
        // while registered). The token in `self` holds the task, whose pin is released only
        // after the slice is reported, which consumes `self`: the borrow ends first.
        #[allow(unsafe_code)]
        Some(unsafe { te_sys::PinnedRange::new(addr, len) })
    }
}

pub use crate::outcome::{Rejection, SliceError, failure_kind, settled};

/// Where transports report slice outcomes. The engine implements it.
pub trait CompletionSink: Send + Sync {
    /// Reports `slice` as finished with `outcome`. Called exactly once per posted slice.
    fn complete(&self, slice: SliceOp, outcome: Result<(), SliceError>);

    /// Reports `slice` as finished successfully: the same as `complete(slice, Ok(()))`, for a
    /// transport that has just copied the slice's bytes on this thread. Passing no outcome
    /// spares a read of one from memory behind the copy's stores: that read cannot be served
    /// from the store just made and waits until every store of the copy has reached the cache
    /// (about 0.1 µs after a 64 KiB copy).
    fn complete_ok(&self, slice: SliceOp) {
        self.complete(slice, Ok(()));
    }
}

/// What a transport gets when it is installed into an engine.
#[derive(Clone)]
pub struct InstallContext {
    /// The engine's configuration.
    pub config: Arc<Config>,
    /// The local segment's name.
    pub local_name: String,
    /// The address the engine's listeners bind to.
    pub bind_ip: std::net::IpAddr,
    /// The control listener's address (its IP unspecified when it listens on every address).
    pub control_addr: std::net::SocketAddr,
    /// The local region table (checked by targets on every request).
    pub regions: Arc<RegionTable>,
    /// The local segment's secret (requests must carry it).
    pub secret: SegmentSecret,
    /// Where to report completions.
    pub sink: Arc<dyn CompletionSink>,
    /// The local rails (NIC name and address), in the order slices name them by index.
    pub rails: Vec<Rail>,
    /// The control listener's state: a transport that sets up endpoints through the control
    /// channel installs its handshake handler here, and its client requests use its
    /// `cluster_key`.
    pub control: Arc<crate::control::ControlState>,
}

/// One local rail: a NIC and its address.
pub use te_topology::rails::Rail;

/// Load and health of one local rail (Mooncake's `NicLoadStats`, plus te's counters).
pub use te_metrics::rail::RailLoad as RailStats;

/// What a transport can move, between which kinds of memory. The engine picks the transport
/// for a buffer from these, and te-tent ranks transports by them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Capabilities(u32);

impl Capabilities {
    /// No capability.
    pub const NONE: Capabilities = Capabilities(0);
    /// Host DRAM to host DRAM of a process on another host (tcp, rdma).
    pub const DRAM_REMOTE_HOST: Capabilities = Capabilities(1);
    /// Host DRAM to host DRAM of another process on this host (shm).
    pub const DRAM_SAME_HOST: Capabilities = Capabilities(1 << 1);
    /// Host DRAM to and from a file segment (uring, bufio).
    pub const DRAM_FILE: Capabilities = Capabilities(1 << 2);
    /// Host DRAM to and from memory on a CXL device mapped by the peer too (cxl).
    pub const DRAM_CXL: Capabilities = Capabilities(1 << 3);
    /// GPU memory to and from memory of a process on another host (GPUDirect RDMA).
    pub const GPU_REMOTE_HOST: Capabilities = Capabilities(1 << 4);
    /// GPU memory to and from memory of another process on this host (NVLink, CUDA IPC).
    pub const GPU_SAME_HOST: Capabilities = Capabilities(1 << 5);
    /// GPU memory to and from a file segment (GPUDirect Storage).
    pub const GPU_FILE: Capabilities = Capabilities(1 << 6);
    /// Between GPU memory and host DRAM of this process (a device copy; the staging hop).
    pub const GPU_LOCAL: Capabilities = Capabilities(1 << 7);

    const NAMES: [(Capabilities, &'static str); 8] = [
        (Capabilities::DRAM_REMOTE_HOST, "dram-remote-host"),
        (Capabilities::DRAM_SAME_HOST, "dram-same-host"),
        (Capabilities::DRAM_FILE, "dram-file"),
        (Capabilities::DRAM_CXL, "dram-cxl"),
        (Capabilities::GPU_REMOTE_HOST, "gpu-remote-host"),
        (Capabilities::GPU_SAME_HOST, "gpu-same-host"),
        (Capabilities::GPU_FILE, "gpu-file"),
        (Capabilities::GPU_LOCAL, "gpu-local"),
    ];

    /// Whether every capability of `other` is in `self`.
    pub fn contains(self, other: Capabilities) -> bool {
        self.0 & other.0 == other.0
    }

    /// The capabilities' names (`dram-remote-host`, `dram-file`, ...).
    pub fn names(self) -> Vec<&'static str> {
        Self::NAMES
            .iter()
            .filter(|(c, _)| self.contains(*c))
            .map(|(_, n)| *n)
            .collect()
    }
}

impl std::ops::BitOr for Capabilities {
    type Output = Capabilities;
    fn bitor(self, rhs: Capabilities) -> Capabilities {
        Capabilities(self.0 | rhs.0)
    }
}

impl fmt::Display for Capabilities {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.names().join(","))
    }
}

/// A way of moving bytes. Object-safe; the engine holds `Arc<dyn Transport>`.
pub trait Transport: Send + Sync {
    /// The protocol name used in segment descriptors (`"tcp"`, `"rdma"`).
    fn name(&self) -> &'static str;

    /// What this transport can move (the engine routes file segments to a transport with
    /// [`Capabilities::DRAM_FILE`], other segments by protocol and [`serves`](Self::serves)).
    fn capabilities(&self) -> Capabilities;

    /// Starts the transport's listeners and threads.
    ///
    /// # Errors
    /// The transport cannot serve (no port, no device).
    fn install(&self, ctx: InstallContext) -> Result<()>;

    /// Adds this transport's fields (ports, keys) to the local segment descriptor; a transport
    /// that publishes nothing of its own keeps the default.
    fn describe(&self, _desc: &mut SegmentDesc) {}

    /// Called after a region enters the table.
    ///
    /// # Errors
    /// The transport cannot use the region (the engine then rolls the registration back).
    fn register(&self, _region: &Arc<Region>) -> Result<()> {
        Ok(())
    }

    /// Called after a region leaves the table (no slice holds it any more).
    fn unregister(&self, _region: &Region) {}

    /// Queues slices for execution and returns at once; outcomes go to the sink.
    fn post(&self, slices: Vec<SliceOp>);

    /// As [`post`](Self::post) for a submit that made a single slice (most small transfers):
    /// a transport that can take it without a list (a memory copy on the posting thread)
    /// overrides this; by default it is posted as a list of one.
    fn post_one(&self, slice: SliceOp) {
        self.post(vec![slice]);
    }

    /// Whether this transport can reach `buffer` of `target` by a path better than the
    /// segment's own protocol (te-shm: the owner is on this host and the buffer is shared
    /// memory; te-cxl: the buffer is on a CXL device mapped here too). The engine prefers a
    /// transport that says yes.
    fn serves(&self, _target: &RemoteSegment, _buffer: &crate::segment::BufferDesc) -> bool {
        false
    }

    /// The slice size this transport wants towards `target`, if not the engine's
    /// (`MC_SLICE_SIZE`): memory-copy transports take larger slices, as a copy costs the same
    /// per byte in any size; te-tcp takes larger ones towards a Mooncake target, whose
    /// sequential server pays per request.
    fn slice_size(&self, _target: &RemoteSegment) -> Option<u64> {
        None
    }

    /// Per local rail load counters; transports without rails report none.
    fn rail_stats(&self) -> Vec<RailStats> {
        Vec::new()
    }

    /// Drops connections to a segment that was closed.
    fn close_segment(&self, _segment: &RemoteSegment) {}

    /// Stops listeners and takes no more slices; slices already queued still complete or fail
    /// through the sink, each exactly once.
    fn shutdown(&self) {}
}

#[cfg(test)]
mod tests {
    use super::Capabilities;

    #[test]
    fn capabilities_combine_and_name_themselves() {
        let tcp = Capabilities::DRAM_REMOTE_HOST | Capabilities::DRAM_SAME_HOST;
        assert!(tcp.contains(Capabilities::DRAM_SAME_HOST));
        assert!(!tcp.contains(Capabilities::DRAM_FILE));
        assert!(!tcp.contains(Capabilities::DRAM_FILE | Capabilities::DRAM_SAME_HOST));
        assert!(tcp.contains(Capabilities::NONE));
        assert_eq!(tcp.to_string(), "dram-remote-host,dram-same-host");
        assert_eq!(Capabilities::DRAM_CXL.names(), vec!["dram-cxl"]);
        assert_eq!(Capabilities::NONE.to_string(), "");
    }
}
