"""Protocol names, Mooncake's MC_USE_TENT switch and transport hints through both Python APIs:
a name te cannot serve is an error naming it (a negative code and an ERROR in the log from
te.mooncake, an exception from te.Engine), never a TCP engine."""

import contextlib
import logging
import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import te
import te.mooncake as mc

MiB = 1 << 20


class Records(logging.Handler):
    def __init__(self):
        super().__init__()
        self.records = []

    def emit(self, record):
        self.records.append(record)

    def wait_for(self, text, level, timeout=10):
        end = time.time() + timeout
        while time.time() < end:
            hits = [r for r in self.records if text in r.getMessage() and r.levelno == level]
            if hits:
                return hits
            time.sleep(0.02)
        return []


@pytest.fixture
def records():
    handler = Records()
    logger = logging.getLogger("te")
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


@pytest.fixture
def chosen(records):
    """te's log at INFO for the test: yields a function that waits for the engine's transport
    choices and returns whether one named ``transport``, with what was said."""
    logger = logging.getLogger("te")
    level = logger.level
    logger.setLevel(logging.INFO)
    te.set_log_level(logging.INFO)

    def said(transport):
        lines = [r.getMessage() for r in records.wait_for("transport chosen", logging.INFO)]
        return any(f"transport={transport}" in line for line in lines), lines

    try:
        yield said
    finally:
        logger.setLevel(level)
        te.set_log_level(logger.getEffectiveLevel())


@contextlib.contextmanager
def peer_process(script):
    """``script`` in a Python process of its own, stdin and stdout piped; killed at the end."""
    child = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        yield child
    finally:
        child.kill()
        child.wait()


def finish(child):
    """Tells a peer process the test is done and returns its verdict line."""
    child.stdin.write("done\n")
    child.stdin.flush()
    return child.stdout.readline().strip()


@pytest.mark.parametrize(
    "protocol",
    ["bogus", "tpc", "efa", "hip", "ascend", "barex", "ub", "nvlink", "nvlink_intra", "mnnvl",
     "cxl", "gds"],
)
def test_initialize_refuses_what_it_cannot_serve_and_logs_why(protocol, records):
    e = mc.TransferEngine()
    assert e.initialize("127.0.0.1", "P2PHANDSHAKE", protocol, "") < 0
    assert records.wait_for(f'"{protocol}"', logging.ERROR), f"no ERROR naming {protocol}"
    assert e.get_rpc_port() == -1, "no engine was started"


def test_tcp_and_rdma_start_and_rdma_falls_back_as_mooncakes_does():
    for protocol in ["tcp", "rdma", "TCP"]:
        e = mc.TransferEngine()
        assert e.initialize("127.0.0.1", "P2PHANDSHAKE", protocol, "") == 0, protocol
        assert e.get_rpc_port() > 0


def test_te_engine_raises_for_names_it_cannot_serve():
    for protocol in ["bogus", "efa", "nvlink"]:
        with pytest.raises(te.TransportError) as err:
            te.Engine(protocol=protocol)
        assert protocol in str(err.value) and isinstance(err.value, ValueError)
    with te.Engine(protocol="shm", backend="tent") as e:
        assert "shm" in e.transports()


def test_a_name_selects_one_transport_and_auto_every_one_that_starts_here():
    with te.Engine(protocol="shm") as e:
        assert list(e.transports()) == ["shm"]
    with te.Engine(protocol="io_uring") as e:
        assert list(e.transports()) in (["uring"], ["bufio"])
    with te.Engine() as a, te.Engine(protocol="auto") as b:
        kinds = a.transports()
        # No RDMA device, GPU or CXL device here: TCP first (what peers see), then the rest.
        assert list(kinds)[0] == "tcp", kinds
        assert "shm" in kinds and ("uring" in kinds or "bufio" in kinds), kinds
        assert not {"rdma", "nvlink", "cxl", "gds"} & set(kinds), kinds
        assert all(isinstance(c, str) for caps in kinds.values() for c in caps)
        # A numpy array is not in a shared-memory file: it moves over TCP, every byte.
        src = np.random.default_rng(5).integers(0, 256, MiB, dtype=np.uint8)
        dst = np.zeros(MiB, dtype=np.uint8)
        ra, rb = a.register(src), b.register(dst)
        a.connect(b.name).write(ra, rb.addr)
        assert (dst == src).all()


