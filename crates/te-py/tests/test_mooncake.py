"""te.mooncake.TransferEngine as Mooncake's consumers drive it: real engines over loopback TCP,
P2PHANDSHAKE, bytes compared after every transfer, Mooncake's return codes checked."""

import ctypes
import mmap
import os
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import te.mooncake as mc

MiB = 1 << 20


class Buffer:
    """Host memory with a stable address, filled with a seed's pattern."""

    def __init__(self, size, seed=0):
        self.array = np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8)
        self.addr = self.array.ctypes.data
        self.size = size

    def bytes(self, off=0, n=None):
        n = self.size - off if n is None else n
        return self.array[off : off + n].tobytes()


def engine(size=8 * MiB, seed=0):
    e = mc.TransferEngine()
    assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    buf = Buffer(size, seed)
    assert e.register_memory(buf.addr, buf.size) == 0
    return e, buf, f"127.0.0.1:{e.get_rpc_port()}"


def free_port_name():
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"127.0.0.1:{port}"


def test_the_module_has_mooncakes_shape():
    assert mc.TransferOpcode.Read == 0 and mc.TransferOpcode.Write == 1
    assert mc.Read is mc.TransferOpcode.Read and mc.Write == 1
    assert mc.TransferEngine.TransferOpcode is mc.TransferOpcode
    n = mc.TransferNotify("a", "b")
    assert (n.name, n.msg) == ("a", "b")
    assert mc.TransferNotify().name == ""
    assert mc.SUPPORT_CUDA is False
    # Positional-only as in pybind: keyword names are refused.
    with pytest.raises(TypeError):
        mc.TransferEngine().initialize(local_hostname="127.0.0.1", metadata_server="P2PHANDSHAKE", protocol="tcp", device_name="")


def test_calls_before_initialize_return_codes_not_crashes():
    e = mc.TransferEngine()
    assert e.get_rpc_port() == -1
    assert e.register_memory(0x1000, 4096) == -1
    assert e.transfer_sync_write("127.0.0.1:1", 1, 2, 3) == -1
    assert e.batch_transfer_async_write("127.0.0.1:1", [1], [2], [3]) == 0
    assert e.transfer_check_status(5) == -1
    assert e.get_batch_transfer_status([5]) == -1
    assert e.get_notifies() == []
    assert e.allocate_managed_buffer(4096) == 0
    assert e.nic_load_stats() == []


def test_p2p_session_names_ignore_the_given_port():
    e = mc.TransferEngine()
    assert e.initialize("127.0.0.1:12345", "P2PHANDSHAKE", "tcp", "") == 0
    assert e.get_rpc_port() not in (12345, -1)
    e.close()


def test_sync_writes_and_reads_land_every_byte():
    a, abuf, _ = engine(seed=1)
    b, bbuf, peer = engine(seed=2)
    assert a.transfer_sync_write(peer, abuf.addr, bbuf.addr + 100, MiB) == 0
    assert bbuf.bytes(100, MiB) == abuf.bytes(0, MiB)
    assert a.transfer_sync_read(peer, abuf.addr + 2 * MiB, bbuf.addr + 4 * MiB, MiB) == 0
    assert abuf.bytes(2 * MiB, MiB) == bbuf.bytes(4 * MiB, MiB)
    srcs = [abuf.addr + i * 65536 for i in range(16)]
    dsts = [bbuf.addr + 6 * MiB + i * 65536 for i in range(16)]
    assert a.batch_transfer_sync_write(peer, srcs, dsts, [65536] * 16) == 0
    assert bbuf.bytes(6 * MiB, MiB) == abuf.bytes(0, MiB)
    assert a.batch_transfer_sync(peer, srcs[:2], dsts[:2], [4096, 4096], mc.TransferOpcode.Read) == 0
    assert a.transfer_sync(peer, abuf.addr, bbuf.addr, 4096, mc.Write) == 0
    assert bbuf.bytes(0, 4096) == abuf.bytes(0, 4096)
    # te's addition, as the C API's getNicLoadStats: every rail, nothing left in flight.
    rails = a.nic_load_stats()
    assert rails and all(isinstance(s["device_name"], str) for s in rails)
    assert all(s["inflight_bytes"] == 0 and s["ewma_bandwidth_bps"] >= 0 for s in rails), rails


