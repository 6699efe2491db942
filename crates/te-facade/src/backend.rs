//! [`Backend`]: the calls te's own bindings (`te.Engine` in Python) make, answered by a
//! [`MooncakeEngine`] on either runtime (classic or TENT, picked at initialization).
//!
//! Not here: Mooncake's integer conventions, which only the classic engine speaks
//! (`te.mooncake`, the C API).

use std::sync::Arc;
use std::time::Duration;

use te_core::notify::Received;
use te_core::{HostBuffer, Notification, Opcode, Permission};

use crate::engine::MooncakeEngine;
use crate::error::Result;

/// One call's descriptor lists: local addresses, remote addresses, lengths.
pub type Lists<'a> = (&'a [u64], &'a [u64], &'a [u64]);

/// An engine as te's bindings drive it.
pub trait Backend: Send + Sync {
    /// The name peers reach it by (`host:port` peer to peer).
    ///
    /// # Errors
    /// A closed engine.
    fn name(&self) -> Result<String>;

    /// Registers `[addr, addr+len)` at `location` with `permission` for peers.
    ///
    /// # Safety
    /// The range must be memory of this process that stays allocated until it is
    /// unregistered: peers write into it from other threads.
    ///
    /// # Errors
    /// A null or empty range, an overlap, a location no transport serves.
    #[allow(unsafe_code)]
    unsafe fn register(
        &self,
        addr: u64,
        len: u64,
        location: &str,
        permission: Permission,
    ) -> Result<()>;

    /// Unregisters the region at `addr`, waiting briefly for requests that hold it.
    ///
    /// # Errors
    /// An address that starts no region; one still busy after the grace.
    fn unregister(&self, addr: u64) -> Result<()>;

    /// `len` bytes the engine allocates (shared memory where shm runs) and registers for
    /// peers to read and write, owned jointly with the caller.
    ///
    /// # Errors
    /// As [`MooncakeEngine::allocate_block`].
    fn allocate(&self, len: u64) -> Result<Arc<HostBuffer>>;

    /// Opens `target` now (the handshake).
    ///
    /// # Errors
    /// An unknown or unreachable peer.
    fn connect(&self, target: &str) -> Result<()>;

    /// Moves bytes and returns when all have landed.
    ///
    /// # Errors
    /// Bad lists, an unknown peer, unregistered ranges, or a transfer that did not complete.
    fn transfer(
        &self,
        target: &str,
        opcode: Opcode,
        lists: Lists<'_>,
        notify: Option<Notification>,
    ) -> Result<()>;

    /// Submits and returns an id at once.
    ///
    /// # Errors
    /// As [`transfer`](Self::transfer), for what can be known at submission.
    fn submit(
        &self,
        target: &str,
        opcode: Opcode,
        lists: Lists<'_>,
        notify: Option<Notification>,
    ) -> Result<u64>;

    /// Waits up to `timeout` for transfer `id`: true when it completed (freed), false while
    /// it runs.
    ///
    /// # Errors
    /// An unknown id; the transfer's failure (freed).
    fn wait(&self, id: u64, timeout: Duration) -> Result<bool>;

    /// Cancels transfer `id`.
    ///
    /// # Errors
    /// An unknown id.
    fn cancel(&self, id: u64) -> Result<()>;

    /// Lets go of transfer `id` without waiting; it is freed once it has ended.
    fn abandon(&self, id: u64);

    /// Sends a notification to `target` without data.
    ///
    /// # Errors
    /// An unknown or unreachable peer.
    fn send_notify(&self, target: &str, notification: &Notification) -> Result<()>;

    /// The notifications received so far (drained), each with the connection it came on.
    ///
    /// # Errors
    /// A closed engine.
    fn take_notifies(&self) -> Result<Vec<Received>>;

    /// The oldest notification, waiting up to `timeout` for one.
    ///
    /// # Errors
    /// A closed engine.
    fn next_notify(&self, timeout: Duration) -> Result<Option<Received>>;

