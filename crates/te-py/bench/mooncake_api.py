"""One benchmark script for Mooncake's Python API, run against te (``te.mooncake``) and against
Mooncake's own wheel (``mooncake.engine``): the same calls, the same sizes, the same machine.

    python mooncake_api.py te|mooncake [--seconds S]

It starts a target process (the same engine, over P2PHANDSHAKE on 127.0.0.1, one registered
buffer) and measures, as the initiator, over TCP loopback:

* ``transfer_sync_write`` of 4 KiB: p50 and p99 latency of single calls;
* ``transfer_sync_write`` of 1 MiB: GB/s, and the CPU the calling thread spends while it
  waits (``time.thread_time`` over wall time: a parked thread is near 0 %, a spinning one 100 %);
* ten threads each calling ``batch_transfer_sync_write`` with 32 x 64 KiB (vLLM's pattern):
  aggregate GB/s.

Every write's bytes are checked once at the end by reading them back from the target with
``transfer_sync_read``. It prints one JSON object on stdout; progress goes to stderr.
"""

import argparse
import ctypes
import json
import os
import subprocess
import sys
import threading
import time

KIB = 1 << 10
MIB = 1 << 20
THREADS = 10
BATCH = 32
BLOCK = 64 * KIB
# Each of the ten threads owns a 2 MiB slice; the single-call cases use the slice after them.
SLICE = BATCH * BLOCK
REGION = (THREADS + 2) * SLICE


def engine_class(which):
    if which == "te":
        from te.mooncake import TransferEngine
    else:
        from mooncake.engine import TransferEngine
    return TransferEngine


def started(which):
    """An initialized engine and a registered, filled buffer (kept alive with it)."""
    engine = engine_class(which)()
    rc = engine.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "")
    if rc != 0:
        sys.exit(f"initialize returned {rc}")
    buf = ctypes.create_string_buffer(REGION)
    addr = ctypes.addressof(buf)
    rc = engine.register_memory(addr, REGION)
    if rc != 0:
        sys.exit(f"register_memory returned {rc}")
    return engine, buf, addr


def target(which):
    engine, buf, addr = started(which)
    print(json.dumps({"name": f"127.0.0.1:{engine.get_rpc_port()}", "addr": addr}), flush=True)
    sys.stdin.read()  # until the initiator closes our stdin
    del engine, buf


def pattern(length, seed):
    return bytes((i * 31 + seed) & 0xFF for i in range(256)) * (length // 256)


def timed_calls(seconds, call):
    """Calls ``call()`` for ``seconds``; the latency of each call, in ns."""
    out = []
    end = time.perf_counter_ns() + int(seconds * 1e9)
    while True:
        t0 = time.perf_counter_ns()
        if call() != 0:
            sys.exit("a transfer failed")
        t1 = time.perf_counter_ns()
        out.append(t1 - t0)
        if t1 >= end:
            return out


def initiator(which, seconds):
    here = os.path.abspath(__file__)
    peer = subprocess.Popen(
        [sys.executable, here, which, "--role=target"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        info = json.loads(peer.stdout.readline())
        return measure(which, info["name"], info["addr"], seconds)
    finally:
        peer.stdin.close()
        peer.wait(timeout=30)


def measure(which, name, remote, seconds):
    engine, buf, local = started(which)
    single = local + THREADS * SLICE
    ctypes.memmove(single, pattern(MIB, 7), MIB)
    for _ in range(200):  # warm-up: the session opens, the pages are touched
        engine.transfer_sync_write(name, single, remote + THREADS * SLICE, 4 * KIB)

    lat = sorted(
        timed_calls(seconds, lambda: engine.transfer_sync_write(
            name, single, remote + THREADS * SLICE, 4 * KIB))
    )
    p50, p99 = lat[len(lat) // 2], lat[min(len(lat) - 1, len(lat) * 99 // 100)]
    print(f"{which}: 4 KiB p50 {p50 / 1e3:.1f} us, p99 {p99 / 1e3:.1f} us", file=sys.stderr)

    cpu0, wall0 = time.thread_time_ns(), time.perf_counter_ns()
    big = timed_calls(seconds, lambda: engine.transfer_sync_write(
        name, single, remote + THREADS * SLICE, MIB))
    cpu, wall = time.thread_time_ns() - cpu0, time.perf_counter_ns() - wall0
    mib_gbs = len(big) * MIB / wall
    wait_cpu = 100.0 * cpu / wall
    print(f"{which}: 1 MiB {mib_gbs:.2f} GB/s, waiting thread {wait_cpu:.0f}% of a core",
          file=sys.stderr)

    counts = [0] * THREADS
    barrier = threading.Barrier(THREADS + 1)

    def worker(t):
        base = t * SLICE
        ctypes.memmove(local + base, pattern(SLICE, t), SLICE)
        srcs = [local + base + i * BLOCK for i in range(BATCH)]
        dsts = [remote + base + i * BLOCK for i in range(BATCH)]
        lens = [BLOCK] * BATCH
        barrier.wait()
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            if engine.batch_transfer_sync_write(name, srcs, dsts, lens) != 0:
                sys.exit("a batch failed")
            counts[t] += 1

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(THREADS)]
    for th in threads:
        th.start()
    barrier.wait()
    t0 = time.perf_counter()
    for th in threads:
        th.join()
    elapsed = time.perf_counter() - t0
    ten_gbs = sum(counts) * SLICE / elapsed / 1e9
    print(f"{which}: ten threads x {BATCH} x 64 KiB {ten_gbs:.2f} GB/s", file=sys.stderr)

    # Every byte written is read back into a cleared buffer and compared.
    check = ctypes.create_string_buffer(REGION)
    check_addr = ctypes.addressof(check)
    if engine.register_memory(check_addr, REGION) != 0:
        sys.exit("registering the check buffer failed")
    if engine.transfer_sync_read(name, check_addr, remote, REGION - SLICE) != 0:
        sys.exit("reading back failed")
    for t in range(THREADS):
        if check.raw[t * SLICE:(t + 1) * SLICE] != pattern(SLICE, t):
            sys.exit(f"thread {t}'s bytes differ at the target")
    if check.raw[THREADS * SLICE:THREADS * SLICE + MIB] != pattern(MIB, 7):
        sys.exit("the single calls' bytes differ at the target")
    engine.unregister_memory(check_addr)
    return {
        "engine": which,
        "p50_us_4k": p50 / 1e3,
        "p99_us_4k": p99 / 1e3,
        "gb_s_1m": mib_gbs,
        "wait_cpu_pct": wait_cpu,
        "gb_s_ten_threads": ten_gbs,
        "verified": True,
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("engine", choices=["te", "mooncake"])
    ap.add_argument("--role", choices=["initiator", "target"], default="initiator")
    ap.add_argument("--seconds", type=float, default=3.0)
    a = ap.parse_args()
    if a.role == "target":
        target(a.engine)
    else:
        print(json.dumps(initiator(a.engine, a.seconds)), flush=True)


if __name__ == "__main__":
    main()
