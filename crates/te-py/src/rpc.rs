//! Mooncake's RPC communicator for Python (`te._native.RpcInterface`, exported by `te.mooncake`
//! under Mooncake's names) over te-facade's `MooncakeRpc`: the same methods, defaults, return
//! codes and callback shapes. Every call that can block runs with the GIL released; callbacks
//! take the GIL only to run. `te.mooncake` adds the asyncio sends and the tensor conversions
//! (torch, numpy, DLPack) in Python.

#![allow(unsafe_code)] // a tensor's bytes are read from the address its Python wrapper holds

use std::sync::{Arc, Mutex, PoisonError};

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use te_facade::MooncakeRpc;
use te_facade::rpc::{Dtype, Outgoing, Owned, Payload, Received, TensorMeta};

/// The Python callbacks a server hands its messages to.
#[derive(Default)]
struct Callbacks {
    data: Mutex<Option<Py<PyAny>>>,
    tensor: Mutex<Option<Py<PyAny>>>,
}

/// Whether a callback is set (read without the GIL).
fn is_set(slot: &Mutex<Option<Py<PyAny>>>) -> bool {
    slot.lock()
        .unwrap_or_else(PoisonError::into_inner)
        .is_some()
}

/// The callback set, if any.
fn callback(py: Python<'_>, slot: &Mutex<Option<Py<PyAny>>>) -> Option<Py<PyAny>> {
    slot.lock()
        .unwrap_or_else(PoisonError::into_inner)
        .as_ref()
        .map(|c| c.clone_ref(py))
}

impl te_facade::rpc::Handler for Callbacks {
    fn receive(&self, message: Received) {
        // The sender's address (Mooncake's receiver says "").
        let source = message.source.to_string();
        let (bytes, tensor) = match message.payload {
            Payload::Tensor(t) => (t.bytes, Some((t.meta, t.header))),
            Payload::Data(b) => (b, None),
        };
        let wanted = is_set(&self.data) || (tensor.is_some() && is_set(&self.tensor));
        if !wanted {
            tracing::debug!(
                len = bytes.len(),
                "an RPC message with no callback set: dropped"
            );
            return;
        }
        // Large payloads were read into a Python bytes object already; the others are copied
        // into one under the GIL, which is taken once.
        let given = bytes.downcast::<PyBytesBuffer>().map(|g| g.object);
        Python::attach(|py| {
            let data = match given {
                Ok(object) => object,
                Err(bytes) => PyBytes::new(py, &bytes).unbind(),
            };
            let called = match (tensor, callback(py, &self.tensor)) {
                (Some((meta, header)), Some(cb)) => {
                    let received = ReceivedTensor {
                        source_address: source,
                        shape: meta.shape,
                        dtype: meta.dtype.name().to_string(),
                        total_bytes: data.bind(py).as_bytes().len() as u64,
                        data,
                        header,
                    };
                    Py::new(py, received).and_then(|r| cb.call1(py, (r,)).map(drop))
                }
                _ => call_data(py, callback(py, &self.data), &source, data),
            };
            if let Err(e) = called {
                tracing::error!(error = %e, "an RPC receive callback raised");
                e.print(py);
            }
        });
    }

    fn buffer(&self, len: usize) -> Option<Box<dyn te_facade::rpc::Buffer>> {
        // With no callback set the payload is dropped on arrival: no Python object, no GIL.
        if !is_set(&self.data) && !is_set(&self.tensor) {
            return None;
        }
        let (object, dst) = new_python_bytes(len).ok()?;
        Some(Box::new(PyBytesBuffer { object, dst, len }))
    }
}

/// A Python bytes object a server reads a payload into before Python sees it.
struct PyBytesBuffer {
    object: Py<PyBytes>,
    dst: Unpublished,
    len: usize,
}

impl te_facade::rpc::Buffer for PyBytesBuffer {
    fn as_slice(&self) -> &[u8] {
        // SAFETY: `dst` points at the object's `len` bytes, which live as long as `object`.
        unsafe { std::slice::from_raw_parts(self.dst.0, self.len) }
    }

    fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as `as_slice`; no Python code holds the object before the callback, so this
        // is its only writer.
        unsafe { std::slice::from_raw_parts_mut(self.dst.0, self.len) }
    }

    fn into_any(self: Box<Self>) -> Box<dyn std::any::Any + Send> {
        self
    }
}

/// A pointer into a bytes object no other thread can see yet.
struct Unpublished(*mut u8);
// SAFETY: the pointer is only written by the one thread that made the object, before the object
// is handed to Python.
unsafe impl Send for Unpublished {}

/// A new, unfilled Python bytes object of `len` bytes and where its bytes are.
fn new_python_bytes(len: usize) -> PyResult<(Py<PyBytes>, Unpublished)> {
    let len = pyo3::ffi::Py_ssize_t::try_from(len)
        .map_err(|_| PyValueError::new_err("a message larger than Python's bytes take"))?;
    Python::attach(|py| -> PyResult<(Py<PyBytes>, Unpublished)> {
        // SAFETY: with a null source, CPython allocates `len` uninitialised bytes (plus its
        // terminator) and returns a new reference, or null with an exception set.
        let raw = unsafe { pyo3::ffi::PyBytes_FromStringAndSize(std::ptr::null(), len) };
        // SAFETY: `raw` is a new (owned) reference or null.
        let bound = unsafe { Bound::from_owned_ptr_or_err(py, raw)? };
        let object = bound.cast_into::<PyBytes>()?.unbind();
        // SAFETY: `object` is a bytes object: its buffer has `len` bytes.
        let dst = unsafe { pyo3::ffi::PyBytes_AsString(object.as_ptr()) }.cast::<u8>();
        Ok((object, Unpublished(dst)))
    })
}

fn call_data(
    py: Python<'_>,
    cb: Option<Py<PyAny>>,
    source: &str,
    data: Py<PyBytes>,
) -> PyResult<()> {
    let Some(cb) = cb else {
        tracing::debug!("an RPC message with no data callback set: dropped");
        return Ok(());
    };
    let d = PyDict::new(py);
    d.set_item("source", source)?;
    d.set_item("data", data)?;
    cb.call1(py, (d,)).map(drop)
}

/// A tensor as Mooncake's `ReceivedTensor` shows it, with its shape readable and its
/// `total_bytes` set (the wheel raises on `shape` and leaves `total_bytes` 0).
#[pyclass(module = "te._native", frozen, get_all)]
pub(crate) struct ReceivedTensor {
    source_address: String,
    shape: Vec<u64>,
    dtype: String,
    total_bytes: u64,
    data: Py<PyBytes>,
    /// Where the tensor's data starts in `data` (the header a Mooncake sender put first).
    #[pyo3(name = "header_bytes")]
    header: usize,
}

#[pymethods]
impl ReceivedTensor {
    fn get_data_size(&self, py: Python<'_>) -> usize {
        self.data.bind(py).as_bytes().len()
    }

    fn get_data_as_bytes(&self, py: Python<'_>) -> Py<PyBytes> {
        self.data.clone_ref(py)
    }

    fn get_memory_view<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        py.import("builtins")?
            .getattr("memoryview")?
            .call1((self.data.bind(py),))
    }

    fn __repr__(&self) -> String {
        format!(
            "ReceivedTensor(source_address={:?}, dtype={:?}, shape={:?}, total_bytes={})",
            self.source_address, self.dtype, self.shape, self.total_bytes
        )
    }
}

/// Mooncake's `RpcInterface`, on te.
#[pyclass(module = "te._native", frozen, subclass)]
pub(crate) struct RpcInterface {
    rpc: Arc<MooncakeRpc>,
    callbacks: Arc<Callbacks>,
}

impl Drop for RpcInterface {
    /// Python drops the object with the GIL held, and the server's and client's threads may be
    /// waiting for it to run a callback: they are stopped and joined without it.
    fn drop(&mut self) {
        let rpc = self.rpc.clone();
        Python::attach(|py| py.detach(move || rpc.shutdown()));
    }
}

