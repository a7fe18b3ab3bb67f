"""``rdmaxfer load FILE``: a safetensors checkpoint from local disk into host or GPU arrays
(optionally compared with the safetensors library's reading), and ``rdmaxfer bench --op load``:
load_weights against ``safetensors.numpy.load_file``, alternating rounds."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ..weights import load_weights
from ..weights.checkpoint import open_checkpoint
from .cli_weights import _mismatch, default_model_file, verify_against_file

__all__ = ["add_load_parser", "cmd_bench_load", "cmd_load"]


def add_load_parser(sub: Any, fmt: type[argparse.HelpFormatter]) -> None:
    """The ``load`` subcommand."""
    p = sub.add_parser(
        "load", formatter_class=fmt, help="read a safetensors checkpoint from disk into arrays"
    )
    p.add_argument("file", help="a .safetensors file, a *.safetensors.index.json, or a folder")
    p.add_argument("--device", default="cpu", help="cpu, or cuda:N: load into that GPU's memory")
    p.add_argument(
        "--verify", action="store_true",
        help="compare every tensor with what the safetensors library reads from the files",
    )  # fmt: skip
    p.add_argument("--buffered", action="store_true", help="read through the page cache")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    p.set_defaults(func=cmd_load)


def _host(arr: Any) -> np.ndarray:
    """A loaded array in host memory (GPU arrays copied: CuPy's ``get``, a Buffer's
    ``copy_to_host``)."""
    if isinstance(arr, np.ndarray):
        return arr
    host: np.ndarray = arr.get() if hasattr(arr, "get") else arr.copy_to_host()
    return host


def cmd_load(args: argparse.Namespace) -> int:
    loaded = load_weights(args.file, device=args.device, direct=not args.buffered)
    files = [{"path": f.path, "io": f.io, "why": f.why, "engine": f.engine} for f in loaded.files]
    if args.json:
        row = {"tensors": len(loaded), "bytes": loaded.nbytes, "seconds": loaded.seconds}
        print(json.dumps({**row, "GB_per_s": loaded.gbps, "files": files}))
    else:
        how = ", ".join(sorted({f"{f.io}, {f.engine}" for f in loaded.files}))
        print(
            f"loaded {len(loaded)} tensors, {loaded.nbytes} bytes from {len(files)} file(s) "
            f"into {args.device} in {loaded.seconds:.3f} s: {loaded.gbps:.3f} GB/s ({how})"
        )
        for f in loaded.files:
            if f.why:
                print(f"  {f.path}: buffered reads: {f.why}")
    if args.verify:
        bad = []
        for part in open_checkpoint(args.file):
            arrays = {t.name: _host(loaded[t.name]) for t in part.tensors}
            bad += verify_against_file(arrays, part.path)
        if bad:
            return _mismatch(bad)
        if not args.json:
            print("verified with safetensors: every tensor identical")
    return 0


def _drop_page_cache() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def cmd_bench_load(args: argparse.Namespace) -> int:
    """``bench --op load``: ``--iters`` rounds, each load_weights and load_file in turn (the
    order swapped every round), the page cache dropped before each with ``--cold``."""
    from safetensors.numpy import load_file

    path = Path(args.file) if args.file else default_model_file()
    size = path.stat().st_size
    methods: dict[str, Callable[[], object]] = {
        "rdmaxfer": lambda: load_weights(path),
        "safetensors": lambda: load_file(str(path)),
    }
    seconds: dict[str, list[float]] = {m: [] for m in methods}
    for r in range(args.iters):
        for name in list(methods) if r % 2 == 0 else list(methods)[::-1]:
            if args.cold:
                _drop_page_cache()
            start = time.perf_counter()
            methods[name]()
            seconds[name].append(time.perf_counter() - start)
            if args.json:
                row = {"op": "load", "method": name, "round": r, "bytes": size}
                print(json.dumps({**row, "seconds": seconds[name][-1]}), flush=True)
    if args.json:
        return 0
    cache = "cold" if args.cold else "warm"
    print(f"# load {path} ({size} bytes), {cache} page cache, median of {args.iters} rounds")
    print("| method | s | GB/s |\n| --- | ---: | ---: |")
    for name, times in seconds.items():
        s = statistics.median(times)
        print(f"| {name} | {s:.4f} | {size / s / 1e9:.3f} |")
    ratio = statistics.median(seconds["safetensors"]) / statistics.median(seconds["rdmaxfer"])
    print(f"rdmaxfer vs safetensors.numpy.load_file: {ratio:.2f}x")
    return 0
