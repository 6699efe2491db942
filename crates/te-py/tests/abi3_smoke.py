"""Run by `cargo xtask ci` with every CPython it finds (3.10 to 3.13), each in its own virtual
environment with the one abi3 wheel installed: te imports, two te.Engine moves bytes (compared),
and te.mooncake starts an engine. Needs nothing but the wheel (no numpy)."""

import sys

import te
import te.mooncake

data = bytes(range(256)) * 4096
with te.Engine() as a, te.Engine() as b:
    src, dst = bytearray(data), bytearray(len(data))
    ra, rb = a.register(src), b.register(dst)
    a.connect(b.name).write(ra, rb.addr)
    assert dst == src, "the bytes differ"
e = te.mooncake.TransferEngine()
assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
assert e.get_rpc_port() > 0
e.close()
print(f"abi3 wheel OK on Python {sys.version.split()[0]}")
