"""Broadcast from rank 0 to N ranks: rdmaxfer.distributed vs torch.distributed.broadcast (gloo).

Both run in the same launch: N processes (multiprocessing spawn) share one TCPStore, which
serves the gloo process group and rdmaxfer's rendezvous (its own namespace). Each iteration
starts after a gloo barrier; a rank's time ends when it holds the data, and the broadcast's
time is the slowest rank's. Every receiver checks the bytes (SHA-256 of the first and last
MiB, and the full sum of the array in uint64). rdmaxfer and gloo alternate, iteration by
iteration. GB/s = payload bytes / seconds / 1e9 (bytes delivered to EACH rank per second).

    python bench/broadcast_bench.py [--size 1G] [--ranks 4] [--iters 3] [--chunk 8M]
        [--transport tcp] [--streams 0] [--io-threads 0] [--json out.json]
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing as mp
import os
import socket
import statistics
import sys
import time
from multiprocessing.queues import Queue
from pathlib import Path
from typing import Any

import numpy as np

#: Where the results go by default, named by what they measure (the docs' tables read them).
RESULTS = Path(__file__).resolve().parent / "results"

_UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    text = text.strip().upper().removesuffix("B").removesuffix("I")
    if text and text[-1] in _UNITS:
        return int(float(text[:-1]) * _UNITS[text[-1]])
    return int(text)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _fingerprint(arr: np.ndarray) -> tuple[int, bytes, bytes]:
    import hashlib

    flat = arr.reshape(-1).view(np.uint8)
    mib = 1 << 20
    return (
        int(flat.view(np.uint64).sum(dtype=np.uint64)) if flat.nbytes % 8 == 0 else 0,
        hashlib.sha256(flat[:mib]).digest(),
        hashlib.sha256(flat[-mib:]).digest(),
    )


def _rank_main(rank: int, args: argparse.Namespace, port: int, results: Queue[Any]) -> None:
    import torch
    import torch.distributed as dist

    import rdmaxfer.distributed as rd

    timeout = datetime.timedelta(seconds=args.timeout)
    store = dist.TCPStore("127.0.0.1", port, args.ranks, rank == 0, timeout=timeout)
    dist.init_process_group(
        "gloo", store=dist.PrefixStore("gloo", store), rank=rank, world_size=args.ranks
    )
    group = rd.init(
        store,
        rank,
        args.ranks,
        transport=args.transport,
        timeout=args.timeout,
        streams=args.streams,
        io_threads=args.io_threads,
    )
    size = args.size
    if rank == 0:
        data = np.frombuffer(np.random.default_rng(7).bytes(size), dtype=np.uint8).copy()
        expect = _fingerprint(data)
    else:
        data = np.empty(size, np.uint8)
        expect = None
    tensor = torch.from_numpy(data)  # shares memory: gloo broadcasts into the same bytes
    times: dict[str, list[float]] = {"rdmaxfer": [], "gloo": []}
    fingerprints: list[tuple[int, bytes, bytes]] = []
    # Warm up both: connections made, pages touched.
    group.broadcast(data if rank == 0 else None, src=0, chunk_bytes=args.chunk)
    dist.broadcast(tensor, src=0)
    for _ in range(args.iters):
        for name in ("rdmaxfer", "gloo"):
            if rank != 0:
                data.fill(0)
            dist.barrier()
            start = time.perf_counter()
            if name == "rdmaxfer":
                got = group.broadcast(data, src=0, chunk_bytes=args.chunk)
                assert got is data or rank == 0
            else:
                dist.broadcast(tensor, src=0)
            times[name].append(time.perf_counter() - start)
            if rank != 0:
                fingerprints.append(_fingerprint(data))
    dist.barrier()
    results.put((rank, times, expect, fingerprints))
    group.close()
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=parse_size, default=1 << 30, help="bytes (1G = 2**30)")
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--chunk", type=parse_size, default=8 << 20, help="rdmaxfer piece size")
    parser.add_argument("--transport", default="tcp")
    parser.add_argument("--streams", type=int, default=0, help="0: the engine's default")
    parser.add_argument("--io-threads", type=int, default=0, help="0: the engine's default")
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument(
        "--json",
        default=str(RESULTS / "broadcast-vs-gloo.json"),
        help="write the times here (default: %(default)s; '': nowhere)",
    )
    args = parser.parse_args(argv)

    ctx = mp.get_context("spawn")
    results: Queue[Any] = ctx.Queue()
    port = _free_port()
    procs = [
        ctx.Process(target=_rank_main, args=(r, args, port, results), daemon=True)
        for r in range(args.ranks)
    ]
    for proc in procs:
        proc.start()
    reports = {}
    deadline = time.monotonic() + args.timeout * (2 * args.iters + 4)
    while len(reports) < args.ranks:
        try:
            rank, times, expect, prints = results.get(timeout=5)
            reports[rank] = (times, expect, prints)
        except Exception:
            dead = [p.pid for p in procs if p.exitcode not in (None, 0)]
            if dead or time.monotonic() > deadline:
                print(f"bench failed: processes {dead} exited early, or timed out", file=sys.stderr)
                for proc in procs:
                    proc.kill()
                return 1
    for proc in procs:
        proc.join(30)

    expect = reports[0][1]
    bad = [r for r in range(1, args.ranks) for fp in reports[r][2] if fp != expect]
    # Per iteration, the broadcast's time is its slowest rank's.
    summary = {}
    for name in ("rdmaxfer", "gloo"):
        per_iter = [max(reports[r][0][name][i] for r in reports) for i in range(args.iters)]
        summary[name] = {"median_s": statistics.median(per_iter), "all_s": per_iter}
    gib = args.size / (1 << 30)
    print(
        f"broadcast of {args.size} bytes ({gib:g} GiB) from rank 0 to {args.ranks} ranks, "
        f"{os.cpu_count()} cores, median of {args.iters}; rdmaxfer {args.transport}, "
        f"chunk {args.chunk} bytes"
    )
    print(f"{'':<28}{'seconds':>10}{'GB/s':>10}{'vs gloo':>10}")
    gloo_s = summary["gloo"]["median_s"]
    for name, label in (
        ("rdmaxfer", "rdmaxfer.distributed (ring)"),
        ("gloo", "torch gloo broadcast"),
    ):
        secs = summary[name]["median_s"]
        print(f"{label:<28}{secs:>10.3f}{args.size / secs / 1e9:>10.2f}{gloo_s / secs:>9.2f}x")
    print("data check: " + ("every rank, every iteration OK" if not bad else f"MISMATCH on {bad}"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": {k: v for k, v in vars(args).items()}, "summary": summary}, f)
    return 0 if not bad else 2


if __name__ == "__main__":
    sys.exit(main())
