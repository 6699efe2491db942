"""One run of the NIXL benchmark: DRAM to DRAM between two agents in two processes (this one
and two_agents.py's target), one request of 64 MiB in descriptors of CHUNK bytes, prepared once
and posted ITERS times, each polled to its end as vLLM polls. Prints the throughput in GB/s.

Usage: bench.py BACKEND OP CHUNK ITERS (BACKEND TE or UCX; OP WRITE or READ). For TE,
NIXL_PLUGIN_DIR names the plugin's folder; for UCX it is unset (the wheel's own plugins).
"""

import os
import sys
import time

os.environ["NIXL_BACKEND_UNDER_TEST"] = sys.argv[1]

import two_agents as ta  # noqa: E402


def main() -> int:
    _, backend, op, chunk, iters = sys.argv
    chunk, iters = int(chunk), int(iters)
    s = ta.Session()
    h = s.a.initialize_xfer(
        op,
        s.a.get_xfer_descs(ta.descs(s.local.ctypes.data, ta.SIZE, chunk), "DRAM"),
        s.a.get_xfer_descs(ta.descs(s.target.addr, ta.SIZE, chunk), "DRAM"),
        "target",
    )
    for i in range(2 + iters):
        if i == 2:
            start = time.perf_counter()
        assert s.a.transfer(h) in ("PROC", "DONE")
        assert ta.wait_done(s.a, h) == "DONE"
    took = time.perf_counter() - start
    s.a.release_xfer_handle(h)
    s.target.ask("EXIT")
    s.target.proc.wait(timeout=30)
    print(f"RESULT {backend} {op} {chunk} {iters * ta.SIZE / took / 1e9:.4f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
