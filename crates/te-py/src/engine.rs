//! The native half of `te.Engine` (`te._native.Engine`): te's own Python API, which raises
//! instead of returning codes. Construction initializes (or raises); transfers take lists of
//! addresses or a table of `(local, remote, length)` rows; asynchronous transfers are ids that
//! `wait` (with a time limit), `cancel` and `abandon` act on. Every call that can block runs
//! with the GIL released, and long waits wake up to let Python handle signals (Ctrl-C).
//!
//! Not here: what Python objects are registered and how (buffer protocol, DLPack, array
//! interfaces), `Peer`, `MemoryRegion` and the asyncio glue: `python/te/_engine.py`.

#![allow(unsafe_code)] // forwards raw addresses to registration, under the caller's contract

use std::sync::Arc;
use std::time::Duration;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use te_core::{HostBuffer, Permission};
use te_facade::{MooncakeEngine, Notification, Opcode, RuntimeKind};

use crate::errors::raise;

/// A wait longer than this is cut into steps, between which Python may run signal handlers.
const WAIT_STEP: Duration = Duration::from_millis(100);
/// Rows a descriptor table may hold (a bound before anything is read or allocated).
const MAX_ROWS: usize = 1 << 24;

#[pyclass(module = "te._native", frozen)]
pub(crate) struct Engine {
    engine: MooncakeEngine,
}

/// Memory from `Engine.allocate`: this handle and the engine own it jointly, so it stays
/// allocated while Python holds the handle (te's Python layer ties every view of the bytes to
/// it), whether or not it is still registered.
#[pyclass(module = "te._native", frozen)]
pub(crate) struct Block {
    buffer: Arc<HostBuffer>,
}

#[pymethods]
impl Block {
    /// Where the bytes start.
    #[getter]
    fn addr(&self) -> u64 {
        self.buffer.addr()
    }

    /// How many bytes there are.
    #[getter]
    fn length(&self) -> u64 {
        self.buffer.len() as u64
    }

    /// Called once the engine let go of the memory (unregistered, or closed): shared memory
    /// becomes private to this process, so a peer that mapped it reaches it no more.
    fn unshare(&self, py: Python<'_>) -> PyResult<()> {
        let unshared = py.detach(|| self.buffer.unshare());
        raise(unshared.map_err(|e| te_core::Error::from(e).into()))
    }
}

fn opcode(write: bool) -> Opcode {
    match write {
        true => Opcode::Write,
        false => Opcode::Read,
    }
}

fn notification(notify: Option<(String, String)>) -> Option<Notification> {
    notify.map(|(name, notify_msg)| Notification { name, notify_msg })
}

/// `rows` rows of three native-endian u64 (local address, remote address, length) at `addr`,
/// as three lists.
///
/// # Safety
/// `[addr, addr + rows * 24)` must be readable memory that does not change during the call.
unsafe fn read_table(addr: u64, rows: usize) -> PyResult<(Vec<u64>, Vec<u64>, Vec<u64>)> {
    if rows > MAX_ROWS {
        return Err(PyValueError::new_err(format!(
            "{rows} descriptors in one call: at most {MAX_ROWS}"
        )));
    }
    if addr == 0 || addr % 8 != 0 {
        return Err(PyValueError::new_err(
            "the descriptor table must be an aligned array of uint64",
        ));
    }
    // SAFETY: the caller guarantees the range readable and stable; it is 8-byte aligned.
    let flat = unsafe { std::slice::from_raw_parts(addr as *const u64, rows * 3) };
    let column = |c: usize| flat.iter().skip(c).step_by(3).copied().collect::<Vec<_>>();
    Ok((column(0), column(1), column(2)))
}

#[pymethods]
impl Engine {
    /// Starts an engine: `metadata` is `P2PHANDSHAKE` (peers named `host:port`) or a metadata
    /// service (`etcd://`, `redis://`, `http://`); `protocol` `auto` or a Mooncake name (`rdma`
    /// on `devices`).
    #[new]
    #[pyo3(signature = (hostname, metadata, protocol, devices, backend))]
    fn new(
        py: Python<'_>,
        hostname: &str,
        metadata: &str,
        protocol: &str,
        devices: &str,
        backend: &str,
    ) -> PyResult<Self> {
        let kind = match backend {
            "classic" => RuntimeKind::Classic,
            "tent" => RuntimeKind::Tent,
            other => {
                return Err(PyValueError::new_err(format!(
                    "backend {other:?}: 'classic' (te's engine) or 'tent' (te's TENT runtime)"
                )));
            }
        };
        let engine = MooncakeEngine::new();
        raise(py.detach(|| engine.initialize_on(kind, hostname, metadata, protocol, devices)))?;
        Ok(Engine { engine })
    }

