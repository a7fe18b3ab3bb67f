"""rdmaxfer.distributed: ranks in separate processes (spawn) on this machine, rendezvous through
a torch.distributed store (TCPStore, FileStore, or the gloo default group's), data over TCP.

The ranks' code is in _dist_ranks.py. Every received byte is checked with SHA-256 against the
data each rank regenerates from the same seed.
"""

from __future__ import annotations

import contextlib
import datetime
import multiprocessing as mp
import os
import queue
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip(
    "torch", reason="torch is not installed (pip install torch==2.13.0: the CPU build)"
)
import torch.distributed as dist  # noqa: E402

import _dist_ranks as R  # noqa: E402
import rdmaxfer  # noqa: E402
import rdmaxfer.distributed as rd  # noqa: E402
from _ports import free_port  # noqa: E402

#: Ranks are forked from one server process that imported these modules once (torch takes
#: seconds to import): each rank is still a fresh process of its own, started in milliseconds.
PRELOAD = ["_dist_ranks", "torch.distributed", "rdmaxfer.distributed"]


class Ranks:
    """``world`` processes running ``target(RankCtx)``; killed at the end of the test."""

    def __init__(self, target: Callable[..., Any], world: int, store: dict[str, Any], args: Any):
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(PRELOAD)
        self.results: Any = ctx.Queue()
        self.events: Any = ctx.Queue()
        self.seen: dict[tuple[int, str], float] = {}
        self.procs = [
            ctx.Process(
                target=R.rank_main,
                args=(target, R.RankCtx(r, world, store, dict(args), self.events), self.results),
                daemon=True,
            )
            for r in range(world)
        ]
        for proc in self.procs:
            proc.start()

    def wait_event(self, what: str, rank: int, timeout: float = 60) -> float:
        """When ``rank`` reported ``what`` (events seen while waiting for another are kept)."""
        deadline = time.monotonic() + timeout
        while (rank, what) not in self.seen:
            try:
                got_rank, got, at = self.events.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(
                    f"rank {rank} did not report {what!r} within {timeout} s"
                ) from None
            self.seen[(got_rank, got)] = float(at)
        return self.seen[(rank, what)]

    def collect(self, ranks: list[int], timeout: float = 120) -> dict[int, R.RankResult]:
        out: dict[int, R.RankResult] = {}
        deadline = time.monotonic() + timeout
        while len(out) < len(ranks):
            try:
                res = self.results.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                codes = {i: p.exitcode for i, p in enumerate(self.procs)}
                raise AssertionError(
                    f"ranks {sorted(set(ranks) - set(out))} gave no result within {timeout} s "
                    f"(exit codes {codes}); got {out}"
                ) from None
            out[res.rank] = res
        return out

    def ok(self, timeout: float = 120) -> dict[int, Any]:
        results = self.collect(list(range(len(self.procs))), timeout)
        failed = {r: f"{v.error_type}: {v.error}" for r, v in results.items() if not v.ok}
        assert not failed, failed
        return {r: v.value for r, v in results.items()}

    def close(self) -> None:
        for proc in self.procs:
            if proc.is_alive() and proc.pid is not None:
                # a rank a test stopped (SIGSTOP) dies only once continued; a rank that ended
                # since is_alive() may be gone already
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGCONT)
                proc.kill()
            proc.join(10)


@pytest.fixture
def tcp_store() -> Iterator[dict[str, Any]]:
    """A TCPStore served by the test process; the ranks are its clients."""
    server = dist.TCPStore(
        "127.0.0.1", 0, 1, True, wait_for_workers=False, timeout=datetime.timedelta(seconds=30)
    )
    yield {"kind": "tcp", "port": server.port}
    del server


@pytest.fixture
def file_store(tmp_path: Path) -> dict[str, Any]:
    return {"kind": "file", "path": str(tmp_path / "store")}


