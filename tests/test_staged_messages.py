"""GPU messages longer than a bounce slab (issue 16 item 3): staged window by window
(csrc/protocol/message_windows.h), each window's device copy overlapped with another window on
the wire, through a bounded number of slabs at each end whatever the message's size.

Over TCP and shm between two engines of this process, with the stand-in CUDA driver
(tests/_cuda_standin.py) for the device memory, or ``_core.HostCopier`` standing in for the
device copies where a test injects delays. The pools are 64 KiB slabs, three of them (192 KiB),
and the messages are larger than a whole pool. Every message is random bytes compared whole.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np
import pytest

from _common import MARGIN_S, Pair
from _gpu_data import crc as _crc
from _gpu_data import device_random as _device
from rdmaxfer import Buffer, _core
from rdmaxfer.errors import RdmaxferError
from rdmaxfer.memory import cuda
from rdmaxfer.memory import meta as _meta

SLAB = 1 << 16
POOL = 3 * SLAB


def _random(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.integers(0, 256, n, dtype=np.uint8)


@pytest.fixture
def small_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pools of three 64 KiB slabs for the engines of the test (read at their first staging),
    and no CUDA IPC exports of unregistered GPU memory, so that shm connections stage it too."""
    monkeypatch.setenv("RDMAXFER_BOUNCE_SLAB_BYTES", str(SLAB))
    monkeypatch.setenv("RDMAXFER_BOUNCE_POOL_BYTES", str(POOL))
    monkeypatch.setenv("RDMAXFER_CUDA_IPC_EXPORTS", "0")


def _bounded(stats: dict[str, int]) -> None:
    """The pool never held more than its bound, and every slab is back."""
    assert stats["slab_bytes"] == SLAB and stats["max_slabs"] == 3
    assert 1 <= stats["peak_slabs"] <= 3 and stats["allocations"] <= 3
    assert stats["free"] == stats["slabs"] and stats["stranded"] == 0


def _host_of(x: object) -> np.ndarray:
    """A received array's bytes on the host: a device Buffer's, a CuPy array's (which refuses
    np.asarray: received GPU messages are CuPy arrays where CuPy is installed), a host array."""
    if isinstance(x, Buffer):
        return x.copy_to_host()
    get = getattr(x, "get", None)
    return np.asarray(get() if callable(get) else x)


@pytest.mark.parametrize("size", [POOL + 1, 1_000_003, 4 << 20])
@pytest.mark.parametrize("route", ["gpu->gpu", "gpu->host", "host->gpu"])
@pytest.mark.gpu
@pytest.mark.skipif(not cuda.available(), reason=cuda.unavailable_reason() or "no GPU")
def test_messages_larger_than_the_pool(
    small_pool: None, pair: Pair, rng: np.random.Generator, route: str, size: int
) -> None:
    """Through the Endpoint API: the message crosses in windows of one slab, each end holding
    at most its three slabs; the bytes arrive exact, in order with the messages around it."""
    src_gpu, dst_gpu = route.split("->")
    before = _random(rng, 1000)  # small messages on either side keep their order
    after = _random(rng, 3000)
    if src_gpu == "gpu":
        src, host = _device(rng, size)
    else:
        host = _random(rng, size)
        src = host
    sends = [pair.a.post_send(before), pair.a.post_send(src), pair.a.post_send(after)]
    assert _crc(pair.b.recv(timeout=30)) == _crc(before)
    got = pair.b.recv(device="cuda:0" if dst_gpu == "gpu" else None, timeout=60)
    assert _crc(pair.b.recv(timeout=30)) == _crc(after)
    for sent in sends:
        sent.wait(60)
    assert _crc(_host_of(got)) == _crc(host)
    for engine in ([pair.client] if src_gpu == "gpu" else []) + (
        [pair.server] if dst_gpu == "gpu" else []
    ):
        stager = engine.stager(0)
        _bounded(stager.pool_stats())
        stats = stager.stats()
        assert stats["messages_windowed"] == 1 and stats["messages_whole"] == 0, stats
        if size >= 1_000_003 and engine is pair.server:
            # 16 windows or more: the receiver grants every free slab a window before any lands,
            # so its first H2D copy starts while the next windows are still on the wire. (A
            # sender's overlap depends on how fast the wire acknowledges, so it is not asserted.)
            assert stats["overlapped_copies"] >= 1, stats


@pytest.fixture
def slow_stagers(small_pool: None, pair: Pair) -> Iterator[tuple[_core.Stager, _core.Stager]]:
    """A Stager on each engine whose "device" copies take 20 ms each."""
    a = _core.Stager(pair.client.core, _core.HostCopier(delay_us=20_000))
    b = _core.Stager(pair.server.core, _core.HostCopier(delay_us=20_000))
    yield a, b
    a.close()
    b.close()


