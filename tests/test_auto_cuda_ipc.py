"""GPU memory between processes of one host on ``transport="auto"`` engines (issue 14): an
automatic engine over TCP exports its GPU registrations for CUDA IPC through its shm companion,
so its shm connections move device memory GPU to GPU (``Endpoint.info["cuda_ipc_bytes"]``),
while its TCP connections stage it and refuse remote access to it. Over the stand-in driver
without a GPU (tests/cuda_standin)."""

from __future__ import annotations

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
    staged_messages,
    write_and_read_back,
)
from _peers import Peer
from rdmaxfer import Buffer, Engine, InvalidArgumentError, RemoteAccessError, _core
from rdmaxfer.memory import cuda

pytestmark = [
    *IPC_MARKS,
    pytest.mark.skipif(
        _core.available_transports().get("rdma", "") == "",
        reason="an RDMA device is active: transport='auto' runs over rdma (GPUDirect) here",
    ),
]


@pytest.fixture(autouse=True)
def no_forced_transport(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RDMAXFER_TRANSPORT", raising=False)


@pytest.fixture
def server() -> Iterator[Engine]:
    with Engine("auto") as engine:
        yield engine


def test_auto_pair_on_one_host_moves_device_memory_by_cuda_ipc(
    server: Engine, spawn: Callable[..., Peer], rng: np.random.Generator, seed: int
) -> None:
    peer, ep, descriptor = connect(server, spawn, seed, transport="auto")
    with ep:
        assert ep.info["transport"] == "shm" and ep.info["cuda_ipc_bytes"] == 0
        assert "cuda_ipc_off" not in ep.info
        # WRITE then READ back, over the peer's whole region
        src, region, host = write_and_read_back(server, ep, peer, descriptor, rng)
        assert region.descriptor().transport == "tcp"  # one key, any link
        # a message each way; the peer's region holds what was written
        message_each_way(server, ep, peer, src, host, host)
        # a batch of two WRITEs, the two halves of new data
        src2, host2 = device_random(rng, NBYTES)
        region2 = server.register(src2, "r")
        result = ep.write_batch(
            [((region2, 0, MiB), descriptor, 0), ((region2, MiB, NBYTES - MiB), descriptor, MiB)],
            timeout=60,
        )
        assert result.ok
        peer.put("crc")
        assert peer.get() == crc(host2)
        # every byte went GPU to GPU, none through the staging slabs
        moved = 5 * NBYTES
        assert ep.info["cuda_ipc_bytes"] == moved
        peer.put("info")
        info = peer.get()
        assert info["transport"] == "shm" and info["cuda_ipc_bytes"] == moved
        assert staged_messages(server) == 0
        peer.put("stop")
    assert peer.join() == 0


def test_tcp_links_of_an_auto_engine_stage_its_cuda_ipc_registrations(
    rng: np.random.Generator,
) -> None:
    """The same registration on a TCP connection (a peer that forces TCP): local transfers are
    staged (the CPU cannot address GPU memory), and a remote WRITE into it is refused."""
    with Engine("auto") as auto, Engine("tcp") as forced:
        port = forced.listen("127.0.0.1", 0)
        with auto.connect("127.0.0.1", port, timeout=10) as ep, forced.accept(timeout=10) as peer:
            assert ep.info["transport"] == "tcp"
            target = np.zeros(NBYTES, np.uint8)
            descriptor = forced.register(target).descriptor()
            src, host = device_random(rng, NBYTES)
            region = auto.register(src, "rw")
            before = staged_messages(auto)
            ep.write(src, descriptor, timeout=60)
            assert crc(target) == crc(host)
            sending = ep.post_send(src)
            assert crc(peer.recv(timeout=60)) == crc(host)
            sending.wait(60)
            assert staged_messages(auto) == before + 1
            with pytest.raises(RemoteAccessError, match=r"GPU memory shared by CUDA IPC"):
                peer.write(np.ones(4096, np.uint8), region.descriptor(), timeout=30)
            # the registration itself, named in a batch: refused before the CPU touches it
            with pytest.raises(InvalidArgumentError, match=r"GPU memory registered for CUDA IPC"):
                ep.write_batch([((region, 0, 4096), descriptor, 0)], timeout=30).check()
            assert crc(target) == crc(host)
            assert crc(src.copy_to_host()) == crc(host)  # untouched


def test_info_says_why_a_shm_link_would_stage(
    server: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A driver without the IPC calls: the shm link says so in Endpoint.info."""
    status = dict(cuda.status())
    status["cuda_ipc"] = "this NVIDIA driver lacks the CUDA IPC calls cuIpcGetMemHandle"
    monkeypatch.setattr(cuda, "status", lambda: status)
    port = server.listen("127.0.0.1", 0)
    with Engine("auto") as client, client.connect("127.0.0.1", port, timeout=10) as ep:
        with server.accept(timeout=10):
            assert ep.info["transport"] == "shm"
            assert "cuda_ipc_off" not in ep.info  # the engine has not touched GPU memory yet
            client.register(Buffer.empty(4096, np.uint8, device="cuda:0"), "r")
            assert ep.info["cuda_ipc_off"] == status["cuda_ipc"]


def test_info_says_an_auto_engine_over_rdma_stages_to_shm_peers(
    server: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over rdma an automatic engine registers GPU memory for GPUDirect RDMA: its shm links
    say they stage it (the engine is made to report rdma as its network transport)."""
    port = server.listen("127.0.0.1", 0)
    with Engine("auto") as client, client.connect("127.0.0.1", port, timeout=10) as ep:
        with server.accept(timeout=10):
            client.register(Buffer.empty(4096, np.uint8, device="cuda:0"), "r")
            assert "cuda_ipc_off" not in ep.info
            monkeypatch.setattr(Engine, "transport", property(lambda self: "rdma"))
            assert ep.info["cuda_ipc_off"].startswith(
                "GPU memory on this engine is registered for GPUDirect RDMA"
            )


def test_notified_write_between_auto_engines_of_one_process(rng: np.random.Generator) -> None:
    """A WRITE with a notification from registered device memory goes by CUDA IPC too, and
    the notification comes once the bytes are in place."""
    with Engine("auto") as server, Engine("auto") as client:
        port = server.listen("127.0.0.1", 0)
        with client.connect("127.0.0.1", port, timeout=10) as ep, server.accept(timeout=10):
            target = Buffer.empty(NBYTES, np.uint8, device="cuda:0")
            descriptor = server.register(target, "rw").descriptor()
            src, host = device_random(rng, NBYTES)
            client.register(src, "r")
            ep.write(src, descriptor, notify=7, timeout=60)
            assert server.wait_notification(timeout=10)[1] == 7
            assert crc(target.copy_to_host()) == crc(host)
            assert ep.info["transport"] == "shm" and ep.info["cuda_ipc_bytes"] == NBYTES
