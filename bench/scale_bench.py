#!/usr/bin/env python3
"""How batches scale with their entries: ``write_batch`` / ``read_batch`` of N entries of 4 KiB
against one contiguous ``write`` / ``read`` of the same bytes, in the same run.

For each N (1,000 to 300,000 by default) the remote side of entry i is slot ``perm[i]`` of a
region of N slots in a peer process (a random permutation, so no two remote neighbours are
contiguous); the local side is, with ``--local region``, ``(region, i * size, size)`` of one
registered array, or with ``--local views``, the 4 KiB NumPy view ``array[i * size:(i + 1) *
size]`` of one unregistered array (resolved to one registration by the engine). Each round
times one blocking batch call (planning included: the entries are given as a list of tuples,
as users do) and then one contiguous transfer of the same bytes; rounds alternate the two, so
load drifting on the host hits both alike, unpinned. Figures are medians over the rounds; the
ratio is contiguous seconds over batch seconds (>= 0.5 is the target), ``us_per_entry`` the
batch's wall time per entry (within 2x from the smallest N to the largest is the target).

Run::

    python bench/scale_bench.py --transport tcp
    python bench/scale_bench.py --transport shm
    tests/rxe/run-in-vm.sh -- .venv/bin/python bench/scale_bench.py --transport rdma \\
        --entries 1000,10000 --rounds 2 --perftest --peer-start-timeout 600

Each row also records the host's 1-minute load average when it ended (``load``).
``--perftest`` (rdma only, in the rxe guest) also runs ``ib_write_bw`` at the same entry size
with the batch's window in flight (``tests/rxe/perftest-ref.sh``) once per round. The JSON
goes to ``bench/results/batch-scale-<transport>.json`` unless ``--json`` says otherwise.
GB/s = 1e9 bytes/s.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import secrets
import statistics
import sys
import time
from typing import Any

import numpy as np

from rdmaxfer._config import format_address
from rdmaxfer.tools.bench import PEER_START_S, RdmaSetup, _engine, peer_process
from rdmaxfer.transport.batch import DEFAULT_WINDOW

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from batch_vs_perftest import ib_write_bw  # noqa: E402

TIMEOUT_S = 600.0


def _entries(
    local: Any, descriptor: bytes, slots: np.ndarray, size: int, mode: str
) -> list[tuple[Any, bytes, int]]:
    offsets = (slots * size).tolist()
    if mode == "region":
        return [((local, i * size, size), descriptor, at) for i, at in enumerate(offsets)]
    array = local
    return [(array[i * size : (i + 1) * size], descriptor, at) for i, at in enumerate(offsets)]


def _round(
    ep: Any, whole: Any, descriptor: bytes, entries: list[Any], op: str, nbytes: int
) -> tuple[float, float, int, int]:
    """One batch call, then one contiguous transfer of its bytes: (batch s, contiguous s,
    operations after merging, channel requests they went as: one per gathered group)."""
    batch = ep.read_batch if op == "read" else ep.write_batch
    before = ep.stats().get(f"{op}.ops", 0)
    start = time.perf_counter()
    result = batch(entries, timeout=TIMEOUT_S)
    batch_s = time.perf_counter() - start
    requests = ep.stats().get(f"{op}.ops", 0) - before
    result.check()
    contiguous = ep.read if op == "read" else ep.write
    start = time.perf_counter()
    contiguous(whole, descriptor, nbytes=nbytes, timeout=TIMEOUT_S)
    contiguous_s = time.perf_counter() - start
    return batch_s, contiguous_s, int(result.operations), int(requests)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--transport", choices=("tcp", "shm", "rdma"), default="tcp")
    ap.add_argument("--local", choices=("region", "views"), default="region")
    ap.add_argument("--entries", default="1000,10000,100000,300000", help="comma-separated N")
    ap.add_argument("--size", type=int, default=4096, help="bytes per entry")
    ap.add_argument("--ops", default="write,read", help="comma-separated: write, read")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--perftest", action="store_true", help="rdma: also run ib_write_bw")
    ap.add_argument(
        "--peer-start-timeout",
        type=float,
        default=PEER_START_S,
        help="seconds the peer process may take to start (default %(default)g; give the rxe "
        "guest's TCG emulation several minutes)",
    )
    ap.add_argument("--json", help="where the JSON goes")
    args = ap.parse_args()
    counts = [int(n) for n in args.entries.split(",")]
    ops = args.ops.split(",")
    size = args.size
    out = args.json or os.path.join(HERE, "results", f"batch-scale-{args.transport}.json")
    setup = RdmaSetup.resolve() if args.transport == "rdma" else RdmaSetup()
    secret = secrets.token_hex(16)
    top = max(counts) * size
    rows: list[dict[str, Any]] = []
    rng = np.random.default_rng(0)
    peer = peer_process(args.transport, top, 0, setup, secret, args.peer_start_timeout)
    with peer as (_, port, descriptor):
        array = rng.integers(0, 256, top, dtype=np.uint8)
        with _engine(args.transport, 0, setup.device, secret) as engine:
            # views: the array stays unregistered (each view resolves to its allocation)
            local = engine.register(array, access="rw") if args.local == "region" else array
            connect_s = max(60.0, args.peer_start_timeout)
            with engine.connect(format_address(setup.bind, port), timeout=connect_s) as ep:
                for n in counts:
                    entries = _entries(local, descriptor, rng.permutation(n), size, args.local)
                    for op in ops:
                        nbytes = n * size
                        _round(ep, local, descriptor, entries, op, nbytes)  # warm-up
                        batch_s, contiguous_s, perf = [], [], []
                        operations = requests = 0
                        for _ in range(args.rounds):
                            if args.perftest and op == "write":
                                perf.append(ib_write_bw(size, n, DEFAULT_WINDOW) / 8)
                            b, c, operations, requests = _round(
                                ep, local, descriptor, entries, op, nbytes
                            )
                            batch_s.append(b)
                            contiguous_s.append(c)
                        row = _row(args, n, op, batch_s, contiguous_s, operations, perf)
                        row["requests"] = requests
                        row["load"] = os.getloadavg()[0]  # 1-minute load average, at the end
                        rows.append(row)
                        print(json.dumps(row), flush=True)
    report = {
        "what": "batch of N scattered entries vs one contiguous transfer of the same bytes",
        "transport": args.transport,
        "local": args.local,
        "entry_bytes": size,
        "rounds": args.rounds,
        "window": DEFAULT_WINDOW,
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "rows": rows,
    }
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    with open(out, "w") as f:
        json.dump(report, f, indent=1)
    print(format_table(rows))
    return 0


def _row(
    args: argparse.Namespace,
    n: int,
    op: str,
    batch_s: list[float],
    contiguous_s: list[float],
    operations: int,
    perf: list[float],
) -> dict[str, Any]:
    nbytes = n * args.size
    b = statistics.median(batch_s)
    c = statistics.median(contiguous_s)
    row: dict[str, Any] = {
        "op": op,
        "entries": n,
        "bytes": nbytes,
        "operations": operations,
        "batch_s": b,
        "contiguous_s": c,
        "us_per_entry": b / n * 1e6,
        "batch_GBps": nbytes / b / 1e9,
        "contiguous_GBps": nbytes / c / 1e9,
        "ratio": c / b,
        "ratio_range": [
            min(cs / bs for bs, cs in zip(batch_s, contiguous_s, strict=True)),
            max(cs / bs for bs, cs in zip(batch_s, contiguous_s, strict=True)),
        ],
    }
    good = [p for p in perf if p == p and p > 0]
    if good:
        row["ib_write_bw_GBps"] = statistics.median(good)
        row["ratio_vs_ib_write_bw"] = row["batch_GBps"] / row["ib_write_bw_GBps"]
    return row


def format_table(rows: list[dict[str, Any]]) -> str:
    """One line per (op, N): operations, channel requests, GB/s of both, ratio, us per entry."""
    lines = [
        f"{'op':<6}{'entries':>9}{'ops':>9}{'requests':>9}{'batch GB/s':>12}{'contig GB/s':>13}"
        f"{'ratio':>7}{'us/entry':>10}"
    ]
    for r in rows:
        lines.append(
            f"{r['op']:<6}{r['entries']:>9}{r['operations']:>9}{r['requests']:>9}"
            f"{r['batch_GBps']:>12.3f}"
            f"{r['contiguous_GBps']:>13.3f}{r['ratio']:>7.2f}{r['us_per_entry']:>10.3f}"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
