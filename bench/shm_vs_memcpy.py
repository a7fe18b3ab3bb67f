"""rdmaxfer shm (same host) against a single-process memcpy and TCP loopback, in one run.

For each size: rdmaxfer one-sided WRITE between two processes over ``shm`` (done when the
bytes are in the peer's region), the same WRITE over ``tcp`` loopback, and a single-process
``memcpy`` of the same size (``numpy.copyto`` between two preallocated, touched arrays). Then
an 8-byte round trip: an rdmaxfer 8-byte WRITE over shm through the Python API vs a plain
Python socket ping-pong (bench/tcp_vs_peers.py). GB/s = 1e9 bytes/s; the median of ``--iters``
runs. Targets: 1 GiB WRITE >= 0.8x memcpy, 64 KiB >= 3x TCP loopback, 8-byte round
trip <= 0.3x the Python ping-pong.

    python bench/shm_vs_memcpy.py [--sizes 64K,1M,16M,256M,1G] [--iters 5] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

from rdmaxfer.tools import bench
from tcp_vs_peers import python_sockets

#: Where the results go by default, named by what they measure (the docs' tables read them).
RESULTS = Path(__file__).resolve().parent / "results"


def memcpy_rates(sizes: list[int], iters: int) -> list[float]:
    """GB/s of one single-process copy per size (median of ``iters``, after one warm-up)."""
    src = np.random.default_rng(0).integers(0, 256, max(sizes), dtype=np.uint8)
    dst = np.ones(max(sizes), dtype=np.uint8)
    rates = []
    for size in sizes:
        times = []
        for _ in range(iters + 1):
            t0 = time.perf_counter()
            np.copyto(dst[:size], src[:size])
            times.append(time.perf_counter() - t0)
        rates.append(size / statistics.median(times[1:]) / 1e9)
    return rates


def write_rates(transport: str, sizes: list[int], iters: int) -> list[float]:
    rows = bench.run_bench(transport=transport, op="write", sizes=sizes, iters=iters, warmup=1)
    return [r.bytes / (r.lat_us_p50 * 1e-6) / 1e9 for r in rows]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="64K,1M,16M,256M,1G")
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--rtt-iters", type=int, default=5000)
    parser.add_argument(
        "--json",
        default=str(RESULTS / "shm-vs-memcpy.json"),
        help="write the results here (default: %(default)s; '': nowhere)",
    )
    args = parser.parse_args()
    sizes = bench.parse_sizes(args.sizes)

    shm = write_rates("shm", sizes, args.iters)
    tcp = write_rates("tcp", sizes, args.iters)
    copy = memcpy_rates(sizes, args.iters)
    shm_rtt = bench.run_bench(
        transport="shm", op="write", sizes=[8], iters=args.rtt_iters, warmup=100
    )[0].lat_us_p50
    _, py_rtt = python_sockets([8], 1, args.rtt_iters)

    rows = []
    print(
        f"{'bytes':>12} {'shm':>10} {'tcp':>10} {'memcpy':>10} {'vs memcpy':>10} "
        f"{'vs tcp':>10}   (GB/s, median of {args.iters})"
    )
    for size, s, t, c in zip(sizes, shm, tcp, copy, strict=True):
        rows.append({"bytes": size, "shm_GB_per_s": s, "tcp_GB_per_s": t, "memcpy_GB_per_s": c})
        print(f"{size:>12} {s:10.3f} {t:10.3f} {c:10.3f} {s / c:9.2f}x {s / t:9.2f}x")
    print(
        f"8-byte round trip (median): rdmaxfer shm WRITE {shm_rtt:.1f} us through the Python "
        f"API; plain Python socket ping-pong {py_rtt:.1f} us ({shm_rtt / py_rtt:.2f}x)"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"sizes": rows, "rtt_us": {"rdmaxfer_shm_python_api": shm_rtt, "python": py_rtt}},
                f,
                indent=2,
            )


if __name__ == "__main__":
    main()
