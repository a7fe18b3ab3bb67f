"""Batches of many entries on every host transport: tens of thousands of scattered entries of
mixed sizes (zero-length ones, ones larger than a gathered piece, a few invalid ones among
them) land exactly, fail exactly by entry index, go gathered (few channel operations, not one
per entry), and a notification after the batch sees every byte. On shm a gathered group spans
more than IOV_MAX (1024) pieces when the window allows it (two process_vm_readv/writev
calls)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pytest

from _common import Pair
from rdmaxfer import InvalidArgumentError, RemoteAccessError, _core

TIMEOUT_S = 60.0
N = 20_000
BIG = 2 * 1024 * 1024 + 123  # above a gathered piece on every transport: posted alone


@dataclass
class Layout:
    """Entry i: sizes[i] bytes at local[local_at[i]:] and remote[remote_at[i]:]."""

    sizes: np.ndarray
    local_at: np.ndarray
    remote_at: np.ndarray
    nbytes: int


def layout(rng: np.random.Generator, n: int, big: tuple[int, ...] = ()) -> Layout:
    """Mixed sizes (1..8 KiB, every 97th zero, `big` ones of BIG bytes), packed one after
    another locally and in a random order remotely (so no two remote neighbours touch)."""
    sizes = rng.integers(1, 8193, n)
    sizes[::97] = 0
    sizes[list(big)] = BIG
    local_at = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    order = rng.permutation(n)
    placed = np.zeros(n, dtype=np.int64)
    # A gap of one byte between remote slots: neighbours never merge.
    placed[order] = np.concatenate([[0], np.cumsum(sizes[order] + 1)[:-1]])
    return Layout(sizes, local_at, placed, int(sizes.sum() + n))


def entries_of(
    lay: Layout, local: object, remote: object, bad: Mapping[int, tuple[object, object, int]]
) -> list[tuple[object, object, int]]:
    out: list[tuple[object, object, int]] = [
        ((local, int(a), int(s)), remote, int(b))
        for a, b, s in zip(lay.local_at, lay.remote_at, lay.sizes, strict=True)
    ]
    for i, entry in bad.items():
        out[i] = entry
    return out


def expect_remote(lay: Layout, src: np.ndarray, out: np.ndarray, skip: set[int]) -> np.ndarray:
    want = np.zeros_like(out)
    for i, (a, b, s) in enumerate(zip(lay.local_at, lay.remote_at, lay.sizes, strict=True)):
        if i not in skip:
            want[b : b + s] = src[a : a + s]
    return want


def ops(pair: Pair, op: str) -> int:
    return int(pair.a.stats()[f"{op}.ops"])


@pytest.mark.parametrize("op", ["write", "read"])
def test_twenty_thousand_mixed_entries_land_and_fail_exactly(
    pair: Pair, rng: np.random.Generator, op: str
) -> None:
    lay = layout(rng, N, big=(5_000, 15_000))
    local_bytes = int(lay.sizes.sum())
    data = rng.integers(0, 256, max(local_bytes, lay.nbytes), dtype=np.uint8)
    here = np.zeros(local_bytes, dtype=np.uint8)
    there = np.zeros(lay.nbytes, dtype=np.uint8)
    if op == "write":
        here[:] = data[:local_bytes]
    else:
        there[:] = data[: lay.nbytes]
    local = pair.client.register(here)
    remote = pair.server.register(there).descriptor()
    # The peer refuses this one (read-only for a WRITE, write-only for a READ).
    shut = np.zeros(8192, dtype=np.uint8)
    closed = pair.server.register(shut, access="r" if op == "write" else "w")
    past_local = ((local, local_bytes - 10, 20), remote, 0)
    past_remote = ((local, 0, 100), remote, lay.nbytes - 50)
    refused = ((local, 0, 4096), closed.descriptor(), 0)
    bad = {777: past_local, 10_001: past_remote, 12_345: refused, 19_998: past_local}
    entries = entries_of(lay, local, remote, bad)
    before = ops(pair, op)
    batch = pair.a.write_batch if op == "write" else pair.a.read_batch
    result = batch(entries, timeout=TIMEOUT_S)

    assert sorted(result.failed) == sorted(bad)
    for i in (777, 10_001, 19_998):
        assert isinstance(result.failed[i], InvalidArgumentError), result.failed[i]
    assert isinstance(result.failed[12_345], RemoteAccessError), result.failed[12_345]
    assert "refused access" in str(result.failed[12_345])
    zero = {i for i in range(N) if lay.sizes[i] == 0}
    assert result.skipped == len(zero - set(bad))
    moved = sum(int(lay.sizes[i]) for i in range(N) if i not in bad)
    assert result.nbytes == moved
    # Gathered: far fewer channel operations than entries (each big entry goes alone).
    posted = ops(pair, op) - before
    assert 2 <= posted <= N // 16, posted
    if op == "write":
        assert np.array_equal(there, expect_remote(lay, here, there, set(bad)))
    else:
        want = np.zeros_like(here)
        for i, (a, b, s) in enumerate(zip(lay.local_at, lay.remote_at, lay.sizes, strict=True)):
            if i not in bad:
                want[a : a + s] = there[b : b + s]
        assert np.array_equal(here, want)
    assert not shut.any()


def test_a_notification_after_a_many_entry_batch_sees_every_byte(
    pair: Pair, rng: np.random.Generator
) -> None:
    lay = layout(rng, N, big=(3,))
    src = rng.integers(0, 256, int(lay.sizes.sum()), dtype=np.uint8)
    dst = np.zeros(lay.nbytes, dtype=np.uint8)
    local = pair.client.register(src)
    remote = pair.server.register(dst).descriptor()
    for payload in (b"all placed", 7):
        src[:] = rng.integers(0, 256, src.nbytes, dtype=np.uint8)
        want = expect_remote(lay, src, dst, set())
        transfer = pair.a.post_write_batch(entries_of(lay, local, remote, {}), notify=payload)
        _, got = pair.server.wait_notification(timeout=TIMEOUT_S)
        assert got == payload
        assert np.array_equal(dst, want)  # every byte, as the notification arrives
        result = transfer.wait(TIMEOUT_S)
        assert result.ok and result.notified


@pytest.mark.parametrize("transport", ["shm"], indirect=True)
@pytest.mark.parametrize("op", ["write", "read"])
def test_shm_groups_span_more_than_iov_max_pieces(
    pair: Pair, rng: np.random.Generator, op: str
) -> None:
    """A window of 4096: 6000 pieces in 4 groups of 1500 (the fewest groups of at most 2048,
    rounded up to the 4 groups in flight and evened out), both sides scattered (nothing
    coalesces), so each group's copy is two system calls (1024 and 476 iovecs)."""
    n, page = 6000, 512
    src = rng.integers(0, 256, n * page, dtype=np.uint8)
    dst = np.zeros(2 * n * page, dtype=np.uint8)
    here_slots = rng.permutation(2 * n)[:n]
    there_slots = rng.permutation(2 * n)[:n]
    if op == "write":
        local_buf = np.zeros(2 * n * page, dtype=np.uint8)
        local_buf.reshape(2 * n, page)[here_slots] = src.reshape(n, page)
        remote_buf = dst
    else:
        local_buf = np.zeros(2 * n * page, dtype=np.uint8)
        remote_buf = np.zeros(2 * n * page, dtype=np.uint8)
        remote_buf.reshape(2 * n, page)[there_slots] = src.reshape(n, page)
    local = pair.client.register(local_buf)
    remote = pair.server.register(remote_buf).descriptor()
    entries = [
        ((local, int(a) * page, page), remote, int(b) * page)
        for a, b in zip(here_slots, there_slots, strict=True)
    ]
    before = ops(pair, op)
    with pair.a.prepare_batch(entries, op=op) as prepared:
        run = _core.post_batch(pair.a._core, prepared._live().core, None, window=4096)
        assert run.request.wait(TIMEOUT_S) and not run.failures()
    assert run.peak_outstanding <= 4096 and run.bytes_done == src.nbytes
    assert ops(pair, op) - before == 4  # 4 x 1500 pieces
    if op == "write":
        got = remote_buf.reshape(2 * n, page)[there_slots]
    else:
        got = local_buf.reshape(2 * n, page)[here_slots]
    assert np.array_equal(got.reshape(-1), src)