fn dtype_of(name: &str) -> PyResult<Dtype> {
    Dtype::from_name(name).ok_or_else(|| {
        PyValueError::new_err(format!(
            "dtype {name:?} is not one te sends (float16/32/64, bfloat16, int8/16/32/64, \
             uint8/16/32/64, bool)"
        ))
    })
}

#[pymethods]
impl RpcInterface {
    #[new]
    fn new() -> Self {
        let callbacks = Arc::new(Callbacks::default());
        RpcInterface {
            rpc: Arc::new(MooncakeRpc::new(callbacks.clone())),
            callbacks,
        }
    }

    #[pyo3(signature = (listen_address = String::new(), thread_count = 0, timeout_seconds = 30, pool_size = 100))]
    fn initialize(
        &self,
        py: Python<'_>,
        listen_address: String,
        thread_count: usize,
        timeout_seconds: u64,
        pool_size: usize,
    ) -> bool {
        py.detach(|| {
            self.rpc
                .initialize(&listen_address, thread_count, timeout_seconds, pool_size)
        })
    }

    #[pyo3(signature = (pool_size = 100, timeout_seconds = 30))]
    fn initialize_client(&self, py: Python<'_>, pool_size: usize, timeout_seconds: u64) -> bool {
        py.detach(|| self.rpc.initialize("", 0, timeout_seconds, pool_size))
    }

    #[pyo3(signature = (listen_address, thread_count = 8, timeout_seconds = 30))]
    fn initialize_server(
        &self,
        py: Python<'_>,
        listen_address: String,
        thread_count: usize,
        timeout_seconds: u64,
    ) -> bool {
        py.detach(|| {
            self.rpc
                .initialize(&listen_address, thread_count, timeout_seconds, 100)
        })
    }

    /// Starts the server and waits, without the GIL, until `stop_server` (Mooncake's blocking
    /// start); False when it cannot start. A signal's handler (Ctrl-C's `KeyboardInterrupt`)
    /// runs while it waits, and its exception ends the wait.
    fn start_server(&self, py: Python<'_>) -> PyResult<bool> {
        if !py.detach(|| self.rpc.start_server()) {
            return Ok(false);
        }
        while !py.detach(|| self.rpc.wait_stopped(std::time::Duration::from_millis(100))) {
            py.check_signals()?;
        }
        Ok(true)
    }

    fn start_server_async(&self, py: Python<'_>) -> bool {
        py.detach(|| self.rpc.start_server())
    }

    fn stop_server(&self, py: Python<'_>) {
        py.detach(|| self.rpc.stop_server());
    }

    /// Where the server listens (`host:port`), while it does. (te's addition.)
    #[getter]
    fn local_address(&self) -> Option<String> {
        self.rpc.local_addr().map(|a| a.to_string())
    }

    /// Sends bytes (any object `bytes()` takes) and waits until the peer's handler took them:
    /// 0, or a negative code.
    fn send_data(
        &self,
        py: Python<'_>,
        target_address: String,
        data: &Bound<'_, PyAny>,
    ) -> PyResult<i32> {
        self._send(py, target_address, data, false)
    }

    /// As `send_data`; with `raising`, a failure raises te's exception instead of returning
    /// its code.
    fn _send(
        &self,
        py: Python<'_>,
        target_address: String,
        data: &Bound<'_, PyAny>,
        raising: bool,
    ) -> PyResult<i32> {
        let owned;
        let bytes: &[u8] = match data.cast::<PyBytes>() {
            Ok(b) => b.as_bytes(),
            Err(_) => {
                owned = py.import("builtins")?.getattr("bytes")?.call1((data,))?;
                owned.cast::<PyBytes>()?.as_bytes()
            }
        };
        let r = py.detach(|| self.rpc.try_send(&target_address, Outgoing::Data(bytes)));
        outcome(r, raising)
    }

