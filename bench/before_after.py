"""Before/after table of small-operation speed: two builds of rdmaxfer in alternating rounds.

Each round runs, in a fresh process of each build's interpreter (``--before``, ``--after``): a
one-sided WRITE per size through the Python API (``rdmaxfer.tools.bench.run_bench``, queue
depth 1) and in the C++ timing loop (``loop="cpp"``), then the reference measured in the same
process right after: plain Python sockets (``tcp_vs_peers.python_sockets``: ``sendall`` +
``recv_into`` + a 1-byte acknowledgement; for 8 bytes and less their 8-byte ping-pong) for
``--transport tcp``; for ``--transport shm`` the same WRITE over TCP loopback (the shm 64 KiB
target), and the plain Python ping-pong for 8 bytes and less (its round-trip target).
Rounds alternate before, after, before, ... so both builds see the same machine load; the table
gives each figure's median over the rounds, and each ratio's median over the rounds (a ratio is
taken within one process).
Latencies are medians of ``--iters`` operations, in microseconds.

``--measure write`` times instead what users see of any release, through the public API only
(so the before build may be any earlier commit): two processes, ``Engine("tcp")`` on 127.0.0.1,
one-sided ``ep.write`` into the peer's registered region, one at a time
(``small_vs_mooncake.py``'s rdmaxfer side, its default poll mode, or ``--poll-mode``): the
median latency per size, GB/s, and each process's CPU %. The table then compares the builds
with each other (after vs before, per round). This is the regression guard of small and large
WRITEs against the previous release.

``--pin A,B`` fixes the placement for every figure alike: each round's process (and every thread
of it) runs on CPU A, the peer processes it spawns (rdmaxfer's bench peer, the plain Python
peer) on CPU B. Without it the scheduler places them, and on a 2-CPU machine that decides more
than either implementation: a plain Python 8-byte ping-pong takes ~6 µs with both processes on
one CPU and ~47 µs across two.

    python bench/before_after.py --before OLD/bin/python --transport tcp
    python bench/before_after.py --before OLD/python --after NEW/python --transport shm \
        --sizes 8,64K --rounds 5
    python bench/before_after.py --before RELEASE/python --measure write --sizes 8,64K,1M,16M
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

#: Where the results go by default, named by what they measure (the docs' tables read them).
RESULTS = Path(__file__).resolve().parent / "results"

HERE = os.path.dirname(os.path.abspath(__file__))


def _pin(mine: int, peers: int) -> None:
    """Run this process on CPU ``mine`` and every process it spawns from now on (through
    ``multiprocessing``'s spawn context, as both peers are started) on CPU ``peers``: a child
    inherits the affinity it is started with, so the parent takes ``peers`` for the start."""
    from multiprocessing.context import SpawnProcess

    os.sched_setaffinity(0, {mine})
    start = SpawnProcess.start

    def start_on_peer_cpu(self: SpawnProcess) -> None:
        os.sched_setaffinity(0, {peers})
        try:
            start(self)
        finally:
            os.sched_setaffinity(0, {mine})

    SpawnProcess.start = start_on_peer_cpu  # type: ignore[method-assign]


def one_round(transport: str, sizes: list[int], iters: int) -> dict[str, Any]:
    """This interpreter's figures (microseconds per WRITE, by size) and the reference's."""
    from rdmaxfer.tools import bench

    sys.path.insert(0, HERE)
    from tcp_vs_peers import python_sockets

    def lat(loop: str, over: str) -> list[float]:
        rows = bench.run_bench(
            transport=over, op="write", sizes=sizes, iters=iters, warmup=20, loop=loop
        )
        return [r.lat_us_p50 for r in rows]

    api, cpp = lat("python", transport), lat("cpp", transport)
    # Sizes of 8 bytes and less take the ping-pong (python_sockets acknowledges those with
    # all their bytes, not the 1 byte its own loop reads back).
    big = [s for s in sizes if s > 8] or [4096]
    rates, rtt = python_sockets(big, iters, iters)
    rate_of = dict(zip(big, rates, strict=True))
    if transport == "tcp":
        ref = [rtt if s <= 8 else s / rate_of[s] * 1e-3 for s in sizes]
        ref_name = "plain Python sockets (8 bytes and less: their ping-pong)"
    else:
        tcp = lat("python", "tcp")
        ref = [rtt if s <= 8 else t for s, t in zip(sizes, tcp, strict=True)]
        ref_name = "tcp loopback, Python API (8 bytes and less: plain Python ping-pong)"
    return {"api_us": api, "cpp_us": cpp, "ref_us": ref, "ref": ref_name}


def write_round(sizes: list[int], mode: str) -> dict[str, Any]:
    """This interpreter's one-sided TCP WRITEs through the public API, one at a time, between
    two processes: per size the median latency (µs), GB/s and both processes' CPU %."""
    sys.path.insert(0, HERE)
    from small_vs_mooncake import _initiator

    rows = _initiator("rdmaxfer", mode, sizes)["sizes"]
    return {key: [r[key] for r in rows] for key in rows[0]}


def _run(python: str, args: argparse.Namespace) -> dict[str, Any]:
    cmd = [python, os.path.abspath(__file__), "--one", "--transport", args.transport,
           "--sizes", args.sizes, "--iters", str(args.iters),
           "--measure", args.measure]  # fmt: skip
    if args.pin:
        cmd += ["--pin", args.pin]
    if args.poll_mode and python == args.after:
        cmd += ["--poll-mode", args.poll_mode]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, check=True)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def _load() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def _write_table(args: argparse.Namespace, rounds: dict[str, list[dict[str, Any]]]) -> None:
    """The --measure write table: each build's medians and after vs before."""

    def med(label: str, key: str, i: int) -> float:
        return statistics.median(r[key][i] for r in rounds[label])

    def speed(i: int) -> float:  # per round: before latency / after latency
        pairs = zip(rounds["before"], rounds["after"], strict=True)
        return statistics.median(b["lat_us"][i] / a["lat_us"][i] for b, a in pairs)

    print(
        f"\ntcp one-sided WRITE through the public API ({_where(args)}), median of "
        f"{args.rounds} alternating rounds; speed = before latency / after latency\n"
    )
    print("| bytes | before µs | after µs | before GB/s | after GB/s | after vs before "
          "| CPU % before (initiator+target) | CPU % after |")  # fmt: skip
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for i, size in enumerate(rounds["after"][0]["bytes"]):
        cpu = {
            label: f"{med(label, 'initiator_cpu_pct', i):.0f}+{med(label, 'target_cpu_pct', i):.0f}"
            for label in rounds
        }
        print(
            f"| {size} | {med('before', 'lat_us', i):.1f} | {med('after', 'lat_us', i):.1f} "
            f"| {med('before', 'GB_per_s', i):.2f} | {med('after', 'GB_per_s', i):.2f} "
            f"| {speed(i):.2f}x | {cpu['before']} | {cpu['after']} |"
        )


