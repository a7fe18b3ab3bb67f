"""GPU messages over verbs (rxe0 -> rxe1) with the stand-in CUDA driver (issue 16 items 2, 3):
messages longer than a whole bounce pool staged window by window through at most three 64 KiB
slabs at each end; and, where both ends' device memory is registered for the NIC, moved by
rendezvous WRITE between the registrations with no slab and no copy (GPUDirect).

The GPUDirect tests pretend nvidia-peermem on a hardware NIC: the stand-in maps its device
memory so that rxe can register it (RDMAXFER_CUDA_STANDIN_PEERMEM=1), and the engines' GPUDirect
preflight answers "peermem" (rxe is software RDMA: the real preflight says staging, see
test_rdma_gpu.py). Everything else is the real path: ``Engine.register`` of device memory by
peermem, the rendezvous, the NIC's WRITE into the registered device memory."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import numpy as np
import pytest

import rdmaxfer
from _gpu_data import crc as _crc
from _gpu_data import device_random as _device
from rdmaxfer import Buffer, Engine, _core, cuda
from rdmaxfer.errors import RdmaxferError
from rdmaxfer.gpu import gpudirect
from rdmaxfer.memory import meta as _meta

from .rdma_helpers import WAIT_S, api_pair

pytestmark = [
    pytest.mark.rdma,
    pytest.mark.gpu,
    pytest.mark.skipif(not cuda.available(), reason=cuda.unavailable_reason() or "no GPU"),
]

SECRET = "rxe-gpu-messages"
SLAB = 1 << 16
POOL = 3 * SLAB

Engines = tuple[Engine, Engine, rdmaxfer.Endpoint, rdmaxfer.Endpoint]


def _host_of(x: object) -> np.ndarray:
    return x.copy_to_host() if isinstance(x, Buffer) else np.asarray(x)


@pytest.fixture
def engines(monkeypatch: pytest.MonkeyPatch) -> Iterator[Engines]:
    """Two verbs engines, each staging through a pool of three 64 KiB slabs."""
    monkeypatch.setenv("RDMAXFER_BOUNCE_SLAB_BYTES", str(SLAB))
    monkeypatch.setenv("RDMAXFER_BOUNCE_POOL_BYTES", str(POOL))
    with api_pair(SECRET) as engines:
        yield engines


def _bounded(stats: dict[str, int]) -> None:
    assert stats["max_slabs"] == 3 and 1 <= stats["peak_slabs"] <= 3, stats
    assert stats["free"] == stats["slabs"] and stats["stranded"] == 0, stats


@pytest.mark.parametrize("route", ["gpu->gpu", "gpu->host", "host->gpu"])
def test_messages_larger_than_the_pool_over_verbs(
    engines: Engines, rng: np.random.Generator, route: str
) -> None:
    server, client, a, b = engines
    size = 1_000_003  # 16 windows of 64 KiB, more than five whole pools
    src_kind, dst_kind = route.split("->")
    if src_kind == "gpu":
        src, host = _device(rng, size)
    else:
        host = rng.integers(0, 256, size, dtype=np.uint8)
        src = host
    sent = a.post_send(src)
    got = b.recv(device="cuda:0" if dst_kind == "gpu" else None, timeout=WAIT_S)
    sent.wait(WAIT_S)
    assert _crc(_host_of(got)) == _crc(host)
    staged = ([client] if src_kind == "gpu" else []) + ([server] if dst_kind == "gpu" else [])
    for engine in staged:
        stager = engine.stager(0)
        _bounded(stager.pool_stats())
        stats = stager.stats()
        assert stats["messages_windowed"] == 1 and stats["messages_direct"] == 0, stats
        if engine is server:  # certain on the receiver; a sender's overlap depends on the wire
            assert stats["overlapped_copies"] >= 1, stats


def test_a_receiver_dying_mid_message_frees_the_slabs_over_verbs(
    engines: Engines, rng: np.random.Generator
) -> None:
    _, client, a, b = engines
    stager = _core.Stager(client.core, _core.HostCopier(delay_us=5_000))
    try:
        device = rng.integers(0, 256, 48 * SLAB, dtype=np.uint8)
        meta = _meta.encode(device.dtype, device.shape)
        sent = stager.post_send(a.core, device.ctypes.data, device.size, meta, WAIT_S)
        received = b.post_recv()
        # Mid-message: the stager holds its slabs (48 windows of 5 ms copy each are left to
        # go), not a count of overlapped copies, which hangs on how fast the wire acknowledges.
        end = time.monotonic() + WAIT_S
        while stager.pool_stats()["acquires"] < 1:
            assert time.monotonic() < end, stager.pool_stats()
            time.sleep(0.005)
        time.sleep(0.02)
        assert stager.active == 1, stager.stats()
        b.abort("the receiver died")
        assert sent.wait(WAIT_S)
        with pytest.raises(RdmaxferError):
            sent.check()
        with pytest.raises(RdmaxferError):
            received.wait(WAIT_S)
        end = time.monotonic() + WAIT_S
        while stager.active or stager.pool_stats()["free"] != stager.pool_stats()["slabs"]:
            assert time.monotonic() < end, stager.pool_stats()
            time.sleep(0.01)
        _bounded(stager.pool_stats())
    finally:
        stager.close()


@pytest.fixture
def peermem(monkeypatch: pytest.MonkeyPatch) -> None:
    if "cuda_standin" not in os.environ.get("RDMAXFER_CUDA_LIBRARY", ""):
        pytest.skip("pretends nvidia-peermem through the stand-in driver (not loaded here)")
    monkeypatch.setenv("RDMAXFER_CUDA_STANDIN_PEERMEM", "1")
    pretend = gpudirect.GpuDirectPreflight(
        "peermem", {"dmabuf": "pretended away", "peermem": "", "staging": ""}
    )
    monkeypatch.setattr(gpudirect, "preflight", lambda *args, **kwargs: pretend)


@pytest.mark.parametrize("size", [100, 65_537, 1_000_003])
def test_gpudirect_messages_between_registered_gpu_memory(
    peermem: None, engines: Engines, rng: np.random.Generator, size: int
) -> None:
    """No slab at either end, whatever the size (a small one too: never EAGER from device
    memory, which the CPU cannot read on a real GPU)."""
    server, client, a, b = engines
    src, host = _device(rng, size)
    out = Buffer.empty(size, np.uint8, device="cuda:0")
    client.register(src, "r")
    server.register(out, "w")
    sent = a.post_send(src)
    assert b.recv(out=out, timeout=WAIT_S) is out
    sent.wait(WAIT_S)
    assert _crc(out.copy_to_host()) == _crc(host)
    for engine in (client, server):
        stager = engine.stager(0)
        assert stager.stats()["messages_direct"] == 1, stager.stats()
        assert stager.pool_stats()["acquires"] == 0  # no bounce slab was taken


def test_gpudirect_meets_staging_at_the_other_end(
    peermem: None, engines: Engines, rng: np.random.Generator
) -> None:
    """One end registered, the other not: the registered end moves its side by GPUDirect, the
    other stages (in windows when longer than a slab); a small message from host memory comes
    EAGER and lands through a slab."""
    server, client, a, b = engines
    size = 1_000_003
    staged_src, host = _device(rng, size)  # not registered: staged, in windows
    out = Buffer.empty(size, np.uint8, device="cuda:0")
    server.register(out, "w")
    sent = a.post_send(staged_src)
    assert b.recv(out=out, timeout=WAIT_S) is out
    sent.wait(WAIT_S)
    assert _crc(out.copy_to_host()) == _crc(host)
    assert client.stager(0).stats()["messages_windowed"] == 1
    assert server.stager(0).stats()["messages_direct"] == 1

    direct_src, host2 = _device(rng, size)
    client.register(direct_src, "r")
    sent = a.post_send(direct_src)
    got = b.recv(device="cuda:0", timeout=WAIT_S)  # a new, unregistered array: staged
    sent.wait(WAIT_S)
    assert _crc(got.copy_to_host()) == _crc(host2)
    assert client.stager(0).stats()["messages_direct"] == 1
    assert server.stager(0).stats()["messages_windowed"] == 1

    small = rng.integers(0, 256, 100, dtype=np.uint8)
    small_out = Buffer.empty(100, np.uint8, device="cuda:0")
    server.register(small_out, "w")
    sent = a.post_send(small)  # EAGER: its bytes arrive in a control message
    assert b.recv(out=small_out, timeout=WAIT_S) is small_out
    sent.wait(WAIT_S)
    assert _crc(small_out.copy_to_host()) == _crc(small)
    stats = server.stager(0).stats()
    assert stats["messages_whole"] == 1 and stats["messages_direct"] == 1, stats
