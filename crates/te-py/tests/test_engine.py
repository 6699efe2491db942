"""te.Engine, te's Pythonic API: real engines on loopback TCP, bytes compared."""

import array
import asyncio
import ctypes
import logging
import mmap
import os
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import te

MiB = 1 << 20


def pattern(n, seed):
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


@pytest.fixture(params=["classic", "tent"])
def pair(request):
    """Two engines (te's classic engine, or its TENT runtime), a registered pattern on the
    first and zeros on the second, and the second as the first's peer."""
    with te.Engine(backend=request.param) as a, te.Engine(backend=request.param) as b:
        src = pattern(4 * MiB, 1)
        dst = np.zeros(4 * MiB, dtype=np.uint8)
        ra, rb = a.register(src), b.register(dst)
        yield a, b, src, dst, ra, rb, a.connect(b.name)


def test_construction_works_or_raises():
    with te.Engine() as e:
        host, port = e.name.rsplit(":", 1)
        assert host == "127.0.0.1" and 0 < int(port) < 65536
    with pytest.raises(te.TeError) as err:
        te.Engine(metadata="nosuchscheme://nowhere")
    assert err.value.code < 0
    with pytest.raises(ValueError):
        te.Engine(backend="nosuch")


def test_close_releases_the_port_and_later_calls_raise():
    with te.Engine() as watcher:
        e = te.Engine()
        name = e.name
        assert watcher.connect(name).probe()
        region = e.register(bytearray(4096))
        e.close()
        e.close()  # idempotent
        assert e.closed and not region.registered
        region.unregister()  # a no-op after close
        with pytest.raises(te.ClosedError) as err:
            e.register(bytearray(16))
        assert err.value.code == -1
        with pytest.raises(te.ClosedError):
            e.connect(watcher.name)
        # The handshake port is released: nothing answers there any more.
        assert not watcher._native().probe(name)


def test_write_read_offsets_and_lengths_land_every_byte(pair):
    a, b, src, dst, ra, rb, peer = pair
    peer.write(ra, rb.addr)
    assert np.array_equal(dst, src)
    dst[:] = 0
    peer.write(ra, rb.addr + 100, 5000, offset=17)
    assert np.array_equal(dst[100:5100], src[17:5017])
    assert not dst[:100].any() and not dst[5100:].any()
    back = np.zeros(8192, dtype=np.uint8)
    with a.register(back) as rback:
        peer.read(rback, rb.addr + 100, 5000, offset=3)
        assert np.array_equal(back[3:5003], src[17:5017])
    assert not rback.registered
    # A raw address on the local side needs a length.
    peer.write(ra.addr + 10, rb.addr, 10)
    assert np.array_equal(dst[:10], src[10:20])
    with pytest.raises(TypeError):
        peer.write(ra.addr, rb.addr)


@pytest.mark.parametrize("backend", ["classic", "tent"])
def test_nic_load_stats_name_each_rail_and_its_bandwidth(backend):
    # Rails are the network's: over TCP (protocol="auto" would move these same-host bytes by
    # cross-memory attach, through no NIC).
    a = te.Engine(protocol="tcp", backend=backend)
    b = te.Engine(protocol="tcp", backend=backend)
    src, dst = pattern(4 * MiB, 1), np.zeros(4 * MiB, dtype=np.uint8)
    ra, rb = a.register(src), b.register(dst)
    peer = a.connect(b.name)
    rails = a.nic_load_stats()
    assert rails, "an engine has at least one rail"
    for s in rails:
        assert set(s) == {"device_name", "inflight_bytes", "ewma_bandwidth_bps"}
        assert isinstance(s["device_name"], str) and s["device_name"]
    # Bandwidth is sampled over at least 10 ms of completions: write until a sample is in.
    deadline = time.monotonic() + 10
    while not any(s["ewma_bandwidth_bps"] > 0 for s in a.nic_load_stats()):
        assert time.monotonic() < deadline, a.nic_load_stats()
        peer.write(ra, rb.addr)
    assert np.array_equal(dst, src)
    after = a.nic_load_stats()
    assert [s["device_name"] for s in after] == [s["device_name"] for s in rails]
    # The calls returned: nothing of theirs is in flight.
    assert all(s["inflight_bytes"] == 0 for s in after), after
    a.close()
    b.close()
    with pytest.raises(te.ClosedError):
        a.nic_load_stats()


