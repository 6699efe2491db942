"""te's NIXL backend (libplugin_TE.so) under NIXL's own agent, from the PyPI wheel nixl-cu12.

Two agents in two processes, as vLLM's NixlConnector and Dynamo run them: this process
("initiator") and a peer it starts ("target"), which exchange NIXL metadata over the peer's
standard input and output and then move bytes through the TE backend only. Every case checks
the bytes that arrived; the peer checks what was written to it and the notifications it got.

Run by `cargo xtask nixl test` (the bench, py/bench.py, imports its two processes) with NIXL_PLUGIN_DIR set to the folder of the built plugin; only
loopback is used (NIXL_TE_IP_ADDR=127.0.0.1).
"""

import base64
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback

import numpy as np
from nixl_cu12._api import nixl_agent, nixl_agent_config
from nixl_cu12._bindings import nixlBackendError

MIB = 1 << 20
SIZE = 64 * MIB
WAIT_S = 60.0
NOTIF_WAIT_S = 10.0


def pattern(seed: int, size: int = SIZE) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8)


# The backend under test: TE, or UCX for the benchmark's reference (both processes).
BACKEND = os.environ.get("NIXL_BACKEND_UNDER_TEST", "TE")


def agent(name: str, telemetry: bool = False) -> nixl_agent:
    config = nixl_agent_config(backends=[BACKEND], capture_telemetry=telemetry)
    return nixl_agent(name, config)


def wait_done(a: nixl_agent, handle, limit: float = WAIT_S) -> str:
    """The transfer's end state, polled as vLLM polls it (check_xfer_state until not PROC)."""
    end = time.monotonic() + limit
    while True:
        state = a.check_xfer_state(handle)
        if state != "PROC":
            return state
        if time.monotonic() > end:
            raise AssertionError(f"transfer still PROC after {limit} s")
        time.sleep(0.0005)


def descs(base: int, size: int, chunk: int) -> list[tuple[int, int, int]]:
    return [(base + off, chunk, 0) for off in range(0, size, chunk)]


# ---- the target process -------------------------------------------------------------------


def target_main() -> None:
    # NIXL's logger writes to standard output: the replies get a descriptor of their own.
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    a = agent("target")
    buf = np.zeros(SIZE, dtype=np.uint8)
    a.register_memory([(buf.ctypes.data, SIZE, 0, "")], "DRAM")
    md = base64.b64encode(a.get_agent_metadata()).decode()
    print(f"META {md}", file=out, flush=True)
    print(f"ADDR {buf.ctypes.data}", file=out, flush=True)
    pending: list[tuple[str, bytes]] = []
    for line in sys.stdin:
        cmd, _, arg = line.strip().partition(" ")
        reply = "OK"
        if cmd == "META":
            a.add_remote_agent(base64.b64decode(arg))
        elif cmd == "FILL":
            buf[:] = pattern(int(arg))
        elif cmd == "CHECK":
            bad = np.flatnonzero(buf != pattern(int(arg)))
            if bad.size:
                reply = f"BAD {bad.size} bytes differ, first at {bad[0]}"
        elif cmd == "NOTIF":
            want = base64.b64decode(arg)
            end = time.monotonic() + NOTIF_WAIT_S
            while want not in [m for s, m in pending if s == "initiator"]:
                for sender, msgs in a.get_new_notifs().items():
                    pending.extend((sender, m) for m in msgs)
                if time.monotonic() > end:
                    reply = f"MISSING {want!r}; got {pending!r}"
                    break
                time.sleep(0.001)
            else:
                pending.remove(("initiator", want))
        elif cmd == "SEND":
            a.send_notif("initiator", base64.b64decode(arg))
        elif cmd == "EXIT":
            print("OK", file=out, flush=True)
            return
        else:
            reply = f"UNKNOWN {cmd}"
        print(reply, file=out, flush=True)


