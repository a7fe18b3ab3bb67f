"""The staging pipeline (csrc/protocol/staging.*) with host memory standing in for the device.

``_core.HostCopier`` does the "device" copies as memcpy on a worker thread (in order, like a
CUDA stream); the wire is the real TCP transport between two engines over loopback. Every test
moves random bytes and compares them whole.
"""

from __future__ import annotations

import time
import zlib

import numpy as np
import pytest

from _common import MARGIN_S, Pair
from rdmaxfer import _core
from rdmaxfer.errors import (
    InvalidArgumentError,
    RemoteAccessError,
    TransferTimeoutError,
    TransportError,
)
from rdmaxfer.memory import meta as _meta


def _random(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.integers(0, 256, n, dtype=np.uint8)


@pytest.fixture
def stager(pair: Pair) -> _core.Stager:
    s = _core.Stager(pair.client.core, _core.HostCopier())
    yield s
    s.close()


@pytest.mark.parametrize("slots", [1, 2, 3])
@pytest.mark.parametrize(
    ("size", "chunk"),
    [(1, 4096), (4096, 4096), (1_000_003, 65536), (3 * 65536, 65536), (5_000_001, 1 << 20)],
)
def test_staged_write_then_read(
    pair: Pair, stager: _core.Stager, rng: np.random.Generator, size: int, chunk: int, slots: int
) -> None:
    remote = np.zeros(size + 64, np.uint8)
    region = pair.server.register(remote, "rw")
    device = _random(rng, size)  # the "device" memory
    req = stager.post_write(
        pair.a.core, device.ctypes.data, size, region.descriptor(), 32, chunk, slots, 30.0
    )
    assert req.wait(30)
    req.check()
    assert zlib.crc32(remote[32 : 32 + size]) == zlib.crc32(device)
    assert not remote[:32].any() and not remote[32 + size :].any()  # nothing outside the range

    back = np.zeros(size, np.uint8)
    req = stager.post_read(
        pair.a.core, back.ctypes.data, size, region.descriptor(), 32, chunk, slots, 30.0
    )
    assert req.wait(30)
    req.check()
    np.testing.assert_array_equal(back, device)


def test_bounce_buffers_are_pooled(
    pair: Pair, stager: _core.Stager, rng: np.random.Generator
) -> None:
    remote = np.zeros(1 << 20, np.uint8)
    region = pair.server.register(remote, "rw")
    for _ in range(3):
        device = _random(rng, remote.size)
        req = stager.post_write(
            pair.a.core, device.ctypes.data, device.size, region.descriptor(), 0, 1 << 18, 3, 30
        )
        assert req.wait(30)
        req.check()
        np.testing.assert_array_equal(remote, device)
    stats = stager.pool_stats()  # three slabs of the engine's bounce pool, reused
    assert stats["allocations"] == 3 and stats["free"] == 3 and stats["acquires"] == 3
    assert stats["slab_bytes"] == 8 << 20  # the default, RDMAXFER_BOUNCE_SLAB_BYTES
    assert stager.active == 0


def test_many_concurrent_operations(
    pair: Pair, stager: _core.Stager, rng: np.random.Generator
) -> None:
    n, size = 6, 300_007
    remote = np.zeros(n * size, np.uint8)
    region = pair.server.register(remote, "rw")
    sources = [_random(rng, size) for _ in range(n)]
    reqs = [
        stager.post_write(
            pair.a.core, s.ctypes.data, size, region.descriptor(), i * size, 65536, 2, 30
        )
        for i, s in enumerate(sources)
    ]
    for req in reqs:
        assert req.wait(30)
        req.check()
    np.testing.assert_array_equal(remote, np.concatenate(sources))


def test_staged_send_to_a_plain_recv(
    pair: Pair, stager: _core.Stager, rng: np.random.Generator
) -> None:
    device = rng.standard_normal((123, 457)).astype(np.float32)
    meta = _meta.encode(device.dtype, device.shape)
    req = stager.post_send(pair.a.core, device.ctypes.data, device.nbytes, meta, 30)
    got = pair.b.recv(timeout=30)  # an ordinary receiver: one message, dtype and shape
    assert req.wait(30)
    req.check()
    assert got.dtype == np.float32 and got.shape == (123, 457)
    np.testing.assert_array_equal(got, device)


def test_staged_recv_of_a_plain_send(
    pair: Pair, stager: _core.Stager, rng: np.random.Generator
) -> None:
    src = _random(rng, 2_345_679)
    sent = pair.b.post_send(src)
    header = pair.a.core.post_recv_header()
    assert header.wait(30)
    msg_id, length, _meta_bytes = header.message()
    assert length == src.nbytes
    device = np.zeros(length, np.uint8)
    req = stager.post_recv(pair.a.core, msg_id, device.ctypes.data, length, 30)
    assert req.wait(30)
    req.check()
    sent.wait(30)
    np.testing.assert_array_equal(device, src)


@pytest.mark.parametrize("fail_at", [0, 2, 5])
def test_a_failed_copy_fails_the_write(pair: Pair, rng: np.random.Generator, fail_at: int) -> None:
    stager = _core.Stager(pair.client.core, _core.HostCopier(fail_at=fail_at))
    try:
        remote = np.zeros(1 << 20, np.uint8)
        region = pair.server.register(remote, "rw")
        device = _random(rng, remote.size)
        req = stager.post_write(
            pair.a.core, device.ctypes.data, device.size, region.descriptor(), 0, 1 << 17, 3, 30
        )
        assert req.wait(30)
        with pytest.raises(TransportError, match=f"injected failure of copy #{fail_at}"):
            req.check()
        # The endpoint is still usable: a copy failure is not a wire failure.
        assert not pair.a.closed
        ok = stager.post_write(
            pair.a.core, device.ctypes.data, 4096, region.descriptor(), 0, 4096, 1, 30
        )
        assert ok.wait(30)
        ok.check()
        np.testing.assert_array_equal(remote[:4096], device[:4096])
    finally:
        stager.close()


def test_a_failed_copy_fails_the_read(pair: Pair, rng: np.random.Generator) -> None:
    stager = _core.Stager(pair.client.core, _core.HostCopier(fail_at=3))
    try:
        remote = _random(rng, 1 << 20)
        region = pair.server.register(remote, "rw")
        device = np.zeros(remote.size, np.uint8)
        req = stager.post_read(
            pair.a.core, device.ctypes.data, device.size, region.descriptor(), 0, 1 << 17, 2, 30
        )
        assert req.wait(30)
        with pytest.raises(TransportError, match="injected failure of copy #3"):
            req.check()
    finally:
        stager.close()


def test_a_hung_copy_times_out(pair: Pair, rng: np.random.Generator) -> None:
    stager = _core.Stager(pair.client.core, _core.HostCopier(hang_at=1))
    try:
        remote = np.zeros(1 << 20, np.uint8)
        region = pair.server.register(remote, "rw")
        device = _random(rng, remote.size)
        start = time.monotonic()
        req = stager.post_write(
            pair.a.core, device.ctypes.data, device.size, region.descriptor(), 0, 1 << 17, 2, 0.5
        )
        assert req.wait(0.5 + MARGIN_S)
        with pytest.raises(TransferTimeoutError, match=r"made no progress for 0\.5 s"):
            req.check()
        assert time.monotonic() - start < 0.5 + MARGIN_S
    finally:
        stager.close()


def test_a_wire_failure_fails_the_operation(
    pair: Pair, stager: _core.Stager, rng: np.random.Generator
) -> None:
    remote = np.zeros(1 << 16, np.uint8)
    region = pair.server.register(remote, "r")  # no remote write
    device = _random(rng, remote.size)
    req = stager.post_write(
        pair.a.core, device.ctypes.data, device.size, region.descriptor(), 0, 1 << 14, 3, 30
    )
    assert req.wait(30)
    with pytest.raises(RemoteAccessError):
        req.check()
    assert not remote.any()


def test_slow_copies_overlap_with_the_wire(pair: Pair, rng: np.random.Generator) -> None:
    """With copies of 20 ms each and 8 chunks, triple buffering takes about 8 copy times (the
    wire runs under the copies); the pipeline never waits for the wire between copies."""
    stager = _core.Stager(pair.client.core, _core.HostCopier(delay_us=20_000))
    try:
        remote = np.zeros(8 << 16, np.uint8)
        region = pair.server.register(remote, "rw")
        device = _random(rng, remote.size)
        start = time.monotonic()
        req = stager.post_write(
            pair.a.core, device.ctypes.data, device.size, region.descriptor(), 0, 1 << 16, 3, 30
        )
        assert req.wait(30)
        req.check()
        elapsed = time.monotonic() - start
        np.testing.assert_array_equal(remote, device)
        assert elapsed >= 8 * 0.020 * 0.9
        assert elapsed < 8 * 0.020 + 1.0
    finally:
        stager.close()


@pytest.mark.parametrize(
    ("slots", "chunk", "timeout"),
    [(0 - 1, 4096, 1.0), (9, 4096, 1.0), (2, -1, 1.0), (2, 4096, -1.0)],
)
def test_bad_options_are_refused(
    pair: Pair, stager: _core.Stager, slots: int, chunk: int, timeout: float
) -> None:
    remote = np.zeros(4096, np.uint8)
    region = pair.server.register(remote, "rw")
    with pytest.raises(InvalidArgumentError):
        stager.post_write(
            pair.a.core, remote.ctypes.data, 4096, region.descriptor(), 0, chunk, slots, timeout
        )


def test_closed_endpoint_is_refused(pair: Pair, stager: _core.Stager) -> None:
    remote = np.zeros(4096, np.uint8)
    region = pair.server.register(remote, "rw")
    pair.a.close()
    with pytest.raises(Exception, match="closed"):
        stager.post_write(pair.a.core, remote.ctypes.data, 4096, region.descriptor(), 0, 0, 0, 1.0)