def test_many_from_a_numpy_table_and_from_triples(pair):
    a, b, src, dst, ra, rb, peer = pair
    rows = np.array(
        [[ra.addr + i * 4096, rb.addr + (63 - i) * 4096, 4096] for i in range(64)],
        dtype=np.uint64,
    )
    peer.write_many(rows)
    for i in range(64):
        assert np.array_equal(dst[(63 - i) * 4096 : (64 - i) * 4096], src[i * 4096 : (i + 1) * 4096])
    back = np.zeros(64 * 4096, dtype=np.uint8)
    rback = a.register(back)
    peer.read_many([(rback.addr + i * 4096, rb.addr + i * 4096, 4096) for i in range(64)])
    assert np.array_equal(back, dst[: 64 * 4096])
    for bad in (
        np.zeros((4, 2), dtype=np.uint64),
        np.zeros((4, 3), dtype=np.int32),
        np.zeros((3, 4), dtype=np.uint64).T,
    ):
        with pytest.raises(te.InvalidArgumentError):
            peer.write_many(bad)
    with pytest.raises(te.InvalidArgumentError):
        peer.write_many([])


def test_registration_of_every_kind_of_memory(pair):
    a, b, src, dst, ra, rb, peer = pair
    kinds = {
        "bytearray": bytearray(8192),
        "mmap": mmap.mmap(-1, 8192),
        "array": array.array("B", bytes(8192)),
        "memoryview": memoryview(bytearray(8192)),
        "numpy": np.zeros(8192, dtype=np.uint8),
        "ctypes": ctypes.create_string_buffer(8192),
    }
    for kind, obj in kinds.items():
        region = b.register(obj)
        assert len(region) == 8192 and not region.read_only, kind
        peer.write(ra, region.addr, 8192, offset=len(kind))
        assert bytes(memoryview(obj)) == src[len(kind) : len(kind) + 8192].tobytes(), kind
        region.unregister()
    raw = ctypes.create_string_buffer(4096)
    region = b.register((ctypes.addressof(raw), 4096))
    peer.write(ra, region.addr, 4096)
    assert raw.raw == src[:4096].tobytes()
    region.unregister()


def test_dlpack_tensors_register_by_their_capsule(pair):
    a, b, src, dst, ra, rb, peer = pair

    class OnlyDlpack:
        """A tensor that offers DLPack and nothing else (as torch's does, for this path)."""

        def __init__(self, array):
            self.array = array

        def __dlpack__(self, **kw):
            return self.array.__dlpack__(**kw)

        def __dlpack_device__(self):
            return self.array.__dlpack_device__()

    t = np.zeros((64, 32), dtype=np.float32)
    region = b.register(OnlyDlpack(t))
    assert region.length == t.nbytes and region.addr == t.ctypes.data
    peer.write(ra, region.addr, t.nbytes)
    assert t.tobytes() == src[: t.nbytes].tobytes()
    region.unregister()
    with pytest.raises(te.InvalidArgumentError, match="not contiguous"):
        b.register(OnlyDlpack(np.zeros((64, 32), dtype=np.float32)[:, ::2]))
    with pytest.raises(TypeError, match="capsule"):
        te._native.dlpack_range(object())
    with pytest.raises(TypeError):
        b.register(object())


