"""The bounce pool of an engine's memory domain (csrc/transport/bounce_pool.h) and the staging
workers (csrc/protocol/staging.h), over TCP with host memory standing in for the device.

Slabs are made once and reused, the pool's total is bounded (``RDMAXFER_BOUNCE_POOL_BYTES``,
slabs of ``RDMAXFER_BOUNCE_SLAB_BYTES``; read when the engine stages its first transfer), a
transfer that finds every slab busy waits within its timeout and then fails with
TransferTimeoutError, and the operations run on a few reused worker threads. Every transfer
moves random bytes and compares them whole.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Iterator

import numpy as np
import pytest

from _common import MARGIN_S, Pair
from rdmaxfer import _core
from rdmaxfer.errors import InvalidArgumentError, TransferTimeoutError
from rdmaxfer.memory import meta as _meta

SLAB = 1 << 16


def _random(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.integers(0, 256, n, dtype=np.uint8)


@pytest.fixture
def small_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pool of two 64 KiB slabs for the engines of the test."""
    monkeypatch.setenv("RDMAXFER_BOUNCE_SLAB_BYTES", str(SLAB))
    monkeypatch.setenv("RDMAXFER_BOUNCE_POOL_BYTES", str(2 * SLAB))


@pytest.fixture
def stager(pair: Pair) -> Iterator[_core.Stager]:
    s = _core.Stager(pair.client.core, _core.HostCopier(delay_us=500))
    yield s
    s.close()


def _write(
    stager: _core.Stager,
    pair: Pair,
    src: np.ndarray,
    desc: _core.Descriptor,
    offset: int = 0,
    slots: int = 2,
    timeout: float = 30.0,
) -> _core.Request:
    return stager.post_write(
        pair.a.core, src.ctypes.data, src.size, desc, offset, SLAB, slots, timeout
    )


def test_slabs_are_made_once_and_reused(
    small_pool: None, pair: Pair, stager: _core.Stager, rng: np.random.Generator
) -> None:
    remote = np.zeros(5 * SLAB + 17, np.uint8)
    region = pair.server.register(remote, "rw")
    device = _random(rng, remote.size)
    req = _write(stager, pair, device, region.descriptor(), 0, 2)
    assert req.wait(30)
    req.check()
    assert zlib.crc32(remote) == zlib.crc32(device)
    first = stager.pool_stats()
    assert first["slab_bytes"] == SLAB and first["max_slabs"] == 2
    assert first["allocations"] == 2 and first["slabs"] == 2 and first["free"] == 2

    # A read and a two-sided send later: the same two slabs, nothing allocated.
    back = np.zeros(remote.size, np.uint8)
    req = stager.post_read(
        pair.a.core, back.ctypes.data, back.size, region.descriptor(), 0, SLAB, 2, 30
    )
    assert req.wait(30)
    req.check()
    np.testing.assert_array_equal(back, device)
    msg = _random(rng, SLAB - 5)
    sent = stager.post_send(
        pair.a.core, msg.ctypes.data, msg.size, _meta.encode(msg.dtype, msg.shape), 30
    )
    got = pair.b.recv(timeout=30)
    assert sent.wait(30)
    sent.check()
    np.testing.assert_array_equal(got, msg)
    after = stager.pool_stats()
    assert after["allocations"] == 2 and after["slabs"] == 2 and after["free"] == 2
    assert after["acquires"] == first["acquires"] + 2


def test_transfers_beyond_the_pool_wait_and_complete(
    small_pool: None, pair: Pair, stager: _core.Stager, rng: np.random.Generator
) -> None:
    """Six concurrent writes that want two slabs each share a pool of two: they take turns."""
    n, size = 6, 3 * SLAB + 1234
    remote = np.zeros(n * size, np.uint8)
    region = pair.server.register(remote, "rw")
    sources = [_random(rng, size) for _ in range(n)]
    reqs = [_write(stager, pair, s, region.descriptor(), i * size) for i, s in enumerate(sources)]
    for req in reqs:
        assert req.wait(60)
        req.check()
    np.testing.assert_array_equal(remote, np.concatenate(sources))
    stats = stager.pool_stats()
    assert stats["allocations"] == 2 and stats["slabs"] == 2
    assert stats["waits"] >= 1 and stats["timeouts"] == 0
    assert stats["acquires"] == n


