"""The benchmark tables of the workloads (bench/results_docs.py): weight sync, GPU staging,
broadcast, fetch, loading from disk, the cold serve and a newcomer's start."""

from __future__ import annotations

import statistics
from typing import Any

from results_format import (
    load_result,
    md_table,
    size_text,
    times,
)


def _sync_medians(d: dict[str, Any]) -> tuple[float, float, int, str]:
    """Median seconds of one full pull and of 4 sharded ones, rounds, per-round ratio range."""
    if "one_s" not in d:  # medians only
        return d["median_one_s"], d["median_four_s"], d["rounds"], ""
    ratios = [b / a for a, b in zip(d["one_s"], d["four_s"], strict=True)]
    spread = f" (rounds {min(ratios):.2f}-{max(ratios):.2f})"
    return statistics.median(d["one_s"]), statistics.median(d["four_s"]), len(ratios), spread


def weight_sync() -> str:
    rows = []
    for name, where in (("tcp", "TCP loopback"), ("rdma", "verbs, rxe0 → rxe1 (soft-RoCE)")):
        one, four, rounds, spread = _sync_medians(load_result(f"weight-sync-{name}.json"))
        rows.append(
            [where, str(rounds), f"{one * 1e3:.0f}", f"{four * 1e3:.0f}", times(four, one) + spread]
        )
    head = ["transport", "rounds", "1 consumer, whole, ms", "4 sharded, slowest, ms", "ratio"]
    return md_table(head, rows, right_from=1)


def gpu_staging() -> str:
    d = load_result("gpu-staging-h200.json")
    keys = ("d2h", "h2d", "wire", "staged_write", "staged_read")
    rows = [
        [size_text(r["bytes"]), *(f"{r[k + '_GB_per_s']:.1f}" for k in keys)] for r in d["sizes"]
    ]
    head = [
        "bytes",
        "pinned D2H GB/s",
        "pinned H2D GB/s",
        "TCP wire GB/s",
        "staged write GB/s",
        "staged read GB/s",
    ]
    big = d["loopback"]
    return (
        md_table(head, rows)
        + f"\n{d['gpu']}, driver {d['driver']}, {d['cpus']} CPUs, TCP loopback. GPU-to-GPU"
        + f" send/recv of {size_text(big['bytes'])} over TCP loopback: {big['GB_per_s']:.1f}"
        + " GB/s.\n"
    )


def cuda_ipc() -> str:
    """``bench/gpu_ipc_bench.py --json``: two processes through CUDA IPC (shm transport)."""
    d = load_result("cuda-ipc-h200.json")
    rows = [
        [
            size_text(r["bytes"]),
            f"{r['src_gpu']} -> {r['dst_gpu']}",
            "yes" if r["registered"] else "no (exported on the fly)",
            f"{r['write_GB_per_s']:.0f}",
            f"{r['read_GB_per_s']:.0f}",
            f"{r['d2h_GB_per_s']:.1f}",
            f"{r['ratio_to_d2h']:.1f}x",
        ]
        for r in d["rows"]
    ]
    head = ["bytes", "GPUs", "registered", "WRITE GB/s", "READ GB/s", "pinned D2H GB/s", "vs D2H"]
    return md_table(head, rows, right_from=3) + f"\n{d['gpu']}, one GPU.\n"


def load_gpu() -> str:
    """``bench/load_gpu_bench.py --json``: load_weights into GPU memory against the disk."""
    d = load_result("load-gpu-h200.json")
    names = {"disk": f"the disk ({d['disk_reference']})", "bounce": "load_weights, pinned bounce"}
    names["read_then_copy"] = "read the file, then copy each tensor (torch.load style)"
    names["gds"] = "load_weights, GPUDirect Storage"
    rows = [
        [names[m], f"{gbps:.2f}", f"{d['vs_disk'][m]:.2f}x" if m in d["vs_disk"] else ""]
        for m, gbps in d["GB_per_s"].items()
    ]
    gds = "" if "gds" in d["GB_per_s"] else f" GPUDirect Storage: not measured ({d['gds']})."
    return (
        md_table(["method", "GB/s", "vs disk"], rows, right_from=1)
        + f"\n{d['file_bytes'] / 2**30:.2f} GiB file on {d['file_system']},"
        + f" {d['cache']} page cache, {d['rounds']} rounds (medians), {d['gpu']}.{gds}\n"
    )


