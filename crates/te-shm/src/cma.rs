//! [`CmaTransport`]: memory the application allocated itself (a numpy array, a tensor, a
//! `malloc`ed block) moved between two processes on one host in one copy, by cross-memory
//! attach (`process_vm_writev`/`readv`, as UCX's `cma` transport), where shared memory would
//! need te to have allocated it and TCP would copy it twice through the network stack.
//!
//! Who can reach what (docs/security.md): the kernel lets this process copy into or out of a
//! peer only where it may ptrace that peer: the same user under Yama's `ptrace_scope` 0, or 1
//! with the peer naming this process through `PR_SET_PTRACER`, or `CAP_SYS_PTRACE`. Such a
//! process could already read and write all of the peer's memory; te adds no reach. But the
//! peer checks nothing on this path, so a descriptor must not be able to aim copies at a
//! process that did not describe itself: only a descriptor whose owner is proven, the process
//! (`te_owner`: pid and start time, rechecked within milliseconds of every post) that held the
//! other end of the connection it was served on, is served ([`live_pid`]). Every slice is checked by the engine against the descriptor (bounds,
//! permission) before it is posted, and the kernel refuses any address the peer has not mapped.
//!
//! Where the kernel refuses (another user, `ptrace_scope` 2 or 3, a container without the
//! capability, a peer in another pid namespace), this transport declines the peer's buffers,
//! says why once, and the engine moves them over the segment's protocol (TCP loopback).

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use te_core::segment::{BufferDesc, RemoteSegment};
use te_core::transport::{Capabilities, InstallContext, SliceError, SliceOp, Transport};
use te_sys::cross_memory::{ptrace_scope, read_from_process, write_to_process};
use te_workers::CopyWorkers;
use tracing::{info, warn};

/// Worker threads copying slices.
const WORKERS: usize = 2;

/// The cross-memory-attach transport.
pub struct CmaTransport {
    workers: CopyWorkers,
    /// The refusal already said (once per transport).
    said: AtomicBool,
    /// Proven peers' processes (`te_owner`) the kernel refused, so they are not probed again.
    refused: Mutex<Vec<String>>,
}

impl std::fmt::Debug for CmaTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CmaTransport").finish_non_exhaustive()
    }
}

impl Default for CmaTransport {
    fn default() -> Self {
        CmaTransport {
            workers: CopyWorkers::new("cma"),
            said: AtomicBool::new(false),
            refused: Mutex::new(Vec::new()),
        }
    }
}

impl CmaTransport {
    /// A transport not yet installed.
    pub fn new() -> Self {
        Self::default()
    }

    /// Says why `target`'s buffers go over the segment's protocol: a warning the first time,
    /// then at INFO.
    fn say(&self, target: &RemoteSegment, why: &str) {
        match self.said.swap(true, Ordering::AcqRel) {
            false => warn!(peer = %target.name(), "{why}; using the segment's protocol"),
            true => info!(peer = %target.name(), "{why}; using the segment's protocol"),
        }
    }
}

/// The peer's pid, when its descriptor's owner is proven to be a process of this host
/// ([`te_core::segment::Origin`]: it held the other end of the connection that served the
/// descriptor, or signed it) and still runs. The target checks nothing on this path, so a
/// descriptor naming another process (a listener of someone else's, a metadata service anyone
/// may write, a copy of this process's own descriptor) must never reach here.
fn live_pid(target: &RemoteSegment) -> Result<u32, String> {
    let pid = target.owner_pid().ok_or_else(|| {
        "the descriptor's owner is not proven to be a process of this host (it did not serve \
         the descriptor over the connection it came on)"
            .to_string()
    })?;
    match target.owner_alive() {
        Some(true) => Ok(pid),
        _ => Err(format!("the segment's process {pid} has exited")),
    }
}

