"""te's Pythonic API: :class:`Engine`, :class:`MemoryRegion`, :class:`Peer`, :class:`Transfer`.

An engine starts in its constructor or raises; ``with`` blocks and :meth:`Engine.close` shut it
down (listeners closed, ports released, memory unregistered). :meth:`Engine.register` takes
anything that describes memory: a DLPack tensor (``__dlpack__``: torch, cupy, jax, numpy), an
object with ``__cuda_array_interface__`` or ``__array_interface__``, a writable buffer
(``bytearray``, ``mmap``, ``array.array``, ``memoryview``), ``bytes`` (read-only), or a raw
``(address, length)`` pair. The region keeps its object (and the buffer export, so a
``bytearray`` cannot be resized nor an ``mmap`` closed) until it is unregistered.

The buffer protocol under the limited C API: the package is one abi3 wheel for CPython 3.10 and
later, and the buffer C API is only part of the limited API from 3.11. So buffers are resolved
here, in Python: ``ctypes`` takes a writable export of the object (``from_buffer``) and gives
its address; arrays and tensors describe themselves through their interfaces, and DLPack
capsules are read by the native module (``te._native.dlpack_range``).
"""

import asyncio
import collections
import ctypes
import json
import os
import sys
import threading

from . import _native
from .errors import InvalidArgumentError

__all__ = ["Engine", "MemoryRegion", "Peer", "Transfer", "Notification"]

class Notification(collections.namedtuple("Notification", "name message")):
    """A notification: the name its sender gave (``name``: the sender's word, nothing more) and
    what it says (``message``). What te vouches for is ``sender``, the address (``ip:port``) of
    the connection it came on, and ``authenticated``, whether that connection proved the
    cluster secret (``MC_TE_CLUSTER_SECRET``)."""

    sender = None
    authenticated = False

    @classmethod
    def _received(cls, name, message, sender, authenticated):
        n = cls(name, message)
        n.sender = sender
        n.authenticated = authenticated
        return n

_U64 = 1 << 64
_NATIVE_U64 = ("<" if sys.byteorder == "little" else ">") + "u8"


def _uint(value, what):
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int, got {type(value).__name__}")
    if not 0 <= value < _U64:
        raise InvalidArgumentError(f"{what} {value} is not in 0..2**64", -1)
    return value


def _contiguous_nbytes(shape, typestr, strides, what):
    """Bytes of a C-contiguous array from its interface dict fields."""
    try:
        itemsize = int(typestr[2:])
    except (TypeError, ValueError):
        raise InvalidArgumentError(f"{what}: typestr {typestr!r} not understood", -1) from None
    count = 1
    for d in shape:
        count *= int(d)
    if strides is not None:
        expect = itemsize
        for d, s in zip(reversed(shape), reversed(strides)):
            if d != 1 and s != expect:
                raise InvalidArgumentError(
                    f"{what}: not contiguous (shape {tuple(shape)}, strides {tuple(strides)}):"
                    " register a contiguous copy", -1)
            expect *= d
    return count * itemsize


def _cuda_device(obj):
    """The CUDA device index of a tensor, from ``.device`` (torch, cupy), else 0."""
    device = getattr(obj, "device", None)
    for attr in ("index", "id"):
        index = getattr(device, attr, None)
        if isinstance(index, int):
            return index
    return 0