def broadcast() -> str:
    """``bench/broadcast_bench.py --json``: one run, or a list of runs."""
    d = load_result("broadcast-vs-gloo.json")
    rows = []
    for run in d if isinstance(d, list) else [d]:
        gb = run["args"]["size"] / 1e9
        ours, gloo = (run["summary"][k]["median_s"] for k in ("rdmaxfer", "gloo"))
        rows.append(
            [
                f"{run['args']['ranks']} ranks, median of {run['args']['iters']}",
                f"{ours:.3f}",
                f"{gb / ours:.2f}",
                f"{gloo:.3f}",
                f"{gb / gloo:.2f}",
                times(gloo, ours),
            ]
        )
    head = ["run", "rdmaxfer ring s", "GB/s", "gloo broadcast s", "GB/s", "gloo time / ours"]
    return md_table(head, rows, right_from=1)


def fetch() -> str:
    """``bench/fetch_bench.py --json``: one row per scenario and tool (the best round)."""
    rows = load_result("fetch-vs-curl-wget-aria2c.json")["rows"]

    def ratio(row: dict[str, Any], key: str) -> str:
        return f"{row[key]:.2f}x" if key in row else ""

    table = [
        [
            r["scenario"],
            r["tool"],
            f"{r['GB_per_s']:.3f}",
            f"{r['cpu_s_per_GB']:.2f}",
            ratio(r, "x_best_reference") or ratio(r, "x_fetch_out"),
            ratio(r, "x_curl"),
            ratio(r, "x_aria2c"),
            " -> ".join(str(n) for n in r.get("connection_steps", [])),
            f"{r['range_size'] >> 20} MiB" if r.get("range_size") else "",
            ", ".join(f"{x:.3f}" for x in r.get("rounds_GB_per_s", [])),
            f"{r['load_avg_1min']:.1f}",
        ]
        for r in rows
    ]
    head = ["scenario", "tool", "GB/s", "CPU s/GB", "vs best other", "vs curl", "vs aria2c",
            "connections", "largest range", "rounds GB/s", "load"]  # fmt: skip
    return md_table(head, table, right_from=2)


def load() -> str:
    """``bench/load_bench.py --json``: medians from a cold page cache, one row per method."""
    r = load_result("load-vs-fio-safetensors.json")
    names = {
        "rdmaxfer": f"rdmaxfer load_weights ({r['io']}, {r['engine']})",
        "fio": "fio --direct=1 --bs=1M --iodepth=16 --ioengine=io_uring",
        "safetensors": "safetensors.numpy.load_file (mmap + copy)",
    }
    best = {m: r["file_bytes"] / min(s) / 1e9 for m, s in r["seconds"].items()}
    rows = [
        [names[m], f"{gbps:.2f}", f"{best[m]:.2f}", times(r["GB_per_s"]["rdmaxfer"], gbps)]
        for m, gbps in r["GB_per_s"].items()
    ]
    head = [f"{size_text(r['file_bytes'])} file, {r['rounds']} rounds", "median GB/s", "best GB/s"]
    load = (
        f" (load average {r['load_average']:.1f} on {r['cpus']} CPUs)"
        if "load_average" in r
        else ""
    )
    spread = ""
    if "per_round" in r:
        loads = sorted(r["round_loads"])
        ratios = "; ".join(
            f"against {ref} {statistics.median(x):.2f}x (rounds {min(x):.2f}-{max(x):.2f}x)"
            for ref, x in r["per_round"].items()
        )
        spread = (
            f" rdmaxfer's ratio within each round, median and range: {ratios}; load average "
            f"{loads[0]:.1f}-{loads[-1]:.1f} over the rounds, on {r['cpus']} CPUs."
        )
        load = ""
    return (
        md_table([*head, "rdmaxfer vs"], rows, right_from=1)
        + f"\nMeasured on {r['machine']}{load}.{spread}\n"
    )


