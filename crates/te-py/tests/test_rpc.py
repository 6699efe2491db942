"""Mooncake's RPC communicator on te.mooncake, and te's own ``te.Rpc``: real servers over
loopback, bytes compared, Mooncake's return codes and callback shapes checked; the wheel's
``RpcInterface`` (from ``target/mooncake-venv``) as the peer in both directions."""

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import te
import te.mooncake as mc

MOONCAKE_PYTHON = os.path.join(
    os.environ.get("TE_MOONCAKE_VENV",
                   os.path.join(os.path.dirname(__file__), "../../../target/mooncake-venv")),
    "bin", "python3")
DTYPES = ["float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool"]


class Inbox:
    """Callbacks that record what a server was given."""

    def __init__(self):
        self.items = []
        self.cond = threading.Condition()

    def data(self, d):
        with self.cond:
            self.items.append(("data", d))
            self.cond.notify_all()

    def tensor(self, t):
        with self.cond:
            self.items.append(("tensor", t))
            self.cond.notify_all()

    def wait(self, n, timeout=10):
        end = time.time() + timeout
        with self.cond:
            while len(self.items) < n and time.time() < end:
                self.cond.wait(end - time.time())
            got, self.items = self.items[:n], self.items[n:]
        assert len(got) == n, f"{len(got)} of {n} messages arrived"
        return got


def serve(timeout=5):
    inbox = Inbox()
    s = mc.RpcInterface()
    assert s.initialize("127.0.0.1:0", 2, timeout, 10)
    s.set_data_receive_callback(inbox.data)
    s.set_tensor_receive_callback(inbox.tensor)
    assert s.start_server_async()
    return s, inbox, s.local_address


def test_the_module_has_mooncakes_names_and_defaults():
    for name in ["RpcInterface", "CoroRPCInterface", "ReceivedData", "ReceivedTensor",
                 "create_rpc_client", "create_rpc_server"]:
        assert name in mc.__all__ and hasattr(mc, name), name
    assert mc.CoroRPCInterface is mc.RpcInterface
    r = mc.RpcInterface()
    assert r.send_data("127.0.0.1:1", b"x") < 0, "before initialize"
    assert r.start_server_async() is False, "before initialize"
    assert r.initialize() is True and r.start_server_async() is False, "no listen address"
    assert r.initialize_client() and r.initialize_client(pool_size=4, timeout_seconds=2)
    assert r.initialize("not an address") is False
    d = mc.ReceivedData("127.0.0.1:5", b"abc")
    assert (d.source_address, d.data_size, d.get_bytes(), bytes(d.get_memory_view())) == (
        "127.0.0.1:5", 3, b"abc", b"abc")
    c = mc.create_rpc_client()
    assert isinstance(c, mc.RpcInterface)


def test_data_and_tensors_reach_mooncakes_callbacks_between_te_peers():
    s, inbox, addr = serve()
    c = mc.create_rpc_client()
    for n in [0, 1, 1024, 1025, 1 << 20]:
        payload = os.urandom(n)
        assert c.send_data(addr, payload) == 0
        kind, d = inbox.wait(1)[0]
        assert kind == "data" and d["data"] == payload
        assert d["source"].startswith("127.0.0.1:")
    assert c.send_data(addr, bytearray(b"ba")) == 0 and inbox.wait(1)[0][1]["data"] == b"ba"
    for dtype in DTYPES + ["bfloat16"] * 0:
        for shape in [(), (5,), (2, 3), (2, 1, 3), (1, 2, 2, 2)]:
            a = (np.arange(int(np.prod(shape))) % 2).astype(dtype).reshape(shape)
            assert c.send_tensor(addr, a) == 0
            kind, t = inbox.wait(1)[0]
            assert kind == "tensor", (dtype, shape)
            assert (t.dtype, tuple(t.shape), t.total_bytes) == (dtype, shape, a.nbytes)
            assert t.get_data_as_bytes() == a.tobytes() and t.get_data_size() == a.nbytes
            assert bytes(t.get_memory_view()) == a.tobytes()
    # A non-contiguous view is sent as its contiguous copy.
    a = np.arange(16, dtype=np.int32).reshape(4, 4)[:, 1]
    assert c.send_tensor(addr, a) == 0
    assert inbox.wait(1)[0][1].get_data_as_bytes() == np.ascontiguousarray(a).tobytes()
    assert c.send_tensor(addr, b"not a tensor") == -1
    s.stop_server()