def test_read_only_memory_can_be_read_and_not_written(pair):
    a, b, src, dst, ra, rb, peer = pair
    frozen = pattern(8192, 5)
    frozen.flags.writeable = False
    rf = b.register(frozen)
    assert rf.read_only
    data = b.register(b"\x07" * 4096)
    assert data.read_only
    back = np.zeros(8192, dtype=np.uint8)
    rback = a.register(back)
    peer.read(rback, rf.addr, 8192)
    assert np.array_equal(back, frozen)
    peer.read(rback, data.addr, 4096)
    assert back[:4096].tobytes() == b"\x07" * 4096
    with pytest.raises(te.TeError):
        peer.write(ra, rf.addr, 4096)
    assert np.array_equal(frozen, pattern(8192, 5))
    with pytest.raises(TypeError, match="read-only"):
        b.register(memoryview(b"abc").toreadonly())


def test_a_registered_buffer_cannot_be_resized_or_closed():
    with te.Engine() as e:
        buf = bytearray(4096)
        m = mmap.mmap(-1, 4096)
        rbuf, rm = e.register(buf), e.register(m)
        with pytest.raises(BufferError):
            buf.extend(b"x")
        with pytest.raises(BufferError):
            m.close()
        rbuf.unregister()
        rm.unregister()
        buf.extend(b"x")
        m.close()


def test_errors_carry_mooncakes_codes(pair):
    a, b, src, dst, ra, rb, peer = pair
    with pytest.raises(te.OverlapError) as err:
        b.register((rb.addr + 10, 100))
    assert err.value.code == -7
    with pytest.raises(te.NotRegisteredError) as err:
        peer.write(ra, rb.addr + 4 * MiB - 10, 100)
    assert err.value.code == -3
    unregistered = np.zeros(4096, dtype=np.uint8)
    with pytest.raises(te.NotRegisteredError):
        peer.write(unregistered.ctypes.data, rb.addr, 4096)
    with pytest.raises(te.InvalidArgumentError):
        peer.write(ra, rb.addr, 0)
    with pytest.raises(te.InvalidArgumentError):
        peer.write(ra, rb.addr, 10, offset=4 * MiB)
    for bad in (-1, 2**64, 2**70):
        with pytest.raises(te.InvalidArgumentError):
            peer.write(ra, bad, 10)
    for bad in ("0x10", 1.5, None, [1]):
        with pytest.raises(TypeError):
            peer.write(ra, bad, 10)
    with pytest.raises(te.PeerError):
        a.connect("127.0.0.1:1")
    with pytest.raises(TypeError):
        a.connect(1234)
    assert isinstance(err.value, te.TeError) and isinstance(err.value, ValueError)


def test_async_transfers_wait_cancel_and_await(pair):
    a, b, src, dst, ra, rb, peer = pair
    t = peer.write_async(ra, rb.addr, MiB)
    assert t.wait(30) is True
    assert t.done() and t.result() is None
    assert t.cancel() is False
    assert np.array_equal(dst[:MiB], src[:MiB])
    ts = [peer.write_async(ra, rb.addr + i * 4096, 4096, offset=i * 4096) for i in range(100)]
    for t in ts:
        t.result(30)
    assert np.array_equal(dst[: 100 * 4096], src[: 100 * 4096])
    big = peer.write_many_async(
        np.array([[ra.addr, rb.addr, 4 * MiB]] * 64, dtype=np.uint64)
    )
    big.cancel()
    try:
        big.wait(60)
    except te.CanceledError as e:
        assert e.code < 0
    assert big.done()
    dst[:] = 0

    async def gather():
        await asyncio.gather(
            *(peer.write_async(ra, rb.addr + i * MiB, MiB, offset=i * MiB) for i in range(4))
        )

    asyncio.run(gather())
    assert np.array_equal(dst, src)
    # A handle let go of without waiting is freed later; the engine goes on.
    for _ in range(20):
        peer.write_async(ra, rb.addr, 4096)
    peer.write(ra, rb.addr, 4096)


def test_refusals_known_at_submission_raise_at_once(pair):
    a, b, src, dst, ra, rb, peer = pair
    frozen = b.register(b"\x01" * 4096)
    with pytest.raises(te.AccessDeniedError) as err:
        peer.write_async(ra, frozen.addr, 4096)
    assert err.value.code == -3 and isinstance(err.value, PermissionError)
    with pytest.raises(te.NotRegisteredError):
        peer.read_async(ra, rb.addr + 4 * MiB, 1)
    t = peer.read_async(ra, frozen.addr, 4096)
    assert t.wait(30)
    assert bytes(memoryview(src)[:4096]) == b"\x01" * 4096