def _resolve(obj):
    """``(address, length, location, read_only, keep)``: where ``obj``'s memory is, and what
    must stay referenced while it is registered."""
    if isinstance(obj, tuple):
        if len(obj) != 2:
            raise TypeError("a raw range is an (address, length) pair")
        return _uint(obj[0], "address"), _uint(obj[1], "length"), "*", False, None
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is not None:
        addr, read_only = cai["data"]
        length = _contiguous_nbytes(cai["shape"], cai["typestr"], cai.get("strides"),
                                    "__cuda_array_interface__")
        return addr, length, f"cuda:{_cuda_device(obj)}", bool(read_only), obj
    ai = getattr(obj, "__array_interface__", None)
    if ai is not None:
        if ai.get("mask") is not None:
            raise InvalidArgumentError("__array_interface__ with a mask: no single range", -1)
        data = ai.get("data")
        if not isinstance(data, tuple):
            raise InvalidArgumentError("__array_interface__ without a data pointer", -1)
        addr, read_only = data
        length = _contiguous_nbytes(ai["shape"], ai["typestr"], ai.get("strides"),
                                    "__array_interface__")
        return addr + ai.get("offset", 0), length, "*", bool(read_only), obj
    if hasattr(obj, "__dlpack__"):
        capsule = obj.__dlpack__()
        try:
            addr, length, location = _native.dlpack_range(capsule)
        except ValueError as e:
            raise InvalidArgumentError(str(e), -1) from None
        return addr, length, location, False, (obj, capsule)
    try:
        view = memoryview(obj)
    except TypeError:
        raise TypeError(
            f"cannot register a {type(obj).__name__}: give a buffer, an array or tensor"
            " (DLPack, __array_interface__, __cuda_array_interface__) or (address, length)"
        ) from None
    if not view.contiguous:
        view.release()
        raise InvalidArgumentError("the buffer is not contiguous", -1)
    length = view.nbytes
    if isinstance(obj, bytes):
        view.release()
        # bytes are immutable: their address is stable while the object lives.
        addr = ctypes.cast(ctypes.c_char_p(obj), ctypes.c_void_p).value
        return addr, length, "*", True, obj
    if view.readonly:
        view.release()
        raise TypeError(
            f"a read-only {type(obj).__name__}: register writable memory, or an array with"
            " __array_interface__ (which may be read-only)")
    if length == 0:
        view.release()
        raise InvalidArgumentError("an empty buffer", -1)
    # The ctypes array holds a buffer export until it is freed: the object cannot be resized,
    # freed or closed meanwhile.
    export = (ctypes.c_char * length).from_buffer(view)
    return ctypes.addressof(export), length, "*", False, (obj, view, export)


class MemoryRegion:
    """Registered memory: ``addr``, ``length`` (also ``len(region)``), ``location`` (``*`` for host memory,
    ``cuda:N``) and ``read_only`` (peers may read it only). Keeps ``obj`` referenced until
    :meth:`unregister` (or the engine closes)."""

    def __init__(self, engine, addr, length, location, read_only, obj, keep):
        self._engine = engine
        self.addr = addr
        self.length = length
        self.location = location
        self.read_only = read_only
        self.obj = obj
        self._keep = keep
        self._lock = threading.Lock()
        self._registered = True

    def __len__(self):
        return self.length

    def __repr__(self):
        state = "registered" if self._registered else "unregistered"
        return (f"MemoryRegion(addr={self.addr:#x}, length={self.length},"
                f" location={self.location!r}, read_only={self.read_only}, {state})")

    @property
    def registered(self):
        return self._registered

    def unregister(self):
        """Unregisters (waiting briefly for transfers that still hold the memory) and lets go
        of the object. Idempotent."""
        with self._lock:
            if not self._registered:
                return
            self._engine._unregister(self)
            self._registered = False
            self._release()

    def _release(self):
        keep, self._keep = self._keep, None
        if isinstance(keep, _native.Block):
            # Memory from Engine.allocate outlives its registration while viewed: no peer that
            # mapped it may reach it any more.
            keep.unshare()
        elif isinstance(keep, tuple) and len(keep) == 3 and isinstance(keep[1], memoryview):
            _, view, export = keep
            del export, keep
            view.release()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.unregister()


def _local(region_or_addr, offset, length):
    """The local address and length of one transfer."""
    if isinstance(region_or_addr, MemoryRegion):
        region = region_or_addr
        offset = _uint(offset, "offset")
        if length is None:
            length = region.length - offset
        length = _uint(length, "length")
        if offset + length > region.length:
            raise InvalidArgumentError(
                f"offset {offset} + length {length} is past the region's {region.length} bytes",
                -3)
        return region.addr + offset, length
    addr = _uint(region_or_addr, "local address") + _uint(offset, "offset")
    if length is None:
        raise TypeError("length is required when the local side is an address")
    return addr, _uint(length, "length")