def test_failures_are_negative_codes_and_async_sends_raise():
    c = mc.RpcInterface()
    assert c.initialize_client(timeout_seconds=1)
    assert c.send_data("127.0.0.1:1", b"x") < 0
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen()
    start = time.time()
    assert c.send_data("127.0.0.1:%d" % silent.getsockname()[1], b"x") == -2
    assert time.time() - start < 5

    async def main():
        loop = asyncio.get_running_loop()
        with pytest.raises(RuntimeError):
            await c.send_data_async("127.0.0.1:1", b"x", loop)
        with pytest.raises(te.RpcTimeoutError):
            await c.send_data_async("127.0.0.1:%d" % silent.getsockname()[1], b"x", loop)

    asyncio.run(main())


def test_asyncio_sends_from_many_tasks_all_arrive():
    s, inbox, addr = serve()
    c = mc.create_rpc_client()

    async def main():
        loop = asyncio.get_running_loop()
        sends = [c.send_data_async(addr, i.to_bytes(4, "little"), loop) for i in range(300)]
        sends += [c.send_tensor_async(addr, np.full((2, 2), i, dtype=np.int64), loop)
                  for i in range(20)]
        return await asyncio.gather(*sends)

    assert asyncio.run(main()) == [0] * 320
    got = inbox.wait(320)
    data = sorted(int.from_bytes(d["data"], "little") for k, d in got if k == "data")
    assert data == list(range(300))
    tensors = sorted(np.frombuffer(t.get_data_as_bytes(), np.int64)[0] for k, t in got if k == "tensor")
    assert tensors == list(range(20))
    s.stop_server()


def test_start_server_waits_without_the_gil_until_stopped():
    s = mc.RpcInterface()
    assert s.initialize_server("127.0.0.1:0", thread_count=1)
    result = {}
    t = threading.Thread(target=lambda: result.setdefault("r", s.start_server()))
    t.start()
    deadline = time.time() + 5
    while s.local_address is None and time.time() < deadline:
        time.sleep(0.01)  # this thread runs: start_server holds no GIL
    assert s.local_address is not None and t.is_alive()
    s.stop_server()
    t.join(5)
    assert result == {"r": True}


def test_tes_own_api_sends_receives_and_raises():
    with te.Rpc("127.0.0.1:0", timeout=2) as server, te.Rpc(timeout=2) as client:
        client.send(server.address, b"hello")
        m = server.receive(5)
        assert (m.data, m.is_tensor) == (b"hello", False)
        a = np.arange(6, dtype=np.float32).reshape(2, 3)
        client.send(server.address, a)
        m = server.receive(5)
        assert (m.dtype, m.shape) == ("float32", (2, 3))
        assert np.array_equal(m.numpy(), a)

        async def main():
            await client.send_async(server.address, b"awaited")
            return await server.receive_async()

        assert asyncio.run(main()).data == b"awaited"
        with pytest.raises(te.RpcError) as e:
            client.send("127.0.0.1:1", b"x")
        assert e.value.code < 0
        with pytest.raises(TimeoutError):
            server.receive(0.1)


# The wheel's RpcInterface as a peer: te-testkit's driver script, in JSON lines.
MOONCAKE_PEER = os.path.join(os.path.dirname(__file__), "../../te-testkit/peers/mooncake_rpc_peer.py")


