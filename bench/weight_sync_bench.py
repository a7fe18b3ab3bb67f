"""Weight sync: 4 consumers each pulling a quarter of every tensor's rows vs one consumer
pulling everything, from one WeightServer serving the MiniLM file (target:
the 4 sharded consumers finish no later than 1.2x the one full pull).

The server runs in its own process; every consumer is a process (multiprocessing spawn) that
makes its engine, waits on a barrier with the others, then times its own connect + catalog +
READs (``pull_weights(..., shard=...)``) on CLOCK_MONOTONIC (one clock for all processes). A
round's time is the last consumer's end minus the first one's start. Rounds alternate (one,
four, one, four...); medians are reported. After each round every consumer compares its bytes
with ``safetensors.numpy.load_file`` of the file (outside the timed part). A tensor's rows are
its first axis (a 1-D tensor's elements); the quarters are ``[k*n//4 : (k+1)*n//4]``.
A round in which a consumer raises is reported with its error and left out of the medians;
the run then exits with status 1. Warnings of the server and the consumers are printed.

    python bench/weight_sync_bench.py [--iters 5] [--transport tcp] [--json FILE]
    tests/rxe/run-in-vm.sh -- .venv/bin/python bench/weight_sync_bench.py --transport rdma
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import logging
import multiprocessing as mp
import statistics
import time
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import Any

import numpy as np

#: Where the results go by default, named by what they measure (the docs' tables read them).
RESULTS = Path(__file__).resolve().parent / "results"

CONSUMERS = 4


def _engine(transport: str, side: int) -> Any:
    from rdmaxfer import Engine
    from rdmaxfer.tools.bench import RdmaSetup

    if transport != "rdma":
        return Engine(transport, secret="weight-sync-bench")
    setup = RdmaSetup.resolve()
    device = setup.peer_device if side == 1 else setup.device
    return Engine("rdma", rdma_device=device, secret="weight-sync-bench")


def _serve(path: str, transport: str, ready: Any, stop: Any) -> None:
    logging.basicConfig(level=logging.WARNING, format="server %(name)s: %(message)s")
    faulthandler.enable()
    from rdmaxfer.tools.bench import RdmaSetup
    from rdmaxfer.weights import WeightServer

    bind = RdmaSetup.resolve().bind if transport == "rdma" else "127.0.0.1"
    with (
        _engine(transport, 1) as engine,
        WeightServer(path, host=bind, engine=engine, timeout=120) as server,
    ):
        server.start()
        ready.put(f"{bind}:{server.port}")
        stop.wait(3600)


def _consume(
    path: str,
    address: str,
    transport: str,
    part: int | None,
    barrier: Barrier,
    out: Any,
) -> None:
    logging.basicConfig(level=logging.WARNING, format=f"consumer {part} %(name)s: %(message)s")
    try:
        _pull(path, address, transport, part, barrier, out)
    except Exception as exc:  # reported by the parent, which would otherwise wait for it
        out.put(exc)
        raise


def _pull(
    path: str,
    address: str,
    transport: str,
    part: int | None,
    barrier: Barrier,
    out: Any,
) -> None:
    from safetensors.numpy import load_file

    from rdmaxfer import pull_weights

    ref = load_file(path)
    shard = None
    if part is not None:
        shard = {
            name: np.s_[part * a.shape[0] // CONSUMERS : (part + 1) * a.shape[0] // CONSUMERS]
            for name, a in ref.items()
        }
    with _engine(transport, 0) as engine:
        barrier.wait(120)
        start = time.monotonic()
        got = pull_weights(address, engine=engine, shard=shard, timeout=120)
        end = time.monotonic()
    bad = [
        name
        for name, a in ref.items()
        if not np.array_equal(got[name], a if shard is None else a[shard[name]])
    ]
    out.put((start, end, sum(int(a.nbytes) for a in got.values()), bad))


class RoundFailed(Exception):
    """A consumer of the round raised (its error is the message); the round has no time."""


def _round(path: str, address: str, transport: str, parts: list[int | None]) -> tuple[float, int]:
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(len(parts))
    out = ctx.Queue()
    procs = [
        ctx.Process(target=_consume, args=(path, address, transport, p, barrier, out))
        for p in parts
    ]
    for proc in procs:
        proc.start()
    results = [out.get(timeout=300) for _ in procs]
    for proc in procs:
        proc.join(60)
    failed = [r for r in results if isinstance(r, BaseException)]
    if failed:
        raise RoundFailed(f"{len(parts)} consumer(s), {len(failed)} failed: {failed[0]!r}")
    bad = [name for r in results for name in r[3]]
    if bad:
        raise SystemExit(f"consumers got wrong bytes for {sorted(set(bad))[:5]}")
    seconds = max(r[1] for r in results) - min(r[0] for r in results)
    return seconds, sum(r[2] for r in results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--transport", default="tcp", choices=["tcp", "rdma"])
    parser.add_argument(
        "--json",
        help="write the rounds here ('': nowhere; default: "
        "bench/results/weight-sync-TRANSPORT.json)",
    )
    args = parser.parse_args()
    from rdmaxfer.tools.cli_weights import default_model_file

    path = str(default_model_file())
    ctx = mp.get_context("spawn")
    ready, stop = ctx.Queue(), ctx.Event()
    server = ctx.Process(target=_serve, args=(path, args.transport, ready, stop))
    server.start()
    try:
        address = ready.get(timeout=120)
        one: list[float] = []
        four: list[float] = []
        failures: list[str] = []
        nbytes = 0
        for r in range(args.iters):
            try:
                one_s, nbytes = _round(path, address, args.transport, [None])
                four_s, four_bytes = _round(path, address, args.transport, list(range(CONSUMERS)))
            except RoundFailed as exc:  # recorded and reported; the other rounds go on
                failures.append(str(exc))
                print(f"round {r + 1} failed: {exc}", flush=True)
                continue
            assert four_bytes == nbytes, (four_bytes, nbytes)
            one.append(one_s)
            four.append(four_s)
            print(
                f"round {r + 1}: one {one_s * 1e3:.1f} ms, {CONSUMERS} sharded "
                f"{four_s * 1e3:.1f} ms, ratio {four_s / one_s:.2f}",
                flush=True,
            )
    finally:
        if server.exitcode is not None:
            print(f"the server process ended early, exit code {server.exitcode}", flush=True)
        stop.set()
        server.join(30)
    if not one:
        raise SystemExit(f"every round failed: {failures}")
    m1, m4 = statistics.median(one), statistics.median(four)
    ratios = [b / a for a, b in zip(one, four, strict=True)]
    print(
        f"# weight sync, MiniLM ({nbytes} tensor bytes), {args.transport}, median of "
        f"{len(one)} round(s) ({len(failures)} failed)"
    )
    print(f"one consumer, every tensor whole:        {m1 * 1e3:8.1f} ms")
    print(f"{CONSUMERS} consumers, a quarter of each's rows:  {m4 * 1e3:8.1f} ms (slowest)")
    print(
        f"ratio 4 sharded / 1 full: {m4 / m1:.2f}x (per round {min(ratios):.2f}-"
        f"{max(ratios):.2f}; target <= 1.2x)"
    )
    if args.json is None:
        args.json = str(RESULTS / f"weight-sync-{args.transport}.json")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "transport": args.transport,
                    "bytes": nbytes,
                    "one_s": one,
                    "four_s": four,
                    "failed_rounds": failures,
                },
                f,
                indent=1,
            )
    if failures:
        raise SystemExit(f"{len(failures)} round(s) failed")


if __name__ == "__main__":
    main()
