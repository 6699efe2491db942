//! The native half of te's Python package (`te._native`): `TransferEngine`, the class that
//! `te.mooncake` exports under Mooncake's name, with Mooncake 0.3.13's methods, argument order
//! and return codes, over `te_facade::MooncakeEngine`. Every call that can block (initialize,
//! registration, handshakes, transfers, waits) runs with the GIL released.
//!
//! Not here: the Python-only parts of the module (`TransferOpcode`, constants,
//! `te.mooncake.install()`), which live in `python/te/mooncake.py`, and the semantics, which
//! live in te-facade.
//!
//! Addresses arrive as Python ints and are taken as Mooncake takes them: the caller promises
//! that what it registers is memory of this process, kept allocated until unregistered.

#![allow(unsafe_code)] // forwards raw addresses to registration, under the caller's contract

mod dlpack;
mod engine;
mod errors;
mod logging;
mod rpc;

use pyo3::exceptions::{PyNotImplementedError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyString};
use te_facade::{
    BatchProgress, FacadeError, MooncakeEngine, Notification, Opcode, Protocol, TransferOptions,
};

/// A notification: who sent it (`name`) and what it says (`msg`).
#[pyclass(module = "te._native", get_all, set_all)]
#[derive(Clone)]
struct TransferNotify {
    name: String,
    msg: String,
}

#[pymethods]
impl TransferNotify {
    #[new]
    #[pyo3(signature = (name = String::new(), msg = String::new()))]
    fn new(name: String, msg: String) -> Self {
        TransferNotify { name, msg }
    }

    fn __repr__(&self) -> String {
        format!("TransferNotify(name={:?}, msg={:?})", self.name, self.msg)
    }
}

/// Mooncake's `TransferEngine`, on te.
#[pyclass(module = "te._native", frozen, subclass)]
struct TransferEngine {
    facade: MooncakeEngine,
}