def _where(args: argparse.Namespace) -> str:
    if not args.pin:
        return "unpinned"
    mine, peers = args.pin.split(",")
    return f"pinned: this side CPU {mine}, peers CPU {peers}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", help="interpreter with the 'before' build installed")
    parser.add_argument("--after", default=sys.executable, help="the 'after' build's")
    parser.add_argument(
        "--before-label", default="", help="what the before build is (a commit), in the JSON"
    )
    parser.add_argument("--transport", choices=("tcp", "shm"), default="tcp")
    parser.add_argument("--sizes", default="8,64K,1M")
    parser.add_argument("--iters", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--json",
        help="write every round here ('': nowhere; default: "
        "bench/results/small-ops-TRANSPORT[-cpus-A-B].json)",
    )
    parser.add_argument(
        "--pin", help="A,B: this side on CPU A, the peer processes on CPU B (default: unpinned)"
    )
    parser.add_argument(
        "--measure",
        choices=("engine", "write"),
        default="engine",
        help="engine: the bench module's WRITE loops and their references; write: public-API "
        "WRITEs between two processes (any release)",
    )
    parser.add_argument("--poll-mode", default="", help="the after build's poll_mode (write)")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    sys.path.insert(0, HERE)
    from small_vs_mooncake import _parse_size

    sizes = [_parse_size(s) for s in args.sizes.split(",")]
    if args.one:
        if args.pin:
            mine, peers = (int(c) for c in args.pin.split(","))
            _pin(mine, peers)
        if args.measure == "write":
            print(json.dumps(write_round(sizes, args.poll_mode)))
        else:
            print(json.dumps(one_round(args.transport, sizes, args.iters)))
        return
    if args.measure == "write" and args.transport != "tcp":
        parser.error("--measure write: over tcp only")
    if not args.before:
        parser.error("--before: the interpreter of the build to compare against")
    rounds: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
    for i in range(args.rounds):
        for label in ("before", "after"):
            load = _load()
            result = _run(args.before if label == "before" else args.after, args)
            result["load"] = load
            rounds[label].append(result)
            if args.measure == "write":
                text = "  ".join(
                    f"{s}B {t:.1f}us {c:.0f}+{d:.0f}%"
                    for s, t, c, d in zip(
                        sizes, result["lat_us"], result["initiator_cpu_pct"],
                        result["target_cpu_pct"], strict=True,
                    )
                )  # fmt: skip
                print(f"round {i + 1} {label:6s} load {load}: WRITE {text}", flush=True)
                continue
            figures = zip(sizes, result["api_us"], result["cpp_us"], result["ref_us"], strict=True)
            text = "  ".join(f"{s}B {a:.1f}/{c:.1f}/{r:.1f}" for s, a, c, r in figures)
            print(f"round {i + 1} {label:6s} load {load}: api/cpp/ref us {text}", flush=True)
    if args.measure == "write":
        _write_table(args, rounds)
        if args.json is None:
            placement = f"-cpus-{args.pin.replace(',', '-')}" if args.pin else ""
            args.json = str(RESULTS / f"write-before-after-tcp{placement}.json")
        if args.json:
            record = {"sizes": sizes, "before": args.before_label, "rounds": rounds}
            with open(args.json, "w") as f:
                json.dump(record, f, indent=2)
        return
    ref_name = rounds["after"][0]["ref"]

    def med(label: str, key: str, i: int) -> float:
        return statistics.median(r[key][i] for r in rounds[label])

    def ratio(label: str, key: str, i: int) -> float:
        # speed relative to the reference = reference latency / our latency, per round
        return statistics.median(r["ref_us"][i] / r[key][i] for r in rounds[label])

    where = _where(args)
    print(
        f"\n{args.transport} WRITE ({where}), median of {args.rounds} alternating rounds of "
        f"{args.iters} operations each; reference: {ref_name} in the same process; "
        "speed vs reference = reference latency / ours (higher is better)\n"
    )
    print("| bytes | before API µs | after API µs | after C++ loop µs | reference µs "
          "| before vs ref | after vs ref |")  # fmt: skip
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for i, size in enumerate(sizes):
        print(
            f"| {size} | {med('before', 'api_us', i):.1f} | {med('after', 'api_us', i):.1f} "
            f"| {med('after', 'cpp_us', i):.1f} | {med('after', 'ref_us', i):.1f} "
            f"| {ratio('before', 'api_us', i):.2f}x | {ratio('after', 'api_us', i):.2f}x |"
        )
    if args.json is None:
        placement = f"-cpus-{args.pin.replace(',', '-')}" if args.pin else ""
        args.json = str(RESULTS / f"small-ops-{args.transport}{placement}.json")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"sizes": sizes, "iters": args.iters, "rounds": rounds}, f, indent=2)


if __name__ == "__main__":
    main()
