"""Same-host WRITE throughput of te.Engine between two processes, and the one-copy limit.

    python same_host.py engine --protocol auto|tcp --block B --count N [--seconds S]
    python same_host.py memcpy --block B --count N [--seconds S]

``engine`` starts a target process (te.Engine with the same protocol, one registered numpy
array of the working set), then WRITEs batches of ``count`` blocks of ``block`` bytes from its
own numpy array (``peer.write_many``), walking the working set (64 MiB or more, larger than the
caches) batch after batch, for ``seconds``. Every byte of the working set is then read back and
compared. ``memcpy`` copies the same blocks over the same working set within one process
(``ctypes.memmove``): the limit a single copy sets. Prints one JSON object.
"""

import argparse
import ctypes
import json
import subprocess
import sys
import time

import numpy as np

WORKING_SET = 64 << 20

TARGET = """
import sys
import numpy as np
import te

with te.Engine(protocol=sys.argv[1]) as e:
    buf = np.zeros(int(sys.argv[2]), dtype=np.uint8)
    region = e.register(buf)
    print(e.name, region.addr, flush=True)
    sys.stdin.readline()
"""


def rows(base_local, base_remote, block, count, batch):
    first = (batch * count * block) % WORKING_SET
    offsets = first + np.arange(count, dtype=np.uint64) * block
    table = np.empty((count, 3), dtype=np.uint64)
    table[:, 0] = base_local + offsets
    table[:, 1] = base_remote + offsets
    table[:, 2] = block
    return table


def engine(protocol, block, count, seconds):
    import te

    target = subprocess.Popen([sys.executable, "-c", TARGET, protocol, str(WORKING_SET)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        name, addr = target.stdout.readline().split()
        remote = int(addr)
        with te.Engine(protocol=protocol) as e:
            src = np.random.default_rng(3).integers(0, 256, WORKING_SET, dtype=np.uint8)
            region = e.register(src)
            peer = e.connect(name)
            batches = WORKING_SET // (block * count)
            tables = [rows(region.addr, remote, block, count, i) for i in range(batches)]
            for t in tables:  # every page touched once before the clock starts
                peer.write_many(t)
            moved, n, start = 0, 0, time.perf_counter()
            while time.perf_counter() - start < seconds:
                peer.write_many(tables[n % batches])
                moved += block * count
                n += 1
            elapsed = time.perf_counter() - start
            back = np.zeros(WORKING_SET, dtype=np.uint8)
            with e.register(back) as rback:
                peer.read(rback, remote, WORKING_SET)
            verified = bool((back == src).all())
            chosen = sorted(e.transports())
        return {"gb_s": moved / elapsed / 1e9, "verified": verified, "transports": chosen}
    finally:
        target.stdin.write("\n")
        target.stdin.flush()
        target.wait(30)


def memcpy(block, count, seconds):
    src = np.random.default_rng(3).integers(0, 256, WORKING_SET, dtype=np.uint8)
    dst = np.zeros(WORKING_SET, dtype=np.uint8)
    s, d = src.ctypes.data, dst.ctypes.data
    batches = WORKING_SET // (block * count)
    offsets = [[(i * count + j) * block % WORKING_SET for j in range(count)] for i in range(batches)]
    for batch in offsets:
        for off in batch:
            ctypes.memmove(d + off, s + off, block)
    moved, n, start = 0, 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for off in offsets[n % batches]:
            ctypes.memmove(d + off, s + off, block)
        moved += block * count
        n += 1
    elapsed = time.perf_counter() - start
    return {"gb_s": moved / elapsed / 1e9, "verified": bool((dst == src).all())}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["engine", "memcpy"])
    p.add_argument("--protocol", default="auto")
    p.add_argument("--block", type=int, default=64 << 10)
    p.add_argument("--count", type=int, default=64)
    p.add_argument("--seconds", type=float, default=3.0)
    a = p.parse_args()
    if a.mode == "engine":
        out = engine(a.protocol, a.block, a.count, a.seconds)
    else:
        out = memcpy(a.block, a.count, a.seconds)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