    /// Sends `length` bytes at `address` (memory the caller keeps alive and unchanged for the
    /// call) as a tensor of `dtype` and `shape`: 0, or a negative code (with `raising`, te's
    /// exception instead).
    #[allow(clippy::too_many_arguments)]
    fn _send_tensor_at(
        &self,
        py: Python<'_>,
        target_address: String,
        address: usize,
        length: usize,
        dtype: &str,
        shape: Vec<u64>,
        raising: bool,
    ) -> PyResult<i32> {
        let meta = TensorMeta {
            dtype: dtype_of(dtype)?,
            shape,
        };
        let bytes: &[u8] = if length == 0 {
            &[]
        } else {
            // SAFETY: te.mooncake's wrapper passes the address and length of a contiguous host
            // tensor it holds a reference to for this call (torch, numpy, a DLPack capsule or
            // Mooncake's tensor interface), as Mooncake's own `send_tensor` reads `data_ptr()`.
            unsafe { std::slice::from_raw_parts(address as *const u8, length) }
        };
        let r = py.detach(|| {
            self.rpc
                .try_send(&target_address, Outgoing::Tensor(&meta, bytes))
        });
        outcome(r, raising)
    }

    /// Sends on te's sending threads and calls `done(code, message)` there (with the GIL):
    /// `data` is bytes; a tensor when `dtype` is given. Waits, without the GIL, while the
    /// sending queue is full.
    #[pyo3(signature = (target_address, data, done, dtype = None, shape = None))]
    fn _send_then(
        &self,
        py: Python<'_>,
        target_address: &str,
        data: Vec<u8>,
        done: Py<PyAny>,
        dtype: Option<&str>,
        shape: Option<Vec<u64>>,
    ) -> PyResult<i32> {
        let what = match dtype {
            Some(d) => Owned::Tensor(
                TensorMeta {
                    dtype: dtype_of(d)?,
                    shape: shape.unwrap_or_default(),
                },
                data,
            ),
            None => Owned::Data(data),
        };
        let report = Box::new(move |r: te_facade::rpc::Result<()>| {
            Python::attach(|py| {
                let (code, message) = match r {
                    Ok(()) => (0, String::new()),
                    Err(e) => (e.code(), e.to_string()),
                };
                if let Err(e) = done.call1(py, (code, message)) {
                    tracing::debug!(error = %e, "an RPC send's completion callback raised");
                }
            });
        });
        // Without the GIL: a full queue waits for a sending thread, which may need the GIL to
        // report the send before it.
        Ok(py
            .detach(|| self.rpc.send_then(target_address, what, report))
            .map_or_else(|e| e.code(), |()| 0))
    }

    fn set_data_receive_callback(&self, callback: Py<PyAny>) {
        *self
            .callbacks
            .data
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(callback);
    }

    fn set_tensor_receive_callback(&self, callback: Py<PyAny>) {
        *self
            .callbacks
            .tensor
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(callback);
    }
}

/// A send's outcome as Mooncake's code, or raised as te's exception.
fn outcome(r: te_facade::rpc::Result<()>, raising: bool) -> PyResult<i32> {
    match r {
        Ok(()) => Ok(0),
        Err(e) if raising => Err(rpc_error(&e)),
        Err(e) => Ok(e.code()),
    }
}

/// `e` as te's exception: `RpcTimeoutError` (a `TimeoutError`) for a timeout,
/// `InvalidArgumentError` for a message te cannot send, `RpcError` (a `RuntimeError`, as the
/// wheel raises) for the rest; `.code` is the negative code `send_data` returns.
fn rpc_error(e: &te_facade::rpc::Error) -> PyErr {
    use te_facade::rpc::Error as E;
    let class = match e {
        E::TimedOut { .. } => "RpcTimeoutError",
        E::Invalid { .. } | E::TooLarge { .. } | E::Setting(_) => "InvalidArgumentError",
        _ => "RpcError",
    };
    Python::attach(|py| {
        let made = py
            .import("te.errors")
            .and_then(|m| m.getattr(class))
            .and_then(|c| c.call1((e.to_string(), e.code())));
        match made {
            Ok(instance) => PyErr::from_value(instance),
            Err(failed) => failed,
        }
    })
}