def test_notifications_without_and_after_data(pair):
    a, b, src, dst, ra, rb, peer = pair
    peer.notify("hello")
    peer.notify("named", name="prefill-0")
    got = b.notifications(timeout=10)
    while len(got) < 2:
        got += b.notifications(timeout=10)
    assert got == [te.Notification(a.name, "hello"), te.Notification("prefill-0", "named")]
    # The name is the sender's word; the connection it came on is te's.
    for n in got:
        host, port = n.sender.rsplit(":", 1)
        assert host == "127.0.0.1" and int(port) > 0 and n.authenticated is False
    assert te.Notification("x", "y").sender is None
    assert b.notifications() == []
    assert b.notifications(timeout=0.05) == []
    peer.write(ra, rb.addr, MiB, notify=("kv", "layer-7"))
    seen = next(b.iter_notifications(timeout=10))
    assert seen == te.Notification("kv", "layer-7")
    assert np.array_equal(dst[:MiB], src[:MiB])
    assert list(b.iter_notifications(timeout=0.1)) == []


def test_the_gil_is_released_during_transfers(pair):
    a, b, src, dst, ra, rb, peer = pair
    count = [0]
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            count[0] += 1

    th = threading.Thread(target=spin)
    th.start()
    try:
        before = count[0]
        for _ in range(20):
            peer.write(ra, rb.addr)
        during = count[0] - before
    finally:
        stop.set()
        th.join()
    assert during > 1000, f"a Python thread ran only {during} times during 80 MiB of writes"


def test_rust_logs_reach_python_logging():
    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record)

    handler = Keep()
    logger = logging.getLogger("te")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        assert te.set_log_level(logging.INFO)
        with te.Engine():
            pass
        deadline = time.time() + 10
        while time.time() < deadline and not any("engine started" in r.getMessage() for r in records):
            time.sleep(0.05)
        started = [r for r in records if "engine started" in r.getMessage()]
        assert started and started[0].name == "te.te_core" and started[0].levelno == logging.INFO
    finally:
        te.set_log_level(logging.WARNING)
        logger.removeHandler(handler)
        logger.setLevel(logging.NOTSET)


def test_calls_after_fork_raise_in_the_child(pair):
    a, b, src, dst, ra, rb, peer = pair
    pid = os.fork()
    if pid == 0:
        code = 3
        try:
            peer.write(ra, rb.addr, 16)
        except te.ForkedError:
            code = 0
        except BaseException:  # noqa: BLE001
            code = 2
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0
    peer.write(ra, rb.addr, 16)  # the parent's engine is untouched


def test_gpu_memory_without_a_gpu_is_a_clear_error():
    class FakeCuda:
        __cuda_array_interface__ = {
            "data": (0x7F0000000000, False),
            "shape": (1024,),
            "typestr": "<f4",
            "version": 3,
        }

    with te.Engine() as e:
        with pytest.raises(te.GpuError, match="CUDA") as err:
            e.register(FakeCuda())
        assert err.value.code == -8


TARGET = textwrap.dedent(
    """
    import sys, numpy as np, te
    e = te.Engine()
    buf = np.zeros(int(sys.argv[1]), dtype=np.uint8)
    r = e.register(buf)
    print(e.name, r.addr, flush=True)
    sys.stdin.readline()
    print(int(buf.astype(np.uint64).sum()), flush=True)
    """
)


