"""Before/after table of weight sync on the MiniLM file: two builds of rdmaxfer in alternating
rounds (before, after, before, ...), so both see the same machine load.

Each round runs, in fresh processes of the build: ``bench/weight_sync_bench.py --iters 1`` (one
consumer pulling every tensor whole, then four consumers a quarter of the rows each; their
times), and the time ``WeightServer(path)`` takes to publish the file (the constructor: it reads,
registers and, since versions are immutable, copies what it serves). The table gives each
figure's median over the rounds and the after/before ratio of the medians.

A build is a ``PYTHONPATH`` (``""``: the rdmaxfer installed in this interpreter's environment).

    python bench/weight_sync_before_after.py --after-path python --rounds 4 \
        --json bench/results/weight-sync-before-after-tcp.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))

PUBLISH = """
import time
from rdmaxfer.tools.cli_weights import default_model_file
from rdmaxfer.weights import WeightServer
path = default_model_file()
start = time.perf_counter()
server = WeightServer(path, transport={transport!r})
print(time.perf_counter() - start)
server.close()
"""


def _env(path: str) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    if path:
        env["PYTHONPATH"] = os.path.abspath(path)
    return env


def one_round(path: str, transport: str) -> dict[str, float]:
    """One build's figures in seconds: one full pull, four sharded pulls, publishing."""
    env = _env(path)
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "round.json")
        subprocess.run(
            [
                sys.executable,
                os.path.join(HERE, "weight_sync_bench.py"),
                "--iters",
                "1",
                "--transport",
                transport,
                "--json",
                out,
            ],
            env=env,
            check=True,
            stdout=subprocess.DEVNULL,
        )
        with open(out) as f:
            sync = json.load(f)
    publish = subprocess.run(
        [sys.executable, "-c", PUBLISH.format(transport=transport)],
        env=env,
        capture_output=True,
        text=True,
    )
    if publish.returncode != 0:
        raise SystemExit(f"timing WeightServer with PYTHONPATH={path!r} failed:\n{publish.stderr}")
    return {
        "one_s": float(sync["one_s"][0]),
        "four_s": float(sync["four_s"][0]),
        "publish_s": float(publish.stdout.split()[-1]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before-path", default="", help="PYTHONPATH of the reference build")
    parser.add_argument("--after-path", required=True, help="PYTHONPATH of the new build")
    parser.add_argument("--transport", default="tcp", choices=["tcp", "rdma"])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--json", help="write the rounds and medians here")
    args = parser.parse_args()
    rounds: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
    for r in range(args.rounds):
        for build, path in (("before", args.before_path), ("after", args.after_path)):
            figures = one_round(path, args.transport)
            rounds[build].append(figures)
            print(
                f"round {r + 1} {build}: "
                + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in figures.items()),
                flush=True,
            )
    medians: dict[str, dict[str, float]] = {
        build: {k: statistics.median(f[k] for f in figs) for k in figs[0]}
        for build, figs in rounds.items()
    }
    print(f"# weight sync, MiniLM, {args.transport}, median of {args.rounds} alternating rounds")
    print(f"{'figure':<12}{'before ms':>12}{'after ms':>12}{'after/before':>14}")
    for key in medians["before"]:
        b, a = medians["before"][key], medians["after"][key]
        print(f"{key:<12}{b * 1e3:>12.1f}{a * 1e3:>12.1f}{a / b:>13.2f}x")
    if args.json:
        result: dict[str, Any] = {
            "transport": args.transport,
            "rounds": rounds,
            "medians": medians,
            "ratios": {k: medians["after"][k] / medians["before"][k] for k in medians["before"]},
        }
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
