#!/usr/bin/env python3
"""rdmaxfer RDMA WRITE against perftest on the same devices, side by side in one run.

Run inside the rxe VM (two soft-RoCE devices, rxe0 <-> rxe1)::

    tests/rxe/run-in-vm.sh -- env PYTHONPATH=python .venv/bin/python bench/rdma_vs_perftest.py

It runs ``tests/rxe/perftest-ref.sh`` (ib_write_bw / ib_write_lat, server on rxe1, client on
rxe0, GID index RDMAXFER_GID_INDEX) and then the same transfers through rdmaxfer:

* bandwidth: ``--iters`` RDMA WRITEs of each size from an engine on rxe0 into a region of an
  engine on rxe1, at most ``--depth`` in flight (perftest's ib_write_bw default tx depth is 128);
  Gb/s = bits / (first post -> last completion).
* latency: 8-byte WRITEs one at a time; each is timed from post to its completion, which is one
  round trip (the WRITE and the responder's ACK). perftest's ib_write_lat reports half of a
  ping-pong round trip (t_typical), so the table compares against 2 x t_typical.

Under TCG emulation absolute numbers mean little; the ratios are what to read. Target: >= 0.9x
perftest's bandwidth, <= 1.1x its round trip.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

from rdmaxfer import _core

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
RW = _core.ACCESS_REMOTE_READ | _core.ACCESS_REMOTE_WRITE


def perftest(kind: str, sizes: list[int], iters: int) -> dict[int, dict[str, float]]:
    cmd = [os.path.join(REPO, "tests/rxe/perftest-ref.sh"), "-n", str(iters), "-t", kind]
    cmd += [str(s) for s in sizes]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    out: dict[int, dict[str, float]] = {}
    for line in done.stdout.splitlines():
        if line.startswith("{"):
            rec = json.loads(line)
            out[int(rec["bytes"])] = rec
    if done.returncode != 0:
        sys.stderr.write(done.stderr[-2000:])
    return out


class Pair:
    def __init__(self, poll_mode: str) -> None:
        devs = os.environ.get("RDMAXFER_RXE_DEVICES", "rxe0 rxe1").split()
        addrs = os.environ.get("RDMAXFER_RXE_ADDRS", "10.77.0.1 10.77.0.2").split()
        self.server = _core.Engine("rdma", rdma_device=devs[1], poll_mode=poll_mode)
        self.client = _core.Engine("rdma", rdma_device=devs[0], poll_mode=poll_mode)
        port = self.server.listen(addrs[1], 0)
        self.ep = self.client.connect(addrs[1], port, 1, 60)
        self.peer = self.server.accept(60)

    def close(self) -> None:
        self.client.close()
        self.server.close()


def rdmaxfer_bw(pair: Pair, size: int, iters: int, depth: int) -> float:
    src = pair.client.alloc_pinned(size, 0)
    dst = pair.server.alloc_pinned(size, RW)
    np.frombuffer(src, dtype=np.uint8)[:] = np.random.default_rng(1).integers(  # type: ignore[call-overload]
        1, 256, size, dtype=np.uint8
    )
    desc = dst.descriptor()
    # Warm-up (first-touch, connection caches).
    for _ in range(min(iters, 8)):
        r = pair.ep.post_write(src, 0, desc, 0, size, size, 1)
        assert r.wait(60)
        r.check()
    in_flight: list[_core.Request] = []
    start = time.perf_counter()
    for _ in range(iters):
        if len(in_flight) >= depth:
            oldest = in_flight.pop(0)
            assert oldest.wait(120)
            oldest.check()
        in_flight.append(pair.ep.post_write(src, 0, desc, 0, size, size, 1))
    for r in in_flight:
        assert r.wait(120)
        r.check()
    elapsed = time.perf_counter() - start
    return size * iters * 8 / elapsed / 1e9


def rdmaxfer_lat(pair: Pair, size: int, iters: int) -> dict[str, float]:
    src = pair.client.alloc_pinned(size, 0)
    dst = pair.server.alloc_pinned(size, RW)
    desc = dst.descriptor()
    samples = []
    for i in range(iters + 20):
        t0 = time.perf_counter()
        r = pair.ep.post_write(src, 0, desc, 0, size, 0, 1)
        assert r.wait(60)
        t1 = time.perf_counter()
        r.check()
        if i >= 20:
            samples.append((t1 - t0) * 1e6)
    return {
        "median": statistics.median(samples),
        "min": min(samples),
        "p99": sorted(samples)[int(len(samples) * 0.99) - 1],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[65536, 1 << 20])
    ap.add_argument("--iters", type=int, default=200, help="WRITEs per bandwidth size")
    ap.add_argument("--lat-iters", type=int, default=500)
    ap.add_argument("--depth", type=int, default=32, help="rdmaxfer WRITEs in flight")
    ap.add_argument("--lat-size", type=int, default=8)
    ap.add_argument("--json", help="append the results as JSON lines to this file")
    args = ap.parse_args()
    if _core.available_transports()["rdma"]:
        print("no RDMA device:", _core.available_transports()["rdma"], file=sys.stderr)
        return 2

    ref_bw = perftest("bw", args.sizes, args.iters)
    ref_lat = perftest("lat", [args.lat_size], args.lat_iters)

    rows = []
    for mode in ("event", "busy"):
        pair = Pair(mode)
        try:
            for size in args.sizes:
                ours = rdmaxfer_bw(pair, size, args.iters, args.depth)
                ref = float(ref_bw.get(size, {}).get("bw_gbps", "nan"))
                rows.append(("bw Gb/s", size, mode, ours, ref, ours / ref if ref else float("nan")))
            lat = rdmaxfer_lat(pair, args.lat_size, args.lat_iters)
            ref_half = float(ref_lat.get(args.lat_size, {}).get("lat_us_typical", "nan"))
            ref_rtt = 2 * ref_half
            rows.append(
                ("RTT us", args.lat_size, mode, lat["median"], ref_rtt, lat["median"] / ref_rtt)
            )
        finally:
            pair.close()

    print(
        f"\n{'metric':10} {'bytes':>8} {'poll':>6} {'rdmaxfer':>10} {'perftest':>10} {'ratio':>7}"
    )
    for metric, size, mode, ours, ref, ratio in rows:
        print(f"{metric:10} {size:>8} {mode:>6} {ours:>10.3f} {ref:>10.3f} {ratio:>7.2f}")
    print(
        "\nbw: higher is better (target ratio >= 0.9); RTT: rdmaxfer post->completion of one "
        "WRITE vs 2 x ib_write_lat t_typical (target ratio <= 1.1)."
    )
    if args.json:
        with open(args.json, "a") as f:
            for metric, size, mode, ours, ref, ratio in rows:
                f.write(
                    json.dumps(
                        {
                            "metric": metric,
                            "bytes": size,
                            "poll": mode,
                            "rdmaxfer": ours,
                            "perftest": ref,
                            "ratio": ratio,
                        }
                    )
                    + "\n"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