def test_a_wait_for_a_slab_is_bounded_by_the_timeout(
    monkeypatch: pytest.MonkeyPatch, pair: Pair, stager: _core.Stager, rng: np.random.Generator
) -> None:
    monkeypatch.setenv("RDMAXFER_BOUNCE_SLAB_BYTES", str(SLAB))
    monkeypatch.setenv("RDMAXFER_BOUNCE_POOL_BYTES", str(SLAB))  # one slab
    # A send holds the only slab until the peer receives it.
    msg = _random(rng, 40_000)
    held = stager.post_send(
        pair.a.core, msg.ctypes.data, msg.size, _meta.encode(msg.dtype, msg.shape), 30
    )
    end = time.monotonic() + 30  # its worker takes the slab before the write is posted
    while stager.pool_stats()["acquires"] < 1:
        assert time.monotonic() < end, stager.pool_stats()
        time.sleep(0.005)
    remote = np.zeros(SLAB, np.uint8)
    region = pair.server.register(remote, "rw")
    device = _random(rng, remote.size)
    start = time.monotonic()
    req = _write(stager, pair, device, region.descriptor(), 0, 1, timeout=0.5)
    assert req.wait(0.5 + MARGIN_S)
    with pytest.raises(TransferTimeoutError) as info:
        req.check()
    assert time.monotonic() - start < 0.5 + MARGIN_S
    text = str(info.value)
    assert "no bounce slab came free for 0.5 s" in text
    assert "1 slabs of 0.1 MiB" in text and "RDMAXFER_BOUNCE_POOL_BYTES" in text
    assert not remote.any()
    assert stager.pool_stats()["timeouts"] == 1

    # The engine is still usable: the held send completes, its slab serves the next write.
    got = pair.b.recv(timeout=30)
    assert held.wait(30)
    held.check()
    np.testing.assert_array_equal(got, msg)
    req = _write(stager, pair, device, region.descriptor(), 0, 1)
    assert req.wait(30)
    req.check()
    np.testing.assert_array_equal(remote, device)
    assert stager.pool_stats()["allocations"] == 1


def test_a_bad_pool_size_is_refused(
    monkeypatch: pytest.MonkeyPatch, pair: Pair, stager: _core.Stager
) -> None:
    monkeypatch.setenv("RDMAXFER_BOUNCE_POOL_BYTES", "lots")
    remote = np.zeros(4096, np.uint8)
    region = pair.server.register(remote, "rw")
    req = _write(stager, pair, remote, region.descriptor(), 0, 1)
    assert req.wait(30)
    with pytest.raises(InvalidArgumentError, match="RDMAXFER_BOUNCE_POOL_BYTES='lots'"):
        req.check()


def test_operations_share_a_few_worker_threads(pair: Pair, rng: np.random.Generator) -> None:
    """No thread per operation: sequential operations reuse one worker, and 24 slow ones at
    once run on at most 8 (Stager.kMaxWorkers), queued behind each other."""
    stager = _core.Stager(pair.client.core, _core.HostCopier(delay_us=20_000))
    try:
        n, size = 24, 9_000
        remote = np.zeros(n * size, np.uint8)
        region = pair.server.register(remote, "rw")
        for _ in range(3):
            device = _random(rng, size)
            req = _write(stager, pair, device, region.descriptor(), 0, 1)
            assert req.wait(30)
            req.check()
            np.testing.assert_array_equal(remote[:size], device)
        assert stager.workers == 1

        sources = [_random(rng, size) for _ in range(n)]
        reqs = [
            _write(stager, pair, s, region.descriptor(), i * size, 1) for i, s in enumerate(sources)
        ]
        for req in reqs:
            assert req.wait(60)
            req.check()
        np.testing.assert_array_equal(remote, np.concatenate(sources))
        assert stager.workers == 8
        assert stager.active == 0
    finally:
        stager.close()
