"""GPU memory between two processes of one host over the shm transport: CUDA IPC (issue 14 item
3). The test process and a spawned peer (tests/_ipc_peer.py) each register device memory on an
shm engine; WRITE, READ, send and recv then copy GPU to GPU (the side that owns the target
opens the other's allocation once), which ``Endpoint.info["cuda_ipc_bytes"]`` shows. Without a
GPU they run over the stand-in driver (tests/cuda_standin/cuda_standin_ipc.cc), whose IPC maps
the same pages in both processes."""

from __future__ import annotations

import ctypes
import os
import time
from collections.abc import Callable, Iterator

import numpy as np
import pytest

from _gpu_data import crc, device_random
from _ipc_checks import (
    IPC_MARKS,
    NBYTES,
    MiB,
    connect,
    message_each_way,
    vmm_source_and_target,
    write_and_read_back,
)
from _ipc_peer import device_peer
from _peers import Peer, make_array
from _vmm import standin_library
from rdmaxfer import (
    Buffer,
    ConnectionFailedError,
    Engine,
    InvalidArgumentError,
    RegistrationError,
    RemoteAccessError,
)
from rdmaxfer.memory import cuda

pytestmark = IPC_MARKS


@pytest.fixture
def server() -> Iterator[Engine]:
    with Engine("shm") as engine:
        yield engine


def _standin_opened() -> int | None:
    """Peer allocations this process has open, as the stand-in driver counts them (None on a
    real driver)."""
    path = os.environ.get("RDMAXFER_CUDA_LIBRARY", "")
    if "cuda_standin" not in path:
        return None
    return int(ctypes.CDLL(path).rdmaxfer_standin_ipc_opened())


def test_write_and_read_of_device_memory_copy_gpu_to_gpu(
    server: Engine, spawn: Callable[..., Peer], rng: np.random.Generator, seed: int
) -> None:
    peer, ep, descriptor = connect(server, spawn, seed)
    with ep:
        assert ep.info["transport"] == "shm" and ep.info["cuda_ipc_bytes"] == 0
        _, _, host = write_and_read_back(server, ep, peer, descriptor, rng)
        # part of it, at offsets on both sides
        part, part_host = device_random(rng, MiB + 3)
        server.register(part, "r")
        ep.write(part, descriptor, offset=5, remote_offset=777, nbytes=MiB - 2, timeout=60)
        expected = host.copy()
        expected[777 : 777 + MiB - 2] = part_host[5 : 5 + MiB - 2]
        peer.put("crc")
        assert peer.get() == crc(expected)
        # both ends say the bytes went by CUDA IPC; the peer opened this process's allocations
        assert ep.info["cuda_ipc_bytes"] == 2 * NBYTES + MiB - 2
        peer.put("info")
        info = peer.get()
        assert info["cuda_ipc_bytes"] == 2 * NBYTES + MiB - 2
        assert info["cuda_ipc_opened"] == 3  # src, back, part: each opened once
        peer.put("stop")
    assert peer.join() == 0


def test_send_and_recv_of_device_memory_between_processes(
    server: Engine, spawn: Callable[..., Peer], rng: np.random.Generator, seed: int
) -> None:
    peer, ep, _ = connect(server, spawn, seed)
    with ep:
        src, host = device_random(rng, NBYTES)
        server.register(src, "r")
        message_each_way(server, ep, peer, src, host, make_array(seed, NBYTES))
        assert ep.info["cuda_ipc_bytes"] == 2 * NBYTES
        peer.put("stop")
    assert peer.join() == 0


