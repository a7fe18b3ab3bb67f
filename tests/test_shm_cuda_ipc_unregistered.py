"""GPU memory that is not registered, between processes of one host (issue 14 item 3): on a shm
connection a transfer from or into it exports the allocation holding it for CUDA IPC on the fly
(``MemoryDomain._export``), cached by the allocation's (base, bytes) and validated on every use
by its CU_POINTER_ATTRIBUTE_BUFFER_ID, so the bytes go GPU to GPU
(``Endpoint.info["cuda_ipc_bytes"]``) instead of through host staging. An allocation freed and
another made at its address is never served by the old export, here or at the peer (which
closes its mapping of the old one). TCP connections, and a driver that does not report the
buffer id, still stage. Over the stand-in driver without a GPU (tests/cuda_standin)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import numpy as np
import pytest

from _gpu_data import crc, device_random
from _ipc_checks import IPC_MARKS, NBYTES, MiB, connect, staged_messages, vmm_source_and_target
from _peers import Peer, make_array
from rdmaxfer import Buffer, Engine, InvalidArgumentError, _core
from rdmaxfer.memory import cuda

pytestmark = IPC_MARKS


@pytest.fixture
def server() -> Iterator[Engine]:
    with Engine("shm") as engine:
        yield engine


def _ptr(buf: Buffer) -> int:
    return buf.device_array().ptr


def _realloc_at(ptr: int, rng: np.random.Generator) -> tuple[Buffer, np.ndarray]:
    """A new device Buffer of NBYTES random bytes at device address ``ptr`` (just freed):
    allocations that land elsewhere are held until one lands there."""
    held = []
    for _ in range(32):
        buf, host = device_random(rng, NBYTES)
        if _ptr(buf) == ptr:
            return buf, host
        held.append(buf)
    pytest.fail(f"the driver never gave address {ptr:#x} again in 32 allocations")


def test_unregistered_device_memory_moves_by_cuda_ipc_between_processes(
    server: Engine, spawn: Callable[..., Peer], rng: np.random.Generator, seed: int
) -> None:
    peer, ep, descriptor = connect(server, spawn, seed)
    with ep:
        # WRITE from, then READ into, device memory this process never registered
        src, host = device_random(rng, NBYTES)
        ep.write(src, descriptor, timeout=60)
        peer.put("crc")
        assert peer.get() == crc(host)
        back = Buffer.empty(NBYTES, np.uint8, device="cuda:0")
        ep.read(back, descriptor, offset=3, remote_offset=5, nbytes=MiB, timeout=60)
        assert crc(back.copy_to_host()[3 : 3 + MiB]) == crc(host[5 : 5 + MiB])
        # a message each way, both ends unregistered
        peer.put(("recv_plain", NBYTES))
        ep.send(src, timeout=60)
        assert peer.get() == crc(host)
        out = Buffer.empty(NBYTES, np.uint8, device="cuda:0")
        peer.put("send_plain")
        ep.recv(out, timeout=60)
        assert peer.get() == "sent"
        assert crc(out.copy_to_host()) == crc(make_array(seed, NBYTES))
        # every byte went GPU to GPU, none through the staging slabs
        moved = 3 * NBYTES + MiB
        assert ep.info["cuda_ipc_bytes"] == moved
        assert staged_messages(server) == 0
        assert "cuda_ipc_export_off" not in ep.info
        # one export per allocation, reused: src was exported once for the WRITE and the send
        exports = server._exports
        assert (len(exports), exports.misses, exports.hits) == (3, 3, 1)
        peer.put("info")
        info = peer.get()
        assert info["cuda_ipc_bytes"] == moved
        assert info["cuda_ipc_opened"] == 2  # src and back; out was granted, the peer pushed
        peer.put("stop")
    assert peer.join() == 0


def test_a_freed_allocation_is_not_served_by_its_old_export(
    server: Engine, spawn: Callable[..., Peer], rng: np.random.Generator, seed: int
) -> None:
    """Free an exported allocation and make another of the same size at its address: the
    export cache sees another buffer id and exports the new one (the old entry is dropped),
    and the peer closes its mapping of the old allocation before it opens the new one."""
    peer, ep, descriptor = connect(server, spawn, seed)
    with ep:
        first, first_host = device_random(rng, NBYTES)
        ep.write(first, descriptor, timeout=60)
        peer.put("crc")
        assert peer.get() == crc(first_host)
        address = _ptr(first)
        del first  # freed: its export stays cached, keyed by (address, bytes)
        second, second_host = _realloc_at(address, rng)
        assert crc(second_host) != crc(first_host)
        ep.write(second, descriptor, timeout=60)
        peer.put("crc")
        assert peer.get() == crc(second_host)
        exports = server._exports
        assert (len(exports), exports.replaced, exports.misses, exports.hits) == (1, 1, 2, 0)
        peer.put("info")
        info = peer.get()
        assert info["cuda_ipc_opened"] == 1  # the new allocation only
        assert info["cuda_ipc_closed_stale"] == 1  # the old mapping, closed
        # READ into it as well: the export of the new allocation is reused
        ep.read(second, descriptor, timeout=60)
        assert crc(second.copy_to_host()) == crc(second_host)
        assert exports.hits == 1
        peer.put("stop")
    assert peer.join() == 0


def test_peer_keeps_a_bounded_number_of_mappings(
    server: Engine, spawn: Callable[..., Peer], rng: np.random.Generator, seed: int
) -> None:
    """WRITEs from more live allocations than a connection keeps mapped by IPC handle
    (kMaxIpcMappings, 128): the peer closes the least recently used, and the bytes stay exact."""
    peer, ep, descriptor = connect(server, spawn, seed)
    with ep:
        expected = make_array(seed, NBYTES)
        held = []
        for i in range(130):
            src, host = device_random(rng, 4096)
            held.append(src)  # alive: 130 distinct allocations
            ep.write(src, descriptor, remote_offset=i * 4096, timeout=60)
            expected[i * 4096 : (i + 1) * 4096] = host
        peer.put("crc")
        assert peer.get() == crc(expected)
        peer.put("info")
        info = peer.get()
        assert (info["cuda_ipc_opened"], info["cuda_ipc_closed_stale"]) == (128, 2)
        assert ep.info["cuda_ipc_bytes"] == 130 * 4096
        peer.put("stop")
    assert peer.join() == 0


def test_unregistered_vmm_memory_is_exported_as_a_posix_fd(
    server: Engine, spawn: Callable[..., Peer], rng: np.random.Generator, seed: int
) -> None:
    """Unregistered memory of the VMM API: its mapped range is exported on the fly as a POSIX
    fd (sent to the peer once), as a registration of it would be."""
    src, dst, host = vmm_source_and_target(rng)
    peer, ep, descriptor = connect(server, spawn, seed)
    with ep:
        ep.write(src, descriptor, timeout=60)
        peer.put("crc")
        assert peer.get() == crc(host)
        ep.read(dst, descriptor, timeout=60)  # the peer pushes into our VMM memory
        out = cuda.array_view(dst, writable=False)
        assert out is not None
        assert crc(cuda.copy_to_host(out)) == crc(host)
        assert ep.info["cuda_ipc_bytes"] == 2 * NBYTES
        peer.put("info")
        assert peer.get()["cuda_ipc_opened"] == 2  # src and dst, each imported once
        peer.put("stop")
    assert peer.join() == 0


@pytest.mark.skipif(
    _core.available_transports().get("rdma", "") == "",
    reason="an RDMA device is active: transport='auto' runs over rdma (GPUDirect) here",
)
def test_auto_engines_export_unregistered_memory_on_their_shm_link(
    spawn: Callable[..., Peer],
    rng: np.random.Generator,
    seed: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An automatic engine over TCP exports through its shm companion, for its shm links."""
    monkeypatch.delenv("RDMAXFER_TRANSPORT", raising=False)
    with Engine("auto") as server:
        peer, ep, descriptor = connect(server, spawn, seed, transport="auto")
        with ep:
            assert ep.info["transport"] == "shm"
            src, host = device_random(rng, NBYTES)
            ep.write(src, descriptor, timeout=60)
            peer.put("crc")
            assert peer.get() == crc(host)
            out = Buffer.empty(NBYTES, np.uint8, device="cuda:0")
            peer.put("send_plain")
            ep.recv(out, timeout=60)
            assert peer.get() == "sent"
            assert crc(out.copy_to_host()) == crc(make_array(seed, NBYTES))
            assert ep.info["cuda_ipc_bytes"] == 2 * NBYTES
            assert staged_messages(server) == 0
            peer.put("stop")
        assert peer.join() == 0