/// An address or length: a non-negative int below 2**64 (pybind's `uintptr_t` rule, with a
/// message that says so).
fn uint(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<u64> {
    obj.extract::<u64>().map_err(|_| {
        PyTypeError::new_err(format!(
            "{what} must be an int in 0..2**64, got {}",
            obj.repr().map_or_else(|_| "?".into(), |r| r.to_string())
        ))
    })
}

/// A list (or any iterable but a string) of addresses or lengths.
fn uints(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Vec<u64>> {
    if obj.is_instance_of::<PyString>() {
        return Err(PyTypeError::new_err(format!(
            "{what} must be a list of ints"
        )));
    }
    obj.try_iter()
        .map_err(|_| PyTypeError::new_err(format!("{what} must be a list of ints")))?
        .map(|item| uint(&item?, what))
        .collect()
}

/// 0 for success, -1 for any failure: Mooncake's transfer calls.
fn sync_code(r: Result<(), FacadeError>) -> i32 {
    match r {
        Ok(()) => 0,
        Err(e) => {
            tracing::debug!(error = %e, "transfer failed");
            -1
        }
    }
}

/// 0 or Mooncake's negative `ERR_*`: registration calls.
fn reg_code(r: Result<(), FacadeError>) -> i32 {
    r.map_or_else(|e| e.code(), |()| 0)
}

fn opcode(obj: &Bound<'_, PyAny>) -> PyResult<Opcode> {
    match obj.extract::<i64>() {
        Ok(0) => Ok(Opcode::Read),
        Ok(1) => Ok(Opcode::Write),
        _ => Err(PyValueError::new_err(
            "opcode must be TransferOpcode.Read (0) or TransferOpcode.Write (1)",
        )),
    }
}

fn notification(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Option<Notification>> {
    match obj {
        None => Ok(None),
        Some(o) if o.is_none() => Ok(None),
        Some(o) => Ok(Some(Notification {
            name: o.getattr("name")?.extract()?,
            notify_msg: o.getattr("msg")?.extract()?,
        })),
    }
}

/// One call's descriptor lists, converted with the GIL held.
struct Lists {
    sources: Vec<u64>,
    targets: Vec<u64>,
    lengths: Vec<u64>,
}

impl Lists {
    fn one(
        buffer: &Bound<'_, PyAny>,
        peer: &Bound<'_, PyAny>,
        len: &Bound<'_, PyAny>,
    ) -> PyResult<Self> {
        Ok(Lists {
            sources: vec![uint(buffer, "buffer")?],
            targets: vec![uint(peer, "peer_buffer_address")?],
            lengths: vec![uint(len, "length")?],
        })
    }

    fn many(
        buffers: &Bound<'_, PyAny>,
        peers: &Bound<'_, PyAny>,
        lens: &Bound<'_, PyAny>,
    ) -> PyResult<Self> {
        Ok(Lists {
            sources: uints(buffers, "buffers")?,
            targets: uints(peers, "peer_buffer_addresses")?,
            lengths: uints(lens, "lengths")?,
        })
    }

    fn view(&self) -> (&[u64], &[u64], &[u64]) {
        (&self.sources, &self.targets, &self.lengths)
    }
}

/// A `transport_hint`: none for `""` or `"unspec"`; a name that is no transport te has raises
/// (`te.errors.TransportError`, a `ValueError`), as Mooncake's TENT builds raise.
fn hint(name: &str) -> PyResult<Option<Protocol>> {
    Protocol::parse_hint(name).map_err(|e| errors::to_py(e.into()))
}

impl TransferEngine {
    fn sync(
        &self,
        py: Python<'_>,
        target: &str,
        op: Opcode,
        lists: &Lists,
        notify: Option<Notification>,
        transport_hint: &str,
    ) -> PyResult<i32> {
        let via = hint(transport_hint)?;
        Ok(py.detach(|| {
            sync_code(self.facade.transfer_sync(
                target,
                op,
                lists.view(),
                TransferOptions { notify, hint: via },
            ))
        }))
    }

    fn submit(
        &self,
        py: Python<'_>,
        target: &str,
        op: Opcode,
        lists: &Lists,
        transport_hint: &str,
    ) -> PyResult<u64> {
        let via = hint(transport_hint)?;
        Ok(py.detach(|| {
            match self.facade.submit(
                target,
                op,
                lists.view(),
                TransferOptions {
                    notify: None,
                    hint: via,
                },
            ) {
                Ok(id) => id,
                Err(e) => {
                    tracing::debug!(error = %e, "asynchronous submission failed");
                    0
                }
            }
        }))
    }
}

#[pymethods]
impl TransferEngine {
    #[new]
    fn new() -> Self {
        TransferEngine {
            facade: MooncakeEngine::new(),
        }
    }

    /// 0, or -1 on any failure.
    #[pyo3(signature = (local_hostname, metadata_server, protocol, device_name, /))]
    fn initialize(
        &self,
        py: Python<'_>,
        local_hostname: &str,
        metadata_server: &str,
        protocol: &str,
        device_name: &str,
    ) -> i32 {
        py.detach(|| {
            sync_code(self.facade.initialize(
                local_hostname,
                metadata_server,
                protocol,
                device_name,
            ))
        })
    }

    /// As `initialize`, with `metadata_type` (`etcd`, `redis`, `http`) naming the service.
    #[pyo3(signature = (local_hostname, metadata_server, protocol, device_name, metadata_type, /))]
    fn initialize_ext(
        &self,
        py: Python<'_>,
        local_hostname: &str,
        metadata_server: &str,
        protocol: &str,
        device_name: &str,
        metadata_type: &str,
    ) -> i32 {
        py.detach(|| {
            sync_code(self.facade.initialize_ext(
                local_hostname,
                metadata_server,
                protocol,
                device_name,
                metadata_type,
            ))
        })
    }

    /// The handshake port (peers name this engine `host:port`); -1 before `initialize`.
    fn get_rpc_port(&self) -> i32 {
        self.facade.rpc_port().map_or(-1, i32::from)
    }

    /// The address of a new registered host buffer, or 0.
    #[pyo3(signature = (length, /))]
    fn allocate_managed_buffer(&self, py: Python<'_>, length: &Bound<'_, PyAny>) -> PyResult<u64> {
        let len = uint(length, "length")?;
        Ok(py.detach(|| self.facade.allocate_managed(len).unwrap_or(0)))
    }

    /// 0, or -3 for an address and length that are not such a buffer.
    #[pyo3(signature = (addr, length, /))]
    fn free_managed_buffer(
        &self,
        py: Python<'_>,
        addr: &Bound<'_, PyAny>,
        length: &Bound<'_, PyAny>,
    ) -> PyResult<i32> {
        let (addr, len) = (uint(addr, "addr")?, uint(length, "length")?);
        Ok(py.detach(|| reg_code(self.facade.free_managed(addr, len))))
    }

    #[pyo3(signature = (target_hostname, buffer, peer_buffer_address, length, transport_hint = ""))]
    fn transfer_sync_write(
        &self,
        py: Python<'_>,
        target_hostname: &str,
        buffer: &Bound<'_, PyAny>,
        peer_buffer_address: &Bound<'_, PyAny>,
        length: &Bound<'_, PyAny>,
        transport_hint: &str,
    ) -> PyResult<i32> {
        let lists = Lists::one(buffer, peer_buffer_address, length)?;
        self.sync(
            py,
            target_hostname,
            Opcode::Write,
            &lists,
            None,
            transport_hint,
        )
    }

    #[pyo3(signature = (target_hostname, buffer, peer_buffer_address, length, transport_hint = ""))]
    fn transfer_sync_read(
        &self,
        py: Python<'_>,
        target_hostname: &str,
        buffer: &Bound<'_, PyAny>,
        peer_buffer_address: &Bound<'_, PyAny>,
        length: &Bound<'_, PyAny>,
        transport_hint: &str,
    ) -> PyResult<i32> {
        let lists = Lists::one(buffer, peer_buffer_address, length)?;
        self.sync(
            py,
            target_hostname,
            Opcode::Read,
            &lists,
            None,
            transport_hint,
        )
    }

    #[pyo3(signature = (target_hostname, buffer, peer_buffer_address, length, opcode, notify = None, transport_hint = ""))]
    #[allow(clippy::too_many_arguments)] // Mooncake's signature
    fn transfer_sync(
        &self,
        py: Python<'_>,
        target_hostname: &str,
        buffer: &Bound<'_, PyAny>,
        peer_buffer_address: &Bound<'_, PyAny>,
        length: &Bound<'_, PyAny>,
        opcode: &Bound<'_, PyAny>,
        notify: Option<&Bound<'_, PyAny>>,
        transport_hint: &str,
    ) -> PyResult<i32> {
        let lists = Lists::one(buffer, peer_buffer_address, length)?;
        let (op, n) = (self::opcode(opcode)?, notification(notify)?);
        self.sync(py, target_hostname, op, &lists, n, transport_hint)
    }

    #[pyo3(signature = (target_hostname, buffers, peer_buffer_addresses, lengths, transport_hint = ""))]
    fn batch_transfer_sync_write(
        &self,
        py: Python<'_>,
        target_hostname: &str,
        buffers: &Bound<'_, PyAny>,
        peer_buffer_addresses: &Bound<'_, PyAny>,
        lengths: &Bound<'_, PyAny>,
        transport_hint: &str,
    ) -> PyResult<i32> {
        let lists = Lists::many(buffers, peer_buffer_addresses, lengths)?;
        self.sync(
            py,
            target_hostname,
            Opcode::Write,
            &lists,
            None,
            transport_hint,
        )
    }

    #[pyo3(signature = (target_hostname, buffers, peer_buffer_addresses, lengths, transport_hint = ""))]
    fn batch_transfer_sync_read(
        &self,
        py: Python<'_>,
        target_hostname: &str,
        buffers: &Bound<'_, PyAny>,
        peer_buffer_addresses: &Bound<'_, PyAny>,
        lengths: &Bound<'_, PyAny>,
        transport_hint: &str,
    ) -> PyResult<i32> {
        let lists = Lists::many(buffers, peer_buffer_addresses, lengths)?;
        self.sync(
            py,
            target_hostname,
            Opcode::Read,
            &lists,
            None,
            transport_hint,
        )
    }

    #[pyo3(signature = (target_hostname, buffers, peer_buffer_addresses, lengths, opcode, notify = None, transport_hint = ""))]
    #[allow(clippy::too_many_arguments)] // Mooncake's signature
    fn batch_transfer_sync(
        &self,
        py: Python<'_>,
        target_hostname: &str,
        buffers: &Bound<'_, PyAny>,
        peer_buffer_addresses: &Bound<'_, PyAny>,
        lengths: &Bound<'_, PyAny>,
        opcode: &Bound<'_, PyAny>,
        notify: Option<&Bound<'_, PyAny>>,
        transport_hint: &str,
    ) -> PyResult<i32> {
        let lists = Lists::many(buffers, peer_buffer_addresses, lengths)?;
        let (op, n) = (self::opcode(opcode)?, notification(notify)?);
        self.sync(py, target_hostname, op, &lists, n, transport_hint)
    }

    /// A batch id, or 0 on failure.
    #[pyo3(signature = (target_hostname, buffers, peer_buffer_addresses, lengths, transport_hint = ""))]
    fn batch_transfer_async_write(
        &self,
        py: Python<'_>,
        target_hostname: &str,
        buffers: &Bound<'_, PyAny>,
        peer_buffer_addresses: &Bound<'_, PyAny>,
        lengths: &Bound<'_, PyAny>,
        transport_hint: &str,
    ) -> PyResult<u64> {
        let lists = Lists::many(buffers, peer_buffer_addresses, lengths)?;
        self.submit(py, target_hostname, Opcode::Write, &lists, transport_hint)
    }

    /// A batch id, or 0 on failure.
    #[pyo3(signature = (target_hostname, buffers, peer_buffer_addresses, lengths, transport_hint = ""))]
    fn batch_transfer_async_read(
        &self,
        py: Python<'_>,
        target_hostname: &str,
        buffers: &Bound<'_, PyAny>,
        peer_buffer_addresses: &Bound<'_, PyAny>,
        lengths: &Bound<'_, PyAny>,
        transport_hint: &str,
    ) -> PyResult<u64> {
        let lists = Lists::many(buffers, peer_buffer_addresses, lengths)?;
        self.submit(py, target_hostname, Opcode::Read, &lists, transport_hint)
    }

    /// A batch id, or 0 on failure.
    #[pyo3(signature = (target_hostname, buffers, peer_buffer_addresses, lengths, opcode, transport_hint = ""))]
    #[allow(clippy::too_many_arguments)] // Mooncake's signature
    fn batch_transfer_async(
        &self,
        py: Python<'_>,
        target_hostname: &str,
        buffers: &Bound<'_, PyAny>,
        peer_buffer_addresses: &Bound<'_, PyAny>,
        lengths: &Bound<'_, PyAny>,
        opcode: &Bound<'_, PyAny>,
        transport_hint: &str,
    ) -> PyResult<u64> {
        let lists = Lists::many(buffers, peer_buffer_addresses, lengths)?;
        let op = self::opcode(opcode)?;
        self.submit(py, target_hostname, op, &lists, transport_hint)
    }

    /// Waits (without spinning) for every batch and frees them: 0 when all completed, -1
    /// otherwise (also for an id that is not an outstanding batch of this engine).
    #[pyo3(signature = (batch_ids, /))]
    fn get_batch_transfer_status(
        &self,
        py: Python<'_>,
        batch_ids: &Bound<'_, PyAny>,
    ) -> PyResult<i32> {
        let ids = uints(batch_ids, "batch_ids")?;
        Ok(py.detach(|| sync_code(self.facade.wait_all(&ids))))
    }

    /// A batch id, or 0 on failure.
    #[pyo3(signature = (target_hostname, buffer, peer_buffer_address, length, transport_hint = ""))]
    fn transfer_submit_write(
        &self,
        py: Python<'_>,
        target_hostname: &str,
        buffer: &Bound<'_, PyAny>,
        peer_buffer_address: &Bound<'_, PyAny>,
        length: &Bound<'_, PyAny>,
        transport_hint: &str,
    ) -> PyResult<u64> {
        let lists = Lists::one(buffer, peer_buffer_address, length)?;
        self.submit(py, target_hostname, Opcode::Write, &lists, transport_hint)
    }

    /// 1 completed (freed), 0 in progress, -1 failed or unknown id (freed), -2 timed out
    /// (freed too: Mooncake leaks it).
    #[pyo3(signature = (batch_id, /))]
    fn transfer_check_status(&self, py: Python<'_>, batch_id: &Bound<'_, PyAny>) -> PyResult<i32> {
        let id = uint(batch_id, "batch_id")?;
        Ok(py.detach(|| match self.facade.check(id) {
            Ok(BatchProgress::Done) => 1,
            Ok(BatchProgress::Running) => 0,
            Ok(BatchProgress::TimedOut) => -2,
            Ok(_) | Err(_) => -1,
        }))
    }

    /// 0, or Mooncake's negative code (-7 overlap, -1 bad argument).
    #[pyo3(signature = (buffer_addr, capacity, location = "*"))]
    fn register_memory(
        &self,
        py: Python<'_>,
        buffer_addr: &Bound<'_, PyAny>,
        capacity: &Bound<'_, PyAny>,
        location: &str,
    ) -> PyResult<i32> {
        let (addr, len) = (
            uint(buffer_addr, "buffer_addr")?,
            uint(capacity, "capacity")?,
        );
        // SAFETY: Mooncake's contract for this call, which te's caller takes on: the range is
        // memory of this process that stays allocated until it is unregistered.
        Ok(py.detach(|| reg_code(unsafe { self.facade.register(addr, len, location) })))
    }

    /// 0, or Mooncake's negative code (-3 not registered, -4 busy).
    #[pyo3(signature = (addr, /))]
    fn unregister_memory(&self, py: Python<'_>, addr: &Bound<'_, PyAny>) -> PyResult<i32> {
        let addr = uint(addr, "addr")?;
        Ok(py.detach(|| reg_code(self.facade.unregister_batch(&[addr]))))
    }

    /// 0, or Mooncake's negative code; all or none.
    #[pyo3(signature = (buffer_addresses, capacities, location = "*"))]
    fn batch_register_memory(
        &self,
        py: Python<'_>,
        buffer_addresses: &Bound<'_, PyAny>,
        capacities: &Bound<'_, PyAny>,
        location: &str,
    ) -> PyResult<i32> {
        let addrs = uints(buffer_addresses, "buffer_addresses")?;
        let lens = uints(capacities, "capacities")?;
        // SAFETY: as `register_memory`, for every range.
        Ok(py.detach(|| reg_code(unsafe { self.facade.register_batch(&addrs, &lens, location) })))
    }

    /// 0, or Mooncake's negative code; all or none.
    #[pyo3(signature = (addrs, /))]
    fn batch_unregister_memory(&self, py: Python<'_>, addrs: &Bound<'_, PyAny>) -> PyResult<i32> {
        let addrs = uints(addrs, "addrs")?;
        Ok(py.detach(|| reg_code(self.facade.unregister_batch(&addrs))))
    }

    /// The peer's first registered buffer's address, or 0.
    #[pyo3(signature = (segment_name, /))]
    fn get_first_buffer_address(&self, py: Python<'_>, segment_name: &str) -> u64 {
        py.detach(|| self.facade.first_buffer_address(segment_name).unwrap_or(0))
    }

    /// This host's topology as JSON.
    #[pyo3(signature = (device_name = None))]
    fn get_local_topology(&self, py: Python<'_>, device_name: Option<&str>) -> String {
        let _ = device_name;
        py.detach(te_facade::local_topology)
    }

    /// Each rail's load, as the C API's `getNicLoadStats` (te's addition): a list of dicts
    /// with `device_name`, `inflight_bytes` and `ewma_bandwidth_bps`; empty before
    /// `initialize`, as every call then answers without an engine.
    fn nic_load_stats<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
        let loads = py.detach(|| self.facade.nic_loads()).unwrap_or_default();
        nic_load_dicts(py, loads)
    }

    /// The notifications received so far (drained).
    fn get_notifies(&self) -> Vec<TransferNotify> {
        self.facade
            .take_notifies()
            .unwrap_or_default()
            .into_iter()
            .map(|r| TransferNotify {
                name: r.notification.name,
                msg: r.notification.notify_msg,
            })
            .collect()
    }

    /// 0 when the peer's handshake listener answers, -1 otherwise.
    #[pyo3(signature = (peer_server_name))]
    fn send_probe(&self, py: Python<'_>, peer_server_name: &str) -> i32 {
        py.detach(|| match self.facade.probe(peer_server_name) {
            Ok(true) => 0,
            Ok(false) => -1,
            Err(e) => e.code(),
        })
    }

    /// Does nothing (EFA only in Mooncake); 0.
    #[pyo3(signature = (segment_name))]
    fn warmup_efa_segment(&self, segment_name: &str) -> i32 {
        let _ = segment_name;
        0
    }

    /// Copies `data[:length]` to `dest`, which must lie in registered memory: 0, or -3.
    #[pyo3(signature = (dest, data, length, /))]
    fn write_bytes_to_buffer(
        &self,
        dest: &Bound<'_, PyAny>,
        data: &[u8],
        length: &Bound<'_, PyAny>,
    ) -> PyResult<i32> {
        let dest = uint(dest, "dest")?;
        let len = uint(length, "length")?;
        let Some(bytes) = usize::try_from(len).ok().and_then(|l| data.get(..l)) else {
            return Err(PyValueError::new_err(format!(
                "length {len} is more than the {} bytes given",
                data.len()
            )));
        };
        Ok(reg_code(self.facade.write_bytes(dest, bytes)))
    }

    /// A copy of `length` bytes at `src`, which must lie in registered memory.
    #[pyo3(signature = (src, length, /))]
    fn read_bytes_from_buffer<'py>(
        &self,
        py: Python<'py>,
        src: &Bound<'_, PyAny>,
        length: &Bound<'_, PyAny>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let (src, len) = (uint(src, "src")?, uint(length, "length")?);
        let data = self
            .facade
            .read_bytes(src, len)
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        Ok(PyBytes::new(py, &data))
    }

    /// None: there is no Mooncake C++ engine to hand to `MooncakeDistributedStore.setup`
    /// (which then makes its own).
    fn get_engine(&self) -> Option<()> {
        None
    }

    /// Not available: te has no `mooncake::TransferEngine*`.
    fn get_engine_ptr(&self) -> PyResult<u64> {
        Err(PyNotImplementedError::new_err(
            "te has no mooncake::TransferEngine pointer to hand out",
        ))
    }

    /// Shuts the engine down: listeners closed, ports released, memory unregistered. Calls
    /// after it answer as before `initialize`. (te's addition.)
    fn close(&self, py: Python<'_>) {
        py.detach(|| self.facade.close());
    }
}

/// Rails' loads as Python dicts, with the names of Mooncake's `nic_load_stat_t` fields.
pub(crate) fn nic_load_dicts(
    py: Python<'_>,
    loads: Vec<te_facade::NicLoad>,
) -> PyResult<Vec<Bound<'_, PyDict>>> {
    loads
        .into_iter()
        .map(|l| {
            let d = PyDict::new(py);
            d.set_item("device_name", l.device_name)?;
            d.set_item("inflight_bytes", l.inflight_bytes)?;
            d.set_item("ewma_bandwidth_bps", l.ewma_bandwidth_bps)?;
            Ok(d)
        })
        .collect()
}

/// This host's topology as JSON.
#[pyfunction]
fn local_topology(py: Python<'_>) -> String {
    py.detach(te_facade::local_topology)
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<TransferEngine>()?;
    m.add_class::<TransferNotify>()?;
    m.add_class::<engine::Engine>()?;
    m.add_class::<engine::Block>()?;
    m.add_class::<rpc::RpcInterface>()?;
    m.add_class::<rpc::ReceivedTensor>()?;
    m.add_function(wrap_pyfunction!(local_topology, m)?)?;
    m.add_function(wrap_pyfunction!(dlpack::dlpack_range, m)?)?;
    m.add_function(wrap_pyfunction!(logging::enable_logging, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
