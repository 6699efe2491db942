"""te, a transfer engine: moves bytes between registered memory on many machines.

``te.Engine`` is te's own API (see ``te._engine``): regions from buffers, arrays and tensors,
peers, synchronous and asynchronous transfers (awaitable from asyncio), notifications, and
exceptions that carry Mooncake's error codes. ``te.Rpc`` sends messages and tensors to a
process by address and receives theirs.

``te.mooncake`` is a drop-in for Mooncake's ``mooncake.engine`` module: change
``from mooncake.engine import TransferEngine`` to ``from te.mooncake import TransferEngine``,
or call ``te.mooncake.install()`` before the program imports ``mooncake.engine``.

te's Rust log events go to Python's ``logging``, under the loggers ``te.<crate>``
(``te.te_tcp``, ...), from the level of the ``te`` logger when this package is imported;
``te.set_log_level`` changes it later.
"""

import logging as _logging

from . import _native
from ._engine import Engine, MemoryRegion, Notification, Peer, Transfer
from ._native import __version__
from ._rpc import Message, Rpc
from .errors import (
    AccessDeniedError,
    BusyError,
    CanceledError,
    ClosedError,
    ForkedError,
    GpuError,
    InvalidArgumentError,
    NotRegisteredError,
    OverlapError,
    PeerError,
    RpcError,
    RpcTimeoutError,
    TeError,
    TransferError,
    TransferTimeoutError,
    TransportError,
)

__all__ = [
    "__version__",
    "Engine",
    "MemoryRegion",
    "Notification",
    "Peer",
    "Transfer",
    "Rpc",
    "Message",
    "set_log_level",
    "TeError",
    "AccessDeniedError",
    "BusyError",
    "CanceledError",
    "ClosedError",
    "ForkedError",
    "GpuError",
    "InvalidArgumentError",
    "NotRegisteredError",
    "OverlapError",
    "PeerError",
    "RpcError",
    "RpcTimeoutError",
    "TransferError",
    "TransferTimeoutError",
    "TransportError",
]


def set_log_level(level):
    """Forwards te's log events at ``level`` (``logging.DEBUG`` ... ``logging.ERROR``) and
    above to Python's ``logging``. False if another tracing subscriber took te's events."""
    if isinstance(level, str):
        level = _logging.getLevelName(level.upper())
    if not isinstance(level, int):
        raise TypeError("level must be a logging level (an int or its name)")
    return _native.enable_logging(level)


set_log_level(_logging.getLogger("te").getEffectiveLevel())
