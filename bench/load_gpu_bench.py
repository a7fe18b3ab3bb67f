#!/usr/bin/env python3
"""load_weights into GPU memory, with and without GPUDirect Storage, against the disk's rate
and a torch.load-style read-then-copy, in one run (bench/gpu_check.sh runs it).

    python bench/load_gpu_bench.py [--size 1G] [--rounds 3] [--dir DIR] [--json OUT]

A safetensors file of ``--size`` bytes (random F32/F16/BF16 tensors, as bench/load_bench.py
writes) is read in rotated rounds by:

- ``disk``: ``fio --direct=1 --rw=read --bs=1M --iodepth=16 --ioengine=io_uring`` where fio is
  installed, else ``load_weights(path)`` into host arrays (O_DIRECT): the disk's rate;
- ``gds``: ``load_weights(path, device="cuda:0", gds=True)`` (cuFileRead into GPU memory),
  where libcufile loads (else the row says why not);
- ``bounce``: ``load_weights(path, device="cuda:0", gds=False)`` (O_DIRECT reads into pinned
  host buffers, host-to-device copies overlapped with the reads);
- ``read_then_copy``: the whole file read into host memory, then each tensor copied to the GPU
  (``safetensors.torch.load`` + ``.to("cuda:0")`` where torch has a GPU, else views of the
  bytes copied by the CUDA driver): what ``torch.load`` does.

The page cache is dropped before each read when this runs as root (``cache: cold``);
otherwise only the buffered read_then_copy can profit from it (``cache: warm``). Every GPU
result is checked bit-exact against the file. GB/s = 1e9 bytes/s of the file's size.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import struct
import sys
import tempfile
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from load_bench import make_checkpoint, run_fio  # noqa: E402
from rdmaxfer import _core, load_weights  # noqa: E402
from rdmaxfer.errors import UnsupportedError  # noqa: E402
from rdmaxfer.memory import cuda  # noqa: E402
from rdmaxfer.memory.buffer import Buffer  # noqa: E402
from rdmaxfer.tools.bench import parse_size  # noqa: E402
from rdmaxfer.weights.format import DTYPES  # noqa: E402

TARGET = 0.8  # GPU loads against the disk's rate


def drop_caches() -> bool:
    """Drops the page cache; False when not allowed (not root)."""
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError:
        return False
    return True


def to_host(arr: Any) -> np.ndarray:
    """A GPU array's bytes on the host (CuPy, torch or a device Buffer)."""
    if hasattr(arr, "get"):  # CuPy
        return np.asarray(arr.get())
    if hasattr(arr, "cpu"):  # torch (bfloat16 has no NumPy dtype: its bytes as uint8)
        import torch

        return np.asarray(arr.detach().cpu().reshape(-1).view(torch.uint8).numpy())
    return np.asarray(arr.copy_to_host())


def crcs(arrays: dict[str, Any]) -> dict[str, int]:
    return {k: zlib.crc32(to_host(v).tobytes()) for k, v in arrays.items()}


def read_then_copy(path: Path) -> dict[str, Any]:
    """torch.load-style: read the file into host memory, then copy each tensor to cuda:0."""
    data = path.read_bytes()
    if _torch_cuda():
        import torch
        from safetensors.torch import load

        out = {k: v.to("cuda:0") for k, v in load(data).items()}
        torch.cuda.synchronize()
        return out
    bufs = {}
    for k, v in _split(data).items():
        buf = Buffer.empty(v.shape, v.dtype, device="cuda:0")
        cuda.copy_from_host(buf.device_array(), v)
        bufs[k] = buf
    return bufs


def _split(data: bytes) -> dict[str, np.ndarray]:
    """The tensors of a safetensors file's bytes, as views of them (BF16 and F8 as ml_dtypes
    arrays, which safetensors.numpy.load cannot make)."""
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    raw = np.frombuffer(data, dtype=np.uint8, offset=8 + n)
    out = {}
    for name, t in header.items():
        if name != "__metadata__":
            lo, hi = t["data_offsets"]
            out[name] = raw[lo:hi].view(DTYPES[t["dtype"]]).reshape(t["shape"])
    return out


def _torch_cuda() -> bool:
    """torch with a usable GPU (not over the tests' stand-in driver, which torch cannot use)."""
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="1G")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=None, help="where to write the file")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    if not cuda.available():
        print(f"no GPU: {cuda.unavailable_reason()}")
        return 2
    from safetensors.numpy import load_file

    gds_why = _core.gds_unavailable()
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="rdmaxfer-load-gpu-") as tmp:
        path = Path(tmp) / "model.safetensors"
        size = make_checkpoint(path, parse_size(args.size))
        ref = {k: zlib.crc32(v.tobytes()) for k, v in load_file(str(path)).items()}
        fio = shutil.which("fio") is not None
        gpu_loads: dict[str, Callable[[], Any]] = {
            "bounce": lambda: load_weights(path, device="cuda:0", gds=False),
            "read_then_copy": lambda: read_then_copy(path),
        }
        if not gds_why:
            gpu_loads["gds"] = lambda: load_weights(path, device="cuda:0", gds=True)
        exact: dict[str, bool] = {}
        engines: dict[str, str] = {}
        for m, load in list(gpu_loads.items()):  # once each, checked, before the timed rounds
            try:
                got = load()
            except UnsupportedError as exc:  # cuFile refused this file (its file system)
                if m != "gds":
                    raise
                gds_why = str(exc).replace(str(path), path.name)  # no machine's paths
                del gpu_loads[m]
                continue
            exact[m] = crcs(got) == ref
            if hasattr(got, "files"):
                engines[m] = got.files[0].engine
            del got

        def disk() -> float:
            if fio:
                return run_fio(path, size)
            start = time.perf_counter()
            load_weights(path)
            return time.perf_counter() - start

        def timed(load: Callable[[], Any]) -> Callable[[], float]:
            def run() -> float:
                start = time.perf_counter()
                result = load()
                elapsed = time.perf_counter() - start
                del result
                return elapsed

            return run

        methods = {"disk": disk, **{m: timed(load) for m, load in gpu_loads.items()}}
        seconds: dict[str, list[float]] = {m: [] for m in methods}
        cold = True
        order = list(methods)
        for r in range(args.rounds):
            for m in order[r % len(order) :] + order[: r % len(order)]:
                cold = drop_caches() and cold
                seconds[m].append(methods[m]())
                print(f"round {r} {m}: {size / seconds[m][-1] / 1e9:.2f} GB/s", flush=True)
    gbps = {m: size / statistics.median(s) / 1e9 for m, s in seconds.items()}
    result = {
        "file_bytes": size,
        "rounds": args.rounds,
        "cache": "cold" if cold else "warm (not root: the page cache was not dropped)",
        "disk_reference": "fio io_uring O_DIRECT" if fio else "load_weights into host arrays",
        "gds": gds_why or "available",
        "engines": engines,
        "GB_per_s": gbps,
        "seconds": seconds,
        "vs_disk": {m: gbps[m] / gbps["disk"] for m in gpu_loads},
        "vs_read_then_copy": {m: gbps[m] / gbps["read_then_copy"] for m in gpu_loads},
        "bit_exact": exact,
        "target": TARGET,
        "load_average": os.getloadavg()[0],
    }
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("GB_per_s", "vs_disk", "bit_exact", "gds")}))
    return 0 if all(exact.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