class MooncakePeer:
    def __init__(self):
        if not os.path.exists(MOONCAKE_PYTHON):
            pytest.fail(f"{MOONCAKE_PYTHON} is missing: .ci/setup installs Mooncake's wheel")
        self.p = subprocess.Popen([MOONCAKE_PYTHON, MOONCAKE_PEER], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)

    def call(self, **req):
        self.p.stdin.write(json.dumps(req) + "\n")
        self.p.stdin.flush()
        return json.loads(self.p.stdout.readline())

    def received(self, n):
        return self.call(op="received", count=n, wait=10)["messages"]

    def close(self):
        self.p.kill()
        self.p.wait()


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_mooncakes_wheel_and_te_talk_both_ways():
    peer = MooncakePeer()
    try:
        reply = peer.call(op="serve")
        assert reply["ok"]
        port = reply["port"]
        c = mc.create_rpc_client()
        payloads = [b"small", os.urandom(1025), os.urandom(1 << 20), b""]
        for p in payloads:
            assert c.send_data("127.0.0.1:%d" % port, p) == 0
        got = peer.received(len(payloads))
        assert [bytes.fromhex(g["hex"]) for g in got] == payloads
        a = np.arange(12, dtype=np.float32)
        assert c.send_tensor("127.0.0.1:%d" % port, a) == 0
        g = peer.received(1)[0]
        assert (g["kind"], bytes.fromhex(g["hex"])) == ("data", a.tobytes()), "raw bytes, as Mooncake sends"
    finally:
        peer.close()
    s, inbox, addr = serve()
    peer = MooncakePeer()
    try:
        assert peer.call(op="client")["ok"]
        for p in [b"x", os.urandom(1025), os.urandom(1 << 20)]:
            assert peer.call(op="send_data", target=addr, hex=p.hex())["rc"] == 0
            kind, d = inbox.wait(1)[0]
            assert kind == "data" and d["data"] == p
        header = (2).to_bytes(4, "little") + (2).to_bytes(4, "little")
        header += b"".join(x.to_bytes(8, "little") for x in (2, 3, 0, 0))
        body = np.arange(6, dtype=np.float32).tobytes()
        assert peer.call(op="send_data", target=addr, hex=(header + body).hex())["rc"] == 0
        kind, t = inbox.wait(1)[0]
        assert kind == "tensor" and (t.dtype, list(t.shape)) == ("float32", [2, 3])
        assert t.get_data_as_bytes() == header + body and t.header_bytes == 40
    finally:
        peer.close()
        s.stop_server()


@pytest.mark.skipif(not os.environ.get("TE_MOONCAKE_RPC_TEST"),
                    reason="TE_MOONCAKE_RPC_TEST names Mooncake's rpc_communicator_test.py "
                           "(in Mooncake's source, not its wheel)")