def serve_cold() -> str:
    """``bench/serve_cold_bench.py --json``: server start + first pull, cold vs warm cache."""
    r = load_result("serve-cold-vs-warm.json")
    rows = [
        [f"{cache} page cache", f"{statistics.median(r['seconds'][cache]):.3f}", f"{gbps:.3f}"]
        for cache, gbps in r["GB_per_s"].items()
    ]
    head = [f"{r['file']} ({r['file_bytes'] / 1e6:.1f} MB), median of {r['rounds']}", "s", "GB/s"]
    return md_table(head, rows, right_from=1) + (
        f"\nCold against warm: {r['cold_vs_warm']:.2f}x.\n"
    )


def ray(name: str = "ray-rdt-vs-object-store-gloo.json") -> str:
    """``bench/ray_bench.py --json``: RDMAXFER against Ray's object store and RDT's gloo
    between two actors (median of the rounds), then the weight sync to 3 actors against 1."""
    d = load_result(name)
    rows = []
    for r in d["transfer"]:
        rate = r["GB_per_s"]
        rows.append(
            [
                f"{size_text(r['bytes'])} {r.get('device', 'cpu')}",
                *(
                    f"{rate[k]:.2f}" if k in rate else "n/a"
                    for k in ("rdmaxfer", "object_store", "gloo")
                ),
                f"{r['vs_object_store']:.2f}x",
                f"{r['vs_gloo']:.2f}x" if "vs_gloo" in r else "n/a",
                f"{r['load_before']:.1f}-{r['load']:.1f}",
            ]
        )
    head = [
        "tensor",
        "RDMAXFER GB/s",
        "object store GB/s",
        "gloo GB/s",
        "object store time / ours",
        "gloo time / ours",
        "load",
    ]
    ws = d["weight_sync"]
    one, three = statistics.median(ws["alone_s"]), statistics.median(ws["three_slowest_s"])
    where = f", {d['gpu']}" if "gpu" in d else ""
    what = "all-MiniLM-L6-v2"
    if ws.get("file", "model.safetensors") != "model.safetensors":
        what += "'s layout with random values"
    return (
        md_table(head, rows, right_from=1)
        + f"\nMedians of {d['rounds']} rounds, Ray {d['ray']}, workers at niceness"
        + f" {d['ray_worker_niceness']}, {d.get('cpus', 2)} CPUs{where}. Weight sync of"
        + f" {what} ({ws['bytes'] / 1e6:.1f} MB): one actor alone {one * 1e3:.0f} ms, the"
        + f" slowest of 3 at once {three * 1e3:.0f} ms ({ws['ratio']:.2f}x),"
        + f" load {ws['load']:.1f}.\n"
    )


def newcomer_start() -> str:
    """``bench/start_bench.py --json``: the README's set-up commands from a fresh clone (quiet
    and busy machine) and ``import rdmaxfer``."""
    d = load_result("newcomer-start.json")
    what = {
        "main job": "first command: build, install, `rdmaxfer demo` (a real pull, checked)",
        "tests": "second command: build, install with the test extra, the suite",
    }
    rows = []
    for r in d["commands"]:
        machine = "quiet" if r["machine"] == "quiet" else f"busy ({r['busy_loops']} spinning)"
        rows.append([what[r["command"]], machine, f"{r['seconds']:.0f}", f"{r['load']:.1f}"])
    rows.append(["`import rdmaxfer` (median of 7)", "quiet", f"{d['import_ms'] / 1e3:.3f}", ""])
    head = [f"from a fresh clone, {d['cores']} cores, Python {d['python']}", "machine", "s"]
    return md_table([*head, "load"], rows, right_from=2)