SAME_HOST_PEER = textwrap.dedent(
    """
    import sys
    import numpy as np
    import te

    with te.Engine() as e:
        buf = np.zeros(8 << 20, dtype=np.uint8)
        buf[: 1 << 20] = np.arange(1 << 20) % 251
        region = e.register(buf)
        print(e.name, region.addr, flush=True)
        sys.stdin.readline()  # the parent is done
        written = (np.arange(1 << 20) * 7 % 256).astype(np.uint8)
        print("OK" if (buf[4 << 20 : 5 << 20] == written).all() else "BAD", flush=True)
    """
)


def test_same_host_processes_move_their_own_memory_by_cross_memory_attach(chosen):
    """Two processes on one host, each with memory it allocated (numpy): te.Engine() moves it
    by cross-memory attach, not TCP, and every byte lands."""
    with peer_process(SAME_HOST_PEER) as child:
        name, addr = child.stdout.readline().split()
        addr = int(addr)
        with te.Engine() as a:
            assert "cma" in a.transports()
            src = (np.arange(MiB) * 7 % 256).astype(np.uint8)
            back = np.zeros(MiB, dtype=np.uint8)
            rs, rb = a.register(src), a.register(back)
            peer = a.connect(name)
            peer.write(rs, addr + 4 * MiB)
            peer.read(rb, addr)
            assert (back == np.arange(MiB) % 251).all()
            cma, said = chosen("cma")
            assert cma, said
        assert finish(child) == "OK"


SHM_PEER = textwrap.dedent(
    """
    import sys
    import te.mooncake as mc

    e = mc.TransferEngine()
    assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "auto", "") == 0
    addr = e.allocate_managed_buffer(1 << 20)
    assert addr != 0
    assert e.write_bytes_to_buffer(addr, bytes(range(256)) * 4096, 1 << 20) == 0
    print(f"127.0.0.1:{e.get_rpc_port()}", addr, flush=True)
    sys.stdin.readline()  # the parent is done
    written = e.read_bytes_from_buffer(addr + 4096, 65536)
    print("OK" if written == bytes([7]) * 65536 else "BAD", flush=True)
    """
)


def test_managed_buffers_move_through_shared_memory_between_processes(chosen):
    """te.mooncake engines with protocol "auto" in two processes: managed buffers are shared
    memory, which the other process maps; every byte lands, and the log says shm."""
    with peer_process(SHM_PEER) as child:
        peer, remote = child.stdout.readline().split()
        remote = int(remote)
        a = mc.TransferEngine()
        assert a.initialize("127.0.0.1", "P2PHANDSHAKE", "auto", "") == 0
        local = a.allocate_managed_buffer(1 << 20)
        assert a.transfer_sync_read(peer, local, remote, 1 << 20) == 0
        assert a.read_bytes_from_buffer(local, 1 << 20) == bytes(range(256)) * 4096
        assert a.write_bytes_to_buffer(local, bytes([7]) * 65536, 65536) == 0
        assert a.transfer_sync_write(peer, local, remote + 4096, 65536) == 0
        shm, said = chosen("shm")
        assert shm, said
        assert finish(child) == "OK"
        a.close()


ALLOCATE_PEER = textwrap.dedent(
    """
    import sys
    import numpy as np
    import te

    with te.Engine() as e:
        region = e.allocate(4 << 20)
        arr = np.frombuffer(region.obj, dtype=np.uint8)
        arr[: 1 << 20] = np.arange(1 << 20) % 253
        print(e.name, region.addr, flush=True)
        sys.stdin.readline()  # the parent is done
        print("OK" if (arr[2 << 20 : 3 << 20] == 9).all() else "BAD", flush=True)
    """
)