def test_batch_of_unregistered_device_memory_between_two_engines(
    rng: np.random.Generator,
) -> None:
    """A batch names unregistered device memory on a shm connection (refused on TCP): each
    entry's allocation is exported; between engines of one process nothing is opened."""
    with Engine("shm") as server, Engine("shm") as client:
        port = server.listen("127.0.0.1", 0)
        with client.connect("127.0.0.1", port, timeout=10) as ep, server.accept(timeout=10) as peer:
            target = Buffer.empty(NBYTES, np.uint8, device="cuda:0")
            descriptor = server.register(target, "rw").descriptor()
            low, low_host = device_random(rng, MiB)
            high, high_host = device_random(rng, NBYTES - MiB)
            assert ep.write_batch([(low, descriptor, 0), (high, descriptor, MiB)], timeout=60).ok
            assert crc(target.copy_to_host()) == crc(np.concatenate([low_host, high_host]))
            back = Buffer.empty(NBYTES - MiB, np.uint8, device="cuda:0")
            assert ep.read_batch([(back, descriptor, MiB)], timeout=60).ok
            assert crc(back.copy_to_host()) == crc(high_host)
            assert ep.info["cuda_ipc_bytes"] == 2 * NBYTES - MiB
            assert peer.info["cuda_ipc_opened"] == 0
            assert len(client._exports) == 3
            exported = [r for r in client._regions.values() if r.temporary]
            assert len(exported) == 3
    # closing the engine drops the exports and ends their registrations
    assert len(client._exports) == 0
    assert not any(r.registered for r in exported)