class Target:
    """The target process and its command channel."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "target"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.metadata = base64.b64decode(self._expect("META"))
        self.addr = int(self._expect("ADDR"))

    def _expect(self, word: str) -> str:
        line = self.proc.stdout.readline().strip()
        assert line.startswith(word + " "), f"target said {line!r}, not {word}"
        return line[len(word) + 1 :]

    def ask(self, cmd: str, arg: str = "") -> None:
        self.proc.stdin.write(f"{cmd} {arg}\n")
        self.proc.stdin.flush()
        reply = self.proc.stdout.readline().strip()
        assert reply == "OK", f"target on {cmd}: {reply!r}"

    def expect_notif(self, msg: bytes) -> None:
        self.ask("NOTIF", base64.b64encode(msg).decode())


# ---- the initiator's cases ----------------------------------------------------------------


class Session:
    def __init__(self) -> None:
        # With NIXL's telemetry: each request's descriptor count as the backend got it.
        self.a = agent("initiator", telemetry=True)
        self.local = np.zeros(SIZE, dtype=np.uint8)
        # As vLLM's NixlConnector registers its KV caches: naming the backends.
        self.a.register_memory(
            [(self.local.ctypes.data, SIZE, 0, "")], "DRAM", backends=[BACKEND]
        )
        self.target = Target()
        assert self.a.add_remote_agent(self.target.metadata) == b"target"
        self.target.ask("META", base64.b64encode(self.a.get_agent_metadata()).decode())

    def xfer(self, op: str, chunk: int, notif: bytes = b"", order=None) -> float:
        """One request of SIZE / chunk descriptors between the two whole buffers; seconds."""
        local = descs(self.local.ctypes.data, SIZE, chunk)
        remote = descs(self.target.addr, SIZE, chunk)
        if order is not None:
            local = [local[i] for i in order]
            remote = [remote[i] for i in order]
        start = time.perf_counter()
        h = self.a.initialize_xfer(
            op,
            self.a.get_xfer_descs(local, "DRAM"),
            self.a.get_xfer_descs(remote, "DRAM"),
            "target",
            notif,
        )
        assert self.a.transfer(h) in ("PROC", "DONE")
        assert wait_done(self.a, h) == "DONE"
        took = time.perf_counter() - start
        assert self.a.query_xfer_backend(h) == BACKEND
        seen = self.a.get_xfer_telemetry(h)
        assert (seen.descCount, seen.totalBytes) == (len(local), SIZE), (
            f"NIXL posted {seen.descCount} descriptors, {seen.totalBytes} bytes"
        )
        self.a.release_xfer_handle(h)
        return took

    def notifs_from(self, sender: str, want: bytes) -> None:
        end = time.monotonic() + NOTIF_WAIT_S
        got: list[bytes] = []
        while time.monotonic() < end:
            got += self.a.get_new_notifs().get(sender, [])
            if want in got:
                return
            time.sleep(0.001)
        raise AssertionError(f"no notification {want!r} from {sender}; got {got!r}")


def case_plugin_listed(s: Session) -> None:
    assert "TE" in s.a.get_plugin_list(), s.a.get_plugin_list()
    params = s.a.get_plugin_params("TE")
    assert set(params) == {"ip_address", "protocol", "release_timeout_ms"}, params
    mems = s.a.get_plugin_mem_types("TE")
    assert {"DRAM_SEG", "VRAM_SEG", "FILE_SEG"} <= set(mems), mems


def case_unknown_option_refused(s: Session) -> None:
    other = nixl_agent("optioned", nixl_agent_config(backends=[]))
    try:
        other.create_backend("TE", {"no_such_option": "1"})
    except Exception:
        pass
    else:
        raise AssertionError("an unknown backend option was accepted")
    other.create_backend("TE", {"ip_address": "127.0.0.1", "protocol": "tcp"})


def write_case(chunk: int, seed: int, notif: bytes, shuffle: bool = False):
    def run(s: Session) -> None:
        s.local[:] = pattern(seed)
        n = SIZE // chunk
        order = np.random.default_rng(seed).permutation(n) if shuffle else None
        took = s.xfer("WRITE", chunk, notif, order)
        s.target.ask("CHECK", str(seed))
        s.target.expect_notif(notif)
        print(f"    {n} descriptors of {chunk} B written in {took * 1e3:.1f} ms")

    return run


def read_case(chunk: int, seed: int, notif: bytes, shuffle: bool = False):
    def run(s: Session) -> None:
        s.target.ask("FILL", str(seed))
        s.local[:] = 0
        n = SIZE // chunk
        order = np.random.default_rng(seed).permutation(n) if shuffle else None
        took = s.xfer("READ", chunk, notif, order)
        assert np.array_equal(s.local, pattern(seed)), "bytes read differ"
        s.target.expect_notif(notif)
        print(f"    {n} descriptors of {chunk} B read in {took * 1e3:.1f} ms")

    return run


def case_vllm_prepped_read(s: Session) -> None:
    """vLLM's NixlConnector: prepped lists of KV blocks, READ by index with a notification
    ("request-id:tp-ratio"), polled, released; the same handle posted twice."""
    block = 16 * 1024
    n = SIZE // block
    s.target.ask("FILL", "21")
    s.local[:] = 0
    local_h = s.a.prep_xfer_dlist(
        "NIXL_INIT_AGENT", descs(s.local.ctypes.data, SIZE, block), "DRAM"
    )
    remote_h = s.a.prep_xfer_dlist("target", descs(s.target.addr, SIZE, block), "DRAM")
    ids = np.random.default_rng(21).permutation(n)
    h = s.a.make_prepped_xfer("READ", local_h, ids, remote_h, ids, notif_msg=b"req-21:1")
    for round_ in range(2):
        assert s.a.transfer(h) in ("PROC", "DONE")
        assert wait_done(s.a, h) == "DONE"
        s.target.expect_notif(b"req-21:1")
        if round_ == 0:
            assert np.array_equal(s.local, pattern(21)), "prepped READ bytes differ"
            s.local[:] = 0
    assert np.array_equal(s.local, pattern(21)), "reposted READ bytes differ"
    s.a.release_xfer_handle(h)
    s.a.release_dlist_handle(local_h)
    s.a.release_dlist_handle(remote_h)


def case_notifications_both_ways(s: Session) -> None:
    s.a.send_notif("target", b"standalone \x00\xff 100%")
    s.target.expect_notif(b"standalone \x00\xff 100%")
    s.target.ask("SEND", base64.b64encode(b"from-target:2").decode())
    s.notifs_from("target", b"from-target:2")


def case_transfer_to_self(s: Session) -> None:
    dst = np.zeros(8 * MIB, dtype=np.uint8)
    s.a.register_memory([(dst.ctypes.data, dst.nbytes, 0, "")], "DRAM")
    s.local[: dst.nbytes] = pattern(31, dst.nbytes)
    h = s.a.initialize_xfer(
        "WRITE",
        s.a.get_xfer_descs(descs(s.local.ctypes.data, dst.nbytes, 64 * 1024), "DRAM"),
        s.a.get_xfer_descs(descs(dst.ctypes.data, dst.nbytes, 64 * 1024), "DRAM"),
        "initiator",
        b"self-done",
    )
    assert s.a.transfer(h) in ("PROC", "DONE")
    assert wait_done(s.a, h) == "DONE"
    assert np.array_equal(dst, pattern(31, dst.nbytes)), "bytes to self differ"
    s.notifs_from("initiator", b"self-done")
    s.a.release_xfer_handle(h)
    s.a.deregister_memory(s.a.get_reg_descs([(dst.ctypes.data, dst.nbytes, 0, "")], "DRAM"))


def case_file_segment(s: Session) -> None:
    size = 8 * MIB
    with tempfile.NamedTemporaryFile() as f:
        f.truncate(size)
        fd = f.fileno()
        file_reg = s.a.get_reg_descs([(0, size, fd, "")], "FILE")
        s.a.register_memory(file_reg)
        data = pattern(41, 4 * MIB)
        s.local[: data.nbytes] = data
        file_descs = s.a.get_xfer_descs(
            [(MIB + off, MIB, fd) for off in range(0, 4 * MIB, MIB)], "FILE"
        )
        mem_descs = s.a.get_xfer_descs(descs(s.local.ctypes.data, 4 * MIB, MIB), "DRAM")
        h = s.a.initialize_xfer("WRITE", mem_descs, file_descs, "initiator")
        assert s.a.transfer(h) in ("PROC", "DONE")
        assert wait_done(s.a, h) == "DONE"
        s.a.release_xfer_handle(h)
        on_disk = np.frombuffer(os.pread(fd, 4 * MIB, MIB), dtype=np.uint8)
        assert np.array_equal(on_disk, data), "bytes in the file differ"
        s.local[: data.nbytes] = 0
        h = s.a.initialize_xfer("READ", mem_descs, file_descs, "initiator")
        assert s.a.transfer(h) in ("PROC", "DONE")
        assert wait_done(s.a, h) == "DONE"
        s.a.release_xfer_handle(h)
        assert np.array_equal(s.local[: data.nbytes], data), "bytes read from the file differ"
        s.a.deregister_memory(file_reg)


def case_vram_without_gpu(s: Session) -> None:
    """Without a GPU, VRAM registration is refused (te says why), not taken as host memory."""
    if os.path.exists("/dev/nvidia0"):
        print("    a GPU is present: the GPU suite covers VRAM")
        return
    host = np.zeros(MIB, dtype=np.uint8)
    try:
        s.a.register_memory([(host.ctypes.data, MIB, 0, "")], "VRAM")
    except nixlBackendError:
        return
    raise AssertionError("VRAM registration succeeded on a machine without a GPU")


def case_release_in_flight(s: Session) -> None:
    """A request released while it moves is cancelled and ended before release returns; the
    next one moves every byte."""
    s.target.ask("FILL", "51")
    local = s.a.get_xfer_descs(descs(s.local.ctypes.data, SIZE, 4096), "DRAM")
    remote = s.a.get_xfer_descs(descs(s.target.addr, SIZE, 4096), "DRAM")
    h = s.a.initialize_xfer("READ", local, remote, "target")
    assert s.a.transfer(h) in ("PROC", "DONE")
    s.a.release_xfer_handle(h)
    s.local[:] = 0
    s.xfer("READ", MIB)
    assert np.array_equal(s.local, pattern(51)), "bytes after a release in flight differ"


def case_target_killed(s: Session) -> None:
    """The target dies mid-transfer: the request ends in an error within seconds, no hang."""
    local = s.a.get_xfer_descs(descs(s.local.ctypes.data, SIZE, 4096), "DRAM")
    remote = s.a.get_xfer_descs(descs(s.target.addr, SIZE, 4096), "DRAM")
    start = time.monotonic()
    state = "DONE"
    posts = 0
    while state == "DONE" and posts < 20:
        h = s.a.initialize_xfer("READ", local, remote, "target")
        try:
            posted = s.a.transfer(h)
        except nixlBackendError:
            posted = "ERR"
        if posts == 0:
            s.target.proc.send_signal(signal.SIGKILL)
        posts += 1
        try:
            state = posted if posted == "ERR" else wait_done(s.a, h, limit=30.0)
        except nixlBackendError:
            state = "ERR"
        s.a.release_xfer_handle(h)
    took = time.monotonic() - start
    s.target.proc.wait(timeout=10)
    assert state == "ERR", f"transfers to a killed target ended {state} ({posts} posts)"
    assert took < 15.0, f"the error took {took:.1f} s"
    print(f"    error after {took * 1e3:.0f} ms, {posts} post(s)")


CASES = [
    ("plugin listed with its options and memory kinds", case_plugin_listed),
    ("unknown backend option refused", case_unknown_option_refused),
    ("WRITE 64 MiB in 1 MiB descriptors", write_case(MIB, 11, b"write-1m")),
    ("WRITE 64 MiB in 16384 x 4 KiB, one request", write_case(4096, 12, b"w4k", shuffle=True)),
    ("READ 64 MiB in 1 MiB descriptors", read_case(MIB, 13, b"read-1m")),
    ("READ 64 MiB in 16384 x 4 KiB, one request", read_case(4096, 14, b"r\x004k%", shuffle=True)),
    ("vLLM's prepped READ with a notification, reposted", case_vllm_prepped_read),
    ("notifications both ways, binary bytes", case_notifications_both_ways),
    ("transfer to the agent itself, with notification", case_transfer_to_self),
    ("file segment WRITE and READ", case_file_segment),
    ("VRAM refused without a GPU", case_vram_without_gpu),
    ("release while in flight", case_release_in_flight),
    ("target killed mid-transfer", case_target_killed),
]


def main() -> int:
    os.environ.setdefault("NIXL_TE_IP_ADDR", "127.0.0.1")
    if len(sys.argv) > 1 and sys.argv[1] == "target":
        target_main()
        return 0
    s = Session()
    failed = 0
    for name, case in CASES:
        try:
            case(s)
            print(f"ok   {name}", flush=True)
        except Exception:
            failed += 1
            print(f"FAIL {name}", flush=True)
            traceback.print_exc()
    if s.target.proc.poll() is None:
        s.target.proc.kill()
    print(f"{len(CASES) - failed} of {len(CASES)} cases passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
