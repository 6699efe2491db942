"""te's Python APIs over RDMA, in the Soft-RoCE guest of ``cargo xtask softroce`` (rxe0 on
198.18.0.1, rxe1 on 198.18.1.1; the Soft-RoCE lane of ``cargo xtask ci`` runs this file there).
Skipped anywhere else: no RDMA device. Every byte is compared."""

import os

import numpy as np
import pytest

import te
import te.mooncake as mc

pytestmark = pytest.mark.skipif(
    os.environ.get("SOFTROCE_VM_GUEST") != "1",
    reason="needs an RDMA device: runs in the Soft-RoCE guest (cargo xtask softroce)",
)

MiB = 1 << 20


@pytest.fixture(autouse=True)
def soft_roce(monkeypatch):
    # Soft-RoCE under emulation acknowledges slowly: a long local ACK timeout.
    monkeypatch.setenv("MC_IB_TIMEOUT", "18")


def test_te_engine_moves_bytes_over_rdma_and_auto_puts_rdma_first():
    with te.Engine(hostname="198.18.0.1", devices="rxe0") as auto:
        assert list(auto.transports())[0] == "rdma", auto.transports()
    with te.Engine(hostname="198.18.0.1", protocol="rdma", devices="rxe0") as a, \
            te.Engine(hostname="198.18.1.1", protocol="rdma", devices="rxe1") as b:
        assert list(a.transports()) == ["rdma"]
        src = np.random.default_rng(7).integers(0, 256, 4 * MiB, dtype=np.uint8)
        dst = np.zeros(4 * MiB, dtype=np.uint8)
        back = np.zeros(4 * MiB, dtype=np.uint8)
        rs, rd, rback = a.register(src), b.register(dst), a.register(back)
        peer = a.connect(b.name)
        peer.write(rs, rd.addr)
        assert (dst == src).all()
        dst[:MiB] = 9
        peer.read(rback, rd.addr, MiB)
        assert (back[:MiB] == 9).all() and not back[MiB:].any()
        # The RDMA device carried it, and nothing is in flight once the calls returned.
        loads = a.nic_load_stats()
        assert [s["device_name"] for s in loads] == ["rxe0"], loads
        assert loads[0]["inflight_bytes"] == 0, loads


def test_mooncake_api_moves_managed_buffers_over_rdma():
    a, b = mc.TransferEngine(), mc.TransferEngine()
    assert a.initialize("198.18.0.1", "P2PHANDSHAKE", "rdma", "rxe0") == 0
    assert b.initialize("198.18.1.1", "P2PHANDSHAKE", "rdma", "rxe1") == 0
    local, remote = a.allocate_managed_buffer(MiB), b.allocate_managed_buffer(MiB)
    assert local and remote
    data = bytes(range(256)) * 4096
    assert a.write_bytes_to_buffer(local, data, MiB) == 0
    peer = f"198.18.1.1:{b.get_rpc_port()}"
    assert a.transfer_sync_write(peer, local, remote, MiB) == 0
    assert b.read_bytes_from_buffer(remote, MiB) == data
    assert b.write_bytes_to_buffer(remote, bytes([3]) * 4096, 4096) == 0
    assert a.transfer_sync_read(peer, local, remote, 4096) == 0
    assert a.read_bytes_from_buffer(local, 4096) == bytes([3]) * 4096
    for e in (a, b):
        e.close()