def _table(descriptors):
    """Descriptors as ``("table", array)`` (a C-contiguous uint64 array of rows) or
    ``("lists", (locals, remotes, lengths))``."""
    if hasattr(descriptors, "__array_interface__"):
        ai = descriptors.__array_interface__
        shape = tuple(ai["shape"])
        if len(shape) != 2 or shape[1] != 3:
            raise InvalidArgumentError(f"descriptor array of shape {shape}: want (n, 3)", -1)
        if ai["typestr"] not in ("|u8", "=u8", _NATIVE_U64):
            raise InvalidArgumentError(
                f"descriptor array of type {ai['typestr']!r}: want uint64", -1)
        if ai.get("strides") is not None:
            raise InvalidArgumentError("descriptor array is not C-contiguous", -1)
        return "table", descriptors
    rows = list(descriptors)
    cols = ([], [], [])
    for row in rows:
        local, remote, length = row
        if isinstance(local, MemoryRegion):
            local = local.addr
        cols[0].append(_uint(local, "local address"))
        cols[1].append(_uint(remote, "remote address"))
        cols[2].append(_uint(length, "length"))
    return "lists", cols


class Transfer:
    """An asynchronous transfer: :meth:`done`, :meth:`wait`, :meth:`result`, :meth:`cancel`,
    and ``await transfer`` from asyncio (the wait runs in the loop's executor, with the GIL
    released)."""

    def __init__(self, engine, native_id, peer):
        self._engine = engine
        self._id = native_id
        self.peer = peer
        self._lock = threading.Lock()
        self._finished = False
        self._error = None

    def __repr__(self):
        state = ("running" if not self._finished
                 else "failed" if self._error else "completed")
        return f"Transfer(peer={self.peer!r}, {state})"

    def _settle(self, timeout):
        with self._lock:
            if self._finished:
                return True
            try:
                if not self._engine._native().wait(self._id, timeout):
                    return False
            except Exception as e:  # noqa: BLE001 - kept and raised by result()
                self._error = e
            self._finished = True
            return True

    def done(self):
        """Whether it has ended (completed or not), without waiting."""
        return self._settle(0.0)

    def wait(self, timeout=None):
        """Waits up to ``timeout`` seconds (None: until it ends). True when it completed,
        False if it is still running; raises the transfer's error if it failed."""
        if not self._settle(timeout):
            return False
        if self._error is not None:
            raise self._error
        return True

    def result(self, timeout=None):
        """Waits as :meth:`wait`; raises ``TimeoutError`` if it is still running then."""
        if not self.wait(timeout):
            raise TimeoutError(f"transfer still running after {timeout} s")

    def cancel(self):
        """Stops what has not started; the transfer then ends CANCELED (waiting raises
        :class:`te.CanceledError`) or COMPLETED if nothing was left. False if it had ended."""
        with self._lock:
            if self._finished:
                return False
            self._engine._native().cancel(self._id)
            return True

    def __await__(self):
        loop = asyncio.get_running_loop()
        return loop.run_in_executor(None, self.result).__await__()

    def __del__(self):
        try:
            if not self._finished:
                self._engine._native().abandon(self._id)
        except Exception:  # noqa: BLE001 - the engine may be closed or gone
            pass


