"""One role of a consumer scenario (a prefill or decode instance, an LMCache server or client, a
weight seed ...), in a process of its own: it drives a Mooncake-API ``TransferEngine`` (te's
``te.mooncake`` or Mooncake's own ``mooncake.engine``) the way the consumer's code does, on
host memory, and answers one JSON command per line on stdin with one JSON line on stdout.

Runs under any CPython 3.10+ with nothing but the engine module installed (Mooncake's virtual
environment has no numpy): memory is anonymous ``mmap``, patterns come from ``random``.

Usage: ``python agent.py te|mooncake``.
"""

import asyncio
import ctypes
import json
import mmap
import queue
import random
import sys
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor

INVALID_BATCH_ID = 2**64 - 1


def pattern(seed, n):
    """The bytes a region with ``seed`` starts with (and a source region holds)."""
    return random.Random(seed).randbytes(n)


class Region:
    """Host memory of this process, page aligned, filled with ``seed``'s pattern."""

    def __init__(self, size, seed):
        self.size = size
        self.seed = seed
        self.mem = mmap.mmap(-1, max(size, 1))
        self.addr = ctypes.addressof(ctypes.c_char.from_buffer(self.mem))
        if size:
            self.mem[:size] = pattern(seed, size)

    def bytes(self):
        return self.mem[: self.size]


def engine_class(impl):
    if impl == "te":
        from te.mooncake import TransferEngine
    elif impl == "mooncake":
        from mooncake.engine import TransferEngine
    else:
        raise ValueError(f"impl {impl!r}: te or mooncake")
    return TransferEngine