def test_a_peer_in_another_process_and_one_that_exits_mid_transfer():
    size = 32 * MiB
    # Over TCP: cross-memory attach (protocol="auto") would finish the 50 writes before the kill.
    with te.Engine(protocol="tcp") as a:
        src = pattern(size, 3)
        ra = a.register(src)
        p = subprocess.Popen(
            [sys.executable, "-c", TARGET, str(size)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )
        try:
            name, addr = p.stdout.readline().split()
            peer = a.connect(name)
            peer.write(ra, int(addr))
            p.stdin.write("\n")
            p.stdin.flush()
            assert int(p.stdout.readline()) == int(src.astype(np.uint64).sum())
            transfers = [peer.write_async(ra, int(addr)) for _ in range(50)]
            p.kill()
            p.wait()
            failed = 0
            for t in transfers:
                try:
                    t.result(120)
                except te.TeError:
                    failed += 1
            assert failed > 0, "every write to a killed peer completed"
        finally:
            p.kill()
            p.wait()
        with te.Engine() as c:
            dst = np.zeros(MiB, dtype=np.uint8)
            rc = c.register(dst)
            a.connect(c.name).write(ra, rc.addr, MiB)
            assert np.array_equal(dst, src[:MiB])


def test_the_docs_python_examples_run():
    root = os.path.join(os.path.dirname(__file__), "..", "..", "..")
    runnable = []
    for doc in ("README.md", os.path.join("docs", "python.md")):
        with open(os.path.join(root, doc), encoding="utf-8") as f:
            text = f.read()
        blocks = [b.split("```", 1)[0] for b in text.split("```python\n")[1:]]
        runnable += [(doc, b) for b in blocks if "te.Engine()" in b or "a, b = TransferEngine()" in b]
    docs = {doc for doc, _ in runnable}
    assert "README.md" in docs, "the README's te.Engine example"
    assert any("TransferEngine()" in b for _, b in runnable), "docs/python.md's te.mooncake example"
    for doc, block in runnable:
        exec(compile(block, doc, "exec"), {})


def test_metrics_count_what_moved_by_transport_and_operation():
    """Engine.metrics(): TENT's totals and per-series figures of the engine's requests, counted
    while switched on (metrics=True), nothing while off."""
    with te.Engine(protocol="tcp", metrics=True) as a, te.Engine(protocol="tcp") as b:
        src = np.arange(1 << 20, dtype=np.uint8)
        dst = np.zeros(1 << 20, dtype=np.uint8)
        ra, rb = a.register(src), b.register(dst)
        peer = a.connect(b.name)
        peer.write(ra, rb.addr)
        peer.read(ra, rb.addr, 4096)
        m = a.metrics()
        assert m["tent_write_bytes_total"] == 1 << 20
        assert m["tent_write_requests_total"] == 1
        assert m["tent_read_bytes_total"] == 4096
        assert m["tent_write_failures_total"] == 0
        (write,) = [s for s in m["series"] if s["operation"] == "write"]
        assert write["transport"] == "tcp" and write["latency_us"]["count"] == 1
        assert write["size_bytes"]["sum"] == 1 << 20
        assert b.metrics()["tent_write_requests_total"] == 0, "b counted nothing: off"


def test_the_tent_backend_counts_requests_and_their_attempts():
    """With backend="tent" a request is counted once, on its final transport, by TENT's runtime;
    te-core counts the attempt that carried it. Private numpy memory on this host is planned
    straight to TCP (shared memory cannot reach it): one attempt, no failover."""
    with te.Engine(backend="tent", protocol="tcp", metrics=True) as a, \
            te.Engine(backend="tent", protocol="tcp") as b:
        src = np.arange(1 << 20, dtype=np.uint8)
        dst = np.zeros(1 << 20, dtype=np.uint8)
        ra, rb = a.register(src), b.register(dst)
        a.connect(b.name).write(ra, rb.addr)
        assert (dst == src).all()
        m = a.metrics()
        assert m["tent_write_requests_total"] == 1
        assert m["tent_write_bytes_total"] == 1 << 20
        (write,) = [s for s in m["series"] if s["operation"] == "write"]
        assert write["transport"] == "tcp"
        assert (write["requests"], write["attempts"], write["attempt_failures"]) == (1, 1, 0)
        assert write["stage_transport_us"]["count"] == 1
        assert write["stage_queue_wait_us"]["count"] == 1
        assert m["failovers"] == []