    /// The name peers reach this engine by (`host:port` peer to peer).
    #[getter]
    fn name(&self) -> PyResult<String> {
        raise(self.engine.session_name())
    }

    /// Registers `[addr, addr + length)` at `location`; peers may write it when `writable`.
    ///
    /// The caller (te's Python layer) keeps the memory's owner alive until it unregisters.
    #[pyo3(signature = (addr, length, location, writable))]
    fn register(
        &self,
        py: Python<'_>,
        addr: u64,
        length: u64,
        location: &str,
        writable: bool,
    ) -> PyResult<()> {
        let permission = match writable {
            true => Permission::RemoteReadWrite,
            false => Permission::RemoteRead,
        };
        // SAFETY: te's Python layer passes ranges of objects it holds (buffer exports, DLPack
        // capsules, arrays) until unregistering, or raw ranges under the caller's promise.
        raise(py.detach(|| unsafe {
            self.engine
                .register_batch_with(&[addr], &[length], location, permission)
        }))
    }

    /// Unregisters the region starting at `addr`, waiting briefly for peers' requests that
    /// still hold it.
    fn unregister(&self, py: Python<'_>, addr: u64) -> PyResult<()> {
        raise(py.detach(|| self.engine.unregister_batch(&[addr])))
    }

    /// `length` bytes the engine allocates (shared memory where shm runs) and registers for
    /// peers to read and write.
    fn allocate(&self, py: Python<'_>, length: u64) -> PyResult<Block> {
        let buffer = raise(py.detach(|| self.engine.allocate_block(length)))?;
        Ok(Block { buffer })
    }

    /// Opens the peer `target` (the handshake) now.
    fn connect(&self, py: Python<'_>, target: &str) -> PyResult<()> {
        raise(py.detach(|| self.engine.connect(target)))
    }

    /// Moves bytes and returns when every byte has landed: raises otherwise.
    #[pyo3(signature = (target, write, sources, targets, lengths, notify = None))]
    #[allow(clippy::too_many_arguments)] // a Python signature
    fn transfer(
        &self,
        py: Python<'_>,
        target: &str,
        write: bool,
        sources: Vec<u64>,
        targets: Vec<u64>,
        lengths: Vec<u64>,
        notify: Option<(String, String)>,
    ) -> PyResult<()> {
        let lists = (&sources[..], &targets[..], &lengths[..]);
        raise(py.detach(|| {
            self.engine
                .transfer_sync(target, opcode(write), lists, notification(notify))
        }))
    }

    /// As `transfer`, from a table of `rows` (local, remote, length) uint64 rows at `table`.
    ///
    /// The caller (te's Python layer) holds the array the table lives in.
    #[pyo3(signature = (target, write, table, rows, notify = None))]
    fn transfer_table(
        &self,
        py: Python<'_>,
        target: &str,
        write: bool,
        table: u64,
        rows: usize,
        notify: Option<(String, String)>,
    ) -> PyResult<()> {
        // SAFETY: the Python layer passes a C-contiguous uint64 array of `rows` x 3 it holds.
        let (s, t, l) = unsafe { read_table(table, rows)? };
        self.transfer(py, target, write, s, t, l, notify)
    }

    /// Submits and returns an id at once; `wait`, `cancel` and `abandon` take it.
    #[pyo3(signature = (target, write, sources, targets, lengths, notify = None))]
    #[allow(clippy::too_many_arguments)] // a Python signature
    fn submit(
        &self,
        py: Python<'_>,
        target: &str,
        write: bool,
        sources: Vec<u64>,
        targets: Vec<u64>,
        lengths: Vec<u64>,
        notify: Option<(String, String)>,
    ) -> PyResult<u64> {
        let lists = (&sources[..], &targets[..], &lengths[..]);
        raise(py.detach(|| {
            self.engine
                .submit(target, opcode(write), lists, notification(notify))
        }))
    }

    /// As `submit`, from a descriptor table (see `transfer_table`).
    #[pyo3(signature = (target, write, table, rows, notify = None))]
    fn submit_table(
        &self,
        py: Python<'_>,
        target: &str,
        write: bool,
        table: u64,
        rows: usize,
        notify: Option<(String, String)>,
    ) -> PyResult<u64> {
        // SAFETY: as `transfer_table`.
        let (s, t, l) = unsafe { read_table(table, rows)? };
        self.submit(py, target, write, s, t, l, notify)
    }

