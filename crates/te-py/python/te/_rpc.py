"""Messages and tensors between processes: Mooncake's ``RpcInterface`` for ``te.mooncake``
(``RpcInterface``, ``CoroRPCInterface``, ``ReceivedData``, ``ReceivedTensor``,
``create_rpc_client``, ``create_rpc_server``), and te's own :class:`Rpc`.

Tensors come from torch, numpy, any DLPack object, or an object with the attributes Mooncake
reads from one (``data_ptr``, ``numel``, ``element_size``, ``shape``, ``dtype``); GPU tensors
are copied to host memory first. Between te peers a tensor arrives with its dtype, shape and
exactly its bytes; to a Mooncake peer it goes as Mooncake sends one (its raw bytes).
"""

import asyncio
import queue
import threading
from dataclasses import dataclass
from typing import Any, Optional, Tuple

from . import _native
from .errors import InvalidArgumentError, RpcError, RpcTimeoutError

__all__ = [
    "RpcInterface",
    "CoroRPCInterface",
    "ReceivedData",
    "ReceivedTensor",
    "create_rpc_client",
    "create_rpc_server",
    "Rpc",
    "Message",
]

ReceivedTensor = _native.ReceivedTensor


class ReceivedData:
    """Mooncake's ``ReceivedData``: a message's sender and bytes. (Mooncake's data callback is
    given a dict ``{"source", "data"}``; this class is offered under its name all the same.)"""

    def __init__(self, source_address: str = "", data: bytes = b""):
        self.source_address = source_address
        self._data = bytes(data)
        self.data_size = len(self._data)

    def get_bytes(self) -> bytes:
        return self._data

    def get_memory_view(self) -> memoryview:
        return memoryview(self._data)


def _host(t):
    """A contiguous host copy of a GPU tensor; the tensor itself otherwise."""
    device = getattr(t, "device", None)
    if getattr(t, "is_cuda", False) or getattr(device, "type", "cpu") not in ("cpu", None):
        if hasattr(t, "cpu"):
            t = t.cpu()
    if hasattr(t, "is_contiguous") and callable(t.contiguous) and not t.is_contiguous():
        t = t.contiguous()
    return t


def tensor_parts(tensor) -> Tuple[Any, int, int, str, Tuple[int, ...]]:
    """``(keepalive, address, length, dtype, shape)`` of a host tensor's contiguous bytes; the
    memory stays valid while ``keepalive`` is held."""
    t = _host(tensor)
    if type(t).__module__ == "numpy" and hasattr(t, "__array_interface__"):
        a = t if t.flags.c_contiguous else t.copy(order="C")
        return a, a.ctypes.data, a.nbytes, a.dtype.name, tuple(a.shape)
    if all(hasattr(t, a) for a in ("data_ptr", "numel", "element_size", "shape", "dtype")):
        length = int(t.numel()) * int(t.element_size())
        return t, int(t.data_ptr()), length, str(t.dtype), tuple(int(d) for d in t.shape)
    if hasattr(t, "__dlpack__"):
        capsule = t.__dlpack__()
        address, length, location = _native.dlpack_range(capsule)
        if location != "*":
            raise InvalidArgumentError(f"a tensor in {location} memory: copy it to the host", -1)
        return (t, capsule), address, length, str(t.dtype), tuple(int(d) for d in t.shape)
    raise TypeError(
        f"{type(tensor).__name__} is not a tensor: torch, numpy, a DLPack object, or an object "
        "with data_ptr(), numel(), element_size(), shape and dtype"
    )


def _error(code: int, message: str) -> Exception:
    """te's exception for a send's negative code (as the native sends raise it)."""
    kind = {-2: RpcTimeoutError, -3: InvalidArgumentError}.get(code, RpcError)
    return kind(message or "send failed", code)


def _settle(future: asyncio.Future, code: int, message: str) -> None:
    if future.cancelled():
        return
    if code == 0:
        future.set_result(0)
    else:
        future.set_exception(_error(code, message))


def _future_send(rpc, loop, target, data: bytes, dtype=None, shape=None) -> asyncio.Future:
    if loop is None:
        loop = asyncio.get_running_loop()
    future = loop.create_future()

    def done(code: int, message: str) -> None:
        try:
            loop.call_soon_threadsafe(_settle, future, code, message)
        except RuntimeError:  # the loop closed meanwhile: nobody awaits the outcome
            pass

    code = rpc._send_then(target, data, done, dtype, None if shape is None else list(shape))
    if code != 0:
        future.set_exception(RpcError("the communicator is not initialized or stopped", code))
    return future


def _tensor_bytes(tensor):
    keep, address, length, dtype, shape = tensor_parts(tensor)
    import ctypes

    data = ctypes.string_at(address, length) if length else b""
    del keep
    return data, dtype, shape


class RpcInterface(_native.RpcInterface):
    """Mooncake's ``RpcInterface``, on te: the same methods, defaults and return codes. Sends
    return 0 or a negative code (a failed call is never reported as 0), the asyncio sends
    work, ``ReceivedTensor.shape`` reads, and ``start_server`` waits without holding the GIL.
    The data callback is given ``{"source": "host:port", "data": bytes}``; the tensor callback
    a ``ReceivedTensor`` (data from a Mooncake peer that carries its receiver's tensor header
    goes there too, header included, as Mooncake's receiver routes it)."""

    def send_tensor(self, target_address: str, tensor) -> int:
        """Sends a tensor and waits until the peer's handler took it: 0 or a negative code."""
        try:
            keep, address, length, dtype, shape = tensor_parts(tensor)
            return self._send_tensor_at(target_address, address, length, dtype, list(shape), False)
        except (TypeError, ValueError) as e:
            import logging

            logging.getLogger("te.rpc").error("send_tensor: %s", e)
            return -1

    def send_data_async(self, target_address: str, data, loop) -> asyncio.Future:
        """An asyncio future on ``loop`` resolved with 0 once the peer took the bytes, or with
        ``te.errors.RpcError`` (a ``RuntimeError``)."""
        payload = data if isinstance(data, bytes) else bytes(data)
        return _future_send(self, loop, target_address, payload)

    def send_tensor_async(self, target_address: str, tensor, loop) -> asyncio.Future:
        """As ``send_data_async``, for a tensor (copied when called)."""
        data, dtype, shape = _tensor_bytes(tensor)
        return _future_send(self, loop, target_address, data, dtype, shape)