def test_tcp_connection_still_stages_unregistered_device_memory(
    rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RDMAXFER_TRANSPORT", raising=False)
    with Engine("auto") as auto, Engine("tcp") as forced:
        port = forced.listen("127.0.0.1", 0)
        with auto.connect("127.0.0.1", port, timeout=10) as ep, forced.accept(timeout=10) as peer:
            assert ep.info["transport"] == "tcp"
            target = np.zeros(NBYTES, np.uint8)
            descriptor = forced.register(target).descriptor()
            src, host = device_random(rng, NBYTES)
            ep.write(src, descriptor, timeout=60)
            assert crc(target) == crc(host)
            before = staged_messages(auto)
            sending = ep.post_send(src)
            assert crc(peer.recv(timeout=60)) == crc(host)
            sending.wait(60)
            assert staged_messages(auto) == before + 1
            with pytest.raises(InvalidArgumentError, match=r"staged GPU memory cannot be batched"):
                ep.write_batch([(src, descriptor, 0)], timeout=30)
            assert len(auto._exports) == 0


@pytest.mark.parametrize(
    ("variable", "why"),
    [
        ("RDMAXFER_CUDA_STANDIN_NO_BUFFER_ID", "does not report CU_POINTER_ATTRIBUTE_BUFFER_ID"),
        ("RDMAXFER_CUDA_IPC_EXPORTS", "RDMAXFER_CUDA_IPC_EXPORTS=0"),
    ],
)
def test_unregistered_memory_is_staged_without_buffer_ids_or_exports(
    rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch, variable: str, why: str
) -> None:
    """A driver without CU_POINTER_ATTRIBUTE_BUFFER_ID (an export could not be told from a
    later allocation at its address), or RDMAXFER_CUDA_IPC_EXPORTS=0: unregistered memory is
    staged on shm, and the endpoint says why; registered memory still moves by CUDA IPC."""
    if variable.startswith("RDMAXFER_CUDA_STANDIN") and "cuda_standin" not in os.environ.get(
        "RDMAXFER_CUDA_LIBRARY", ""
    ):
        pytest.skip("the stand-in driver is made to withhold the buffer id")
    monkeypatch.setenv(variable, "1" if "STANDIN" in variable else "0")
    with Engine("shm") as server, Engine("shm") as client:
        port = server.listen("127.0.0.1", 0)
        with client.connect("127.0.0.1", port, timeout=10) as ep, server.accept(timeout=10):
            target = Buffer.empty(NBYTES, np.uint8, device="cuda:0")
            descriptor = server.register(target, "rw").descriptor()
            src, host = device_random(rng, NBYTES)
            ep.write(src, descriptor, timeout=60)
            assert crc(target.copy_to_host()) == crc(host)
            assert ep.info["cuda_ipc_bytes"] == 0
            assert why in str(ep.info["cuda_ipc_export_off"])
            assert len(client._exports) == 0
            client.register(src, "r")
            ep.write(src, descriptor, timeout=60)
            assert ep.info["cuda_ipc_bytes"] == NBYTES