class Agent:
    def __init__(self, impl):
        self.impl = impl
        self.cls = engine_class(impl)
        self.engines = {}
        self.groups = {}
        self.lock = threading.Lock()

    # -- engines and memory ------------------------------------------------------------------

    def start(self, engine="main", hostname="127.0.0.1", protocol="tcp", device=""):
        e = self.cls()
        ret = e.initialize(hostname, "P2PHANDSHAKE", protocol, device)
        if ret == 0:
            self.engines[engine] = e
            return {"ret": ret, "session": f"{hostname}:{e.get_rpc_port()}"}
        return {"ret": ret}

    def alloc(self, group, sizes, seeds):
        regions = [Region(s, seed) for s, seed in zip(sizes, seeds, strict=True)]
        self.groups[group] = regions
        return {"addrs": [r.addr for r in regions]}

    def batch_register(self, group, engine="main"):
        rs = self.groups[group]
        return {"ret": self.engines[engine].batch_register_memory([r.addr for r in rs], [r.size for r in rs])}

    def batch_unregister(self, group, engine="main"):
        rs = self.groups[group]
        return {"ret": self.engines[engine].batch_unregister_memory([r.addr for r in rs])}

    def register_each(self, group, engine="main"):
        e = self.engines[engine]
        return {"rets": [e.register_memory(r.addr, r.size) for r in self.groups[group]]}

    # -- vLLM --------------------------------------------------------------------------------

    def vllm_send(self, session, calls, workers=10):
        """vLLM's MooncakeConnector sender: asyncio tasks hand each pull message's descriptors
        to a pool of ``workers`` threads, each calling ``batch_transfer_sync_write``."""
        e = self.engines["main"]
        pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="vllm-mooncake-sender")

        def send(call):
            src, dst, lens = call
            t = time.perf_counter()
            ret = e.batch_transfer_sync_write(session, src, dst, lens)
            return ret, time.perf_counter() - t

        async def run():
            loop = asyncio.get_running_loop()
            return await asyncio.gather(*(loop.run_in_executor(pool, send, c) for c in calls))

        try:
            results = asyncio.run(run())
        finally:
            pool.shutdown()
        return {"rets": [r for r, _ in results], "seconds": [s for _, s in results]}

    def ec_push(self, session, pushes, workers=4):
        """vLLM's EC connector: each push, on one of ``workers`` IO threads, registers fresh
        source buffers (under a lock), writes them into the receiver's slab, unregisters them."""
        e = self.engines["main"]

        def push(p):
            bufs = [Region(size, seed) for size, seed in zip(p["sizes"], p["seeds"], strict=True)]
            addrs = [b.addr for b in bufs]
            with self.lock:
                reg = e.batch_register_memory(addrs, [b.size for b in bufs])
            if reg != 0:
                return {"register": reg}
            ret = e.batch_transfer_sync_write(session, addrs, p["dsts"], [b.size for b in bufs])
            with self.lock:
                unreg = e.batch_unregister_memory(addrs)
            return {"register": reg, "write": ret, "unregister": unreg}

        with ThreadPoolExecutor(max_workers=workers) as pool:
            return {"results": list(pool.map(push, pushes))}

    # -- SGLang ------------------------------------------------------------------------------

    def sglang_queues(self, chunks, queues=4, executor_workers=2):
        """SGLang's prefill transfer path: requests sharded over ``queues`` queues by the sum of
        the decode session's port, each queue drained by its own thread that runs the chunk's
        ``batch_transfer_sync_write`` on a small executor; ``ret != 0`` marks the session failed.
        """
        e = self.engines["main"]
        qs = [queue.Queue() for _ in range(queues)]
        executors = [ThreadPoolExecutor(max_workers=executor_workers) for _ in range(queues)]
        results = [None] * len(chunks)
        failed = set()

        def worker(i):
            while True:
                item = qs[i].get()
                if item is None:
                    return
                n, c = item
                fut = executors[i].submit(
                    lambda c=c: e.batch_transfer_sync_write(c["session"], c["src"], c["dst"], c["lens"])
                )
                ret = fut.result()
                results[n] = ret
                if ret != 0:
                    with self.lock:
                        failed.add(c["session"])

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(queues)]
        for t in threads:
            t.start()
        for n, c in enumerate(chunks):
            port = int(c["session"].rsplit(":", 1)[1])
            qs[port % queues].put((n, c))
        for q in qs:
            q.put(None)
        for t in threads:
            t.join()
        for x in executors:
            x.shutdown()
        return {"rets": results, "failed_sessions": sorted(failed)}

    def write(self, session, src, dst, lens):
        """One ``batch_transfer_sync_write`` call; its code and how long it took."""
        t = time.perf_counter()
        ret = self.engines["main"].batch_transfer_sync_write(session, src, dst, lens)
        return {"ret": ret, "seconds": time.perf_counter() - t}

    def read(self, session, local, remote, lens):
        """One ``batch_transfer_sync_read`` call (SGLang's weight loading checks ``< 0``)."""
        return {"ret": self.engines["main"].batch_transfer_sync_read(session, local, remote, lens)}

    def probe(self, session):
        return {"ret": self.engines["main"].send_probe(session)}

    # -- LMCache -----------------------------------------------------------------------------

    def lmcache_reads(self, session, reads, engine="main", deadline=10.0):
        """LMCache's Mooncake channel: ``batch_transfer_async_read`` per read, its id checked as
        LMCache checks it, then ``transfer_check_status`` polled by one prefetch thread against a
        deadline (0 pending, 1 done, -1 failed, -2 timed out; anything else is an error)."""
        e = self.engines[engine]
        ids, submit_errors = [], []
        for local, remote, lens in reads:
            bid = e.batch_transfer_async_read(session, local, remote, lens)
            if bid == 0 or bid == INVALID_BATCH_ID:
                submit_errors.append(f"failed submit: {bid}")
            elif bid < 0 or bid >= 1 << 63:
                submit_errors.append(f"invalid batch id {bid}")
            ids.append(bid)
        statuses = {}

        def prefetch():
            pending = [b for b in ids if 0 < b < 1 << 63]
            end = time.monotonic() + deadline
            while pending and time.monotonic() < end:
                for b in list(pending):
                    s = e.transfer_check_status(b)
                    if s == 0:
                        continue
                    statuses[b] = s
                    pending.remove(b)
                time.sleep(0.0005)
            for b in pending:
                statuses[b] = "deadline"

        t = threading.Thread(target=prefetch, name="lmcache-prefetch")
        t.start()
        t.join()
        return {
            "ids": ids,
            "submit_errors": submit_errors,
            "statuses": [statuses.get(b) for b in ids],
        }

    def page_writes(self, session, pages):
        """LMCache's other channel: one ``transfer_sync_write`` per page (``< 0`` raises)."""
        e = self.engines["main"]
        return {"rets": [e.transfer_sync_write(session, s, d, n) for s, d, n in pages]}

    # -- checks ------------------------------------------------------------------------------

    def verify(self, group, writes):
        """Compares every byte of every region of ``group`` with what it should hold: its own
        pattern, with each of ``writes`` ([region, offset, source seed, source size, source
        offset, length]) copied in. Mismatches: [region, first bad offset, bad bytes]."""
        regions = self.groups[group]
        expected = [bytearray(pattern(r.seed, r.size)) for r in regions]
        sources = {}
        for region, off, seed, size, src_off, n in writes:
            if (seed, size) not in sources:
                sources[(seed, size)] = pattern(seed, size)
            expected[region][off : off + n] = sources[(seed, size)][src_off : src_off + n]
        bad = []
        for i, (r, want) in enumerate(zip(regions, expected)):
            got = r.bytes()
            if got != bytes(want):
                diffs = [k for k in range(r.size) if got[k] != want[k]]
                bad.append([i, diffs[0], len(diffs)])
        return {"mismatches": bad, "regions": len(regions)}


def main():
    agent = Agent(sys.argv[1])
    out = sys.stdout
    sys.stdout = sys.stderr  # anything else printed goes to the log, not the answers
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd.pop("op")
        if op == "exit":
            break
        try:
            answer = getattr(agent, op)(**cmd)
        except Exception as exc:  # reported to the driver, which fails the scenario
            answer = {"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()}
        out.write(json.dumps(answer) + "\n")
        out.flush()
    out.write(json.dumps({"bye": True}) + "\n")
    out.flush()


if __name__ == "__main__":
    main()