def test_allocated_memory_moves_through_shared_memory_between_processes(chosen):
    """te.Engine.allocate in two processes with the default protocol: the memory is shared
    memory the other process maps, written through numpy views; every byte lands, and the log
    says shm."""
    with peer_process(ALLOCATE_PEER) as child:
        name, addr = child.stdout.readline().split()
        addr = int(addr)
        with te.Engine() as a:
            local = a.allocate(MiB)
            view = np.frombuffer(local.obj, dtype=np.uint8)
            peer = a.connect(name)
            peer.read(local, addr)
            assert (view == np.arange(MiB) % 253).all()
            view[:] = 9
            peer.write(local, addr + 2 * MiB)
            shm, said = chosen("shm")
            assert shm, said
        assert finish(child) == "OK"


def test_allocated_memory_outlives_unregister_and_close_while_viewed():
    """The bytes of te.Engine.allocate stay allocated while a view of them lives: after
    unregister (peers lose access) and after close, the view still reads what was written."""
    with te.Engine() as a, te.Engine() as b:
        region = b.allocate(MiB)
        view = np.frombuffer(region.obj, dtype=np.uint8)
        view[:] = np.arange(MiB) % 241
        src = a.register(np.full(MiB, 3, dtype=np.uint8))
        peer = a.connect(b.name)
        peer.write(src, region.addr, 4096)
        assert (view[:4096] == 3).all() and (view[4096:] == np.arange(4096, MiB) % 241).all()
        region.unregister()
        assert not region.registered
        # The peer mapped the shared memory before: what it writes or reads now (where its
        # stale descriptor lets it) no longer reaches the bytes.
        view[:4096] = 8
        back = a.register(np.zeros(4096, dtype=np.uint8))
        for move in (lambda: peer.write(src, region.addr, 4096),
                     lambda: peer.read(back, region.addr, 4096)):
            try:
                move()
            except te.TeError:
                pass
        assert (view[:4096] == 8).all()
        assert not (back.obj == 8).any()
        view[:4096] = 3
        del region
    # Both engines are closed and the region is gone: the view alone holds the bytes.
    assert (view[:4096] == 3).all() and (view[4096:] == np.arange(4096, MiB) % 241).all()
    view[:] = 1
    assert int(view.sum()) == MiB


CXL_PEER = textwrap.dedent(
    """
    import sys
    import numpy as np
    import te

    with te.Engine(protocol="cxl") as e:
        region = e.allocate(2 << 20)
        arr = np.frombuffer(region.obj, dtype=np.uint8)
        arr[: 1 << 20] = np.arange(1 << 20) % 239
        print(e.name, region.addr, flush=True)
        sys.stdin.readline()  # the parent is done
        print("OK" if (arr[1 << 20 :] == 4).all() else "BAD", flush=True)
    """
)


def test_cxl_moves_engine_memory_on_a_shared_device_between_processes(tmp_path, monkeypatch,
                                                                      chosen):
    """te.Engine(protocol="cxl") in two processes mapping one device (a regular file stands in
    for the DAX device): allocate() carves memory out of the device, and each process reaches
    the other's through it; every byte lands, and the log says cxl."""
    device = tmp_path / "cxl-device"
    with open(device, "wb") as f:
        f.truncate(64 * MiB)
    monkeypatch.setenv("MC_CXL_DEV_PATH", str(device))
    with peer_process(CXL_PEER) as child:
        name, addr = child.stdout.readline().split()
        addr = int(addr)
        with te.Engine(protocol="cxl") as a:
            assert list(a.transports()) == ["cxl"]
            local = a.allocate(MiB)
            view = np.frombuffer(local.obj, dtype=np.uint8)
            peer = a.connect(name)
            peer.read(local, addr)
            assert (view == np.arange(MiB) % 239).all()
            view[:] = 4
            peer.write(local, addr + MiB)
            cxl, said = chosen("cxl")
            assert cxl, said
        assert finish(child) == "OK"
    monkeypatch.delenv("MC_CXL_DEV_PATH")
    with pytest.raises(te.TransportError) as err:
        te.Engine(protocol="cxl")
    assert "MC_CXL_DEV_PATH" in str(err.value)


