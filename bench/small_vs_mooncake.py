"""rdmaxfer over TCP against Mooncake Transfer Engine (TCP), one-sided WRITEs from 8 B to 1 GiB.

Each side is two processes on this host: a target that registers a buffer and serves it, and an
initiator that WRITEs into it one operation at a time (each done when the target placed the
bytes): rdmaxfer ``Engine("tcp")`` on 127.0.0.1 (``ep.write`` into the peer's registered
region), once per ``--modes`` poll mode and once per ``--before`` build (its default mode), and
Mooncake's Python ``TransferEngine`` with protocol ``"tcp"`` and metadata ``"P2PHANDSHAKE"``
(``transfer_sync_write``), run by ``--mooncake-python`` (a venv with
``mooncake-transfer-engine`` and NumPy). Rounds alternate the sides (A, B, C, A, B, C, ...), a
fresh pair of processes each, so every side sees the same machine load; each figure is the
median over the rounds of a round's median. 8 B is a completion latency in µs, larger sizes
GB/s (1e9 bytes/s). CPU % is each process's CPU time (user + system, every thread) over the
timed operations' wall time: 100 % is one CPU busy. The load average is recorded per run.
Placement is the scheduler's (unpinned); for one CPU run the whole command under
``taskset -c 0`` (the processes inherit it). ``--iperf3`` adds one iperf3 stream per large
size (``tcp_vs_peers.iperf3``) to every round.

Mooncake's wheel links the CUDA runtime and driver (``libcudart.so.12``, ``libcuda.so.1``). On a
host without CUDA, make ``--mooncake-python`` a script that puts on ``LD_LIBRARY_PATH`` the
``lib`` folder of the ``nvidia-cuda-runtime-cu12`` wheel and a stub ``libcuda.so.1`` whose
``cu*`` calls answer "no device" (CUDA_ERROR_NO_DEVICE), then runs the venv's python; its TCP
transport needs neither.

    python bench/small_vs_mooncake.py --mooncake-python /opt/mc/bin/python --rounds 5
    taskset -c 0 python bench/small_vs_mooncake.py --sizes 8,64K,1M --json OUT.json
    python bench/small_vs_mooncake.py --before OLD/bin/python --modes adaptive --sizes 8,64K
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
#: Where the results go by default, named by what they measure (the docs' tables read them).
RESULTS = HERE / "results"
#: Seconds of timed operations per size (after the warm-up), within the iteration bounds.
BUDGET_S = 0.4
MIN_ITERS, MAX_ITERS = 3, 3000


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _load() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def _parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().removesuffix("B").removesuffix("I")
    if text and text[-1] in units:
        return int(text[:-1]) * units[text[-1]]
    return int(text)


# -- the target: serves one buffer, answers the initiator's CPU questions on stdin ---------------
def _target(kind: str, mode: str, size: int) -> None:
    import numpy as np

    buf = np.zeros(size, np.uint8)
    if kind == "mooncake":
        from mooncake.engine import TransferEngine

        te = TransferEngine()
        if te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") != 0:
            raise SystemExit("mooncake: initialize failed")
        if te.register_memory(buf.ctypes.data, buf.nbytes) != 0:
            raise SystemExit("mooncake: register_memory failed")
        hello = {"session": f"127.0.0.1:{te.get_rpc_port()}", "addr": buf.ctypes.data}
        print(json.dumps(hello), flush=True)
    else:
        import rdmaxfer

        engine = rdmaxfer.Engine("tcp", poll_mode=mode) if mode else rdmaxfer.Engine("tcp")
        port = engine.listen("127.0.0.1", 0)
        region = engine.register(buf, access="rw")
        print(json.dumps({"port": port, "desc": region.descriptor().pack().hex()}), flush=True)
        ep = engine.accept(timeout=60)
    for line in sys.stdin:
        if line.strip() != "cpu":
            break
        print(json.dumps(_cpu_s()), flush=True)
    if kind != "mooncake":
        ep.close()
        engine.close()


# -- the initiator: times WRITEs into the target, one at a time ----------------------------------
class _Writer:
    """WRITEs of the first ``n`` bytes of a local buffer to the start of the target's."""

    def __init__(self, kind: str, mode: str, hello: dict[str, Any], size: int) -> None:
        import numpy as np

        self.kind = kind
        self.buf = np.ones(size, np.uint8)
        if kind == "mooncake":
            from mooncake.engine import TransferEngine

            self.te = TransferEngine()
            if self.te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") != 0:
                raise SystemExit("mooncake: initialize failed")
            if self.te.register_memory(self.buf.ctypes.data, self.buf.nbytes) != 0:
                raise SystemExit("mooncake: register_memory failed")
            self.session, self.addr = hello["session"], int(hello["addr"])
        else:
            import rdmaxfer

            self.engine = rdmaxfer.Engine("tcp", poll_mode=mode) if mode else rdmaxfer.Engine("tcp")
            self.region = self.engine.register(self.buf, access="rw")
            self.ep = self.engine.connect(f"127.0.0.1:{hello['port']}", timeout=60)
            self.desc = bytes.fromhex(hello["desc"])

    def write(self, n: int) -> None:
        if self.kind == "mooncake":
            ret = self.te.transfer_sync_write(self.session, self.buf.ctypes.data, self.addr, n)
            if ret != 0:
                raise SystemExit(f"mooncake: transfer_sync_write returned {ret}")
        else:
            self.ep.write(self.buf[:n], self.desc, timeout=60)

    def close(self) -> None:
        if self.kind != "mooncake":
            self.ep.close()
            self.engine.close()


