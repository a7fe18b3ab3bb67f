"""How a batch of small WRITEs travels on TCP: gathered, one WRITE_GATHER frame and one
acknowledgement per group of neighbouring operations from one local region
(transport/gather.h), each entry still placed, failed or skipped on its own."""

from __future__ import annotations

import numpy as np
import pytest

from _common import Pair
from rdmaxfer import RemoteAccessError

PAGE = 4096
TIMEOUT_S = 30.0

tcp_only = pytest.mark.parametrize("transport", ["tcp"], indirect=True)

Entry = tuple[tuple[object, int, int], object, int]


def scattered_pages(
    pair: Pair, rng: np.random.Generator, n: int, slots: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[Entry]]:
    """n random source pages (one registered region) and entries WRITing page i to slot
    order[i] of a zeroed target of `slots` pages: (src, dst, order, entries)."""
    src = rng.integers(0, 256, n * PAGE, dtype=np.uint8)
    dst = np.zeros(slots * PAGE, dtype=np.uint8)
    local = pair.client.register(src)
    desc = pair.server.register(dst).descriptor()
    order = rng.permutation(slots)[:n]
    entries: list[Entry] = [
        ((local, i * PAGE, PAGE), desc, int(s) * PAGE) for i, s in enumerate(order)
    ]
    return src, dst, order, entries


@tcp_only
def test_small_writes_of_a_batch_go_gathered_and_land_scattered(
    pair: Pair, rng: np.random.Generator
) -> None:
    n = 1000
    src, dst, slots, entries = scattered_pages(pair, rng, n, 2 * n)
    before = pair.a.stats()["write.ops"]
    result = pair.a.write_batch(entries, timeout=TIMEOUT_S)
    assert result.ok and (result.operations, result.nbytes) == (n, src.nbytes)
    assert 1 <= result.peak_outstanding <= result.window
    # 64 pieces per frame: at most a handful of frames beyond n / 64, never one per entry.
    frames = pair.a.stats()["write.ops"] - before
    assert n // 64 <= frames <= n // 8, frames
    pages = dst.reshape(2 * n, PAGE)
    assert np.array_equal(pages[slots].reshape(-1), src)
    assert not pages[np.setdiff1d(np.arange(2 * n), slots)].any()


@tcp_only
def test_a_piece_the_peer_refuses_fails_alone_inside_its_frame(
    pair: Pair, rng: np.random.Generator
) -> None:
    src = rng.integers(0, 256, 48 * PAGE, dtype=np.uint8)
    writable = np.zeros(96 * PAGE, dtype=np.uint8)
    readonly = np.zeros(8 * PAGE, dtype=np.uint8)
    local = pair.client.register(src)
    w = pair.server.register(writable).descriptor()
    r = pair.server.register(readonly, access="r").descriptor()
    refused = {3, 17, 40}
    entries = [
        ((local, i * PAGE, PAGE), r if i in refused else w, 0 if i in refused else 2 * i * PAGE)
        for i in range(48)
    ]
    before = pair.a.stats()["write.ops"]
    result = pair.a.write_batch(entries, timeout=TIMEOUT_S)
    assert pair.a.stats()["write.ops"] - before == 1  # all 48 in one frame
    assert sorted(result.failed) == sorted(refused)
    for i in refused:
        assert isinstance(result.failed[i], RemoteAccessError)
        assert "refused access" in str(result.failed[i]), result.failed[i]
    assert result.nbytes == 45 * PAGE and not readonly.any()
    for i in set(range(48)) - refused:
        got = writable[2 * i * PAGE : (2 * i + 1) * PAGE]
        assert np.array_equal(got, src[i * PAGE : (i + 1) * PAGE]), i
    assert not pair.a.closed  # a refused piece is not a protocol error


@tcp_only
def test_a_gathered_batch_notifies_after_its_last_frame(
    pair: Pair, rng: np.random.Generator
) -> None:
    n = 700
    src, dst, order, entries = scattered_pages(pair, rng, n, n)
    with pair.a.prepare_batch(entries) as prepared:
        transfer = prepared.post(notify=b"all pages")
        peer, payload = pair.server.wait_notification(TIMEOUT_S)
        landed = dst.reshape(n, PAGE)[order].reshape(-1)
        assert np.array_equal(landed, src)  # checked the moment the notification arrived
        assert (peer, payload) == (pair.b.peer, b"all pages")
        assert transfer.wait(TIMEOUT_S).notified