def test_allocate_refuses_what_it_cannot_hand_out():
    with te.Engine() as e:
        with pytest.raises(te.InvalidArgumentError):
            e.allocate(0)
        with pytest.raises(te.InvalidArgumentError):
            e.allocate(-1)
        with pytest.raises(TypeError):
            e.allocate(1.5)
        with pytest.raises(te.TeError):
            e.allocate(1 << 62)
    with pytest.raises(te.ClosedError):
        e.allocate(4096)


def pair(**kw):
    a, b = mc.TransferEngine(), mc.TransferEngine()
    for e in (a, b):
        assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    src = np.random.default_rng(1).integers(0, 256, MiB, dtype=np.uint8)
    dst = np.zeros(MiB, dtype=np.uint8)
    assert a.register_memory(src.ctypes.data, MiB) == 0
    assert b.register_memory(dst.ctypes.data, MiB) == 0
    return a, b, src, dst, f"127.0.0.1:{b.get_rpc_port()}"


def test_transport_hints_on_the_classic_engine():
    a, b, src, dst, peer = pair()
    s, d = src.ctypes.data, dst.ctypes.data
    for hint in ["", "unspec", "tcp"]:
        assert a.transfer_sync_write(peer, s, d + 64, 4096, transport_hint=hint) == 0, hint
    assert dst[64 : 64 + 4096].tobytes() == src[:4096].tobytes()
    before = dst.copy()
    # Known transports this engine does not run: the call fails and writes nothing.
    for hint in ["rdma", "shm", "io_uring"]:
        assert a.transfer_sync_write(peer, s, d, 4096, transport_hint=hint) == -1, hint
        assert a.batch_transfer_async_write(peer, [s], [d], [4096], transport_hint=hint) == 0
    assert (dst == before).all()
    # Names that are no transport te has raise, as Mooncake's TENT builds raise.
    for hint in ["bogus", "ascend", "rdam"]:
        with pytest.raises(ValueError) as err:
            a.batch_transfer_sync_write(peer, [s], [d], [4096], transport_hint=hint)
        assert hint in str(err.value)


RUN_ON_TENT = textwrap.dedent(
    """
    import numpy as np
    import te.mooncake as mc

    MiB = 1 << 20
    # On TENT, shm runs with TCP beside it; the classic engine runs shm alone.
    a, b = mc.TransferEngine(), mc.TransferEngine()
    assert a.initialize("127.0.0.1", "P2PHANDSHAKE", "shm", "") == 0
    assert b.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    src = np.random.default_rng(2).integers(0, 256, MiB, dtype=np.uint8)
    dst = np.zeros(MiB, dtype=np.uint8)
    assert a.batch_register_memory([src.ctypes.data], [MiB]) == 0
    assert b.register_memory(dst.ctypes.data, MiB) == 0
    peer = f"127.0.0.1:{b.get_rpc_port()}"
    s, d = src.ctypes.data, dst.ctypes.data
    assert a.transfer_sync_write(peer, s, d, MiB // 2, transport_hint="tcp") == 0
    ids = [a.batch_transfer_async_write(peer, [s + MiB // 2], [d + MiB // 2], [MiB // 2])]
    ids.append(a.batch_transfer_async_read(peer, [s], [d], [4096], transport_hint="tcp"))
    assert all(0 < i < 1 << 48 for i in ids), ids
    for i in ids:
        while (status := a.transfer_check_status(i)) == 0:
            pass
        assert status == 1, status
    assert a.transfer_check_status(ids[0]) == -1, "freed once it reported completion"
    assert (dst == src).all()
    # Hints TENT does not run fail the call; names that are no transport raise.
    assert a.transfer_sync_write(peer, s, d, 4096, transport_hint="gds") == -1
    assert a.transfer_sync_write(peer, s, d, 4096, transport_hint="mnnvl") == -1
    try:
        a.transfer_sync_write(peer, s, d, 4096, transport_hint="bogus")
        raise SystemExit("a bogus hint did not raise")
    except ValueError:
        pass
    assert mc.TransferEngine().initialize("127.0.0.1", "P2PHANDSHAKE", "efa", "") < 0
    print("ON TENT OK")
    """
)