def test_every_return_code_of_the_reference():
    a, abuf, _ = engine(seed=3)
    b, bbuf, peer = engine(seed=4)
    assert a.register_memory(abuf.addr + 4096, 4096) == -7  # overlap
    assert a.register_memory(abuf.addr, abuf.size) == -7  # the same range again
    assert a.unregister_memory(abuf.addr + 1) == -3  # not registered
    assert a.batch_transfer_sync_write(peer, [abuf.addr], [bbuf.addr, bbuf.addr], [8]) == -1
    assert a.batch_register_memory([1, 2], [1]) == -1
    nobody = free_port_name()
    assert a.transfer_sync_write(nobody, abuf.addr, 0, 8) == -1
    assert a.batch_transfer_async_write(nobody, [abuf.addr], [0], [8]) == 0
    assert a.transfer_submit_write(nobody, abuf.addr, 0, 8) == 0
    assert a.transfer_sync_write(peer, 8, bbuf.addr, 8) == -1  # local range not registered
    assert a.transfer_sync_write(peer, abuf.addr, bbuf.addr + bbuf.size - 4, 8) == -1
    assert bbuf.bytes(bbuf.size - 4) == Buffer(bbuf.size, 4).bytes(bbuf.size - 4)
    # Async: ids are checked.
    bid = a.batch_transfer_async_write(peer, [abuf.addr], [bbuf.addr], [MiB])
    assert bid != 0
    assert a.get_batch_transfer_status([bid]) == 0
    assert a.get_batch_transfer_status([bid]) == -1  # freed
    assert a.transfer_check_status(bid) == -1
    assert a.transfer_check_status(0xDEADBEEF) == -1  # made up
    tid = a.transfer_submit_write(peer, abuf.addr, bbuf.addr + MiB, MiB)
    while (st := a.transfer_check_status(tid)) == 0:
        time.sleep(0.001)
    assert st == 1
    assert bbuf.bytes(0, 2 * MiB) == abuf.bytes(0, MiB) * 2
    assert a.send_probe(peer) == 0
    assert a.send_probe(nobody) != 0
    assert a.get_first_buffer_address(peer) == bbuf.addr
    assert a.get_first_buffer_address(nobody) == 0
    assert a.unregister_memory(abuf.addr) == 0
    assert a.unregister_memory(abuf.addr) == -3
    # And it still serves.
    assert b.transfer_sync_read(f"127.0.0.1:{a.get_rpc_port()}", bbuf.addr, abuf.addr, 8) == -1
    assert a.register_memory(abuf.addr, abuf.size) == 0
    assert b.transfer_sync_read(f"127.0.0.1:{a.get_rpc_port()}", bbuf.addr, abuf.addr, 8) == 0


@pytest.mark.parametrize(
    "bad",
    [-1, 2**64, 2**70, "0x1000", 1.5, None, b"\x00", [1]],
)
def test_bad_addresses_raise_type_error(bad):
    a, abuf, peer = engine()
    with pytest.raises(TypeError):
        a.register_memory(bad, 4096)
    with pytest.raises(TypeError):
        a.transfer_sync_write(peer, bad, abuf.addr, 8)
    with pytest.raises(TypeError):
        a.batch_transfer_sync_write(peer, [bad], [abuf.addr], [8])
    with pytest.raises(TypeError):
        a.transfer_check_status(bad)
    # The engine keeps working after the refusals (a write to itself).
    assert a.transfer_sync_write(peer, abuf.addr, abuf.addr + MiB, 4096) == 0
    assert abuf.bytes(MiB, 4096) == abuf.bytes(0, 4096)


