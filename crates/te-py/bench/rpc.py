"""Mooncake's RPC communicator API (``mooncake.engine.RpcInterface``) under load, for
``cargo xtask bench rpc``: the same script runs on Mooncake's wheel and on te
(``te.mooncake.install()``), as server or client, so every pairing can be measured.

  rpc.py serve ENGINE [--no-callback] prints "port N", serves until stdin closes, then prints
                                      the receive callback's counts as JSON (with
                                      --no-callback none is set, as Mooncake's own test runs)
  rpc.py send ENGINE HOST:PORT --seconds S
                                      prints JSON: 8 threads x 1 MiB and x 4 KiB (GB/s), and
                                      one thread's 4 KiB send_data round trips (p50, p99 us)

ENGINE is ``te`` or ``mooncake``. A send returns once the server's receive callback ran, so a
round trip includes it. Every message carries its length at its end; the server checks each
one it receives, and the driver compares its counts with the client's.
"""

import json
import socket
import sys
import threading
import time

KiB, MiB = 1 << 10, 1 << 20


def engine_module(engine):
    if engine == "te":
        import te.mooncake

        te.mooncake.install()
    import mooncake.engine

    return mooncake.engine


def message(size):
    body = bytes(range(256)) * (size // 256) + bytes(size % 256)
    return body[:-8] + size.to_bytes(8, "little")


def serve(engine, callback):
    m = engine_module(engine)
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    counts = {"messages": 0, "bytes": 0, "bad": 0}
    lock = threading.Lock()

    def on_data(d):
        data = d["data"]
        ok = len(data) >= 8 and int.from_bytes(data[-8:], "little") == len(data)
        with lock:
            counts["messages"] += 1
            counts["bytes"] += len(data)
            counts["bad"] += 0 if ok else 1

    rpc = m.RpcInterface()
    assert rpc.initialize_server(f"127.0.0.1:{port}", thread_count=8)
    if callback:
        rpc.set_data_receive_callback(on_data)
    assert rpc.start_server_async()
    print(f"port {port}", flush=True)
    sys.stdin.read()
    print(json.dumps(counts), flush=True)
    rpc.stop_server()


def load(rpc, target, size, threads, seconds):
    payload = message(size)
    sent, failed = [0] * threads, [0] * threads
    end = time.perf_counter() + seconds

    def run(i):
        while time.perf_counter() < end:
            if rpc.send_data(target, payload) == 0:
                sent[i] += 1
            else:
                failed[i] += 1

    workers = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    start = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    took = time.perf_counter() - start
    return sum(sent) * size / took / 1e9, sum(sent), sum(failed)


def round_trips(rpc, target, seconds):
    payload = message(4 * KiB)
    times, failed = [], 0
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        if rpc.send_data(target, payload) != 0:
            failed += 1
        times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2] * 1e6, times[int(len(times) * 0.99)] * 1e6, len(times), failed


def send(engine, target, seconds):
    m = engine_module(engine)
    rpc = m.RpcInterface()
    assert rpc.initialize_client(pool_size=100)
    for _ in range(20):  # connections made before the clock starts
        rpc.send_data(target, message(4 * KiB))
    out = {"warmup": 20}
    # One thread's round trips first, over the one connection it has made so far.
    out["p50_us_4k"], out["p99_us_4k"], nr, fr = round_trips(rpc, target, seconds)
    out["gb_s_1m"], n1, f1 = load(rpc, target, MiB, 8, seconds)
    out["gb_s_4k"], n4, f4 = load(rpc, target, 4 * KiB, 8, seconds)
    out["messages"] = 20 + n1 + n4 + nr
    out["bytes"] = 20 * 4 * KiB + n1 * MiB + (n4 + nr) * 4 * KiB
    out["failed"] = f1 + f4 + fr
    print(json.dumps(out), flush=True)


def main():
    if sys.argv[1] == "serve":
        serve(sys.argv[2], "--no-callback" not in sys.argv)
    else:
        seconds = float(sys.argv[4].split("=")[1]) if len(sys.argv) > 4 else 3.0
        send(sys.argv[2], sys.argv[3], seconds)


if __name__ == "__main__":
    main()