    /// Waits for transfer `id` up to `timeout` seconds (None: until it ends): True when it
    /// completed, False while it still runs; raises when it ended otherwise.
    #[pyo3(signature = (id, timeout = None))]
    fn wait(&self, py: Python<'_>, id: u64, timeout: Option<f64>) -> PyResult<bool> {
        let limit = match timeout {
            None => None,
            Some(t) if t.is_finite() && t >= 0.0 => Some(Duration::from_secs_f64(t.min(1e9))),
            Some(t) => {
                return Err(PyValueError::new_err(format!(
                    "timeout {t}: a number of seconds >= 0, or None"
                )));
            }
        };
        let start = std::time::Instant::now();
        loop {
            let left = limit.map(|l| l.saturating_sub(start.elapsed()));
            let step = left.map_or(WAIT_STEP, |l| l.min(WAIT_STEP));
            if raise(py.detach(|| self.engine.wait_batch(id, step)))? {
                return Ok(true);
            }
            if left.is_some_and(|l| l <= step) {
                return Ok(false);
            }
            py.check_signals()?;
        }
    }

    /// Cancels transfer `id` (wait for it afterwards).
    fn cancel(&self, id: u64) -> PyResult<()> {
        raise(self.engine.cancel_batch(id))
    }

    /// Lets go of transfer `id` without waiting: it runs to its end and is freed later.
    fn abandon(&self, id: u64) {
        self.engine.abandon(id);
    }

    /// Sends a notification to `target` (no data moves).
    fn notify(&self, py: Python<'_>, target: &str, name: &str, message: &str) -> PyResult<()> {
        let n = Notification {
            name: name.to_string(),
            notify_msg: message.to_string(),
        };
        raise(py.detach(|| self.engine.send_notify(target, &n)))
    }

    /// The notifications received, oldest first (drained), each as (name, message, the
    /// address of the connection it came on, whether that connection proved the cluster
    /// secret); with `timeout`, waits up to that many seconds for the first when none is there.
    #[pyo3(signature = (timeout = None))]
    fn notifications(
        &self,
        py: Python<'_>,
        timeout: Option<f64>,
    ) -> PyResult<Vec<(String, String, String, bool)>> {
        let mut got = raise(self.engine.take_notifies())?;
        if got.is_empty()
            && let Some(t) = timeout.filter(|t| t.is_finite() && *t > 0.0)
        {
            let deadline = std::time::Instant::now() + Duration::from_secs_f64(t.min(1e9));
            loop {
                let step = deadline
                    .saturating_duration_since(std::time::Instant::now())
                    .min(WAIT_STEP);
                if let Some(n) = raise(py.detach(|| self.engine.next_notify(step)))? {
                    got.push(n);
                    got.extend(raise(self.engine.take_notifies())?);
                    break;
                }
                if std::time::Instant::now() >= deadline {
                    break;
                }
                py.check_signals()?;
            }
        }
        Ok(got
            .into_iter()
            .map(|r| {
                let n = r.notification;
                let sender = r.sender;
                (
                    n.name,
                    n.notify_msg,
                    sender.addr.to_string(),
                    sender.authenticated,
                )
            })
            .collect())
    }

    /// Whether `target`'s handshake listener answers.
    fn probe(&self, py: Python<'_>, target: &str) -> PyResult<bool> {
        raise(py.detach(|| self.engine.probe(target)))
    }

    /// Opens the file at `path` as a segment: the name transfers take as their target.
    fn open_file(&self, py: Python<'_>, path: &str, writable: bool) -> PyResult<String> {
        raise(py.detach(|| self.engine.open_file(path, writable).map(|(name, _)| name)))
    }

    /// The transports installed: `(name, capabilities)` pairs, the network one first.
    fn transports(&self, py: Python<'_>) -> PyResult<Vec<(&'static str, Vec<&'static str>)>> {
        raise(py.detach(|| self.engine.transports()))
    }

    /// Each rail's load, as the C API's `getNicLoadStats`: a list of dicts.
    fn nic_load_stats<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
        let loads = raise(py.detach(|| self.engine.nic_loads()))?;
        crate::nic_load_dicts(py, loads)
    }

    /// The engine's figures as te-metrics' JSON text; `count` switches counting first.
    #[pyo3(signature = (count=None))]
    fn metrics(&self, py: Python<'_>, count: Option<bool>) -> PyResult<String> {
        raise(py.detach(|| {
            if let Some(on) = count {
                self.engine.set_metrics(on)?;
            }
            self.engine.metrics_json()
        }))
    }

    /// Shuts the engine down: listeners closed, ports released, memory unregistered.
    /// Idempotent; later calls raise `ClosedError`.
    fn close(&self, py: Python<'_>) {
        py.detach(|| self.engine.close());
    }
}
