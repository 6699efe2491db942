"""te, a transfer engine: moves bytes between registered memory on many machines.

``te.mooncake`` is a drop-in for Mooncake's ``mooncake.engine`` module: change
``from mooncake.engine import TransferEngine`` to ``from te.mooncake import TransferEngine``,
or call ``te.mooncake.install()`` before the program imports ``mooncake.engine``.
"""

from ._native import __version__

__all__ = ["__version__"]