def test_wrong_types_of_lists_and_opcodes():
    a, abuf, peer = engine()
    with pytest.raises(TypeError):
        a.batch_transfer_sync_write(peer, "abc", [1], [1])
    with pytest.raises(TypeError):
        a.batch_transfer_sync_write(peer, 5, [1], [1])
    with pytest.raises(ValueError):
        a.transfer_sync(peer, abuf.addr, abuf.addr, 8, 7)
    with pytest.raises(TypeError):
        a.initialize(1, 2, 3, 4)


def test_closed_engine_and_double_close():
    a, abuf, peer = engine()
    a.close()
    a.close()
    assert a.get_rpc_port() == -1
    assert a.transfer_sync_write(peer, abuf.addr, abuf.addr, 8) == -1
    assert a.register_memory(abuf.addr, 8) == -1
    # A closed engine can be initialized again.
    assert a.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    assert a.get_rpc_port() > 0


def test_calls_after_fork_are_an_error_in_the_child():
    a, abuf, peer = engine()
    pid = os.fork()
    if pid == 0:
        ok = a.get_rpc_port() == -1 and a.transfer_sync_write(peer, abuf.addr, abuf.addr, 8) == -1
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0
    assert a.get_rpc_port() > 0


def test_ten_threads_to_one_and_to_several_peers():
    a, abuf, _ = engine(16 * MiB, seed=5)
    peers = [engine(16 * MiB, seed=10 + i) for i in range(3)]
    errors = []

    def worker(t):
        b, bbuf, peer = peers[t % 3] if t >= 4 else peers[0]
        base = t * MiB
        for _ in range(5):
            srcs = [abuf.addr + base + i * 65536 for i in range(16)]
            dsts = [bbuf.addr + base + i * 65536 for i in range(16)]
            if a.batch_transfer_sync_write(peer, srcs, dsts, [65536] * 16) != 0:
                errors.append(t)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    for t in range(10):
        _, bbuf, _ = peers[t % 3] if t >= 4 else peers[0]
        assert bbuf.bytes(t * MiB, MiB) == abuf.bytes(t * MiB, MiB), f"thread {t}"


def test_the_gil_is_released_while_transfers_run():
    a, abuf, _ = engine(64 * MiB)
    b, bbuf, peer = engine(64 * MiB)
    # How fast this thread counts with the GIL to itself.
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < 0.2:
        n += 1
    rate = n / 0.2
    inside = threading.Event()
    done = threading.Event()

    def transfer():
        inside.set()
        for _ in range(10):
            assert a.transfer_sync_write(peer, abuf.addr, bbuf.addr, 64 * MiB) == 0
        done.set()

    t = threading.Thread(target=transfer)
    t.start()
    inside.wait()
    counted, start = 0, time.perf_counter()
    while not done.is_set():
        counted += 1
    elapsed = time.perf_counter() - start
    t.join()
    # With the GIL held through each call this thread would count only between calls.
    assert counted > 0.3 * rate * elapsed, (counted, rate, elapsed)


def test_registration_of_numpy_bytearray_and_mmap():
    a, _, _ = engine()
    b, bbuf, peer = engine(seed=6)
    arr = np.zeros(MiB, dtype=np.uint8)
    ba = bytearray(MiB)
    mm = mmap.mmap(-1, MiB)
    ba_addr = ctypes.addressof(ctypes.c_char.from_buffer(ba))
    mm_addr = ctypes.addressof(ctypes.c_char.from_buffer(mm))
    assert a.batch_register_memory([arr.ctypes.data, ba_addr, mm_addr], [MiB] * 3) == 0
    assert a.batch_transfer_sync_read(peer, [arr.ctypes.data, ba_addr, mm_addr], [bbuf.addr] * 3, [MiB] * 3) == 0
    want = bbuf.bytes(0, MiB)
    assert arr.tobytes() == want and bytes(ba) == want and mm[:] == want
    assert a.batch_unregister_memory([arr.ctypes.data, ba_addr, mm_addr]) == 0