class Peer:
    """Another engine, by ``name`` (``host:port``), opened by :meth:`Engine.connect`."""

    def __init__(self, engine, name):
        self._engine = engine
        self.name = name

    def __repr__(self):
        return f"Peer({self.name!r})"

    def _one(self, write, local, remote, length, offset, notify, wait):
        addr, length = _local(local, offset, length)
        remote = _uint(remote, "remote address")
        args = (self.name, write, [addr], [remote], [length], self._notify_pair(notify))
        return self._run(wait, False, args)

    def _many(self, write, descriptors, notify, wait):
        kind, data = _table(descriptors)
        n = self._notify_pair(notify)
        if kind == "table":
            rows = int(data.__array_interface__["shape"][0])
            addr = data.__array_interface__["data"][0]
            return self._run(wait, True, (self.name, write, addr, rows, n), keep=data)
        return self._run(wait, False, (self.name, write, *data, n))

    def _run(self, wait, table, args, keep=None):
        native = self._engine._native()
        if wait:
            (native.transfer_table if table else native.transfer)(*args)
            return None
        transfer = Transfer(self._engine, (native.submit_table if table else native.submit)(*args),
                            self)
        del keep  # the table was read before submit returned
        return transfer

    def _notify_pair(self, notify):
        if notify is None:
            return None
        if isinstance(notify, str):
            return (self._engine.name, notify)
        name, message = notify
        return (str(name), str(message))

    def write(self, local, remote, length=None, *, offset=0, notify=None):
        """Writes ``length`` bytes (default: the rest of the region) from ``local`` (a
        :class:`MemoryRegion`, at ``offset``, or an address) to the peer's address ``remote``;
        returns when they are in the peer's memory. ``notify`` (a message, or a ``(name,
        message)`` pair) reaches the peer after the data."""
        return self._one(True, local, remote, length, offset, notify, True)

    def read(self, local, remote, length=None, *, offset=0):
        """Reads ``length`` bytes at the peer's address ``remote`` into ``local``."""
        return self._one(False, local, remote, length, offset, None, True)

    def write_many(self, descriptors, *, notify=None):
        """Writes every ``(local address, remote address, length)`` row: a numpy ``uint64``
        array of shape ``(n, 3)`` (read without conversion) or a sequence of triples (a
        :class:`MemoryRegion` may stand for its address). All or nothing is reported."""
        return self._many(True, descriptors, notify, True)

    def read_many(self, descriptors):
        """Reads every ``(local address, remote address, length)`` row."""
        return self._many(False, descriptors, None, True)

    def write_async(self, local, remote, length=None, *, offset=0, notify=None):
        """As :meth:`write`, returning a :class:`Transfer` at once."""
        return self._one(True, local, remote, length, offset, notify, False)

    def read_async(self, local, remote, length=None, *, offset=0):
        """As :meth:`read`, returning a :class:`Transfer` at once."""
        return self._one(False, local, remote, length, offset, None, False)

    def write_many_async(self, descriptors, *, notify=None):
        """As :meth:`write_many`, returning a :class:`Transfer` at once."""
        return self._many(True, descriptors, notify, False)

    def read_many_async(self, descriptors):
        """As :meth:`read_many`, returning a :class:`Transfer` at once."""
        return self._many(False, descriptors, None, False)

    def notify(self, message, name=None):
        """Sends ``message`` to the peer without moving data; ``name`` defaults to this
        engine's name."""
        self._engine._native().notify(self.name, self._engine.name if name is None else name,
                                      message)

    def probe(self):
        """Whether the peer's handshake listener answers now."""
        return self._engine._native().probe(self.name)


