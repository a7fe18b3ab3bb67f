"""The benchmark pages' tables and plots, made from the JSON in ``bench/results/``.

An mkdocs hook (``hooks:`` in mkdocs.yml): at every build a line ``<!-- bench-table NAME -->``
in a page becomes the Markdown table ``TABLES[NAME]`` makes from the current results, and the
plots of ``PLOTS`` are drawn with matplotlib into the site as ``benchmarks/NAME.png``, so the
pages always show what the files hold. Each result file is written by the bench script named
in its table's caption (``--json``).

    python bench/results_docs.py          # prints every table (a check without mkdocs)
"""

from __future__ import annotations

import io
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

# The table modules beside this file (bench/ is no package; mkdocs loads this hook by its path).
sys.path.insert(0, str(Path(__file__).resolve().parent))

from results_format import load_result, size_text
from results_transports import (
    batch_rxe,
    batch_scale,
    batch_tcp,
    batch_where_time,
    ofi_guest,
    ofi_host,
    ofi_rails,
    rails,
    rails_throttled,
    rdma_vs_perftest,
    register_scale,
    shm_vs_memcpy,
    small_ops,
    tcp_vs_peers,
    tls_vs_plain,
    vs_mooncake,
    write_before_after,
)
from results_workloads import (
    broadcast,
    cuda_ipc,
    fetch,
    gpu_staging,
    load,
    load_gpu,
    newcomer_start,
    ray,
    serve_cold,
    weight_sync,
)

MARKER = re.compile(r"^<!-- bench-table ([a-z0-9-]+) -->$", re.MULTILINE)


TABLES: dict[str, Callable[[], str]] = {
    "tls-vs-plain-tcp": tls_vs_plain,
    "tcp-vs-peers": tcp_vs_peers,
    "shm-vs-memcpy": shm_vs_memcpy,
    "small-ops-tcp": lambda: small_ops("tcp"),
    "small-ops-shm": lambda: small_ops("shm"),
    "vs-mooncake-2cpu": lambda: vs_mooncake(2),
    "vs-mooncake-1cpu": lambda: vs_mooncake(1),
    "write-before-after-tcp": write_before_after,
    "rdma-vs-perftest": rdma_vs_perftest,
    "rails": rails,
    "rails-throttled": rails_throttled,
    "weight-sync": weight_sync,
    "batch-tcp": batch_tcp,
    "batch-scale": batch_scale,
    "register-scale": register_scale,
    "batch-rxe": batch_rxe,
    "batch-where-time": batch_where_time,
    "gpu-staging": gpu_staging,
    "cuda-ipc": cuda_ipc,
    "load-gpu": load_gpu,
    "broadcast": broadcast,
    "fetch": fetch,
    "load": load,
    "serve-cold": serve_cold,
    "ofi-host": ofi_host,
    "ofi-rails": ofi_rails,
    "ofi-guest": ofi_guest,
    "ray": ray,
    "ray-h200": lambda: ray("ray-rdt-h200.json"),
    "newcomer-start": newcomer_start,
}


def _bandwidth_plot(title: str, sizes: list[int], lines: dict[str, list[float]]) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    for label, values in lines.items():
        ax.plot(sizes, values, marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [size_text(s) for s in sizes])
    ax.set_xlabel("bytes per transfer")
    ax.set_ylabel("GB/s (1e9 bytes per second)")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    out = io.BytesIO()
    fig.savefig(out, format="png", metadata={"Software": None})
    plt.close(fig)
    return out.getvalue()


def tcp_plot() -> bytes:
    rows = load_result("tcp-vs-iperf3-python.json")["sizes"]
    return _bandwidth_plot(
        "TCP loopback: one-sided WRITE vs iperf3 and plain Python sockets",
        [r["bytes"] for r in rows],
        {
            "rdmaxfer": [r["rdmaxfer_GB_per_s"] for r in rows],
            "iperf3 (one stream)": [r["iperf3_GB_per_s"] for r in rows],
            "Python sendall/recv_into": [r["python_GB_per_s"] for r in rows],
        },
    )


def shm_plot() -> bytes:
    rows = load_result("shm-vs-memcpy.json")["sizes"]
    return _bandwidth_plot(
        "Same host: shm WRITE vs memcpy and TCP loopback",
        [r["bytes"] for r in rows],
        {
            "rdmaxfer shm": [r["shm_GB_per_s"] for r in rows],
            "rdmaxfer TCP loopback": [r["tcp_GB_per_s"] for r in rows],
            "memcpy (numpy.copyto)": [r["memcpy_GB_per_s"] for r in rows],
        },
    )


PLOTS: dict[str, Callable[[], bytes]] = {"tcp": tcp_plot, "shm": shm_plot}


def render(markdown: str) -> str:
    """``markdown`` with every ``<!-- bench-table NAME -->`` line replaced by its table.

    Raises:
        KeyError: a marker names no table (the message lists the names).
    """

    def table(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in TABLES:
            raise KeyError(f"no bench table {name!r}; the tables are {sorted(TABLES)}")
        return TABLES[name]()

    return MARKER.sub(table, markdown)


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    for name, plot in PLOTS.items():
        files.append(File.generated(config, f"benchmarks/{name}.png", content=plot()))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    return render(markdown)


if __name__ == "__main__":
    for name, make in TABLES.items():
        sys.stdout.write(f"## {name}\n\n{make()}\n")
