"""The call patterns of Mooncake's Transfer Engine's users, replayed with their shapes, threads and
return-code checks: vLLM's MooncakeConnector (and its heterogeneous-TP and EC paths), SGLang's
disaggregation, weight loading and dead-peer handling, and LMCache's Mooncake channels. Each
role runs in its own process (``agent.py``) on host memory over TCP loopback, and every byte of
every region is checked afterwards, so stray writes are caught too.

The same scenarios run on te (``te.mooncake``) and on Mooncake's own wheel (``mooncake.engine``):
``python scenarios.py te|mooncake [--json FILE]`` runs them all and prints one line per
scenario (a failure is reported by name, not hidden); ``test_consumers.py`` runs them on te
under pytest. Read from the released packages (vLLM 0.34.0, SGLang 0.5.23, LMCache 0.5.6); no
code of theirs is here.
"""

import json
import os
import random
import signal
import subprocess
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
KIB = 1024
MIB = 1024 * KIB


class Role:
    """A role's process: commands in, answers out."""

    def __init__(self, impl, name, env=None):
        self.name = name
        e = dict(os.environ)
        e.update({"MC_FORCE_TCP": "1", "MC_TRANSFER_TIMEOUT": "10"})
        e.update(env or {})
        self.proc = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "agent.py"), impl],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=e,
            text=True,
        )

    def __call__(self, op, **args):
        self.proc.stdin.write(json.dumps({"op": op, **args}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise AssertionError(f"{self.name}: exited ({self.proc.wait()}) during {op}")
        answer = json.loads(line)
        if "error" in answer:
            raise AssertionError(f"{self.name}: {op}: {answer['error']}\n{answer['trace']}")
        return answer

    def start(self, **args):
        a = self("start", **args)
        check(a["ret"] == 0, f"{self.name}: initialize returned {a['ret']}")
        return a["session"]

    def kill(self):
        self.proc.kill()
        self.proc.wait()

    def signal(self, sig):
        os.kill(self.proc.pid, sig)

    def close(self):
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(json.dumps({"op": "exit"}) + "\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=30)
            except Exception:
                self.proc.kill()
                self.proc.wait()


class Group:
    """Regions of one role, as the driver knows them: sizes, seeds and addresses."""

    def __init__(self, role, name, sizes, seed0):
        self.role, self.name = role, name
        self.sizes = list(sizes)
        self.seeds = [seed0 + i for i in range(len(self.sizes))]
        self.addrs = role("alloc", group=name, sizes=self.sizes, seeds=self.seeds)["addrs"]
        self.writes = []

    def register(self):
        ret = self.role("batch_register", group=self.name)["ret"]
        check(ret == 0, f"{self.role.name}: batch_register_memory of {self.name} returned {ret}")

    def copied(self, region, off, src, src_region, src_off, n):
        """Records that ``n`` bytes of ``src``'s region at ``src_off`` land here."""
        self.writes.append(
            [region, off, src.seeds[src_region], src.sizes[src_region], src_off, n]
        )

    def verify(self):
        a = self.role("verify", group=self.name, writes=self.writes)
        check(
            not a["mismatches"],
            f"{self.role.name}/{self.name}: bytes differ (region, first offset, count): "
            f"{a['mismatches'][:5]}",
        )


def check(ok, message):
    if not ok:
        raise AssertionError(message)


class Roles:
    """Every role of one scenario, closed (or killed) at its end."""

    def __init__(self, impl):
        self.impl, self.all = impl, []

    def __call__(self, name, env=None):
        r = Role(self.impl, name, env)
        self.all.append(r)
        return r

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for r in self.all:
            r.close()


def runs(ids):
    """Contiguous runs of paired block ids: [(first local, first remote, count)]."""
    out = []
    for lo, re in ids:
        if out and out[-1][0] + out[-1][2] == lo and out[-1][1] + out[-1][2] == re:
            out[-1][2] += 1
        else:
            out.append([lo, re, 1])
    return out


# ---------------------------------------------------------------------------------------------
# vLLM


class VllmPair:
    """A vLLM prefill and decode pair: one region per layer on each side, registered in one
    ``batch_register_memory``, and pull messages built as the connector builds them (request x
    layer x contiguous run of blocks)."""

    layers, blocks, block = 64, 80, 16 * KIB

    def __init__(self, roles):
        self.p, self.d = roles("prefill"), roles("decode")
        self.p.start()
        self.session = self.d.start()
        sizes = [self.blocks * self.block] * self.layers
        self.src = Group(self.p, "kv", sizes, 1000)
        self.dst = Group(self.d, "kv", sizes, 2000)
        self.src.register()
        self.dst.register()
        self.free = iter(range(self.blocks))
        # Requests of 4 blocks from a shuffled order in which only some neighbours are
        # contiguous on both sides (runs of two merge, the others do not).
        units = [[2 * k, 2 * k + 1] for k in range(self.blocks // 2)]
        random.Random(7).shuffle(units)
        order = [b for i, u in enumerate(units) for b in (u if i % 2 else u[::-1])]
        self.requests = iter([order[4 * i : 4 * i + 4] for i in range(self.blocks // 4)])

    def message(self, n_requests):
        """One pull message of ``n_requests`` requests: its descriptors and their copies."""
        s, t, n, copies = [], [], [], []
        block = self.block
        for _ in range(n_requests):
            local_ids = next(self.requests)
            remote_ids = [next(self.free) for _ in local_ids]
            for layer in range(self.layers):
                for lo, re, cnt in runs(zip(local_ids, remote_ids)):
                    s.append(self.src.addrs[layer] + lo * block)
                    t.append(self.dst.addrs[layer] + re * block)
                    n.append(cnt * block)
                    copies.append((layer, re * block, self.src, layer, lo * block, cnt * block))
        return [s, t, n], copies

    def send(self, built, workers=10):
        """Sends built messages from the pool; records the copies of those that returned 0."""
        calls = [b[0] for b in built]
        rets = self.p("vllm_send", session=self.session, calls=calls, workers=workers)["rets"]
        for ret, (_, copies) in zip(rets, built):
            if ret == 0:
                for c in copies:
                    self.dst.copied(*c)
        return rets

    def verify(self):
        self.dst.verify()
        self.src.verify()


def vllm_mooncake_connector(impl):
    """vLLM's MooncakeConnector: 64 layer regions per side in one ``batch_register_memory``; a
    10-thread pool writing 10 pull messages of hundreds of descriptors at once."""
    with Roles(impl) as roles:
        v = VllmPair(roles)
        built = [v.message(n) for n in [2, 1, 2, 1, 2, 1, 2, 1, 1, 1]]
        widest = max(len(b[0][0]) for b in built)
        check(widest >= 256, f"hundreds of descriptors per call ({widest})")
        rets = v.send(built)
        check(rets == [0] * len(built), f"writes returned {rets}")
        v.verify()
    return {"descriptors per call (max)": widest}


def vllm_sleep_wake(impl):
    """vLLM's sleep and wake: every region unregistered in one ``batch_unregister_memory``,
    then the same regions registered again. On the prefill side writes work after it woke; on
    the decode side a write into its unregistered memory fails and lands nowhere, and the same
    write lands once it woke."""
    with Roles(impl) as roles:
        v = VllmPair(roles)
        check(v.send([v.message(1)]) == [0], "a first write")
        check(v.p("batch_unregister", group="kv")["ret"] == 0, "prefill sleep")
        v.src.register()
        rets = v.send([v.message(1)])
        check(rets == [0], f"a write after the prefill woke returned {rets}")
        check(v.d("batch_unregister", group="kv")["ret"] == 0, "decode sleep")
        doomed = v.message(1)
        rets = v.send([doomed])
        check(rets[0] != 0, "a write into memory the decode side unregistered returned 0")
        v.dst.register()
        rets = v.send([doomed])
        check(rets == [0], f"the same write after the decode side woke returned {rets}")
        v.verify()
    return {}


def vllm_heterogeneous_tp(impl):
    """Prefill at TP 1, decode at TP 2: one decode instance per rank, each sent the half of
    every block at offset ``rank * length`` (sub-block descriptors, never merged)."""
    layers, blocks, block = 16, 32, 16 * KIB
    half = block // 2
    with Roles(impl) as roles:
        p = roles("prefill")
        p.start()
        src = Group(p, "kv", [blocks * block] * layers, 3000)
        src.register()
        ranks = []
        for rank in range(2):
            d = roles(f"decode-rank{rank}")
            session = d.start()
            dst = Group(d, "kv", [blocks * half] * layers, 4000 + 100 * rank)
            dst.register()
            ranks.append((session, dst))
        local_ids = [2, 3, 4, 9, 17, 30]
        remote_ids = [0, 1, 2, 5, 6, 7]
        for rank, (session, dst) in enumerate(ranks):
            s, t, n = [], [], []
            for layer in range(layers):
                for lo, re in zip(local_ids, remote_ids):
                    s.append(src.addrs[layer] + lo * block + rank * half)
                    t.append(dst.addrs[layer] + re * half)
                    n.append(half)
                    dst.copied(layer, re * half, src, layer, lo * block + rank * half, half)
            rets = p("vllm_send", session=session, calls=[[s, t, n]], workers=10)["rets"]
            check(rets == [0], f"rank {rank}: write returned {rets}")
        for _, dst in ranks:
            dst.verify()
        src.verify()
    return {}


def vllm_ec_connector(impl):
    """vLLM's encoder-cache connector: the receiver registers one slab; the sender pushes from
    4 IO threads, each push registering fresh source buffers (under a lock), writing them and
    unregistering them."""
    slot, pushes = 256 * KIB, 24
    with Roles(impl) as roles:
        sender, receiver = roles("encoder"), roles("receiver")
        sender.start()
        session = receiver.start()
        slab = Group(receiver, "slab", [pushes * 2 * slot], 5000)
        slab.register()
        plan = []
        for i in range(pushes):
            seeds = [6000 + 2 * i, 6001 + 2 * i]
            dsts = [slab.addrs[0] + (2 * i + k) * slot for k in range(2)]
            plan.append({"sizes": [slot, slot], "seeds": seeds, "dsts": dsts})
        results = sender("ec_push", session=session, pushes=plan, workers=4)["results"]
        for i, r in enumerate(results):
            check(r == {"register": 0, "write": 0, "unregister": 0}, f"push {i}: {r}")
            for k in range(2):
                slab.writes.append([0, (2 * i + k) * slot, plan[i]["seeds"][k], slot, 0, slot])
        slab.verify()
    return {"pushes": pushes}


# ---------------------------------------------------------------------------------------------
# SGLang


def sglang_disaggregation(impl):
    """SGLang's prefill: K, V and aux buffers in one ``batch_register_memory``; requests
    sharded by decode port over 4 queues, each with a transfer thread and an executor; one
    write per chunk over all layers x page runs; heterogeneous TP's one call per layer with one
    descriptor per token slot; ``send_aux``'s one call of tiny descriptors (4 B - 4 KiB)."""
    layers, pages, page = 24, 64, 8 * KIB
    aux_items = [4, 8, 16, 64, 128, 512, 1024, 4096, 4, 40, 256, 2048, 8]  # bytes per item
    aux_slots = 8
    with Roles(impl) as roles:
        p = roles("prefill")
        p.start()

        def buffers(role, seed):
            g = Group(role, "all", [pages * page] * (2 * layers) + [n * aux_slots for n in aux_items],
                      seed)
            g.register()
            return g

        src = buffers(p, 7000)
        decodes = []
        for k in range(2):
            d = roles(f"decode{k}")
            session = d.start()
            decodes.append((session, buffers(d, 8000 + 200 * k)))
        chunks = []
        for k, (session, dst) in enumerate(decodes):
            for c in range(4):
                # Chunk c of request k: 4 pages, two contiguous runs, in every K and V layer.
                lo = [8 * c + 1, 8 * c + 2, 8 * c + 5, 8 * c + 6]
                re = [16 * k + 4 * c + i for i in range(4)]
                s, t, n = [], [], []
                for buf in range(2 * layers):
                    for a, b, cnt in runs(zip(lo, re)):
                        s.append(src.addrs[buf] + a * page)
                        t.append(dst.addrs[buf] + b * page)
                        n.append(cnt * page)
                        dst.copied(buf, b * page, src, buf, a * page, cnt * page)
                chunks.append({"session": session, "src": s, "dst": t, "lens": n})
        a = p("sglang_queues", chunks=chunks, queues=4)
        check(a["rets"] == [0] * len(chunks) and not a["failed_sessions"], f"chunks: {a}")
        # Heterogeneous TP: per layer, one descriptor per token slot (256 B of a page).
        session, dst = decodes[0]
        slot = 256
        for buf in range(layers):
            s, t, n = [], [], []
            for tok in range(48):
                off = 40 * page + tok * slot
                s.append(src.addrs[buf] + off)
                t.append(dst.addrs[buf] + 48 * page + tok * slot)
                n.append(slot)
                dst.copied(buf, 48 * page + tok * slot, src, buf, off, slot)
            r = p("write", session=session, src=s, dst=t, lens=n)["ret"]
            check(r == 0, f"per-token write of layer {buf} returned {r}")
        # send_aux: item 3 of every aux buffer to the decode's slot 5.
        s, t, n = [], [], []
        for i, item in enumerate(aux_items):
            buf = 2 * layers + i
            s.append(src.addrs[buf] + 3 * item)
            t.append(dst.addrs[buf] + 5 * item)
            n.append(item)
            dst.copied(buf, 5 * item, src, buf, 3 * item, item)
        r = p("write", session=session, src=s, dst=t, lens=n)["ret"]
        check(r == 0, f"send_aux returned {r}")
        for _, dst in decodes:
            dst.verify()
        src.verify()
    return {"chunks": len(chunks)}


def sglang_weight_loading(impl):
    """SGLang's remote weight loading: seed and client each ``register_memory`` every weight;
    the client reads them all with one ``batch_transfer_sync_read`` (``< 0`` fails)."""
    sizes = [4, 64, 2 * KIB, 4 * KIB, 100_000, 256 * KIB, 1 * MIB, 3 * MIB + 12] * 6
    with Roles(impl) as roles:
        seed, client = roles("seed"), roles("client")
        session = seed.start()
        client.start()
        theirs = Group(seed, "weights", sizes, 9000)
        mine = Group(client, "weights", sizes, 9500)
        for g in (theirs, mine):
            rets = g.role("register_each", group="weights")["rets"]
            check(rets == [0] * len(sizes), f"{g.role.name}: register_memory returned {rets}")
        r = client("read", session=session, local=mine.addrs, remote=theirs.addrs, lens=sizes)["ret"]
        check(r >= 0, f"batch_transfer_sync_read returned {r}")
        for i, n in enumerate(sizes):
            mine.copied(i, 0, theirs, i, 0, n)
        mine.verify()
        theirs.verify()
    return {"weights": len(sizes)}


def sglang_decode_killed(impl):
    """A decode instance killed mid-run: the prefill's next write fails (returns, does not
    hang), ``send_probe`` answers non-zero, and a restarted decode on a new port is served."""
    size = 4 * MIB
    with Roles(impl) as roles:
        p = roles("prefill")
        p.start()
        src = Group(p, "kv", [size], 10000)
        src.register()
        d1 = roles("decode")
        s1 = d1.start()
        g1 = Group(d1, "kv", [size], 10100)
        g1.register()
        r = p("write", session=s1, src=[src.addrs[0]], dst=[g1.addrs[0]], lens=[size])
        check(r["ret"] == 0, f"first write returned {r['ret']}")
        check(p("probe", session=s1)["ret"] == 0, "send_probe to a live decode")
        d1.kill()
        r = p("write", session=s1, src=[src.addrs[0]], dst=[g1.addrs[0]], lens=[size])
        check(r["ret"] != 0, "a write to a killed decode returned 0")
        took = r["seconds"]
        check(took < 30, f"the failed write took {took:.1f} s")
        check(p("probe", session=s1)["ret"] != 0, "send_probe to a killed decode returned 0")
        d2 = roles("decode-restarted")
        s2 = d2.start()
        check(s2 != s1, "the restarted decode has a new session")
        g2 = Group(d2, "kv", [size], 10200)
        g2.register()
        r = p("write", session=s2, src=[src.addrs[0]], dst=[g2.addrs[0]], lens=[size])
        check(r["ret"] == 0, f"a write to the restarted decode returned {r['ret']}")
        g2.copied(0, 0, src, 0, 0, size)
        g2.verify()
        src.verify()
    return {"failed write seconds": round(took, 3)}


# ---------------------------------------------------------------------------------------------
# LMCache


def lmcache_reads(server, client, remote, local, page, reads_n, engine="main"):
    """``reads_n`` LMCache reads of 4 pages each from ``remote`` into ``local``; checked."""
    # Reads in flight together never share a local page (LMCache's do not): each lands once.
    check(reads_n * 4 * page <= local.sizes[0], "distinct local pages for every read")
    reads = []
    for i in range(reads_n):
        pages = [(7 * i + 3 * k) % (remote.sizes[0] // page) for k in range(4)]
        lo = [local.addrs[0] + (4 * i + k) * page for k in range(4)]
        rm = [remote.addrs[0] + q * page for q in pages]
        reads.append([lo, rm, [page] * 4])
    a = client("lmcache_reads", session=server, reads=reads, engine=engine)
    check(not a["submit_errors"], f"LMCache's id checks: {a['submit_errors']}")
    check(all(0 < b < 1 << 48 for b in a["ids"]), f"batch ids outside (0, 2^48): {a['ids']}")
    check(a["statuses"] == [1] * reads_n, f"transfer_check_status: {a['statuses']}")
    return reads, a["ids"]


def lmcache_channel(impl):
    """LMCache's Mooncake channel: the server registers its L1 buffer once (unchecked); the
    client's ``batch_transfer_async_read``s pass LMCache's id checks and are polled with
    ``transfer_check_status`` by a prefetch thread; the other channel writes one page per
    ``transfer_sync_write``. A read of memory the server never registered fails cleanly."""
    page, l1 = 32 * KIB, 8 * MIB
    with Roles(impl) as roles:
        server, client = roles("server"), roles("client")
        ssession = server.start()
        client.start()
        remote = Group(server, "l1", [l1], 11000)
        server("register_each", group="l1")
        local = Group(client, "l1", [l1], 11100)
        local.register()
        reads, _ = lmcache_reads(ssession, client, remote, local, page, 40)
        for lo, rm, _ in reads:
            for a, b in zip(lo, rm):
                local.copied(0, a - local.addrs[0], remote, 0, b - remote.addrs[0], page)
        local.verify()
        # The other channel: pages of a buffer of their own, one transfer_sync_write each.
        out = Group(client, "out", [16 * page], 11200)
        out.register()
        pages = [[out.addrs[0] + k * page, remote.addrs[0] + (100 + k) * page, page]
                 for k in range(16)]
        rets = client("page_writes", session=ssession, pages=pages)["rets"]
        check(all(r >= 0 for r in rets), f"transfer_sync_write per page: {rets}")
        for k in range(16):
            remote.copied(0, (100 + k) * page, out, 0, k * page, page)
        remote.verify()
        # A read from an address the server never registered: no id, or a failed status.
        a = client("lmcache_reads", session=ssession,
                   reads=[[[local.addrs[0]], [remote.addrs[0] + 2 * l1], [page]]])
        outcome = a["submit_errors"] or a["statuses"]
        check(a["submit_errors"] or a["statuses"] == [-1], f"a read of unregistered memory: {a}")
    return {"reads": len(reads), "unregistered read": str(outcome)}


def lmcache_stalled_server(impl):
    """LMCache's read of a server that stopped answering (SIGSTOP, its sockets open):
    ``transfer_check_status`` answers 0 while it waits, then -2 once the read timed out (te:
    ``MC_TRANSFER_TIMEOUT`` passed and the connection made no progress for
    ``MC_TCP_STATUS_TIMEOUT_SEC``, both 5 s here), within LMCache's 15 s; nothing lands in the
    read's page afterwards; once the server resumes, new reads complete."""
    page = 64 * KIB
    with Roles(impl) as roles:
        server = roles("server")
        client = roles("client", env={"MC_TRANSFER_TIMEOUT": "5", "MC_TCP_STATUS_TIMEOUT_SEC": "5"})
        ssession = server.start()
        client.start()
        remote = Group(server, "l1", [4 * MIB], 14000)
        remote.register()
        local = Group(client, "l1", [4 * MIB], 14100)
        local.register()
        lmcache_reads(ssession, client, remote, local, page, 2)  # connected and warm
        server.signal(signal.SIGSTOP)
        try:
            a = client("lmcache_reads", session=ssession, deadline=15.0,
                       reads=[[[local.addrs[0] + 40 * page], [remote.addrs[0]], [page]]])
        finally:
            server.signal(signal.SIGCONT)
        check(not a["submit_errors"], f"submission: {a['submit_errors']}")
        check(a["statuses"] == [-2], f"transfer_check_status of a stalled read: {a['statuses']}")
        reads, _ = lmcache_reads(ssession, client, remote, local, page, 2)
        for lo, rm, _ in reads:
            for x, y in zip(lo, rm):
                local.copied(0, x - local.addrs[0], remote, 0, y - remote.addrs[0], page)
        # Nothing lands after the status said the read was over: its page is as it was, even
        # once the resumed server answered the request it had received.
        time.sleep(0.5)
        local.verify()
    return {}


def lmcache_many_engines(impl):
    """Batch ids from many engines in several processes (3 processes x 4 engines) are all in
    Mooncake's range (non-zero, below 2^48), and LMCache's read sequence passes on every one."""
    page = 16 * KIB
    with Roles(impl) as roles:
        server = roles("server")
        ssession = server.start()
        remote = Group(server, "l1", [2 * MIB], 12000)
        remote.register()
        ids = []
        for proc in range(3):
            c = roles(f"client{proc}")
            for k in range(4):
                name = f"e{k}"
                c.start(engine=name)
                local = Group(c, f"l1-{name}", [1 * MIB], 12100 + 10 * proc + k)
                check(c("batch_register", group=local.name, engine=name)["ret"] == 0, "register")
                reads, got = lmcache_reads(ssession, c, remote, local, page, 6, engine=name)
                ids += got
                for lo, rm, _ in reads:
                    for a, b in zip(lo, rm):
                        local.copied(0, a - local.addrs[0], remote, 0, b - remote.addrs[0], page)
                local.verify()
    return {"engines": 12, "largest id": hex(max(ids))}


def over_2048_descriptors(impl):
    """One ``batch_transfer_sync_write`` of 4,096 descriptors (vLLM's and SGLang's shapes can
    exceed 2,048 to one peer, which Mooncake's TCP transport refuses)."""
    n, size = 4096, 4 * KIB
    with Roles(impl) as roles:
        p, d = roles("prefill"), roles("decode")
        p.start()
        session = d.start()
        src = Group(p, "kv", [n * size], 13000)
        dst = Group(d, "kv", [n * size], 13100)
        src.register()
        dst.register()
        order = [(k * 1237) % n for k in range(n)]  # a permutation: no two runs merge
        s = [src.addrs[0] + k * size for k in range(n)]
        t = [dst.addrs[0] + order[k] * size for k in range(n)]
        r = p("write", session=session, src=s, dst=t, lens=[size] * n)["ret"]
        check(r == 0, f"a call of {n} descriptors returned {r}")
        for k in range(n):
            dst.copied(0, order[k] * size, src, 0, k * size, size)
        dst.verify()
    return {"descriptors": n}


SCENARIOS = [
    vllm_mooncake_connector,
    vllm_sleep_wake,
    vllm_heterogeneous_tp,
    vllm_ec_connector,
    sglang_disaggregation,
    sglang_weight_loading,
    sglang_decode_killed,
    lmcache_channel,
    lmcache_stalled_server,
    lmcache_many_engines,
    over_2048_descriptors,
]


def run_all(impl):
    """Every scenario on ``impl``: name -> {"ok", "seconds", "detail"}."""
    results = {}
    for scenario in SCENARIOS:
        start = time.monotonic()
        try:
            detail = scenario(impl)
            ok = True
        except Exception as exc:
            detail = {"failure": str(exc).splitlines()[0][:300]}
            if not isinstance(exc, AssertionError):
                detail["trace"] = traceback.format_exc()
            ok = False
        results[scenario.__name__] = {
            "ok": ok,
            "seconds": round(time.monotonic() - start, 2),
            "detail": detail,
        }
        mark = "pass" if ok else "FAIL"
        print(f"{mark}  {scenario.__name__:28} {results[scenario.__name__]['seconds']:6.2f} s  "
              f"{json.dumps(detail)}", flush=True)
    return results


def main():
    impl = sys.argv[1]
    out = sys.argv[3] if len(sys.argv) > 3 and sys.argv[2] == "--json" else None
    results = run_all(impl)
    if out:
        with open(out, "w") as f:
            json.dump(results, f, indent=1)
    failed = [n for n, r in results.items() if not r["ok"]]
    print(f"{impl}: {len(results) - len(failed)} of {len(results)} scenarios passed"
          + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
