#!/usr/bin/env python3
"""rdmaxfer.load_weights vs fio (the disk's rate) vs safetensors.numpy.load_file, from a cold
page cache, in one run.

    sudo python bench/load_bench.py [--size 1G] [--rounds 3] [--dir DIR] [--json OUT]

A safetensors file of ``--size`` bytes (random F32/F16/BF16 tensors of 1-64 MiB) is written in
``--dir`` (default: a temporary folder on the disk holding the system's temporary files). Each
round runs the three methods in a rotated order, the page cache dropped (``sync; echo 3 >
/proc/sys/vm/drop_caches``, so it needs root) before each:

- ``rdmaxfer``: ``load_weights(path)`` into new host arrays (O_DIRECT, io_uring);
- ``fio``: ``fio --direct=1 --rw=read --bs=1M --iodepth=16 --ioengine=io_uring`` on the file;
- ``safetensors``: ``safetensors.numpy.load_file(path)`` (mmap and copy).

GB/s = 1e9 bytes/s of the file's size; the table gives the medians, the best round and
rdmaxfer's ratio to each reference (medians), and the spread of the ratios within each round
with the rounds' load averages (``per_round``, ``round_loads`` in the JSON). The new arrays'
pages are faulted in (zeroed by the kernel) during the load, as load_file's are; fio reads into
one reused buffer.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
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

from _st_files import write  # noqa: E402
from rdmaxfer import load_weights  # noqa: E402
from rdmaxfer.tools.bench import parse_size  # noqa: E402

RESULTS = HERE / "results"
DEFAULT_JSON = RESULTS / "load-vs-fio-safetensors.json"


def make_checkpoint(path: Path, size: int) -> int:
    """Random tensors of 1-64 MiB adding up to about ``size`` bytes; returns the file's size."""
    import ml_dtypes

    rng = np.random.default_rng(7)
    dtypes = [np.dtype(np.float32), np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)]
    tensors = {}
    left, i = size, 0
    while left > 0:
        n = min(left, int(rng.integers(1, 65)) << 20)
        dtype = dtypes[i % len(dtypes)]
        raw = rng.integers(0, 256, n - n % (dtype.itemsize * 1024), dtype=np.uint8)
        tensors[f"layer{i}.weight"] = raw.view(dtype).reshape(-1, 1024)
        left -= n
        i += 1
    write(path, tensors)
    return path.stat().st_size


def drop_caches() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def run_fio(path: Path, size: int) -> float:
    """Seconds fio took to read the file (its own runtime)."""
    out = subprocess.run(
        [
            "fio", "--name=read", f"--filename={path}", "--direct=1", "--rw=read", "--bs=1M",
            "--iodepth=16", "--ioengine=io_uring", f"--size={size}", "--output-format=json",
        ],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    job = json.loads(out)["jobs"][0]["read"]
    return size / float(job["bw_bytes"])


def timed(fn: Callable[[], object]) -> float:
    """Seconds ``fn`` took; its result is freed after the clock stops (for every method)."""
    start = time.perf_counter()
    result = fn()
    elapsed = time.perf_counter() - start
    del result
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="1G", help="file size (default 1G)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=None, help="where to write the file")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON)
    args = parser.parse_args()
    from safetensors.numpy import load_file

    with tempfile.TemporaryDirectory(dir=args.dir, prefix="rdmaxfer-load-") as tmp:
        path = Path(tmp) / "model.safetensors"
        size = make_checkpoint(path, parse_size(args.size))
        methods: dict[str, Callable[[], float]] = {
            "rdmaxfer": lambda: timed(lambda: load_weights(path)),
            "fio": lambda: run_fio(path, size),
            "safetensors": lambda: timed(lambda: load_file(str(path))),
        }
        io = load_weights(path).files[0]
        seconds: dict[str, list[float]] = {m: [] for m in methods}
        loads: list[float] = []  # the 1-minute load average at the start of each round
        order = list(methods)
        for r in range(args.rounds):
            loads.append(os.getloadavg()[0])
            for m in order[r % 3 :] + order[: r % 3]:
                drop_caches()
                seconds[m].append(methods[m]())
                print(f"round {r} {m}: {size / seconds[m][-1] / 1e9:.2f} GB/s", flush=True)
            print(f"round {r}: load {loads[-1]:.1f}", flush=True)
    median = {m: size / statistics.median(s) / 1e9 for m, s in seconds.items()}
    per_round = {  # rdmaxfer's ratio to each reference within each round (same disk, same load)
        ref: [b / a for a, b in zip(seconds["rdmaxfer"], seconds[ref], strict=True)]
        for ref in ("fio", "safetensors")
    }
    result = {
        "file_bytes": size,
        "rounds": args.rounds,
        "io": io.io,
        "engine": io.engine,
        "GB_per_s": median,
        "seconds": seconds,
        "vs_fio": median["rdmaxfer"] / median["fio"],
        "vs_safetensors": median["rdmaxfer"] / median["safetensors"],
        "per_round": per_round,
        "round_loads": loads,
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg()[0],  # other work on the machine during the run
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("GB_per_s", "vs_fio", "vs_safetensors")}))


if __name__ == "__main__":
    main()
