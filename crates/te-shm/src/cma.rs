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
//! process that did not describe itself: only a descriptor fetched from the peer itself (peer
//! to peer), at an address of this host, whose process (`te_owner`: pid and start time,
//! rechecked within milliseconds of every post) holds the listener it came from, is served
//! ([`bound`]). Every slice is checked by the engine against the descriptor (bounds,
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

/// The peer's pid, when its descriptor names a process that runs on this host now (`te_owner`
/// read against this host's `/proc`: a peer in another pid namespace, or one whose pid now
/// names another process, does not match).
fn live_pid(target: &RemoteSegment) -> Option<u32> {
    if !target.same_host() || target.owner_alive() != Some(true) {
        return None;
    }
    target.owner_pid()
}

/// Whether `pid` is the process that described itself to us: the descriptor was fetched from
/// the owner's control listener (peer to peer), at an address of this host, and `pid` holds
/// that listening socket. Without that, a descriptor naming another process of this user (a
/// metadata service anyone may write, a listener of someone else's) could steer our copies
/// into it: the target checks nothing on this path, so the binding must hold before any.
fn bound(target: &RemoteSegment, pid: u32) -> Result<(), String> {
    if !target.desc().from_owner {
        return Err(
            "the descriptor came from a metadata service, not from the peer itself \
                    (cross-memory attach needs peer-to-peer handshakes)"
                .into(),
        );
    }
    let ips: Vec<std::net::IpAddr> =
        std::net::ToSocketAddrs::to_socket_addrs(&(target.host(), target.rpc_port()))
            .map_err(|e| format!("the peer's host {:?}: {e}", target.host()))?
            .map(|a| a.ip())
            .collect();
    let local: Vec<std::net::IpAddr> = te_sys::interface_addrs().iter().map(|a| a.ip).collect();
    if !ips.iter().any(|ip| ip.is_loopback() || local.contains(ip)) {
        return Err(format!("{} is not an address of this host", target.host()));
    }
    let held = socket_inodes(pid)?;
    let listening = ["/proc/self/net/tcp", "/proc/self/net/tcp6"]
        .iter()
        .filter_map(|f| std::fs::read_to_string(f).ok())
        .flat_map(|table| listeners(&table, target.rpc_port()));
    match listening.into_iter().any(|inode| held.contains(&inode)) {
        true => Ok(()),
        false => Err(format!(
            "process {pid} does not hold the listener at {}:{} the descriptor came from",
            target.host(),
            target.rpc_port()
        )),
    }
}

/// The inodes of the sockets process `pid` holds (`/proc/<pid>/fd`, readable where this
/// process may attach to it).
fn socket_inodes(pid: u32) -> Result<Vec<u64>, String> {
    let fds =
        std::fs::read_dir(format!("/proc/{pid}/fd")).map_err(|e| format!("/proc/{pid}/fd: {e}"))?;
    Ok(fds
        .filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
        .filter_map(|link| {
            let link = link.to_str()?;
            link.strip_prefix("socket:[")?
                .strip_suffix(']')?
                .parse()
                .ok()
        })
        .collect())
}

/// The inodes of the listening sockets on `port` in a `/proc/net/tcp` or `tcp6` table.
fn listeners(table: &str, port: u16) -> Vec<u64> {
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let local_port = fields.get(1)?.rsplit(':').next()?;
            let listening = *fields.get(3)? == "0A";
            let inode = fields.get(9)?.parse().ok()?;
            (listening && u16::from_str_radix(local_port, 16).ok()? == port).then_some(inode)
        })
        .collect()
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
        let (Some(pid), Some(owner)) = (live_pid(target), target.desc().te_owner.clone()) else {
            return false;
        };
        let mut refused = self.refused.lock().unwrap_or_else(|e| e.into_inner());
        if refused.contains(&owner) {
            return false;
        }
        let mut byte = [0u8; 1];
        let probe = bound(target, pid).and_then(|()| {
            read_from_process(pid, te_sys::PinnedRange::of_mut(&mut byte), buffer.addr)
                .map_err(|e| refusal(&e, ptrace_scope()))
        });
        match probe {
            Ok(()) => true,
            Err(why) => {
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
    fn listeners_are_read_from_the_kernels_table() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:3A98 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4242 1 0000000000000000 100 0 0 10 0
   1: 0100007F:3A98 0100007F:9C40 01 00000000:00000000 00:00000000 00000000     0        0 4343 1 0000000000000000 20 4 30 10 -1
   2: 00000000:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4444 1 0000000000000000 100 0 0 10 0";
        assert_eq!(
            listeners(table, 15000),
            [4242],
            "the listener, not the connection"
        );
        assert_eq!(listeners(table, 8080), [4444]);
        assert!(listeners(table, 1).is_empty());
        assert!(listeners("", 15000).is_empty());
        let mine = socket_inodes(std::process::id()).unwrap();
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let table = std::fs::read_to_string("/proc/self/net/tcp").unwrap();
        let found = listeners(&table, port);
        assert_eq!(found.len(), 1, "{port}");
        assert!(!mine.contains(&found[0]), "bound after the first look");
        assert!(
            socket_inodes(std::process::id())
                .unwrap()
                .contains(&found[0])
        );
    }

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
