//! [`CmaTransport`]: memory the application allocated itself (a numpy array, a tensor, a
//! `malloc`ed block) moved between two processes on one host in one copy, by cross-memory
//! attach (`process_vm_writev`/`readv`, as UCX's `cma` transport), where shared memory would
//! need te to have allocated it and TCP would copy it twice through the network stack.
//!
//! Who can reach what (docs/security.md): the kernel lets this process copy into or out of a
//! peer only where it may ptrace that peer: the same user under Yama's `ptrace_scope` 0, or 1
//! with the peer naming this process through `PR_SET_PTRACER`, or `CAP_SYS_PTRACE`. Such a
//! process could already read and write all of the peer's memory; te adds no reach. te itself
//! still keeps to what the peer published: every slice is checked by the engine against the
//! descriptor (bounds, permission) before it is posted, the peer's process is identified by
//! pid and start time (`te_owner`, rechecked within milliseconds of every post, so a pid reused
//! by another process is never written), and the kernel refuses any address the peer has not
//! mapped.
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
    /// Peers (by `te_owner`) found unreachable, so they are not probed again.
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
}

/// The pid the peer's descriptor names (`te_owner`, `pid:start-time`).
fn owner_pid(target: &RemoteSegment) -> Option<u32> {
    let owner = target.desc().te_owner.as_deref()?;
    owner.split(':').next()?.parse().ok()
}

/// The peer's pid, when its descriptor names a process that runs on this host now (`te_owner`
/// read against this host's `/proc`: a peer in another pid namespace, or one whose pid now
/// names another process, does not match).
fn live_pid(target: &RemoteSegment) -> Option<u32> {
    if !target.same_host() || target.owner_alive() != Some(true) {
        return None;
    }
    owner_pid(target)
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
    let pid = owner_pid(&op.target)
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
        let (Some(pid), Some(owner)) = (live_pid(target), target.desc().te_owner.clone()) else {
            return false;
        };
        let mut refused = self.refused.lock().unwrap_or_else(|e| e.into_inner());
        if refused.contains(&owner) {
            return false;
        }
        let mut byte = [0u8; 1];
        let probe = read_from_process(pid, te_sys::PinnedRange::of_mut(&mut byte), buffer.addr);
        match probe {
            Ok(()) => true,
            Err(e) => {
                let why = refusal(&e, ptrace_scope());
                match self.said.swap(true, Ordering::AcqRel) {
                    false => warn!(peer = %target.name(), "{why}; using the segment's protocol"),
                    true => info!(peer = %target.name(), "{why}; using the segment's protocol"),
                }
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
