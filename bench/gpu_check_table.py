"""The one table of bench/gpu_check.sh: every GPU check with its figure, its target and PASS,
FAIL or SKIP, read from what the earlier steps wrote into the results folder:

- ``gpu_bench.json`` (bench/gpu_bench.py): staged WRITE/READ against the pinned copy and wire
  ceiling per size, target >= 0.8x; the GPU-to-GPU loopback send/recv
  (default 4 GiB), target: bytes intact and >= 0.8x the staged WRITE rate of the largest size
  measured in the same run;
- ``gpu-tests.xml`` (pytest -m gpu, JUnit): pull_weights of the MiniLM file into cuda:0 checked
  bit-exact against safetensors on CPU, CuPy and torch interop, the two-process CUDA IPC
  tests, and all GPU tests;
- ``gpu_ipc.json`` (bench/gpu_ipc_bench.py): two processes on the same GPU (and GPU 0 to GPU 1
  when there are two) through CUDA IPC, against the pinned D2H copy of the same run; on the
  same GPU also from and into memory this process did not register (exported on the fly).
- ``load_gpu.json`` (bench/load_gpu_bench.py): load_weights of a safetensors file into cuda:0
  by GPUDirect Storage (cuFileRead) and through pinned host buffers, each against the disk's
  rate (fio, or load_weights into host arrays without fio), target >= 0.8x and bit-exact,
  with the torch.load-style read-then-copy of the same run beside them; the GDS row is SKIP
  where libcufile does not load (the reason).
- ``tls_bench.json`` (bench/tls_bench.py): a 1 GiB TCP WRITE with TLS 1.3 (AES-128-GCM)
  against plain TCP (target >= 0.5x) and against a Python ``ssl`` socket pair (>= 1.5x), on the
  machine's CPUs; one core's AES-128-GCM rate (``openssl speed``) beside them, the bound of one
  stream.

- ``ray-gpu-tests.xml`` and ``ray_bench.json`` (where Ray is installed): GPU tensors between
  Ray actors over RDMAXFER, bit-exact; bench/ray_bench.py's RDMAXFER against Ray's object
  store (target >= 2x) and RDT's gloo (CPU tensors, >= 1.5x) at 64 MiB and 1 GiB, and the
  weight sync's slowest of 3 actors against one alone (<= 1.3x). Without Ray they are SKIP.

A missing file makes its rows FAIL ("not run"). Exit status 0 only when no row failed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from check_table import Row, load_json, print_table, test_rows

STAGING_TARGET = 0.8
LOOPBACK_TARGET = 0.8
LOAD_TARGET = 0.8

#: Table rows drawn from the GPU tests: (label, test file, test name prefix or "" for all).
TEST_ROWS = (
    ("pull_weights MiniLM -> cuda:0, bit-exact", "test_weights_sync_gpu", "test_shards_land"),
    ("CuPy interop", "test_gpu_device", "test_cupy_arrays"),
    ("torch interop (DLPack)", "test_gpu_device", "test_torch_dlpack"),
    ("two-process CUDA IPC tests", "test_shm_cuda_ipc", ""),
    ("CUDA IPC of unregistered GPU memory", "test_shm_cuda_ipc_unregistered", ""),
    ("auto over TCP: same-host CUDA IPC tests", "test_auto_cuda_ipc", ""),
    ("all GPU tests (pytest -m gpu)", "", ""),
)


def _size(n: int) -> str:
    return f"{n >> 30} GiB" if n >= 1 << 30 and n % (1 << 30) == 0 else f"{n >> 20} MiB"


def bench_rows(bench: Any) -> list[Row]:
    if not bench:
        return [("staged write/read, GPU loopback", "not run", "", "FAIL")]
    rows: list[Row] = []
    for r in bench["sizes"]:
        for op in ("write", "read"):
            eff = r[f"{op}_eff"]
            ok = eff >= STAGING_TARGET and r["checksums_ok"]
            rows.append(
                (
                    f"staged {op} {_size(r['bytes'])} vs pinned copy/wire",
                    f"{r[f'staged_{op}_GB_per_s']:.2f} GB/s = {eff:.2f}x",
                    f">= {STAGING_TARGET}x, bytes intact",
                    "PASS" if ok else "FAIL",
                )
            )
    big = bench.get("big")
    if big is None:
        rows.append(("GPU->GPU loopback send/recv", "not run", "", "FAIL"))
        return rows
    largest = max(bench["sizes"], key=lambda r: r["bytes"], default=None)
    ref = largest["staged_write_GB_per_s"] if largest else 0.0
    ratio = big["GB_per_s"] / ref if ref else 0.0
    ok = big["checksum_ok"] and ratio >= LOOPBACK_TARGET
    rows.append(
        (
            f"GPU->GPU loopback send/recv {_size(big['bytes'])}",
            f"{big['GB_per_s']:.2f} GB/s = {ratio:.2f}x staged write",
            f">= {LOOPBACK_TARGET}x, bytes intact",
            "PASS" if ok else "FAIL",
        )
    )
    return rows


def ipc_rows(ipc: Any) -> list[Row]:
    if not ipc:
        return [("2 processes, same GPU, CUDA IPC", "not run", "", "FAIL")]
    rows: list[Row] = []
    for r in ipc["rows"]:
        same = r["src_gpu"] == r["dst_gpu"]
        where = "same GPU" if same else f"GPU {r['src_gpu']} -> GPU {r['dst_gpu']}"
        memory = "" if r.get("registered", True) else ", unregistered"
        rows.append(
            (
                f"2 processes, {where}{memory}, CUDA IPC {_size(r['bytes'])}",
                f"W {r['write_GB_per_s']:.1f} R {r['read_GB_per_s']:.1f} GB/s = "
                f"{r['ratio_to_d2h']:.1f}x pinned D2H",
                f">= {r['target']}x, bytes intact, by IPC",
                "PASS" if r["pass"] else "FAIL",
            )
        )
    if ipc["gpus"] < 2:
        rows.append(("2 processes, GPU 0 -> GPU 1, CUDA IPC", "one GPU here", "", "SKIP"))
    return rows


def load_rows(load: Any) -> list[Row]:
    if not load:
        return [("load_weights -> cuda:0 vs disk", "not run", "", "FAIL")]
    size = _size(load["file_bytes"])
    disk = load["GB_per_s"]["disk"]
    rows: list[Row] = []
    for m, label in (("gds", "GPUDirect Storage"), ("bounce", "pinned bounce + H2D")):
        if m not in load["GB_per_s"]:
            rows.append((f"load_weights {size} -> cuda:0, {label}", load["gds"], "", "SKIP"))
            continue
        ratio = load["vs_disk"][m]
        ok = ratio >= LOAD_TARGET and load["bit_exact"][m]
        rows.append(
            (
                f"load_weights {size} -> cuda:0, {label} ({load['engines'][m]})",
                f"{load['GB_per_s'][m]:.2f} GB/s = {ratio:.2f}x disk "
                f"({disk:.2f}), {load['vs_read_then_copy'][m]:.2f}x read-then-copy",
                f">= {LOAD_TARGET}x disk, bytes intact",
                "PASS" if ok else "FAIL",
            )
        )
    rtc = load["GB_per_s"]["read_then_copy"]
    rows.append(
        (
            f"read-then-copy {size} -> cuda:0 (torch.load style, {load['cache']} cache)",
            f"{rtc:.2f} GB/s = {load['vs_disk']['read_then_copy']:.2f}x disk",
            "reference, bytes intact",
            "PASS" if load["bit_exact"]["read_then_copy"] else "FAIL",
        )
    )
    return rows


TLS_VS_PLAIN = 0.5
TLS_VS_PYTHON_SSL = 1.5


def tls_rows(tls: Any) -> list[Row]:
    if not tls:
        return [("TCP WRITE with TLS vs plain TCP", "not run", "", "FAIL")]
    med = tls["median"]
    where = f"{_size(tls['bytes'])}, {tls['cpus']} CPUs"
    return [
        (
            f"TCP WRITE {where}: TLS vs plain",
            f"{med['tls_GB_per_s']:.2f} vs {med['plain_GB_per_s']:.2f} GB/s = "
            f"{tls['tls_vs_plain']:.2f}x (AES-128-GCM on one core "
            f"{tls['openssl_speed_aes_128_gcm_GB_per_s_one_core']:.2f} GB/s)",
            f">= {TLS_VS_PLAIN}x",
            "PASS" if tls["tls_vs_plain"] >= TLS_VS_PLAIN else "FAIL",
        ),
        (
            f"TCP WRITE {where}: TLS vs Python ssl",
            f"{med['tls_GB_per_s']:.2f} vs {med['python_ssl_GB_per_s']:.2f} GB/s = "
            f"{tls['tls_vs_python_ssl']:.2f}x",
            f">= {TLS_VS_PYTHON_SSL}x",
            "PASS" if tls["tls_vs_python_ssl"] >= TLS_VS_PYTHON_SSL else "FAIL",
        ),
    ]


RAY_VS_OBJECT_STORE = 2.0
RAY_VS_GLOO = 1.5
RAY_SYNC_RATIO = 1.3
RAY_TEST_ROWS = (("Ray RDMAXFER: CUDA tensors between actors", "test_ray", "test_cuda_case"),)


def ray_rows(results: Path) -> list[Row]:
    bench = load_json(results / "ray_bench.json")
    junit = results / "ray-gpu-tests.xml"
    if bench is None and not junit.exists():
        return [("Ray (RDMAXFER, ray_bench)", "Ray not installed", "", "SKIP")]
    rows = test_rows(junit, RAY_TEST_ROWS)
    if not bench:
        return [*rows, ("Ray bench", "not run", "", "FAIL")]
    for r in bench["transfer"]:
        gbps = r["GB_per_s"]
        for ref, target in (("object_store", RAY_VS_OBJECT_STORE), ("gloo", RAY_VS_GLOO)):
            if f"vs_{ref}" not in r:
                continue
            ratio = r[f"vs_{ref}"]
            rows.append(
                (
                    f"Ray {r.get('device', 'cpu')} tensor {_size(r['bytes'])}: RDMAXFER vs {ref}",
                    f"{gbps['rdmaxfer']:.2f} vs {gbps[ref]:.2f} GB/s = {ratio:.1f}x",
                    f">= {target}x",
                    "PASS" if ratio >= target else "FAIL",
                )
            )
    sync = bench["weight_sync"]
    rows.append(
        (
            f"Ray weight sync {sync['bytes'] / 1e6:.0f} MB, slowest of 3 vs 1 alone",
            f"{sync['ratio']:.2f}x",
            f"<= {RAY_SYNC_RATIO}x",
            "PASS" if sync["ratio"] <= RAY_SYNC_RATIO else "FAIL",
        )
    )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("results", type=Path, help="the folder gpu_check.sh wrote into")
    args = parser.parse_args()
    rows = (
        bench_rows(load_json(args.results / "gpu_bench.json"))
        + test_rows(args.results / "gpu-tests.xml", TEST_ROWS)
        + ipc_rows(load_json(args.results / "gpu_ipc.json"))
        + load_rows(load_json(args.results / "load_gpu.json"))
        + tls_rows(load_json(args.results / "tls_bench.json"))
        + ray_rows(args.results)
    )
    return print_table(rows)


if __name__ == "__main__":
    sys.exit(main())
