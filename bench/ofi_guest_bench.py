#!/usr/bin/env python3
"""rdmaxfer's ofi transport over libfabric's verbs;ofi_rxm against rdmaxfer's own verbs
transport (rdma) and the references, on the soft-RoCE devices of the test VM, in one run:

    tests/rxe/run-in-vm.sh -- .venv/bin/python bench/ofi_guest_bench.py

Each round, in turn (the order reversed every other round): ofi, rdma (each: a server engine
on rxe1, a client on rxe0), ``ib_write_bw`` (tests/rxe/perftest-ref.sh) and ``fi_pingpong -p
"verbs;ofi_rxm" -e rdm -S 8`` (server on rxe1, client on rxe0). Bandwidth: ``--iters`` WRITEs
of each size with ``--depth`` in flight (ib_write_bw with the same send queue depth), timed in C++
(``Endpoint.timed_loop``) from the first post to the last completion. Round trip: 8-byte
WRITEs one at a time, post to completion (median), beside fi_pingpong's usec/xfer (a SEND
ping-pong: two one-way messages). Medians over the rounds; the 1-minute load average of each
round is recorded. Under TCG emulation absolute numbers mean little: read the
ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np

from rdmaxfer import _core

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
RW = _core.ACCESS_REMOTE_READ | _core.ACCESS_REMOTE_WRITE
PROVIDER = "verbs;ofi_rxm"


def devices() -> list[str]:
    return os.environ.get("RDMAXFER_RXE_DEVICES", "rxe0 rxe1").split()


def addrs() -> list[str]:
    return os.environ.get("RDMAXFER_RXE_ADDRS", "10.77.0.1 10.77.0.2").split()


def side_rails(side: int, rails: int) -> list[str]:
    """Side `side`'s devices (0: client, 1: server): its first `rails` of
    RDMAXFER_RXE_RAIL_DEVICES (``run-in-vm.sh --rails 2``), or its one device."""
    sides = os.environ.get("RDMAXFER_RXE_RAIL_DEVICES", "").split()
    names = sides[side].split(",") if len(sides) == 2 else [devices()[side]]
    if len(names) < rails:
        raise SystemExit(f"{rails} rails need run-in-vm.sh --rails {rails} (side {side}: {names})")
    return names[:rails]


def engine(transport: str, side: int, rails: int = 1) -> _core.Engine:
    if transport == "ofi":
        os.environ["RDMAXFER_OFI_PROVIDER"] = PROVIDER
        os.environ["RDMAXFER_OFI_IFACE"] = ",".join(side_rails(side, rails))
        return _core.Engine("ofi")
    return _core.Engine("rdma", rdma_devices=side_rails(side, rails))


def measure(
    transport: str, sizes: list[int], iters: int, depth: int, rtt_iters: int, rails: int = 1
) -> dict[str, Any]:
    """{size: Gb/s} and the 8-byte WRITE round trip (median us) of `transport` on `rails`
    rails per side."""
    server, client = engine(transport, 1, rails), engine(transport, 0, rails)
    try:
        port = server.listen(addrs()[1], 0)
        ep = client.connect(addrs()[1], port, 0, 60.0)
        peer = server.accept(60.0)  # held: a dropped endpoint closes
        out: dict[str, Any] = {"Gbit_per_s": {}}
        for size in sizes:
            src = client.alloc_pinned(size, 0)
            np.frombuffer(src, np.uint8)[:] = 7  # type: ignore[call-overload]
            dst = server.alloc_pinned(size, RW)
            times = ep.timed_loop("write", src, 0, dst.descriptor(), 0, size, iters, 8, depth, 120)
            out["Gbit_per_s"][size] = size * 8 * iters / sum(times) / 1e9
        src, dst = client.alloc_pinned(8, 0), server.alloc_pinned(8, RW)
        times = ep.timed_loop("write", src, 0, dst.descriptor(), 0, 8, rtt_iters, 20, 1, 60)
        out["rtt_us"] = statistics.median(times) * 1e6
        peer.close()
        return out
    finally:
        client.close()
        server.close()


def ib_write_bw(sizes: list[int], iters: int, depth: int) -> dict[int, float]:
    """ib_write_bw's Gb/s per size with `depth` WRITEs in flight (perftest's --tx-depth), as
    rdmaxfer's loop keeps."""
    cmd = [str(HERE.parent / "tests/rxe/perftest-ref.sh"), "-n", str(iters), "-t", "bw",
           "-d", str(depth)]  # fmt: skip
    done = subprocess.run([*cmd, *map(str, sizes)], capture_output=True, text=True, timeout=900)
    out = {}
    for line in done.stdout.splitlines():
        if line.startswith("{"):
            row = json.loads(line)
            if "bw_Gbit_per_s" in row:
                out[int(row["bytes"])] = float(row["bw_Gbit_per_s"])
    return out


