"""A real Mooncake engine (PyPI wheel `mooncake-transfer-engine-non-cuda`) driven by te's tests.

te's interoperability tests start this script with the virtual environment's Python that
`.ci/setup` makes, and talk to it in JSON lines: one request on stdin, one reply on stdout.
It only calls Mooncake's public Python API (`mooncake.engine.TransferEngine`); every reply
carries Mooncake's own return code, so the tests assert what a Mooncake user would see.

Requests (`op` and its fields) and replies:
  init      host, metadata, protocol, device          -> rc, rpc_port
  alloc     len                                       -> addr (anonymous memory of this process,
                                                        registered with register_memory, as
                                                        consumers register their own buffers)
  put       addr, hex                                  -> rc
  get       addr, len                                  -> hex
  write     target, local, remote, len                 -> rc (transfer_sync_write)
  read      target, local, remote, len                 -> rc (transfer_sync_read)
  batch     target, opcode (read|write), locals, remotes, lens -> rc (batch_transfer_sync_*)
  notify_write target, local, remote, len, name, msg   -> rc (transfer_sync with a TransferNotify)
  first     target                                     -> addr (get_first_buffer_address)
  notifies                                             -> list of [name, msg]
  quit                                                 -> (exits)
"""

import ctypes
import json
import mmap
import sys

from mooncake.engine import TransferEngine, TransferNotify, TransferOpcode


def main():
    engine = TransferEngine()
    out = sys.stdout
    buffers = []  # keeps registered memory alive
    for line in sys.stdin:
        req = json.loads(line)
        op = req["op"]
        reply = {}
        if op == "init":
            reply["rc"] = engine.initialize(
                req["host"], req.get("metadata", "P2PHANDSHAKE"),
                req.get("protocol", "tcp"), req.get("device", ""))
            reply["rpc_port"] = engine.get_rpc_port() if reply["rc"] == 0 else 0
        elif op == "alloc":
            buf = mmap.mmap(-1, req["len"])
            addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
            rc = engine.register_memory(addr, req["len"], "cpu:0")
            buffers.append(buf)
            reply["addr"] = addr if rc == 0 else 0
            reply["rc"] = rc
        elif op == "put":
            data = bytes.fromhex(req["hex"])
            reply["rc"] = engine.write_bytes_to_buffer(req["addr"], data, len(data))
        elif op == "get":
            reply["hex"] = engine.read_bytes_from_buffer(req["addr"], req["len"]).hex()
        elif op == "write":
            reply["rc"] = engine.transfer_sync_write(
                req["target"], req["local"], req["remote"], req["len"])
        elif op == "read":
            reply["rc"] = engine.transfer_sync_read(
                req["target"], req["local"], req["remote"], req["len"])
        elif op == "batch":
            call = (engine.batch_transfer_sync_write if req["opcode"] == "write"
                    else engine.batch_transfer_sync_read)
            reply["rc"] = call(req["target"], req["locals"], req["remotes"], req["lens"])
        elif op == "notify_write":
            reply["rc"] = engine.transfer_sync(
                req["target"], req["local"], req["remote"], req["len"], TransferOpcode.Write,
                TransferNotify(req["name"], req["msg"]))
        elif op == "first":
            reply["addr"] = engine.get_first_buffer_address(req["target"])
        elif op == "notifies":
            reply["notifies"] = [[n.name, n.msg] for n in engine.get_notifies()]
        elif op == "quit":
            out.write("{}\n")
            out.flush()
            return
        else:
            reply["error"] = "unknown op " + op
        out.write(json.dumps(reply) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
