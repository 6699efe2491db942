"""Mooncake's RPC communicator (`mooncake.engine.RpcInterface`, from the PyPI wheel) driven by
te's tests in JSON lines: one request on stdin, one reply on stdout. It calls only Mooncake's
public Python API and reports what Mooncake returns and what its callbacks were given.

Requests (`op` and its fields) and replies:
  serve     threads                      -> port (initialize on 127.0.0.1, start_server_async)
  client                                  -> ok (initialize_client)
  send_data target, hex                   -> rc (send_data)
  send_tensor target, hex, dtype, shape, element_size -> rc (send_tensor, with an object that
                                            has the attributes Mooncake reads from a tensor)
  received  count, wait                   -> messages: the callbacks' arguments so far
                                            (waiting up to `wait` seconds for `count` of them)
  quit                                    -> (exits)
"""

import ctypes
import json
import socket
import sys
import threading
import time

from mooncake.engine import RpcInterface


class Tensor:
    """What Mooncake's send_tensor reads from a torch tensor, over memory of this process."""

    def __init__(self, data, dtype, shape, element_size):
        self.buf = ctypes.create_string_buffer(data, max(len(data), 1))
        self.n = len(data)
        self.dtype = dtype
        self.shape = tuple(shape)
        self.es = element_size

    def data_ptr(self):
        return ctypes.addressof(self.buf)

    def numel(self):
        return self.n // self.es

    def element_size(self):
        return self.es


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def main():
    rpc = RpcInterface()
    got = []
    cond = threading.Condition()

    def on_data(d):
        with cond:
            got.append({"kind": "data", "source": d["source"], "hex": bytes(d["data"]).hex()})
            cond.notify_all()

    def on_tensor(t):
        try:
            shape = list(t.shape)
        except Exception as e:  # the wheel cannot convert its shape
            shape = "error: " + type(e).__name__
        with cond:
            got.append({"kind": "tensor", "source": t.source_address, "dtype": t.dtype,
                        "shape": shape, "total_bytes": t.total_bytes,
                        "size": t.get_data_size(), "hex": t.get_data_as_bytes().hex()})
            cond.notify_all()

    out = sys.stdout
    for line in sys.stdin:
        req = json.loads(line)
        op = req["op"]
        reply = {}
        if op == "serve":
            port = free_port()
            ok = rpc.initialize(f"127.0.0.1:{port}", req.get("threads", 2), 10, 10)
            rpc.set_data_receive_callback(on_data)
            rpc.set_tensor_receive_callback(on_tensor)
            ok = ok and rpc.start_server_async()
            reply = {"ok": bool(ok), "port": port}
        elif op == "client":
            reply = {"ok": bool(rpc.initialize_client(10, req.get("timeout", 10)))}
        elif op == "send_data":
            reply = {"rc": rpc.send_data(req["target"], bytes.fromhex(req["hex"]))}
        elif op == "send_tensor":
            t = Tensor(bytes.fromhex(req["hex"]), req["dtype"], req["shape"], req["element_size"])
            reply = {"rc": rpc.send_tensor(req["target"], t)}
        elif op == "received":
            end = time.time() + req.get("wait", 0)
            with cond:
                while len(got) < req.get("count", 0) and time.time() < end:
                    cond.wait(end - time.time())
                reply = {"messages": list(got)}
                got.clear()
        elif op == "quit":
            break
        out.write(json.dumps(reply) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