def _header(pair: Pair) -> tuple[int, int]:
    header = pair.b.core.post_recv_header()
    assert header.wait(30)
    msg_id, length, _ = header.message()
    return msg_id, length


def test_windows_overlap_copies_with_the_wire_at_both_ends(
    pair: Pair, slow_stagers: tuple[_core.Stager, _core.Stager], rng: np.random.Generator
) -> None:
    """Staged sender to staged receiver, 24 windows: device copies start while other windows
    of the same message are on the wire, at both ends."""
    a, b = slow_stagers
    device = _random(rng, 24 * SLAB - 5)
    sent = a.post_send(
        pair.a.core, device.ctypes.data, device.size, _meta.encode(device.dtype, device.shape), 30
    )
    msg_id, length = _header(pair)
    out = np.zeros(length, np.uint8)
    got = b.post_recv(pair.b.core, msg_id, out.ctypes.data, length, 30)
    assert got.wait(60) and sent.wait(60)
    got.check()
    sent.check()
    np.testing.assert_array_equal(out, device)
    for stager in (a, b):
        stats = stager.stats()
        assert stats["messages_windowed"] == 1
        assert stats["overlapped_copies"] >= 2, stats
        _bounded(stager.pool_stats())


@pytest.mark.parametrize("slots", [1, 2, 3])
@pytest.mark.parametrize("chunk", [SLAB, 40_000])
def test_chunk_and_slots_choose_the_windows(
    small_pool: None, pair: Pair, rng: np.random.Generator, slots: int, chunk: int
) -> None:
    """The sender's chunk is its window; a receiver with larger slabs follows it, a sender that
    stages through one slab still gets every window (no overlap then, and none needed)."""
    a = _core.Stager(pair.client.core, _core.HostCopier())
    b = _core.Stager(pair.server.core, _core.HostCopier())
    try:
        device = _random(rng, 7 * chunk + 3)
        meta = _meta.encode(device.dtype, device.shape)
        sent = a.post_send(pair.a.core, device.ctypes.data, device.size, meta, 30, 0, chunk, slots)
        msg_id, length = _header(pair)
        out = np.zeros(length, np.uint8)
        got = b.post_recv(pair.b.core, msg_id, out.ctypes.data, length, 30, 0, slots)
        assert got.wait(30) and sent.wait(30)
        got.check()
        sent.check()
        np.testing.assert_array_equal(out, device)
        assert a.pool_stats()["peak_slabs"] == slots
        assert b.pool_stats()["peak_slabs"] == slots
    finally:
        a.close()
        b.close()


def test_a_receiver_dying_mid_message_frees_the_senders_slabs(
    pair: Pair, slow_stagers: tuple[_core.Stager, _core.Stager], rng: np.random.Generator
) -> None:
    a, _ = slow_stagers
    device = _random(rng, 64 * SLAB)
    meta = _meta.encode(device.dtype, device.shape)
    sent = a.post_send(pair.a.core, device.ctypes.data, device.size, meta, 30)
    received = pair.b.post_recv()  # a host receiver: granted window by window
    _wait_mid_message(a)
    pair.b.abort("the receiver died")
    assert sent.wait(MARGIN_S)
    with pytest.raises(RdmaxferError):
        sent.check()
    with pytest.raises(RdmaxferError):
        received.wait(MARGIN_S)
    _wait_slabs_back(a)


def test_a_sender_dying_mid_message_frees_the_receivers_slabs(
    pair: Pair, slow_stagers: tuple[_core.Stager, _core.Stager], rng: np.random.Generator
) -> None:
    _, b = slow_stagers
    src = _random(rng, 64 * SLAB)
    sent = pair.a.post_send(src)  # a plain sender: writes each window the receiver grants
    msg_id, length = _header(pair)
    out = np.zeros(length, np.uint8)
    got = b.post_recv(pair.b.core, msg_id, out.ctypes.data, length, 30)
    _wait_mid_message(b)
    pair.a.abort("the sender died")
    assert got.wait(MARGIN_S)
    with pytest.raises(RdmaxferError):
        got.check()
    with pytest.raises(RdmaxferError):
        sent.wait(MARGIN_S)
    _wait_slabs_back(b)


def _wait_mid_message(stager: _core.Stager) -> None:
    """Until the stager's message holds its slabs and a few of its 64 windows (20 ms of copy
    each) moved: well inside the message."""
    end = time.monotonic() + 30
    while stager.pool_stats()["acquires"] < 1:
        assert time.monotonic() < end, stager.pool_stats()
        time.sleep(0.005)
    time.sleep(0.1)
    assert stager.active == 1


def _wait_slabs_back(stager: _core.Stager) -> None:
    end = time.monotonic() + MARGIN_S
    while stager.active or stager.pool_stats()["free"] != stager.pool_stats()["slabs"]:
        assert time.monotonic() < end, stager.pool_stats()
        time.sleep(0.01)
    _bounded(stager.pool_stats())
