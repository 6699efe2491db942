"""te's drop-in for Mooncake's ``mooncake.engine`` (0.3.13): the same ``TransferEngine`` methods,
argument order and return codes, over te.

Differences, all on the side of safety: calls before ``initialize`` return an error code instead
of crashing; batch ids are checked (a freed or made-up id is -1, never a use-after-free);
synchronous calls wait without spinning a core; every call that can block releases the GIL
(registration and handshakes included); ``write_bytes_to_buffer`` and
``read_bytes_from_buffer`` only touch registered memory; ``transfer_check_status`` frees a
timed-out batch (-2) instead of leaking it; ``get_engine()`` is ``None`` (there is no Mooncake
C++ engine to share) and ``get_engine_ptr()`` raises ``NotImplementedError``. te adds
``close()`` and ``nic_load_stats()`` (each rail's load, as the C API's ``getNicLoadStats``).

Mooncake's RPC communicator is here too (``RpcInterface`` and its companions, see ``te._rpc``),
without the wheel's defects: failed sends return a negative code, the asyncio sends work and
``ReceivedTensor.shape`` reads.
"""

import enum
import importlib.util
import sys
import types

from ._native import TransferNotify, local_topology
from ._native import TransferEngine as _NativeTransferEngine
from ._rpc import (
    CoroRPCInterface,
    ReceivedData,
    ReceivedTensor,
    RpcInterface,
    create_rpc_client,
    create_rpc_server,
)

__all__ = [
    "TransferEngine",
    "TransferOpcode",
    "TransferNotify",
    "Read",
    "Write",
    "SUPPORT_CUDA",
    "SUPPORT_EFA",
    "SUPPORT_HIP",
    "SUPPORT_MNNVL",
    "SUPPORT_MUSA",
    "SUPPORT_INTRA_NVLINK",
    "RpcInterface",
    "CoroRPCInterface",
    "ReceivedData",
    "ReceivedTensor",
    "create_rpc_client",
    "create_rpc_server",
    "install",
]


class TransferOpcode(enum.IntEnum):
    """Direction of a transfer: Mooncake's members ``Read`` and ``Write`` (``READ`` and
    ``WRITE``, which Mooncake's docs name but its module lacks, are aliases)."""

    Read = 0
    Write = 1
    READ = 0
    WRITE = 1


Read = TransferOpcode.Read
Write = TransferOpcode.Write

# The CUDA-stream methods (transfer_write_on_cuda, ...) are not offered, as in Mooncake's
# non-CUDA wheel; te registers CUDA memory through register_memory all the same.
SUPPORT_CUDA = False
SUPPORT_EFA = False
SUPPORT_HIP = False
SUPPORT_MNNVL = False
SUPPORT_MUSA = False
SUPPORT_INTRA_NVLINK = False


class TransferEngine(_NativeTransferEngine):
    """Mooncake's ``TransferEngine``, on te. See the module's documentation for what differs."""

    TransferOpcode = TransferOpcode

    @staticmethod
    def get_local_topology_json() -> str:
        """This host's topology as JSON (te's name for a static ``get_local_topology``)."""
        return local_topology()


def install() -> None:
    """Makes ``import mooncake.engine`` give this module, so that programs written against
    Mooncake run on te unmodified. The real ``mooncake`` package is kept when it imports (its
    other modules still work); otherwise a bare package stands in for it."""
    this = sys.modules[__name__]
    parent = sys.modules.get("mooncake")
    if parent is None:
        try:
            if importlib.util.find_spec("mooncake") is not None:
                import mooncake as parent  # noqa: F811 - the real package, when it imports
        except Exception:  # a broken or partial Mooncake install: stand in for it
            parent = None
        if parent is None:
            parent = types.ModuleType("mooncake")
            parent.__path__ = []
            parent.__doc__ = "Stand-in package made by te.mooncake.install()"
        sys.modules["mooncake"] = parent
    sys.modules["mooncake.engine"] = this
    parent.engine = this