def test_notifications_arrive_after_their_data():
    a, abuf, _ = engine(seed=7)
    b, bbuf, peer = engine(seed=8)
    note = mc.TransferNotify("from-a", "hello")
    assert a.transfer_sync(peer, abuf.addr, bbuf.addr, 4096, mc.Write, note) == 0
    assert a.batch_transfer_sync(peer, [abuf.addr], [bbuf.addr], [8], mc.Write, mc.TransferNotify("from-a", "two")) == 0
    got = []
    deadline = time.time() + 10
    while len(got) < 2 and time.time() < deadline:
        got += b.get_notifies()
        time.sleep(0.005)
    assert sorted(n.msg for n in got) == ["hello", "two"]
    assert all(n.name == "from-a" for n in got)
    assert bbuf.bytes(0, 4096) == abuf.bytes(0, 4096)


def test_managed_buffers_and_byte_helpers():
    a, _, _ = engine()
    b, bbuf, peer = engine()
    x = a.allocate_managed_buffer(65536)
    assert x != 0
    assert a.write_bytes_to_buffer(x, b"kv-cache", 8) == 0
    assert a.read_bytes_from_buffer(x, 8) == b"kv-cache"
    assert b.transfer_sync_read(f"127.0.0.1:{a.get_rpc_port()}", bbuf.addr, x, 8) == 0
    assert bbuf.bytes(0, 8) == b"kv-cache"
    assert a.write_bytes_to_buffer(8, b"x", 1) == -3  # not registered memory
    with pytest.raises(ValueError):
        a.read_bytes_from_buffer(8, 1)
    with pytest.raises(ValueError):
        a.write_bytes_to_buffer(x, b"ab", 3)
    assert a.free_managed_buffer(x, 4096) == -3
    assert a.free_managed_buffer(x, 65536) == 0


TARGET = textwrap.dedent(
    """
    import sys, numpy as np, te.mooncake as mc
    e = mc.TransferEngine()
    assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    buf = np.zeros(int(sys.argv[1]), dtype=np.uint8)
    assert e.register_memory(buf.ctypes.data, buf.size) == 0
    print(f"127.0.0.1:{e.get_rpc_port()} {buf.ctypes.data}", flush=True)
    sys.stdin.readline()
    print(int(buf.astype(np.uint64).sum()), flush=True)
    """
)


def start_target(size):
    p = subprocess.Popen([sys.executable, "-c", TARGET, str(size)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    session, addr = p.stdout.readline().split()
    return p, session, int(addr)


def test_two_processes_exchange_session_names_the_way_consumers_do():
    a, abuf, _ = engine(seed=9)
    p, session, addr = start_target(8 * MiB)
    try:
        assert a.transfer_sync_write(session, abuf.addr, addr, 8 * MiB) == 0
        p.stdin.write("\n")
        p.stdin.flush()
        assert int(p.stdout.readline()) == int(abuf.array.astype(np.uint64).sum())
    finally:
        p.kill()
        p.wait()


def test_a_peer_that_exits_mid_transfer_is_an_error_and_the_engine_goes_on():
    a, abuf, _ = engine(64 * MiB)
    p, session, addr = start_target(64 * MiB)
    results = []

    def writes():
        for _ in range(200):
            results.append(a.transfer_sync_write(session, abuf.addr, addr, 64 * MiB))
            if results[-1] != 0:
                return

    t = threading.Thread(target=writes)
    t.start()
    while not results:
        time.sleep(0.01)
    p.kill()
    p.wait()
    t.join(timeout=120)
    assert not t.is_alive()
    assert results[-1] == -1
    b, bbuf, peer = engine()
    assert a.transfer_sync_write(peer, abuf.addr, bbuf.addr, MiB) == 0
    assert bbuf.bytes(0, MiB) == abuf.bytes(0, MiB)


def test_install_makes_unmodified_mooncake_programs_use_te():
    script = textwrap.dedent(
        """
        import te.mooncake
        te.mooncake.install()
        from mooncake.engine import TransferEngine, TransferOpcode
        import mooncake.engine
        assert TransferEngine is te.mooncake.TransferEngine
        assert mooncake.engine is te.mooncake
        e = TransferEngine()
        assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
        print("ok", e.get_rpc_port() > 0)
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "ok True", out.stderr