def _initiator(kind: str, mode: str, sizes: list[int]) -> dict[str, Any]:
    size = max(sizes)
    cmd = [sys.executable, __file__, "--target", kind, "--poll-mode", mode, "--size", str(size)]
    target = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert target.stdin is not None and target.stdout is not None

    def target_cpu() -> float:
        assert target.stdin is not None and target.stdout is not None
        target.stdin.write("cpu\n")
        target.stdin.flush()
        return float(json.loads(target.stdout.readline()))

    try:
        writer = _Writer(kind, mode, json.loads(target.stdout.readline()), size)
        rows = []
        for n in sizes:
            t0 = time.perf_counter()
            for _ in range(3 if n >= 1 << 24 else 50):
                writer.write(n)
            per_op = (time.perf_counter() - t0) / (3 if n >= 1 << 24 else 50)
            iters = max(MIN_ITERS, min(MAX_ITERS, round(BUDGET_S / max(per_op, 1e-9))))
            times = []
            theirs, mine, wall = target_cpu(), _cpu_s(), time.perf_counter()
            for _ in range(iters):
                t = time.perf_counter_ns()
                writer.write(n)
                times.append(time.perf_counter_ns() - t)
            wall = time.perf_counter() - wall
            mine, theirs = _cpu_s() - mine, target_cpu() - theirs
            med_ns = statistics.median(times)
            rows.append(
                {
                    "bytes": n,
                    "iters": iters,
                    "lat_us": med_ns / 1e3,
                    "GB_per_s": n / med_ns,
                    "initiator_cpu_pct": 100 * mine / wall,
                    "target_cpu_pct": 100 * theirs / wall,
                }
            )
        writer.close()
    finally:
        target.stdin.close()
        target.wait(timeout=60)
    return {"sizes": rows}


# -- the runner: alternating rounds of every side ------------------------------------------------
def _sides(args: argparse.Namespace) -> list[tuple[str, str, str, str]]:
    """(label, interpreter, kind, poll mode) of every side measured."""
    sides = [(f"rdmaxfer {m}", sys.executable, "rdmaxfer", m) for m in args.modes.split(",") if m]
    if args.before:
        sides.insert(0, ("rdmaxfer before", args.before, "rdmaxfer", ""))
    if args.mooncake_python:
        sides.append(("mooncake", args.mooncake_python, "mooncake", ""))
    return sides


