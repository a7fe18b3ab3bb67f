"""Batches and notifications (csrc/protocol/batch.h) over the in-process loopback transport,
which offers only channel primitives: the protocol layer's batch and NOTIFY work unchanged."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from rdmaxfer import InvalidArgumentError, _core

TIMEOUT_S = 10.0
PAGE = 4096


@pytest.fixture
def engines() -> Iterator[tuple[_core.Engine, _core.Engine, _core.Endpoint]]:
    server = _core.Engine("loopback")
    client = _core.Engine("loopback")
    port = server.listen("loopback", 0)
    a = client.connect("loopback", port, streams=2, timeout=TIMEOUT_S)
    b = server.accept(TIMEOUT_S)
    yield client, server, a
    a.close()
    b.close()
    client.close()
    server.close()


def register(engine: _core.Engine, array: np.ndarray, access: int) -> _core.Region:
    return engine.register(array.ctypes.data, array.nbytes, access)


def test_batch_with_a_bad_entry_then_a_notification(
    engines: tuple[_core.Engine, _core.Engine, _core.Endpoint],
) -> None:
    client, server, a = engines
    rng = np.random.default_rng(13)
    src = rng.integers(0, 256, 16 * PAGE, dtype=np.uint8)
    dst = np.zeros(32 * PAGE, dtype=np.uint8)
    local = register(client, src, _core.ACCESS_LOCAL)
    remote = register(server, dst, _core.ACCESS_REMOTE_WRITE).descriptor()
    slots = rng.permutation(32)[:16]
    rows = [[0, i * PAGE, 0, int(s) * PAGE, PAGE] for i, s in enumerate(slots)]
    rows.append([0, 0, 0, 32 * PAGE, PAGE])  # past the region: fails alone
    rows.append([0, 0, 0, 0, 0])  # zero-length: skipped
    plan = _core.BatchPlan("write", [local], [remote], np.array(rows, dtype=np.uint64))
    assert (plan.entries, plan.operations, plan.skipped) == (18, 16, 1)
    run = _core.post_batch(a, plan, b"pages")
    assert run.request.wait(TIMEOUT_S)
    run.request.check()
    failures = run.failures()
    assert [(f[0], f[1]) for f in failures] == [(16, "InvalidArgumentError")]
    assert not run.notified and run.bytes_done == 16 * PAGE
    assert _core.pop_notification(server, 0.2) is None  # an entry failed: no notification
    assert np.array_equal(dst.reshape(32, PAGE)[slots].reshape(-1), src)

    good = _core.BatchPlan("write", [local], [remote], np.array(rows[:16], dtype=np.uint64))
    for payload in (b"pages", 2**32 - 1):
        src[:] = rng.integers(0, 256, src.nbytes, dtype=np.uint8)
        run = _core.post_batch(a, good, payload)
        got = _core.pop_notification(server, TIMEOUT_S)
        assert got is not None and got[1] == payload
        assert np.array_equal(dst.reshape(32, PAGE)[slots].reshape(-1), src)  # at notification
        assert run.request.wait(TIMEOUT_S) and run.notified


def test_merged_read_batch_in_a_small_window(
    engines: tuple[_core.Engine, _core.Engine, _core.Endpoint],
) -> None:
    client, server, a = engines
    data = np.random.default_rng(5).integers(0, 256, 64 * PAGE, dtype=np.uint8)
    out = np.zeros_like(data)
    local = register(client, out, _core.ACCESS_LOCAL_WRITE)
    remote = register(server, data, _core.ACCESS_REMOTE_READ).descriptor()
    rows = [[0, i * PAGE, 0, i * PAGE, PAGE] for i in range(64)]
    rows[40][3] += 1  # breaks the run: 3 operations
    plan = _core.BatchPlan("read", [local], [remote], np.array(rows, dtype=np.uint64))
    assert plan.operations == 3
    run = _core.post_batch(a, plan, None, window=1)
    assert run.request.wait(TIMEOUT_S) and not run.failures()
    assert run.peak_outstanding == 1
    expect = data.copy()
    expect[40 * PAGE : 41 * PAGE] = data[40 * PAGE + 1 : 41 * PAGE + 1]
    assert np.array_equal(out, expect)
    with pytest.raises(InvalidArgumentError, match="notify= goes with WRITEs only"):
        _core.post_batch(a, plan, b"x")
