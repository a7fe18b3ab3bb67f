#!/usr/bin/env python3
"""rdmaxfer RDMA WRITE against perftest on the same devices, side by side in one run.

Run inside the rxe VM (two soft-RoCE devices, rxe0 <-> rxe1)::

    tests/rxe/run-in-vm.sh -- env PYTHONPATH=python .venv/bin/python bench/rdma_vs_perftest.py

It runs ``tests/rxe/perftest-ref.sh`` (ib_write_bw / ib_write_lat, server on rxe1, client on
rxe0, GID index RDMAXFER_GID_INDEX) and then the same transfers through rdmaxfer, each two ways:

* ``C++ loop``: ``Endpoint.timed_loop`` (csrc/engine/timed_loop.cc), a tight loop in C++ over the
  same post/wait path the Python API uses, like perftest's own loop. A one-at-a-time wait drives
  the CQ itself (caller-driven progress) for up to 1 ms before it sleeps; with several in
  flight it spins at most 50 us, leaving the CPU to rxe (the kernel on the same vCPUs).
* ``Python``: the same operations posted and waited for from Python (``post_write`` +
  ``Request.wait``), i.e. what one API call costs; the wait spins at most 50 us before it sleeps.

Bandwidth: ``--iters`` RDMA WRITEs of each size from an engine on rxe0 into a region of an engine
on rxe1, at most ``--depth`` in flight (default 128, perftest's ib_write_bw default tx depth);
Gb/s = bits / (first post -> last completion). Latency: 8-byte WRITEs one at a time; each is
timed from post to its completion, which is one round trip (the WRITE and the responder's ACK).
perftest's ib_write_lat reports half of a ping-pong round trip (t_typical), so the table
compares against 2 x t_typical. That ping-pong needs both perftest processes on the guest's two
vCPUs at once, so a loaded host inflates it; the ``READ us`` row compares a single-process round
trip with the same shape on both sides: rdmaxfer's 8-byte READ (C++ loop) vs ib_read_lat.

Under TCG emulation absolute numbers mean little; the ratios are what to read. Target: >= 0.9x
perftest's bandwidth, <= 1.2x its round trip.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from rdmaxfer import _core

#: Where the results go by default, named by what they measure (the docs' tables read them).
RESULTS = Path(__file__).resolve().parent / "results"

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


def perftest_read_lat(size: int, iters: int) -> float:
    """ib_read_lat t_typical in microseconds (nan on failure). Unlike ib_write_lat's ping-pong
    it times one READ round trip from a single active process, as rdmaxfer's loop does, so host
    scheduling of the guest's vCPUs hits both alike."""
    devs = os.environ.get("RDMAXFER_RXE_DEVICES", "rxe0 rxe1").split()
    addrs = os.environ.get("RDMAXFER_RXE_ADDRS", "10.77.0.1 10.77.0.2").split()
    gid = os.environ.get("RDMAXFER_GID_INDEX", "1")
    opts = ["-x", gid, "-n", str(iters), "-s", str(size), "-F"]
    for attempt in range(3):
        port = str(19515 + 7 * attempt + os.getpid() % 500)
        server = subprocess.Popen(
            ["ib_read_lat", "-d", devs[1], *opts, "-p", port],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                client = subprocess.run(
                    ["ib_read_lat", "-d", devs[0], *opts, "-p", port, addrs[1]],
                    capture_output=True,
                    text=True,
                    timeout=300,
                )
                if client.returncode == 0:
                    for line in client.stdout.splitlines():
                        f = line.split()
                        if len(f) >= 9 and f[0] == str(size) and f[1].isdigit():
                            return float(f[4])  # t_typical
                    break
                if server.poll() is not None:
                    break
                time.sleep(0.5)  # the server is not listening yet
        finally:
            server.kill()
            server.wait()
    return float("nan")


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


def regions(pair: Pair, size: int) -> tuple[_core.Region, _core.Region, _core.Descriptor]:
    src = pair.client.alloc_pinned(size, 0)
    dst = pair.server.alloc_pinned(size, RW)
    np.frombuffer(src, dtype=np.uint8)[:] = np.random.default_rng(1).integers(  # type: ignore[call-overload]
        1, 256, size, dtype=np.uint8
    )
    return src, dst, dst.descriptor()


def py_bw(pair: Pair, size: int, iters: int, depth: int) -> float:
    src, _dst, desc = regions(pair, size)
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


def cpp_bw(pair: Pair, size: int, iters: int, depth: int) -> float:
    src, _dst, desc = regions(pair, size)
    times = pair.ep.timed_loop("write", src, 0, desc, 0, size, iters, min(iters, 8), depth, 120)
    return size * iters * 8 / sum(times) / 1e9


def summary(samples_us: list[float]) -> dict[str, float]:
    ordered = sorted(samples_us)
    return {
        "median": statistics.median(ordered),
        "min": ordered[0],
        "p99": ordered[max(0, int(len(ordered) * 0.99) - 1)],
    }


def py_lat(pair: Pair, size: int, iters: int) -> dict[str, float]:
    src, _dst, desc = regions(pair, size)
    samples = []
    for i in range(iters + 20):
        t0 = time.perf_counter()
        r = pair.ep.post_write(src, 0, desc, 0, size, 0, 1)
        assert r.wait(60)
        t1 = time.perf_counter()
        r.check()
        if i >= 20:
            samples.append((t1 - t0) * 1e6)
    return summary(samples)


def cpp_lat(pair: Pair, size: int, iters: int, op: str = "write") -> dict[str, float]:
    src, _dst, desc = regions(pair, size)
    times = pair.ep.timed_loop(op, src, 0, desc, 0, size, iters, 20, 1, 60)
    return summary([t * 1e6 for t in times])


def clocksource() -> str:
    try:
        with open("/sys/devices/system/clocksource/clocksource0/current_clocksource") as f:
            return f.read().strip()
    except OSError:
        return "unknown"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[65536, 1 << 20])
    ap.add_argument("--iters", type=int, default=200, help="WRITEs per bandwidth size")
    ap.add_argument("--lat-iters", type=int, default=500)
    ap.add_argument(
        "--depth", type=int, default=128, help="rdmaxfer WRITEs in flight (ib_write_bw: 128)"
    )
    ap.add_argument("--modes", nargs="+", default=["event", "busy"], choices=["event", "busy"])
    ap.add_argument("--lat-size", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3, help="perftest/rdmaxfer rounds, interleaved")
    ap.add_argument(
        "--json",
        default=str(RESULTS / "rdma-vs-perftest-rxe.json"),
        help="write the results here (default: %(default)s; '': nowhere)",
    )
    args = ap.parse_args()
    if _core.available_transports()["rdma"]:
        print("no RDMA device:", _core.available_transports()["rdma"], file=sys.stderr)
        return 2

    # Rounds interleave perftest and rdmaxfer, so that load drifting on the host (the guest's
    # vCPUs are host threads) hits both alike; each figure is the median over the rounds and the
    # ratio range is that of the per-round ratios.
    ref: dict[tuple[str, int], list[float]] = {}
    ours: dict[tuple[str, int, str, str], list[float]] = {}
    for _ in range(args.rounds):
        ref_bw = perftest("bw", args.sizes, args.iters)
        ref_lat = perftest("lat", [args.lat_size], args.lat_iters)
        for size in args.sizes:
            ref.setdefault(("bw Gb/s", size), []).append(
                float(ref_bw.get(size, {}).get("bw_Gbit_per_s", "nan"))
            )
        half = float(ref_lat.get(args.lat_size, {}).get("lat_us_typical", "nan"))
        ref.setdefault(("RTT us", args.lat_size), []).append(2 * half)
        ref.setdefault(("READ us", args.lat_size), []).append(
            perftest_read_lat(args.lat_size, args.lat_iters)
        )
        for mode in args.modes:
            pair = Pair(mode)
            try:
                for size in args.sizes:
                    for loop, fn in (("C++ loop", cpp_bw), ("Python", py_bw)):
                        value = fn(pair, size, args.iters, args.depth)
                        ours.setdefault(("bw Gb/s", size, mode, loop), []).append(value)
                for loop, lat_fn in (("C++ loop", cpp_lat), ("Python", py_lat)):
                    lat = lat_fn(pair, args.lat_size, args.lat_iters)
                    key = ("RTT us", args.lat_size, mode, loop)
                    ours.setdefault(key, []).append(lat["median"])
                lat = cpp_lat(pair, args.lat_size, args.lat_iters, "read")
                ours.setdefault(("READ us", args.lat_size, mode, "C++ loop"), []).append(
                    lat["median"]
                )
            finally:
                pair.close()

    rows = []
    for (metric, size, mode, loop), values in ours.items():
        refs = ref[(metric, size)]
        ratios = [o / r if r > 0 else float("nan") for o, r in zip(values, refs, strict=True)]
        mine, theirs = statistics.median(values), statistics.median(refs)
        ratio = mine / theirs if theirs > 0 else float("nan")
        rows.append((metric, size, mode, loop, mine, theirs, ratio, min(ratios), max(ratios)))

    print(f"\nclocksource {clocksource()}, {os.cpu_count()} CPUs, {args.rounds} round(s)")
    print(
        f"{'metric':10} {'bytes':>8} {'poll':>6} {'loop':>9} {'rdmaxfer':>10} {'perftest':>10} "
        f"{'ratio':>7} {'per-round':>12}"
    )
    for metric, size, mode, loop, mine, theirs, ratio, lo, hi in rows:
        print(
            f"{metric:10} {size:>8} {mode:>6} {loop:>9} {mine:>10.3f} {theirs:>10.3f} "
            f"{ratio:>7.2f} {lo:>5.2f}-{hi:<5.2f}"
        )
    print(
        "\nbw: higher is better (target ratio >= 0.9); RTT: rdmaxfer post->completion of one "
        "WRITE vs 2 x ib_write_lat t_typical (target ratio <= 1.2); READ: one 8-byte RDMA READ "
        "round trip vs ib_read_lat t_typical (same shape: one active process). Medians over "
        "rounds."
    )
    if args.json:
        keys = ("metric", "bytes", "poll", "loop", "rdmaxfer", "perftest", "ratio")
        records = [
            {**dict(zip(keys, row[:7], strict=True)), "ratio_min": row[7], "ratio_max": row[8]}
            for row in rows
        ]
        with open(args.json, "w") as f:
            json.dump(
                {
                    "rounds": args.rounds,
                    "iters": args.iters,
                    "lat_iters": args.lat_iters,
                    "rows": records,
                },
                f,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