    /// Whether `target`'s handshake listener answers.
    ///
    /// # Errors
    /// A closed engine.
    fn probe(&self, target: &str) -> Result<bool>;

    /// Each rail's load (Mooncake's `getNicLoadStats`).
    ///
    /// # Errors
    /// A closed engine.
    fn nic_loads(&self) -> Result<Vec<crate::NicLoad>>;

    /// Opens the file at `path` as a segment: the name transfers take as their target.
    ///
    /// # Errors
    /// As [`MooncakeEngine::open_file`].
    fn open_file(&self, path: &str, writable: bool) -> Result<String>;

    /// The transports installed, each with its capability names (the first is the protocol
    /// the engine's descriptor publishes).
    ///
    /// # Errors
    /// A closed engine.
    fn transports(&self) -> Result<Vec<(&'static str, Vec<&'static str>)>>;

    /// The engine's figures as te-metrics' JSON; with `count`, counting is switched first.
    ///
    /// # Errors
    /// A closed engine.
    fn metrics(&self, count: Option<bool>) -> Result<String>;

    /// Shuts the engine down; idempotent.
    fn close(&self);
}

impl Backend for MooncakeEngine {
    fn name(&self) -> Result<String> {
        self.session_name()
    }

    #[allow(unsafe_code)]
    unsafe fn register(
        &self,
        addr: u64,
        len: u64,
        location: &str,
        permission: Permission,
    ) -> Result<()> {
        // SAFETY: forwarded from this function's contract.
        unsafe { self.register_batch_with(&[addr], &[len], location, permission) }
    }

    fn unregister(&self, addr: u64) -> Result<()> {
        self.unregister_batch(&[addr])
    }

    fn allocate(&self, len: u64) -> Result<Arc<HostBuffer>> {
        self.allocate_block(len)
    }

    fn connect(&self, target: &str) -> Result<()> {
        MooncakeEngine::connect(self, target)
    }

    fn transfer(
        &self,
        target: &str,
        opcode: Opcode,
        lists: Lists<'_>,
        notify: Option<Notification>,
    ) -> Result<()> {
        self.transfer_sync(target, opcode, lists, notify)
    }

    fn submit(
        &self,
        target: &str,
        opcode: Opcode,
        lists: Lists<'_>,
        notify: Option<Notification>,
    ) -> Result<u64> {
        self.submit_notify(target, opcode, lists, notify)
    }

    fn wait(&self, id: u64, timeout: Duration) -> Result<bool> {
        self.wait_batch(id, timeout)
    }

    fn cancel(&self, id: u64) -> Result<()> {
        self.cancel_batch(id)
    }

    fn abandon(&self, id: u64) {
        MooncakeEngine::abandon(self, id);
    }

    fn send_notify(&self, target: &str, notification: &Notification) -> Result<()> {
        MooncakeEngine::send_notify(self, target, notification)
    }

    fn take_notifies(&self) -> Result<Vec<Received>> {
        Ok(self.live()?.engine().take_received())
    }

    fn next_notify(&self, timeout: Duration) -> Result<Option<Received>> {
        Ok(self.live()?.engine().recv_received(timeout))
    }

    fn probe(&self, target: &str) -> Result<bool> {
        MooncakeEngine::probe(self, target)
    }

    fn nic_loads(&self) -> Result<Vec<crate::NicLoad>> {
        MooncakeEngine::nic_loads(self)
    }

    fn open_file(&self, path: &str, writable: bool) -> Result<String> {
        MooncakeEngine::open_file(self, path, writable).map(|(name, _)| name)
    }

    fn transports(&self) -> Result<Vec<(&'static str, Vec<&'static str>)>> {
        MooncakeEngine::transports(self)
    }

    fn metrics(&self, count: Option<bool>) -> Result<String> {
        if let Some(on) = count {
            self.set_metrics(on)?;
        }
        self.metrics_json()
    }

    fn close(&self) {
        MooncakeEngine::close(self);
    }
}