def test_mooncakes_own_rpc_test_runs_on_te_on_both_sides():
    wrap = ("import runpy, sys, te.mooncake; te.mooncake.install(); "
            "sys.argv = ['rpc_communicator_test.py'] + sys.argv[1:]; "
            "runpy.run_path(%r, run_name='__main__')" % os.environ["TE_MOONCAKE_RPC_TEST"])
    url = "127.0.0.1:%d" % free_port()
    server = subprocess.Popen([sys.executable, "-u", "-c", wrap, "server", "--url", url],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.5)
    client = subprocess.Popen([sys.executable, "-u", "-c", wrap, "client", "--url", url],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    time.sleep(4)
    client.kill()
    server.kill()
    out = client.communicate()[0]
    server.wait()
    rates = [float(line.split()[1]) for line in out.splitlines() if line.startswith("bandwidth:")]
    assert rates and min(rates) > 0, out
    assert "Warning" not in out and "Error" not in out, out


class MooncakeStyleTensor:
    """The attributes Mooncake's send_tensor reads from a torch tensor, over numpy memory."""

    def __init__(self, array):
        self.array = np.ascontiguousarray(array)
        self.shape = self.array.shape
        self.dtype = "torch." + self.array.dtype.name

    def data_ptr(self):
        return self.array.ctypes.data

    def numel(self):
        return self.array.size

    def element_size(self):
        return self.array.itemsize


class DlpackOnly:
    """An object that offers DLPack, a dtype and a shape, and nothing numpy or torch offer."""

    def __init__(self, array):
        self.array = array
        self.shape = array.shape
        self.dtype = array.dtype

    def __dlpack__(self, stream=None):
        return self.array.__dlpack__()

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()


def test_tensors_come_from_torch_style_and_dlpack_objects():
    s, inbox, addr = serve()
    c = mc.create_rpc_client()
    a = np.arange(24, dtype=np.int16).reshape(2, 3, 4)
    for obj in [MooncakeStyleTensor(a), DlpackOnly(a)]:
        assert c.send_tensor(addr, obj) == 0
        kind, t = inbox.wait(1)[0]
        assert (kind, t.dtype, tuple(t.shape)) == ("tensor", "int16", (2, 3, 4)), type(obj)
        assert t.get_data_as_bytes() == a.tobytes()
    odd = MooncakeStyleTensor(np.zeros(2, dtype=np.complex64))
    assert c.send_tensor(addr, odd) == -1, "a dtype te does not send"
    s.stop_server()


def test_a_full_inbox_holds_senders_back_and_close_still_returns():
    server = te.Rpc("127.0.0.1:0", timeout=10, queue_size=2)
    client = te.Rpc(timeout=10)
    done = []

    def send_five():
        for i in range(5):
            client.send(server.address, bytes([i]))
            done.append(i)

    t = threading.Thread(target=send_five)
    t.start()
    time.sleep(1.0)
    assert done == [0, 1], "the third waits for room in the receiver's queue"
    assert [server.receive(5).data for _ in range(5)] == [bytes([i]) for i in range(5)]
    t.join(10)
    assert done == [0, 1, 2, 3, 4]
    # A sender held by a full queue does not hold close().
    for i in range(3):
        threading.Thread(target=client.send, args=(server.address, b"x"), daemon=True).start()
    time.sleep(0.5)
    start = time.time()
    server.close()
    assert time.time() - start < 5


def test_a_signal_ends_the_blocking_start_server():
    import _thread

    s = mc.RpcInterface()
    assert s.initialize_server("127.0.0.1:0", thread_count=1)
    threading.Timer(0.3, _thread.interrupt_main).start()
    with pytest.raises(KeyboardInterrupt):
        s.start_server()
    assert s.local_address is not None, "still serving until stop_server"
    s.stop_server()
    assert s.local_address is None


def test_more_asyncio_sends_than_the_queue_holds_finish():
    """Past the sending queue (1,024), a send waits for room without the GIL: the sending
    threads, which take the GIL to report each send, keep going."""
    inbox = Inbox()
    s = mc.RpcInterface()
    assert s.initialize("127.0.0.1:0", 1, 10, 10)

    def slow(d):
        time.sleep(0.0005)
        inbox.data(d)

    s.set_data_receive_callback(slow)
    assert s.start_server_async()
    c = mc.RpcInterface()
    assert c.initialize_client(pool_size=2, timeout_seconds=30)
    result = {}

    async def main():
        loop = asyncio.get_running_loop()
        sends = [c.send_data_async(s.local_address, b"m", loop) for _ in range(1500)]
        return await asyncio.gather(*sends)

    t = threading.Thread(target=lambda: result.setdefault("r", asyncio.run(main())), daemon=True)
    t.start()
    t.join(60)
    assert not t.is_alive(), "the sends deadlocked"
    assert result["r"] == [0] * 1500
    assert len(inbox.wait(1500)) == 1500
    s.stop_server()


def test_dropping_a_communicator_with_sends_in_flight_does_not_hang():
    """Python drops the object holding the GIL while te's threads may wait for it to report
    a send or run a callback: they are stopped without it."""
    import gc

    s, inbox, addr = serve()

    def run():
        for _ in range(20):
            c = mc.create_rpc_client()

            async def main():
                loop = asyncio.get_running_loop()
                for _ in range(50):
                    c.send_data_async(addr, b"x", loop)
                await asyncio.sleep(0)  # the sends still in flight

            asyncio.run(main())
            del c
            gc.collect()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(60)
    assert not t.is_alive(), "dropping the communicator deadlocked"
    s.stop_server()