def fi_pingpong(iters: int) -> float | None:
    """fi_pingpong -p verbs;ofi_rxm -e rdm -S 8, server on rxe1, client on rxe0: usec/xfer."""
    args = ["fi_pingpong", "-p", PROVIDER, "-e", "rdm", "-S", "8", "-I", str(iters)]
    server = subprocess.Popen(
        [*args, "-d", devices()[1]], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        out = ""
        for _ in range(20):  # the server listens after its domain opened: retry the client
            time.sleep(1.0)
            done = subprocess.run(
                [*args, "-d", devices()[0], addrs()[1]], capture_output=True, text=True,
                timeout=300,
            )  # fmt: skip
            out = done.stdout
            if done.returncode == 0:
                break
    finally:
        try:
            server.wait(timeout=300)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(10)
    match = re.search(r"^8\s+\S+\s+\S+\s+\S+\s+\S+\s+\S+\s+([0-9.]+)", out, re.MULTILINE)
    return float(match.group(1)) if match else None


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--sizes", default="65536,1048576")
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--depth", type=int, default=16)
    parser.add_argument("--rtt-iters", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", default=str(RESULTS / "ofi-vs-verbs-rxe.json"))
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    runs: dict[str, list[Any]] = {"ofi": [], "rdma": [], "ib_write_bw": [], "fi_pingpong": []}
    loads = []
    for r in range(args.rounds):
        loads.append(os.getloadavg()[0])
        # Alternating rounds: the order flips every round, so neither side always runs first.
        order = ["ofi", "rdma", "ib_write_bw", "fi_pingpong"]
        for name in order if r % 2 == 0 else order[::-1]:
            if name in ("ofi", "rdma"):
                runs[name].append(measure(name, sizes, args.iters, args.depth, args.rtt_iters))
            elif name == "ib_write_bw":
                runs[name].append(ib_write_bw(sizes, args.iters, args.depth))
            else:
                runs[name].append(fi_pingpong(args.rtt_iters))
        print(f"round {r + 1}: {json.dumps({k: v[-1] for k, v in runs.items()})}", flush=True)

    def med(values: list[float | None]) -> float | None:
        got = [v for v in values if v is not None]
        return statistics.median(got) if got else None

    rows = []
    for size in sizes:
        row: dict[str, Any] = {"bytes": size}
        for t in ("ofi", "rdma"):
            row[f"{t}_Gbit_per_s"] = med([run["Gbit_per_s"][size] for run in runs[t]])
        row["ib_write_bw_Gbit_per_s"] = med([run.get(size) for run in runs["ib_write_bw"]])
        rows.append(row)
        print(row)
    rtt = {
        "ofi_write_us": med([run["rtt_us"] for run in runs["ofi"]]),
        "rdma_write_us": med([run["rtt_us"] for run in runs["rdma"]]),
        "fi_pingpong_usec_per_xfer": med(runs["fi_pingpong"]),
    }
    print(f"8-byte round trip: {rtt}")
    result = {
        "what": "ofi (verbs;ofi_rxm) vs rdmaxfer verbs vs ib_write_bw / fi_pingpong on rxe (TCG)",
        "rounds": args.rounds, "iters": args.iters, "depth": args.depth,
        "sizes": rows, "rtt": rtt, "loadavg_1min": loads, "runs": runs,
    }  # fmt: skip
    if args.json:
        Path(args.json).parent.mkdir(exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