def _one(python: str, kind: str, mode: str, sizes: str) -> dict[str, Any]:
    cmd = [python, __file__, "--initiator", kind, "--poll-mode", mode, "--sizes", sizes]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stderr}")
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def _summary(rounds: list[dict[str, Any]], labels: list[str]) -> dict[str, list[dict[str, Any]]]:
    """Per side and size: the medians over the rounds of every figure."""
    out: dict[str, list[dict[str, Any]]] = {}
    for label in labels:
        runs = [r[label]["sizes"] for r in rounds]
        out[label] = [
            {
                "bytes": runs[0][i]["bytes"],
                **{
                    k: statistics.median(run[i][k] for run in runs)
                    for k in ("lat_us", "GB_per_s", "initiator_cpu_pct", "target_cpu_pct")
                },
            }
            for i in range(len(runs[0]))
        ]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="8,64K,1M,16M,256M,1G")
    parser.add_argument("--modes", default="adaptive,busy,event", help="rdmaxfer poll modes")
    parser.add_argument("--before", help="interpreter of an earlier build (its default mode)")
    parser.add_argument("--before-label", default="", help="what that build is (a commit)")
    parser.add_argument(
        "--mooncake-python", default="", help="interpreter with mooncake-transfer-engine"
    )
    parser.add_argument("--iperf3", action="store_true", help="iperf3 from 16 MiB on, per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", help="default: bench/results/small-vs-mooncake-tcp-Ncpu.json")
    parser.add_argument("--target", help=argparse.SUPPRESS)
    parser.add_argument("--initiator", help=argparse.SUPPRESS)
    parser.add_argument("--poll-mode", default="", help=argparse.SUPPRESS)
    parser.add_argument("--size", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.target:
        _target(args.target, args.poll_mode, args.size)
        return
    sizes = [_parse_size(s) for s in args.sizes.split(",")]
    if args.initiator:
        print(json.dumps(_initiator(args.initiator, args.poll_mode, sizes)))
        return
    sides = _sides(args)
    cpus = len(os.sched_getaffinity(0))
    big = [s for s in sizes if s >= 1 << 24]
    rounds: list[dict[str, Any]] = []
    for i in range(args.rounds):
        result: dict[str, Any] = {}
        for label, python, kind, mode in sides:
            load = _load()
            run = _one(python, kind, mode, args.sizes)
            run["load"] = load
            result[label] = run
            text = "  ".join(
                f"{r['bytes']}B {r['lat_us']:.1f}us/{r['GB_per_s']:.2f}GB/s "
                f"cpu {r['initiator_cpu_pct']:.0f}+{r['target_cpu_pct']:.0f}%"
                for r in run["sizes"]
            )
            print(f"round {i + 1} {label:16s} load {load}: {text}", flush=True)
        if args.iperf3 and big:
            sys.path.insert(0, str(HERE))
            from tcp_vs_peers import iperf3

            rates = iperf3(big, 1)
            result["iperf3"] = {
                "load": _load(),
                "sizes": dict(zip(map(str, big), rates, strict=True)),
            }
            print(f"round {i + 1} iperf3: {result['iperf3']['sizes']}", flush=True)
        rounds.append(result)
    summary = _summary(rounds, [s[0] for s in sides])
    print(f"\nmedians of {args.rounds} alternating rounds, {cpus} CPU(s), unpinned")
    for label, rows in summary.items():
        text = "  ".join(
            f"{r['bytes']}B {r['lat_us']:.1f}us/{r['GB_per_s']:.2f}GB/s "
            f"cpu {r['initiator_cpu_pct']:.0f}+{r['target_cpu_pct']:.0f}%"
            for r in rows
        )
        print(f"{label:16s} {text}")
    path = args.json or str(RESULTS / f"small-vs-mooncake-tcp-{cpus}cpu.json")
    record = {
        "sizes": sizes,
        "cpus": cpus,
        "before_label": args.before_label,
        "sides": {label: {"kind": kind, "mode": mode} for label, _, kind, mode in sides},
        "rounds": rounds,
        "summary": summary,
    }
    if args.iperf3 and big:
        record["iperf3"] = {
            str(s): statistics.median(r["iperf3"]["sizes"][str(s)] for r in rounds) for s in big
        }
    Path(path).write_text(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
