#!/usr/bin/env python3
"""rdmaxfer batches of scattered 4 KiB WRITEs against ``ib_write_bw`` at 4 KiB with the same
depth, side by side in one run (target: >= 0.9x).

Run inside the rxe VM (two soft-RoCE devices, rxe0 -> rxe1)::

    tests/rxe/run-in-vm.sh -- .venv/bin/python bench/batch_vs_perftest.py

Each round runs ``tests/rxe/perftest-ref.sh -t bw -d DEPTH`` (``ib_write_bw``, client on rxe0,
server on rxe1, ``--entries x --iters`` WRITEs of ``--size`` bytes with DEPTH in flight) and
then ``rdmaxfer bench --batch`` over the same devices (:func:`rdmaxfer.tools.bench_batch.
run_batch_bench`: a prepared ``write_batch`` of ``--entries`` scattered entries, so none merge,
at most DEPTH = 256 operations outstanding, the batch window; and in the same run the same
bytes as one contiguous WRITE). Rounds interleave the two so that load drifting on the host
hits both alike; the figures are medians over rounds, with the range of per-round ratios.
Gb/s = 1e9 bit/s. Under TCG emulation absolute numbers mean little; read the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from rdmaxfer import _core
from rdmaxfer.tools.bench_batch import BatchCase, run_batch_bench

#: Where the results go by default, named by what they measure (the docs' tables read them).
RESULTS = Path(__file__).resolve().parent / "results"

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
#: Operations a batch keeps outstanding (``rdmaxfer.transport.batch.DEFAULT_WINDOW``).
DEPTH = 256


def ib_write_bw(size: int, iters: int, depth: int) -> float:
    """ib_write_bw's average Gb/s (nan when every attempt failed or it reported 0: too few
    WRITEs for its 2-decimal clock)."""
    cmd = [os.path.join(REPO, "tests/rxe/perftest-ref.sh"), "-t", "bw", "-n", str(iters)]
    cmd += ["-d", str(depth), str(size)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    for line in done.stdout.splitlines():
        if line.startswith("{"):
            rec = json.loads(line)
            if float(rec.get("bw_Gbit_per_s", 0)) > 0:
                return float(rec["bw_Gbit_per_s"])
    sys.stderr.write(done.stderr[-2000:])
    return float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--entries", type=int, default=2000, help="entries per batch")
    ap.add_argument("--size", type=int, default=4096, help="bytes per entry")
    ap.add_argument("--iters", type=int, default=3, help="batches per round (after a warm-up)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--json",
        default=str(RESULTS / "batch-vs-ib-write-bw-rxe.jsonl"),
        help="append the run as a JSON line here (default: %(default)s; '': nowhere)",
    )
    args = ap.parse_args()
    if _core.available_transports()["rdma"]:
        print("no RDMA device:", _core.available_transports()["rdma"], file=sys.stderr)
        return 2
    case = BatchCase("scattered", args.entries, args.size)
    perftest, batch, contiguous = [], [], []
    for r in range(args.rounds):
        perftest.append(ib_write_bw(args.size, args.entries * args.iters, DEPTH))
        row = run_batch_bench([case], transport="rdma", op="write", iters=args.iters)[0]
        batch.append(row.batch_gbps * 8)
        contiguous.append(row.contiguous_gbps * 8)
        print(
            f"round {r + 1}: ib_write_bw {perftest[-1]:.4f} Gb/s, batch {batch[-1]:.4f} Gb/s, "
            f"contiguous {contiguous[-1]:.4f} Gb/s",
            flush=True,
        )
    # Rounds where ib_write_bw gave no figure are left out of the comparison.
    paired = [(b, p) for b, p in zip(batch, perftest, strict=True) if p > 0]
    if not paired:
        print("ib_write_bw gave no figure in any round", file=sys.stderr)
        return 1
    ratios = [b / p for b, p in paired]
    mine, theirs = statistics.median(b for b, _ in paired), statistics.median(p for _, p in paired)
    print(
        f"\n{args.entries} x {args.size} B WRITEs, depth {DEPTH}, {args.rounds} round(s), "
        f"{os.cpu_count()} CPUs\n"
        f"{'':22} {'Gb/s':>8}\n"
        f"{'ib_write_bw':22} {theirs:>8.4f}\n"
        f"{'rdmaxfer write_batch':22} {mine:>8.4f}\n"
        f"{'rdmaxfer contiguous':22} {statistics.median(contiguous):>8.4f}\n"
        f"ratio batch / ib_write_bw {mine / theirs:.2f} (per round "
        f"{min(ratios):.2f}-{max(ratios):.2f}; target >= 0.9)"
    )
    if args.json:
        with open(args.json, "a") as f:
            rec = {
                "entries": args.entries,
                "bytes": args.size,
                "depth": DEPTH,
                "rounds": args.rounds,
                "ib_write_bw_gbps": perftest,
                "batch_gbps": batch,
                "contiguous_gbps": contiguous,
                "ratio": mine / theirs,
                "host_load": os.getloadavg()[0],
            }
            f.write(json.dumps(rec) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
