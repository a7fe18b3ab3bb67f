#!/usr/bin/env python3
"""rdmaxfer.fetch with parallel ranges vs one stream with the same client vs curl, against nginx
on loopback, in one run.

    python bench/fetch_bench.py [--size 1G] [--connections 8] [--repeat 3] [--cap 100M]

A random file of ``--size`` bytes is served by nginx (tests/_nginx.py; Debian's ``nginx``).
For each scenario, each method downloads it to a file ``--repeat`` times (median time):

- ``parallel``: ``rdmaxfer.fetch(url, out, connections=N)`` (chunks from the size);
- ``single``: the same client, one connection, one range for the whole file;
- ``curl``: ``curl -s -o out url``.

Scenarios: ``loopback`` (nginx unthrottled: the client's CPU is the limit) and ``per-connection
cap`` (nginx ``limit_rate --cap`` per connection, as CDNs and object stores limit each
connection; parallel ranges are meant for this). GB/s = 1e9 bytes/s; ratio = single's time /
method's time.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

from _nginx import Nginx  # noqa: E402
from rdmaxfer.tools.bench import parse_size  # noqa: E402
from rdmaxfer.tools.fetch import fetch  # noqa: E402

#: Where the results go by default, named by what they measure (the docs' tables read them).
RESULTS = HERE / "results"


def make_file(path: Path, size: int) -> str:
    """Random bytes (never zeros), written in 64 MiB pieces; returns the sha256."""
    rng = np.random.default_rng(12345)
    h = hashlib.sha256()
    with path.open("wb") as f:
        left = size
        while left:
            n = min(left, 64 << 20)
            block = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
            h.update(block)
            f.write(block)
            left -= n
    return h.hexdigest()


def methods_for(
    url: str, out: Path, size: int, connections: int
) -> list[tuple[str, Callable[[], None]]]:
    def single() -> None:
        fetch(url, out, connections=1, chunk_size=size)

    def parallel() -> None:
        fetch(url, out, connections=connections)

    def curl() -> None:
        subprocess.run(["curl", "-sf", "-o", str(out), url], check=True, timeout=600)

    methods = [
        ("single (rdmaxfer, 1 connection)", single),
        (f"parallel (rdmaxfer, {connections} connections)", parallel),
    ]
    if shutil.which("curl"):
        methods.append(("curl", curl))
    return methods


def timed(run: Callable[[], None], out: Path, repeat: int) -> list[float]:
    times = []
    for _ in range(repeat):
        out.unlink(missing_ok=True)
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return times


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", default="1G", help="file size (default 1G)")
    ap.add_argument("--connections", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--cap", default="100M", help="nginx limit_rate per connection ('' = skip)")
    ap.add_argument("--dir", default=None, help="work directory (default: a temp dir)")
    ap.add_argument(
        "--json",
        default=str(RESULTS / "fetch-vs-curl.json"),
        help="write the rows here (default: %(default)s; '': nowhere)",
    )
    args = ap.parse_args()
    size = parse_size(args.size)
    work = Path(args.dir or tempfile.mkdtemp(prefix="fetch-bench-"))
    www = work / "www"
    www.mkdir(parents=True, exist_ok=True)
    src = www / "file.bin"
    print(f"writing {size} random bytes to {src}", flush=True)
    digest = make_file(src, size)
    cap = parse_size(args.cap) if args.cap else 0
    extra = f"        location /capped/ {{ alias {www}/; limit_rate {cap}; }}\n" if cap else ""
    out = work / "out.bin"
    rows = []
    try:
        with Nginx(www, work / "nginx", extra) as nginx:
            scenarios = [("loopback", f"{nginx.url}/file.bin")]
            if cap:
                scenarios.append(
                    (f"cap {args.cap}B/s per connection", f"{nginx.url}/capped/file.bin")
                )
            for scenario, url in scenarios:
                methods = methods_for(url, out, size, args.connections)
                single = 0.0
                for name, run in methods:
                    times = timed(run, out, args.repeat)
                    med = statistics.median(times)
                    with out.open("rb") as f:
                        ok = hashlib.file_digest(f, "sha256").hexdigest() == digest
                    single = single or med
                    row = {
                        "scenario": scenario,
                        "method": name,
                        "seconds": med,
                        "GB_per_s": size / med / 1e9,
                        "ratio_vs_single": single / med,
                        "intact": ok,
                    }
                    rows.append(row)
                    print(
                        f"{scenario:28} {name:36} {med:7.2f} s {row['GB_per_s']:6.3f} GB/s "
                        f"x{row['ratio_vs_single']:.2f} {'ok' if ok else 'CORRUPT'}",
                        flush=True,
                    )
    finally:
        out.unlink(missing_ok=True)
        if args.dir is None:
            shutil.rmtree(work, ignore_errors=True)
    print(f"\nfile {size} bytes, median of {args.repeat}; ratio = single's time / method's time")
    print(f"{'scenario':28} {'method':36} {'seconds':>9} {'GB/s':>7} {'ratio':>6}")
    for r in rows:
        print(
            f"{r['scenario']:28} {r['method']:36} {r['seconds']:9.2f} {r['GB_per_s']:7.3f} "
            f"{r['ratio_vs_single']:6.2f}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0 if all(r["intact"] for r in rows) else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