CoroRPCInterface = RpcInterface


def create_rpc_client(local_rank: int = 0, world_size: int = 1) -> RpcInterface:
    """Mooncake's factory: a client with a pool of 10 connections per peer."""
    rpc = RpcInterface()
    rpc.initialize("", 0, 30, 10)
    return rpc


def create_rpc_server(local_rank: int = 0, world_size: int = 1) -> RpcInterface:
    """Mooncake's factory: initialized to listen on 0.0.0.0:8080 (start it with
    ``start_server_async``)."""
    rpc = RpcInterface()
    rpc.initialize("0.0.0.0:8080", 0, 30, 10)
    return rpc


@dataclass(frozen=True)
class Message:
    """A received message: ``data`` exactly as sent; for a tensor also its ``dtype`` (numpy's
    name) and ``shape``."""

    source: str
    data: bytes
    dtype: Optional[str] = None
    shape: Optional[Tuple[int, ...]] = None

    @property
    def is_tensor(self) -> bool:
        return self.dtype is not None

    def numpy(self):
        """The tensor as a read-only numpy array over ``data`` (numpy has no bfloat16)."""
        import numpy as np

        if self.dtype is None:
            return np.frombuffer(self.data, dtype=np.uint8)
        return np.frombuffer(self.data, dtype=np.dtype(self.dtype)).reshape(self.shape)


class Rpc:
    """te's messaging: send bytes or tensors to an address, and receive what peers send.

    ``Rpc(listen="127.0.0.1:0")`` serves (``address`` says where); ``Rpc()`` only sends. Sends
    raise te's exceptions (``RpcTimeoutError``, ``RpcError``, ``InvalidArgumentError``).
    Received messages wait in a bounded queue (``queue`` messages); when it is full the server
    stops reading, so senders wait rather than memory growing. Iterate, call ``receive``, or
    ``await receive_async()``.
    """

    def __init__(self, listen: Optional[str] = None, *, threads: int = 0, timeout: float = 30.0,
                 pool_size: int = 100, queue_size: int = 1024):
        if timeout < 1:
            raise InvalidArgumentError("timeout must be at least 1 second", -1)
        self._inbox: "queue.Queue[Message]" = queue.Queue(maxsize=queue_size)
        self._closed = threading.Event()
        self._native = _native.RpcInterface()
        self._native.set_data_receive_callback(self._on_data)
        self._native.set_tensor_receive_callback(self._on_tensor)
        if not self._native.initialize(listen or "", threads, int(timeout), pool_size):
            raise InvalidArgumentError(
                f"cannot set up the communicator (listen={listen!r}, threads={threads}, "
                f"pool_size={pool_size}); te's log says why", -1)
        if listen and not self._native.start_server_async():
            raise RpcError(f"cannot listen on {listen!r}; te's log says why", -1)


    @property
    def address(self) -> Optional[str]:
        """Where it listens (``host:port``), or None."""
        return self._native.local_address

    def _put(self, message: Message) -> None:
        # A full queue holds the server's thread (and so the sender) until there is room, or
        # until close().
        while not self._closed.is_set():
            try:
                self._inbox.put(message, timeout=0.1)
                return
            except queue.Full:
                pass

    def _on_data(self, d) -> None:
        self._put(Message(d["source"], d["data"]))

    def _on_tensor(self, t) -> None:
        data = t.get_data_as_bytes()[t.header_bytes:]
        self._put(Message(t.source_address, data, t.dtype, tuple(t.shape)))

    def send(self, target: str, payload) -> None:
        """Sends bytes (any bytes-like object) or a tensor, and returns once the peer's
        receiver took it."""
        if isinstance(payload, (bytes, bytearray, memoryview)):
            self._native._send(target, payload, True)
            return
        keep, address, length, dtype, shape = tensor_parts(payload)
        self._native._send_tensor_at(target, address, length, dtype, list(shape), True)
        del keep

    async def send_async(self, target: str, payload) -> None:
        """As ``send``, awaited: the send runs on te's sending threads."""
        loop = asyncio.get_running_loop()
        if isinstance(payload, (bytes, bytearray, memoryview)):
            await _future_send(self._native, loop, target, bytes(payload))
        else:
            data, dtype, shape = _tensor_bytes(payload)
            await _future_send(self._native, loop, target, data, dtype, shape)

    def receive(self, timeout: Optional[float] = None) -> Message:
        """The next message; ``TimeoutError`` when none came within ``timeout`` seconds."""
        try:
            return self._inbox.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"no message within {timeout} s") from None

    async def receive_async(self) -> Message:
        """The next message, awaited."""
        return await asyncio.get_running_loop().run_in_executor(None, self._inbox.get)

    def __iter__(self):
        while True:
            yield self._inbox.get()

    def close(self) -> None:
        """Stops serving; messages not yet taken are dropped."""
        self._closed.set()
        self._native.stop_server()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