@pytest.fixture
def ranks() -> Iterator[Callable[..., Ranks]]:
    started: list[Ranks] = []

    def start(target: Callable[..., Any], world: int, store: dict[str, Any], **args: Any) -> Ranks:
        r = Ranks(target, world, store, args)
        started.append(r)
        return r

    yield start
    for r in started:
        r.close()


# -- broadcast -----------------------------------------------------------------------------------
def test_broadcast_array_to_four_ranks(ranks: Callable[..., Ranks], tcp_store: dict[str, Any]):
    # 24 pieces of 1 MiB and a short last one: every link of the ring pipelines.
    nbytes = 24 * (1 << 20) + 12_345
    got = ranks(R.broadcast_array, 4, tcp_store, seed=11, nbytes=nbytes, src=0, chunk=1 << 20).ok()
    expect = R.sha(R.random_bytes(11, nbytes))
    assert {r: v["sha"] for r, v in got.items()} == {r: expect for r in range(4)}
    assert all(v["shape"] == (nbytes,) and v["dtype"] == "uint8" for v in got.values())


def test_broadcast_from_rank_2_to_a_subset(ranks: Callable[..., Ranks], file_store: dict[str, Any]):
    # ranks [0, 2, 3], src 2: the ring is 2 -> 3 -> 0; rank 1 only joins the barrier.
    nbytes = 3 * 1_000_000
    got = ranks(
        R.broadcast_array,
        4,
        file_store,
        seed=5,
        nbytes=nbytes,
        src=2,
        ranks=[0, 2, 3],
        chunk=256 * 1024,
        dtype="float32",
    ).ok()
    expect = R.sha(R.random_bytes(5, nbytes))
    assert got[1] == {"skipped": True}
    for r in (0, 2, 3):
        assert got[r]["sha"] == expect
        assert got[r]["dtype"] == "float32" and got[r]["shape"] == (nbytes // 4,)


def test_broadcast_weights_dict_of_many_dtypes(
    ranks: Callable[..., Ranks], tcp_store: dict[str, Any]
):
    # 64 KiB pieces: small tensors share pieces (staged at the source and at in-place ranks),
    # big ones span many; rank 2 fills its own dict in place, ranks 1 and 3 get new arrays.
    got = ranks(
        R.broadcast_weights, 4, tcp_store, seed=3, src=0, chunk=64 * 1024, in_place=[2]
    ).ok()
    w = R.weights(3)
    expect = R.fingerprint(w)
    dtypes = {dtype for _, dtype, _, _ in expect}
    assert {
        "float32",
        "bfloat16",
        "float16",
        "int64",
        "bool",
        "float8_e4m3fn",
        "complex64",
    } <= dtypes
    for r in range(4):
        assert got[r]["fp"] == expect, f"rank {r}"
        assert got[r]["order"] == list(w)
    assert got[2]["in_place"] is True
    assert got[1]["aligned"] and got[3]["aligned"]


def test_gloo_default_group(ranks: Callable[..., Ranks]):
    port = free_port()
    got = ranks(R.default_group, 3, {"kind": "tcp", "port": port}, seed=9).ok()
    data = R.ints_as_float32(9, 750_000)
    assert {v["sha"] for v in got.values()} == {R.sha(data)}
    assert {v["sum_sha"] for v in got.values()} == {R.sha(data * 3)}
    assert sorted((v["rank"], v["world"]) for v in got.values()) == [(0, 3), (1, 3), (2, 3)]


# -- point to point -------------------------------------------------------------------------------
def test_send_recv_between_every_pair(ranks: Callable[..., Ranks], file_store: dict[str, Any]):
    got = ranks(R.all_pairs, 3, file_store).ok()
    for dst in range(3):
        expect = [
            (i, dst, R.sha(R.random_bytes(100 * i + dst, 1000 + 70_001 * (i * 3 + dst))))
            for i in range(3)
            if i != dst
        ]
        assert got[dst] == expect


def test_recv_into_mismatched_out(ranks: Callable[..., Ranks], tcp_store: dict[str, Any]):
    got = ranks(R.mismatched_recv, 2, tcp_store).ok()
    assert got[1].startswith("InvalidArgumentError") and "(99999,)" in got[1]
    assert got[0].startswith("ProtocolError")


# -- failures -------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["exit", "kill"])
def test_dead_rank_fails_the_others_fast(
    ranks: Callable[..., Ranks], tcp_store: dict[str, Any], mode: str
):
    # A 20 s timeout; a dead rank must be noticed long before it (connection refused/reset).
    timeout = 20.0
    run = ranks(R.failing_rank, 3, tcp_store, victim=2, mode=mode, timeout=timeout, nbytes=48 << 20)
    if mode == "kill":
        run.wait_event("victim ready", 2)
        run.wait_event("broadcast", 1)
        time.sleep(1.0)  # rank 1 has connected to rank 2 and its pieces are stuck there
        os.kill(run.procs[2].pid or 0, signal.SIGKILL)
    results = run.collect([0, 1], timeout=90)
    assert results[0].ok and results[1].ok  # failing_rank returns what it caught
    (one, one_s), (zero, zero_s) = results[1].value, results[0].value
    assert one.startswith(("ConnectionFailedError", "EndpointClosedError")), one
    assert one_s < timeout / 2, one
    # Rank 0 learns it from its own broadcast (rank 1 aborted the ring) or the next barrier.
    assert zero.startswith(
        ("ConnectionFailedError", "EndpointClosedError", "TransferTimeoutError")
    ), zero
    assert zero_s < 2 * timeout + 5, zero


def test_hung_rank_times_out(ranks: Callable[..., Ranks], tcp_store: dict[str, Any]):
    timeout = 4.0
    run = ranks(
        R.failing_rank, 3, tcp_store, victim=2, mode="stop", timeout=timeout, nbytes=48 << 20
    )
    run.wait_event("victim ready", 2)
    os.kill(run.procs[2].pid or 0, signal.SIGSTOP)
    results = run.collect([0, 1], timeout=90)
    (one, one_s), (zero, zero_s) = results[1].value, results[0].value
    assert one.startswith("TransferTimeoutError"), one
    assert timeout - 0.5 <= one_s < timeout + 5, one
    assert zero.startswith(
        ("ConnectionFailedError", "EndpointClosedError", "TransferTimeoutError")
    ), zero
    assert zero_s < 2 * timeout + 5, zero


# -- in one process -------------------------------------------------------------------------------
def test_single_rank_and_bad_arguments(tmp_path: Path):
    store = dist.FileStore(str(tmp_path / "one"), 1)
    with rd.init(store, 0, 1, transport="tcp", timeout=5) as group:
        x = np.arange(12, dtype=np.float64).reshape(3, 4)
        assert group.broadcast(x) is x
        w = {"a": x}
        assert group.broadcast(w)["a"] is x
        group.barrier()
        with pytest.raises(rdmaxfer.InvalidArgumentError, match="dst=0 is this rank"):
            group.send(x, 0)
        with pytest.raises(rdmaxfer.InvalidArgumentError, match=r"src=3 must be in 0\.\.0"):
            group.recv(3)
        with pytest.raises(rdmaxfer.InvalidArgumentError, match="passed None"):
            group.broadcast(None)
        with pytest.raises(rdmaxfer.InvalidArgumentError, match="chunk_bytes=0"):
            group.broadcast(x, chunk_bytes=0)
        with pytest.raises(rdmaxfer.InvalidArgumentError, match="keys must be strings"):
            group.broadcast({1: x})  # type: ignore[dict-item]
        with pytest.raises(rdmaxfer.InvalidArgumentError, match="contiguous"):
            group.broadcast(x[:, ::2])
        assert group.address.startswith("127.0.0.1:") and group.transport == "tcp"
    assert group.closed
    with pytest.raises(rdmaxfer.EndpointClosedError, match="closed"):
        group.barrier()
    with pytest.raises(rdmaxfer.InvalidArgumentError, match=r"rank=2 must be in 0\.\.1"):
        rd.init(store, 2, 2)
    with pytest.raises(rdmaxfer.InvalidArgumentError, match="has no set"):
        rd.init(object(), 0, 1)


def test_missing_peer_is_a_bounded_wait(tmp_path: Path):
    store = dist.FileStore(str(tmp_path / "two"), 2)
    with rd.init(store, 0, 2, transport="tcp", timeout=1.0) as group:
        start = time.monotonic()
        with pytest.raises(rdmaxfer.TransferTimeoutError, match="rank 1"):
            group.send(np.zeros(4), 1)
        assert time.monotonic() - start < 5
    with rd.init(store, 1, 2, transport="tcp", timeout=1.0) as group:
        start = time.monotonic()
        with pytest.raises(rdmaxfer.TransferTimeoutError, match="rank 0 did not connect"):
            group.recv(0)
        with pytest.raises(rdmaxfer.TransferTimeoutError, match="1 of 2 ranks arrived"):
            group.barrier(timeout=0.5)
        assert time.monotonic() - start < 6
        with pytest.raises(rdmaxfer.ConnectionFailedError, match="broken"):
            group.recv(0)


def test_default_group_needs_torch_distributed():
    assert not dist.is_initialized()
    with pytest.raises(rdmaxfer.InvalidArgumentError, match="init_process_group"):
        rd.init()


# -- GPU memory (issue 16 item 5) ---------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(
    not rdmaxfer.cuda.available(), reason=rdmaxfer.cuda.unavailable_reason() or "no GPU"
)
def test_gpu_memory_through_send_recv_and_broadcast(
    ranks: Callable[..., Ranks], tcp_store: dict[str, Any]
):
    # 5 pieces of 64 KiB, the last one short; the dict's small arrays straddle pieces.
    nbytes, chunk, seed = 4 * 65_536 + 4_000, 65_536, 16
    r = ranks(R.gpu_exchange, 4, tcp_store, seed=seed, nbytes=nbytes, chunk=chunk)
    got = r.ok(timeout=240)
    data = R.random_bytes(seed, nbytes).view(np.float32).reshape(-1, 4)
    assert got[0]["p2p"] == got[1]["p2p"] == R.sha(data)
    assert [got[k]["array"][0] for k in range(4)] == [R.sha(data)] * 4
    assert [got[k]["array"][1] for k in range(4)] == ["cuda:0", "cuda:0", "cuda:0", "cpu"]
    expected = R.fingerprint(R.weights(seed))
    for k in range(4):
        assert got[k]["weights"] == expected, k
    assert got[1]["weights_devices"] == got[2]["weights_devices"] == ["cuda:0"]
    assert got[3]["weights_devices"] == ["cpu"]
    assert got[0]["weights_devices"] == ["cpu", "cuda:0"]


@pytest.mark.gpu
@pytest.mark.parametrize("library", ["cupy", "torch"])
def test_cupy_and_torch_cuda_tensors_through_the_group(
    ranks: Callable[..., Ranks], tcp_store: dict[str, Any], library: str
):
    if library == "cupy":
        pytest.importorskip("cupy", reason="CuPy is not installed (needs a GPU)")
    elif not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here (a CUDA build of torch and a real GPU)")
    seed = 23
    got = ranks(R.framework_exchange, 3, tcp_store, seed=seed, library=library).ok(timeout=240)
    expected = {"a": R.sha(R.random_bytes(seed, 4 << 20)), "b": R.sha(R.random_bytes(7, 999))}
    assert got[1]["p2p"] == expected["a"]
    assert [got[k]["weights"] for k in range(3)] == [expected] * 3
