"""te's exceptions. Every one is a :class:`TeError` and carries Mooncake's ``ERR_*`` number as
``.code`` (-1 invalid argument, -3 address not registered, -4 busy, -7 overlap, ...); each also
derives from the built-in exception a Python caller would catch for it (``ValueError``,
``TimeoutError``, ``ConnectionError``, ...)."""

__all__ = [
    "TeError",
    "InvalidArgumentError",
    "NotRegisteredError",
    "AccessDeniedError",
    "OverlapError",
    "BusyError",
    "PeerError",
    "TransferError",
    "TransferTimeoutError",
    "CanceledError",
    "ClosedError",
    "ForkedError",
    "GpuError",
    "TransportError",
    "RpcError",
    "RpcTimeoutError",
]


class TeError(Exception):
    """A te call failed. ``code`` is Mooncake's ``ERR_*`` number for the failure."""

    def __init__(self, message="", code=-1):
        super().__init__(message)
        self.code = code


class InvalidArgumentError(TeError, ValueError):
    """A bad argument: zero length, lists of different lengths, an unknown transfer id, ..."""


class TransportError(TeError, ValueError):
    """A transport te cannot serve: a protocol or ``transport_hint`` that names no transport,
    one te does not have, or one not installed in this engine (the message says which)."""


class NotRegisteredError(TeError, ValueError):
    """An address range that is not inside one registered region (here or at the peer)."""


class AccessDeniedError(TeError, PermissionError):
    """The region does not allow this access (a WRITE into memory registered read-only)."""


class OverlapError(TeError, ValueError):
    """The range overlaps a region registered already."""


class BusyError(TeError):
    """The region or transfer is still in use (unregistering memory a transfer holds)."""


class PeerError(TeError, ConnectionError):
    """The peer is unknown, unreachable or refused the handshake."""


class TransferError(TeError):
    """A transfer ended otherwise than completed; the message says why."""


class TransferTimeoutError(TransferError, TimeoutError):
    """A transfer ran past its time limit (``MC_TRANSFER_TIMEOUT``)."""


class CanceledError(TransferError):
    """A transfer was cancelled before all of it moved."""


class ClosedError(TeError, RuntimeError):
    """The engine was closed."""


class ForkedError(TeError, RuntimeError):
    """The engine belongs to the parent process; this one was forked from it."""


class GpuError(TeError, RuntimeError):
    """GPU memory cannot be used: no CUDA driver or device here, or the device refused."""


class RpcError(TeError, RuntimeError):
    """An RPC send failed: the peer refused it, broke the protocol, did not prove the cluster
    secret, or could not be reached. A ``RuntimeError``, as Mooncake's ``RpcInterface`` raises."""


class RpcTimeoutError(RpcError, TimeoutError):
    """An RPC send got no answer within its timeout."""
