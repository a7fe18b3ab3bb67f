"""The round trips the CUDA IPC tests make with a device peer process (tests/_ipc_peer.py), over
the shm transport (tests/test_shm_cuda_ipc.py) and over an automatic engine's shm link
(tests/test_auto_cuda_ipc.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from _gpu_data import crc, device_random
from _ipc_peer import device_peer
from _peers import Peer
from _vmm import VmmArray, standin_library
from rdmaxfer import Buffer, Endpoint, Engine, _core
from rdmaxfer.memory import cuda

MiB = 1 << 20
NBYTES = 3 * MiB + 17  # not a multiple of a page or a chunk

#: The marks of every CUDA IPC test module: GPU tests that need a usable CUDA (the stand-in
#: driver on a machine without a GPU) and the shm transport.
IPC_MARKS = [
    pytest.mark.gpu,
    pytest.mark.skipif(not cuda.available(), reason=cuda.unavailable_reason() or "no GPU"),
    pytest.mark.skipif(
        _core.available_transports().get("shm", "") != "",
        reason=f"shm unavailable: {_core.available_transports().get('shm')}",
    ),
]


def vmm_source_and_target(rng: np.random.Generator) -> tuple[VmmArray, VmmArray, np.ndarray]:
    """Two NBYTES ranges of VMM memory (cuMemCreate + cuMemMap, through the stand-in driver's
    entry points): a source holding random bytes, a target, and the source's bytes on the host.
    Skips the test where the stand-in driver is not the one loaded."""
    lib = standin_library()
    if lib is None:
        pytest.skip("allocates VMM memory through the stand-in driver's entry points")
    src, dst = VmmArray(lib, NBYTES), VmmArray(lib, NBYTES)
    host = rng.integers(0, 256, NBYTES, dtype=np.uint8)
    view = cuda.array_view(src, writable=True)
    assert view is not None
    cuda.copy_from_host(view, host)
    return src, dst, host


def staged_messages(engine: Engine) -> int:
    """How many messages ``engine`` has staged through host memory on GPU 0 (whole or in
    windows): 0 while every GPU message moves by CUDA IPC."""
    stats = engine.stager(0).stats()
    return int(stats["messages_whole"] + stats["messages_windowed"])


def connect(
    server: Engine,
    spawn: Callable[..., Peer],
    seed: int,
    access: str = "rw",
    transport: str = "shm",
) -> tuple[Peer, Endpoint, bytes]:
    """A peer process on this host (an engine of ``transport``) with NBYTES of its GPU memory
    registered with ``access`` (make_array(seed)); returns the peer, the accepted endpoint and
    the descriptor of the peer's region."""
    port = server.port or server.listen("127.0.0.1", 0)
    peer = spawn(device_peer, port, NBYTES, seed, access, 0, transport)
    ep = server.accept(timeout=30)
    descriptor = peer.get()
    assert isinstance(descriptor, bytes)
    return peer, ep, descriptor


def write_and_read_back(
    server: Engine, ep: Endpoint, peer: Peer, descriptor: bytes, rng: np.random.Generator
) -> tuple[Any, Any, np.ndarray]:
    """WRITEs random device memory over the whole of the peer's region, checks the peer's CRC,
    READs it back into another registered device buffer and checks that; returns the source,
    its registration and its bytes."""
    src, host = device_random(rng, NBYTES)
    region = server.register(src, "r")
    ep.write(src, descriptor, timeout=60)
    peer.put("crc")
    assert peer.get() == crc(host)
    back = Buffer.empty(NBYTES, np.uint8, device="cuda:0")
    server.register(back, "rw")
    ep.read(back, descriptor, timeout=60)
    assert crc(back.copy_to_host()) == crc(host)
    return src, region, host


def message_each_way(
    server: Engine, ep: Endpoint, peer: Peer, src: Any, host: np.ndarray, theirs: np.ndarray
) -> None:
    """Sends ``src`` (registered device memory holding ``host``) to the peer, which checks it,
    then receives the peer's region (holding ``theirs``) into a registered device buffer."""
    peer.put(("recv", NBYTES))
    ep.send(src, timeout=60)
    assert peer.get() == crc(host)
    out = Buffer.empty(NBYTES, np.uint8, device="cuda:0")
    server.register(out, "rw")
    peer.put("send")
    ep.recv(out, timeout=60)
    assert peer.get() == "sent"
    assert crc(out.copy_to_host()) == crc(theirs)
