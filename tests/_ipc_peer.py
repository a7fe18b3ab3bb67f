"""The peer process of the CUDA IPC tests (tests/test_shm_cuda_ipc.py): device memory of another
process on this host, over the shm transport. Imported by spawned children: no pytest here."""

from __future__ import annotations

import zlib
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from _peers import make_array
from _vmm import VmmArray, standin_library
from rdmaxfer import Buffer, Engine
from rdmaxfer.memory import cuda


def _crc(buf: object) -> int:
    view = cuda.array_view(buf, writable=False)
    assert view is not None
    return zlib.crc32(np.ascontiguousarray(cuda.copy_to_host(view)).view(np.uint8))


def device_peer(
    conn: Connection,
    port: int,
    nbytes: int,
    seed: int,
    access: str,
    gpu: int = 0,
    transport: str = "shm",
    vmm: bool = False,
) -> None:
    """Connect over shm (an engine of ``transport``: "shm", or "auto" whose link to this host
    is shm); fill ``nbytes`` of memory of GPU ``gpu`` (with ``vmm``: memory of the VMM API of
    GPU 0, made through the stand-in driver) with make_array(seed), register it with
    ``access`` and send its descriptor bytes. Then obey commands until
    "stop" (or killed): "crc" (of the device memory), "info" (the endpoint's), "send" (the
    device memory as one message), ("recv", n) (one message into a registered device buffer
    of n bytes; answers its CRC), ("write", descriptor, n) (its first n bytes into the test's
    region), ("write_host", descriptor, n) (the same bytes from host memory); "send_plain"
    (make_array(seed) as one message) and ("recv_plain", n) (as "recv"), from or into a new
    device Buffer it did not register (an implicit CUDA IPC export on shm)."""
    with Engine(transport) as engine, engine.connect("127.0.0.1", port, timeout=30) as ep:
        host = make_array(seed, nbytes)
        buf: object = Buffer.empty(nbytes, np.uint8, device=f"cuda:{gpu}")
        if vmm:
            lib = standin_library()
            if lib is None:
                raise RuntimeError("vmm=True makes VMM memory through the stand-in driver")
            buf = VmmArray(lib, nbytes)
        view = cuda.array_view(buf, writable=True)
        assert view is not None
        cuda.copy_from_host(view, host)
        region = engine.register(buf, access)
        conn.send(region.descriptor().pack())
        while True:
            if not conn.poll(120):
                raise TimeoutError("the test sent no command within 120 s")
            cmd: Any = conn.recv()
            if cmd == "stop":
                return
            if cmd == "crc":
                conn.send(_crc(buf))
            elif cmd == "info":
                conn.send(ep.info)
            elif cmd == "send":
                ep.send(buf, timeout=60)
                conn.send("sent")
            elif cmd == "send_plain":
                plain = Buffer.empty(nbytes, np.uint8, device=f"cuda:{gpu}")
                cuda.copy_from_host(plain.device_array(), host)
                ep.send(plain, timeout=60)
                conn.send("sent")
            elif cmd[0] == "recv_plain":
                out = Buffer.empty(cmd[1], np.uint8, device="cuda:0")
                ep.recv(out, timeout=60)
                conn.send(_crc(out))
            elif cmd[0] == "recv":
                out = Buffer.empty(cmd[1], np.uint8, device="cuda:0")
                engine.register(out, "rw")
                ep.recv(out, timeout=60)
                conn.send(_crc(out))
            elif cmd[0] == "write":
                ep.write(buf, cmd[1], nbytes=cmd[2], timeout=60)
                conn.send("written")
            elif cmd[0] == "write_host":
                ep.write(host[: cmd[2]], cmd[1], timeout=60)
                conn.send("written")