def test_write_and_read_between_gpus_of_two_processes(
    server: Engine,
    spawn: Callable[..., Peer],
    rng: np.random.Generator,
    seed: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """This process's GPU 0 and the peer's GPU 1 (the stand-in gives the peer two GPUs): the
    peer opens this process's allocation in its GPU 1's context and copies across."""
    if _standin_opened() is None and len(cuda.status()["gpus"]) < 2:
        pytest.skip("needs two GPUs")
    monkeypatch.setenv("RDMAXFER_CUDA_STANDIN_GPUS", "2")  # read by the peer's stand-in only
    port = server.listen("127.0.0.1", 0)
    peer = spawn(device_peer, port, NBYTES, seed, "rw", 1)
    with server.accept(timeout=30) as ep:
        write_and_read_back(server, ep, peer, peer.get(), rng)
        assert ep.info["cuda_ipc_bytes"] == 2 * NBYTES
        peer.put("stop")
    assert peer.join() == 0


def test_host_memory_into_device_memory_of_another_process(
    server: Engine, spawn: Callable[..., Peer], seed: int
) -> None:
    """The peer's host memory lands in this process's device region (staged at the target:
    CMA cannot reach device memory); its device memory lands there by CUDA IPC."""
    peer, ep, _ = connect(server, spawn, seed)
    with ep:
        target = Buffer.empty(NBYTES, np.uint8, device="cuda:0")
        region = server.register(target, "rw")
        peer.put(("write_host", region.descriptor().pack(), NBYTES))
        assert peer.get() == "written"
        assert crc(target.copy_to_host()) == crc(make_array(seed, NBYTES))
        assert ep.info["cuda_ipc_bytes"] == 0
        peer.put("stop")
    assert peer.join() == 0


def test_bounds_and_access_are_checked_as_for_host_memory(
    server: Engine, spawn: Callable[..., Peer], rng: np.random.Generator, seed: int
) -> None:
    peer, ep, descriptor = connect(server, spawn, seed, access="r")
    with ep:
        src, _ = device_random(rng, MiB)
        server.register(src, "rw")
        with pytest.raises(InvalidArgumentError, match=r"outside the remote region"):
            ep.write(src, descriptor, remote_offset=NBYTES - MiB + 1, timeout=30)
        with pytest.raises(
            RemoteAccessError,
            match=r"refused access to 1048576 bytes: the region does not allow this access",
        ):
            ep.write(src, descriptor, timeout=30)  # registered "r": no remote write
        with pytest.raises(InvalidArgumentError, match=r"outside|exceeds|bytes"):
            ep.read(src, descriptor, offset=1, nbytes=MiB, timeout=30)
        peer.put("crc")
        assert peer.get() == crc(make_array(seed, NBYTES))  # untouched
        ep.read(src, descriptor, remote_offset=NBYTES - MiB, timeout=30)  # allowed: "r"
        assert crc(src.copy_to_host()) == crc(make_array(seed, NBYTES)[NBYTES - MiB :])
        peer.put("stop")
    assert peer.join() == 0


def test_peer_that_dies_frees_what_was_opened(
    server: Engine, spawn: Callable[..., Peer], seed: int
) -> None:
    peer, ep, remote = connect(server, spawn, seed)
    target = Buffer.empty(NBYTES, np.uint8, device="cuda:0")
    region = server.register(target, "rw")
    peer.put(("write", region.descriptor().pack(), NBYTES))
    assert peer.get() == "written"
    assert crc(target.copy_to_host()) == crc(make_array(seed, NBYTES))
    assert ep.info["cuda_ipc_opened"] == 1  # this end opened the peer's allocation
    before = _standin_opened()
    assert before in (None, 1)
    peer.kill()
    deadline = time.monotonic() + 10
    while not ep.closed and time.monotonic() < deadline:
        time.sleep(0.01)
    with pytest.raises(ConnectionFailedError):
        ep.write(target, remote, timeout=5)  # the dead peer's own region
    deadline = time.monotonic() + 10
    while ep.info["cuda_ipc_opened"] != 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert ep.info["cuda_ipc_opened"] == 0
    assert _standin_opened() in (None, 0)
    # the engine stays usable: a new peer connects and moves device memory again
    peer2, ep2, descriptor = connect(server, spawn, seed + 1)
    with ep2:
        ep2.read(target, descriptor, timeout=60)
        assert crc(target.copy_to_host()) == crc(make_array(seed + 1, NBYTES))
        peer2.put("stop")
    assert peer2.join() == 0


def test_two_engines_of_one_process_copy_without_opening(rng: np.random.Generator) -> None:
    """The driver refuses to open a process's own handle: between engines of one process the
    device addresses are used as they are, and nothing is opened."""
    with Engine("shm") as server, Engine("shm") as client:
        port = server.listen("127.0.0.1", 0)
        with client.connect("127.0.0.1", port, timeout=10) as ep, server.accept(timeout=10) as peer:
            target = Buffer.empty(NBYTES, np.uint8, device="cuda:0")
            descriptor = server.register(target, "rw").descriptor()
            src, host = device_random(rng, NBYTES)
            client.register(src, "r")
            ep.write(src, descriptor, timeout=60)
            assert crc(target.copy_to_host()) == crc(host)
            out = Buffer.empty(NBYTES, np.uint8, device="cuda:0")
            server.register(out, "rw")
            sending = ep.post_send(src)
            peer.recv(out, timeout=60)
            sending.wait(60)
            assert crc(out.copy_to_host()) == crc(host)
            assert ep.info["cuda_ipc_bytes"] == 2 * NBYTES
            assert peer.info["cuda_ipc_bytes"] == 2 * NBYTES
            assert peer.info["cuda_ipc_opened"] == 0
            assert _standin_opened() in (None, 0)


def test_registering_device_memory_not_from_cumemalloc_fails_clearly(server: Engine) -> None:
    host = np.arange(4096, dtype=np.uint8)
    with pytest.raises(InvalidArgumentError, match="method 'bogus'"):
        server._core.register_device(int(host.ctypes.data), 4096, 0, "bogus", 0)
    with pytest.raises(RegistrationError, match=r"CUDA IPC: the memory is host memory"):
        server._core.register_device(int(host.ctypes.data), 4096, 0, "cuda_ipc", 0)


def test_vmm_memory_is_shared_by_a_posix_fd(
    server: Engine, spawn: Callable[..., Peer], rng: np.random.Generator, seed: int
) -> None:
    """Memory of the VMM API has no CUDA IPC handle: it is exported as a POSIX fd, sent to the
    peer once over the connection's socket (SCM_RIGHTS), and imported and mapped there."""
    src, dst, host = vmm_source_and_target(rng)
    peer, ep, descriptor = connect(server, spawn, seed)
    with ep:
        server.register(src, "r")
        server.register(dst, "rw")
        ep.write(src, descriptor, timeout=60)
        peer.put("crc")
        assert peer.get() == crc(host)
        peer.put(("recv", NBYTES))
        ep.send(src, timeout=60)
        assert peer.get() == crc(host)
        ep.read(dst, descriptor, timeout=60)  # the peer pushes into our VMM memory
        out = cuda.array_view(dst, writable=False)
        assert out is not None
        assert crc(cuda.copy_to_host(out)) == crc(host)
        assert ep.info["cuda_ipc_bytes"] == 3 * NBYTES
        peer.put("info")
        info = peer.get()
        assert info["cuda_ipc_bytes"] == 3 * NBYTES
        assert info["cuda_ipc_opened"] == 2  # src and dst, each imported once
        peer.put("stop")
    assert peer.join() == 0


def test_vmm_memory_imported_here_is_released_when_the_connection_ends(
    server: Engine, spawn: Callable[..., Peer], seed: int
) -> None:
    """The peer WRITEs from its VMM memory: this end imports and maps the fd it sent, once, and
    unmaps and releases it when the connection ends (the stand-in counts what is alive)."""
    lib = standin_library()
    if lib is None:
        pytest.skip("allocates VMM memory through the stand-in driver's entry points")
    port = server.listen("127.0.0.1", 0)
    peer = spawn(device_peer, port, NBYTES, seed, "rw", 0, "shm", True)
    ep = server.accept(timeout=30)
    assert isinstance(peer.get(), bytes)
    target = Buffer.empty(NBYTES, np.uint8, device="cuda:0")
    region = server.register(target, "rw")
    before = lib.rdmaxfer_standin_vmm_physical()
    for _ in range(2):
        peer.put(("write", region.descriptor().pack(), NBYTES))
        assert peer.get() == "written"
        assert crc(target.copy_to_host()) == crc(make_array(seed, NBYTES))
    assert ep.info["cuda_ipc_opened"] == 1  # imported once
    assert lib.rdmaxfer_standin_vmm_physical() == before + 1
    peer.put("stop")
    assert peer.join() == 0
    deadline = time.monotonic() + 10
    while ep.info["cuda_ipc_opened"] != 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert ep.info["cuda_ipc_opened"] == 0
    assert lib.rdmaxfer_standin_vmm_physical() == before
    ep.close()