class Engine:
    """A te engine. ``Engine()`` serves on 127.0.0.1 with peers named ``host:port``
    (``P2PHANDSHAKE``); ``metadata`` may name a service instead (``etcd://``, ``redis://``,
    ``http://``). ``protocol="auto"`` (the default) runs every transport that can start on this
    machine and lets the engine choose per peer and buffer (:meth:`transports` says which run);
    a Mooncake name (``tcp``, ``rdma`` on ``devices``, ``shm``, ``io_uring``, ``nvlink``,
    ``cxl``, ``gds``) runs that one. Raises :class:`te.TeError` when it cannot start (a
    transport this machine or build lacks is a :class:`te.TransportError` saying which)."""

    def __init__(self, hostname="127.0.0.1", metadata="P2PHANDSHAKE", protocol="auto", devices="",
                 *, backend="classic", metrics=None):
        self._engine = _native.Engine(hostname, metadata, protocol, devices, backend)
        if metrics is not None:
            self._engine.metrics(bool(metrics))
        self.backend = backend
        self._regions = {}
        self._lock = threading.Lock()
        self._closed = False
        self._name = self._engine.name

    def __repr__(self):
        return f"Engine({self._name!r}{', closed' if self._closed else ''})"

    def _native(self):
        return self._engine

    @property
    def name(self):
        """The name peers connect to (``host:port`` peer to peer)."""
        return self._name

    @property
    def closed(self):
        return self._closed

    def register(self, obj, *, location=None, read_only=None):
        """Registers ``obj``'s memory (see the module doc for what it may be) and returns its
        :class:`MemoryRegion`. ``location`` overrides where it is (``cpu``, ``cuda:0``);
        ``read_only`` lets peers only read it (default: as the object says)."""
        addr, length, where, ro, keep = _resolve(obj)
        if length == 0:
            raise InvalidArgumentError("nothing to register: zero bytes", -1)
        location = where if location is None else location
        ro = ro if read_only is None else bool(read_only)
        self._engine.register(addr, length, location, not ro)
        region = MemoryRegion(self, addr, length, location, ro, obj, keep)
        with self._lock:
            self._regions[addr] = region
        return region

    def allocate(self, length):
        """``length`` bytes the engine allocates and registers for peers to read and write, as
        a :class:`MemoryRegion` whose ``obj`` is a writable ``memoryview`` of them
        (``numpy.frombuffer(region.obj, dtype)`` views them as an array). Where shared memory
        runs (``protocol="auto"`` or ``"shm"``) they are a shared-memory file that peers on
        this host map, the fastest kind between processes here; else page-aligned host
        memory. The bytes stay allocated while the region or any view of them lives, also
        after :meth:`MemoryRegion.unregister` or :meth:`close`; from then on they are private
        to this process (a peer that had mapped them no longer reaches them, and bytes written
        while it happens may be lost)."""
        length = _uint(length, "length")
        if length == 0:
            raise InvalidArgumentError("nothing to allocate: zero bytes", -1)
        block = self._engine.allocate(length)
        # Every view of the bytes reaches the ctypes array, which holds the block: the memory
        # cannot be freed under a view.
        export = (ctypes.c_char * block.length).from_address(block.addr)
        export.te_block = block
        view = memoryview(export).cast("B")
        region = MemoryRegion(self, block.addr, block.length, "*", False, view, block)
        with self._lock:
            self._regions[block.addr] = region
        return region

    def _unregister(self, region):
        self._engine.unregister(region.addr)
        with self._lock:
            self._regions.pop(region.addr, None)

    def connect(self, name):
        """Opens the peer ``name`` (its descriptor, the handshake) and returns its
        :class:`Peer`; raises :class:`te.PeerError` when it cannot be reached."""
        if not isinstance(name, str):
            raise TypeError("a peer is named by a str, host:port")
        self._engine.connect(name)
        return Peer(self, name)

    def open_file(self, path, mode="r"):
        """Opens the regular file at ``path`` as a segment, and returns it as a :class:`Peer`:
        ``read``/``write`` (and their ``_many`` and ``_async`` forms) move bytes between
        registered memory and the file, the file offset in place of the remote address.
        ``mode`` is ``"r"`` (READs only) or ``"rw"``. The file keeps its size (size it first);
        io_uring moves the bytes where the kernel allows it, buffered I/O otherwise (the
        engine needs a file transport: ``protocol="auto"`` or ``"io_uring"``)."""
        if mode not in ("r", "rw"):
            raise ValueError(f"mode {mode!r}: 'r' or 'rw'")
        return Peer(self, self._engine.open_file(os.fspath(path), mode == "rw"))

    def transports(self):
        """The transports this engine runs, as ``{name: [capabilities]}`` in the order it asks
        them: the first is the protocol peers see; a buffer another one serves better (shared
        memory on this host, GPU memory through NVLink) goes to that one. ``protocol="auto"``
        installs every transport that can start on this machine."""
        return {name: caps for name, caps in self._engine.transports()}

    def nic_load_stats(self):
        """Each rail's load, as the C API's ``getNicLoadStats``: a list of dicts with
        ``device_name``, ``inflight_bytes`` (posted, not yet done) and ``ewma_bandwidth_bps``
        (completed bytes per second, smoothed)."""
        return self._engine.nic_load_stats()

    def metrics(self):
        """This engine's figures as a dict: TENT's totals by name (``tent_write_bytes_total``,
        ``tent_read_requests_total``, ...), then ``series``: per transport and operation,
        requests, bytes, failures by kind, latency (µs) and size histograms; ``failovers`` and
        ``rail_pauses``. Requests are counted while counting is on: ``Engine(metrics=True)``,
        or ``TENT_METRICS_ENABLED`` / ``MC_TE_METRIC`` (which also serve or log them for the
        whole process; docs/metrics.md)."""
        return json.loads(self._engine.metrics())

    def notifications(self, timeout=None):
        """The notifications received so far, oldest first (each returned once); with
        ``timeout``, waits up to that many seconds for the first when there is none."""
        return [Notification._received(*got) for got in self._engine.notifications(timeout)]

    def iter_notifications(self, timeout=None):
        """Yields notifications as they arrive; stops once none came for ``timeout`` seconds
        (None: never)."""
        while True:
            got = self._engine.notifications(3600.0 if timeout is None else timeout)
            if not got and timeout is not None:
                return
            for received in got:
                yield Notification._received(*received)

    def close(self):
        """Shuts the engine down (listeners closed, ports released, memory unregistered) and
        lets go of every registered object. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            regions, self._regions = list(self._regions.values()), {}
        self._engine.close()
        for region in regions:
            with region._lock:
                region._registered = False
                region._release()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