@pytest.mark.parametrize("switch", [("MC_USE_TENT", "1"), ("MC_USE_TENT", "0"), ("MC_USE_TEV1", "")])
def test_mc_use_tent_runs_te_mooncake_on_tent(switch):
    env = {k: v for k, v in os.environ.items() if k not in ("MC_USE_TENT", "MC_USE_TEV1")}
    env[switch[0]] = switch[1]
    out = subprocess.run([sys.executable, "-c", RUN_ON_TENT], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0 and "ON TENT OK" in out.stdout, out.stdout + out.stderr
    # Without the switch, the classic engine runs shm alone, and the program's TCP calls fail.
    classic = {k: v for k, v in env.items() if k != switch[0]}
    out = subprocess.run([sys.executable, "-c", RUN_ON_TENT], env=classic,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "ON TENT OK" not in out.stdout


SAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "te-tent", "tests", "data",
                      "mooncake-keys.json")


def test_tent_runs_under_a_configuration_written_for_mooncakes_tent(monkeypatch, records):
    """Every key of Mooncake's sample transfer-engine.json: te.Engine(backend="tent") starts,
    moves bytes, and names the keys it does not use."""
    monkeypatch.setenv("MC_TENT_CONF", SAMPLE)
    with te.Engine(backend="tent") as a, te.Engine(backend="tent") as b:
        src = np.random.default_rng(3).integers(0, 256, 4 * MiB, dtype=np.uint8)
        dst = np.zeros(4 * MiB, dtype=np.uint8)
        region, remote = a.register(src), b.register(dst)
        a.connect(b.name).write(region, remote.addr)
        assert (dst == src).all()
    # The keys te does not use are named (once per process; no other test here reads them).
    for key in ["transports.ub", "metrics.http_server_threads", "enable_progress_worker"]:
        assert records.wait_for(f"{key} ignored", logging.WARNING), key
    monkeypatch.setenv("MC_TENT_CONF", '{"transports": {"rdma": {"device": {"gid_index": 300}}}}')
    with pytest.raises(te.TeError) as err:
        te.Engine(backend="tent")
    assert "transports.rdma.device.gid_index" in str(err.value)


def test_a_file_opens_as_a_segment_and_moves_through_the_peer_calls(tmp_path):
    path = tmp_path / "kv.bin"
    content = np.random.default_rng(11).integers(0, 256, 4 * MiB, dtype=np.uint8)
    path.write_bytes(content.tobytes())
    with te.Engine() as e:
        f = e.open_file(path, "rw")
        buf = np.zeros(MiB, dtype=np.uint8)
        region = e.register(buf)
        f.read(region, 4096, 256 << 10)
        assert (buf[: 256 << 10] == content[4096 : 4096 + (256 << 10)]).all()
        buf[:] = 7
        f.write(region, 2 * MiB, MiB)
        f.write_async(region, 3 * MiB, 4096).result(10)
        on_disk = np.frombuffer(path.read_bytes(), dtype=np.uint8)
        assert (on_disk[2 * MiB : 3 * MiB] == 7).all() and (on_disk[3 * MiB : 3 * MiB + 4096] == 7).all()
        assert (on_disk[: 2 * MiB] == content[: 2 * MiB]).all()
        ro = e.open_file(str(path))
        with pytest.raises(te.TeError):
            ro.write(region, 0, 4096)
        with pytest.raises(ValueError):
            e.open_file(path, "w")
        with pytest.raises(te.TeError) as err:
            e.open_file(tmp_path / "missing")
        assert "missing" in str(err.value)
    with te.Engine(protocol="tcp") as e, pytest.raises(te.TeError) as err:
        e.open_file(path)
    assert "file segments" in str(err.value)