/// Why the kernel refused an attach, in words an operator can act on.
fn refusal(e: &std::io::Error, scope: Option<u32>) -> String {
    let why = match (e.raw_os_error() == Some(EPERM), scope) {
        (true, Some(1)) => {
            "Yama's ptrace_scope is 1: a process may attach only to its descendants, or to a peer \
             that names it with prctl(PR_SET_PTRACER)"
        }
        (true, Some(2 | 3)) => {
            "Yama's ptrace_scope is 2 or 3: only CAP_SYS_PTRACE (or nobody) may attach"
        }
        (true, _) => {
            "the peer runs as another user, or this process lacks CAP_SYS_PTRACE in a container"
        }
        (false, _) => "the kernel refused",
    };
    format!("cross-memory attach refused ({e}): {why}")
}

/// `EPERM`, without a libc dependency in this crate.
const EPERM: i32 = 1;

/// One slice. Its post checked, within milliseconds, that the peer's pid still names the peer
/// ([`CopyWorkers::post_live`]).
fn execute(op: &SliceOp) -> Result<(), SliceError> {
    let pid = op
        .target
        .owner_pid()
        .ok_or_else(|| SliceError::Path("the peer's descriptor names no process".into()))?;
    let local = op
        .local_range()
        .ok_or_else(|| SliceError::Path("GPU memory on the cross-memory path".into()))?;
    let moved = match op.opcode {
        te_core::Opcode::Write => write_to_process(pid, local, op.remote_addr),
        _ => read_from_process(pid, local, op.remote_addr),
    };
    moved.map_err(|e| SliceError::Path(format!("cross-memory attach to pid {pid}: {e}")))
}

impl Transport for CmaTransport {
    fn name(&self) -> &'static str {
        "cma"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::DRAM_SAME_HOST
    }

    fn install(&self, ctx: InstallContext) -> te_core::Result<()> {
        self.workers
            .start(WORKERS, ctx.sink, std::sync::Arc::new(execute))?;
        info!(segment = %ctx.local_name, ptrace_scope = ?ptrace_scope(), "cma transport installed");
        Ok(())
    }

    /// A host buffer of a live process on this host that this process may attach to: probed
    /// once per peer by reading the buffer's first byte (a published buffer is at least
    /// remotely readable).
    fn serves(&self, target: &RemoteSegment, buffer: &BufferDesc) -> bool {
        if buffer.shm_name.is_some() || buffer.name.starts_with("cuda") {
            return false;
        }
        // An unproven owner is not remembered: a forged descriptor naming a process must not
        // keep that process's own descriptors off this path.
        let pid = match live_pid(target) {
            Ok(pid) => pid,
            Err(why) => {
                self.say(target, &why);
                return false;
            }
        };
        // Proven: `live_pid` matched it, start time included.
        let owner = target.desc().te_owner.clone().unwrap_or_default();
        let mut refused = self.refused.lock().unwrap_or_else(|e| e.into_inner());
        if refused.contains(&owner) {
            return false;
        }
        let mut byte = [0u8; 1];
        match read_from_process(pid, te_sys::PinnedRange::of_mut(&mut byte), buffer.addr) {
            Ok(()) => true,
            Err(e) => {
                self.say(target, &refusal(&e, ptrace_scope()));
                refused.push(owner);
                false
            }
        }
    }

    fn slice_size(&self, _target: &RemoteSegment) -> Option<u64> {
        Some(te_workers::COPY_SLICE)
    }

    fn post(&self, slices: Vec<SliceOp>) {
        self.workers.post_live(slices);
    }

    fn post_one(&self, slice: SliceOp) {
        self.workers.post_live_one(slice);
    }

    fn shutdown(&self) {
        self.workers.shutdown();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_say_what_to_change() {
        let eperm = std::io::Error::from_raw_os_error(EPERM);
        assert!(refusal(&eperm, Some(1)).contains("PR_SET_PTRACER"));
        assert!(refusal(&eperm, Some(2)).contains("CAP_SYS_PTRACE"));
        assert!(refusal(&eperm, Some(0)).contains("another user"));
        assert!(refusal(&eperm, None).contains("another user"));
        let gone = std::io::Error::from_raw_os_error(3);
        assert!(refusal(&gone, Some(0)).contains("the kernel refused"));
    }
}
