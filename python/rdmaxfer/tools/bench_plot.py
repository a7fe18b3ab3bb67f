"""``rdmaxfer bench --plot out.png``: bandwidth vs size and latency vs size (log axes), rdmaxfer
and the reference tool on the same charts. Needs matplotlib (``pip install 'rdmaxfer[plot]'``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import UnsupportedError

__all__ = ["plot_results"]


def _label(nbytes: float, _pos: object = None) -> str:
    n = int(nbytes)
    for unit, div in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= div and n % div == 0:
            return f"{n // div}{unit}"
    return str(n)


def plot_results(
    rows: Sequence[Mapping[str, Any]],
    out: str | os.PathLike[str],
    *,
    title: str = "rdmaxfer bench",
    reference_name: str | None = None,
) -> None:
    """Draw ``rows`` (``BenchResult.as_dict()`` records, with ``ref_bw_GB_per_s``/``ref_lat_us``
    when a reference ran) into a PNG at ``out``: left bandwidth (GB/s) vs message size, right
    latency (microseconds, median with the min-p99 band) vs size; both axes logarithmic.

    Raises:
        UnsupportedError: matplotlib is not installed.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FuncFormatter
    except ImportError as exc:
        raise UnsupportedError(
            "--plot needs matplotlib: pip install matplotlib (or 'rdmaxfer[plot]')"
        ) from exc
    sizes = [int(r["bytes"]) for r in rows]
    fig, (ax_bw, ax_lat) = plt.subplots(1, 2, figsize=(11, 4.2), dpi=100)
    ours = "rdmaxfer"
    ax_bw.plot(sizes, [r["bw_avg_GB_per_s"] for r in rows], "o-", color="C0", label=f"{ours} avg")
    ax_bw.plot(
        sizes,
        [r["bw_peak_GB_per_s"] for r in rows],
        ".:",
        color="C0",
        alpha=0.6,
        label=f"{ours} peak",
    )
    ax_lat.plot(sizes, [r["lat_us_p50"] for r in rows], "o-", color="C0", label=f"{ours} median")
    ax_lat.fill_between(
        sizes,
        [r["lat_us_min"] for r in rows],
        [r["lat_us_p99"] for r in rows],
        color="C0",
        alpha=0.15,
        label=f"{ours} min-p99",
    )
    ref = reference_name or next((r.get("ref_tool") for r in rows if r.get("ref_tool")), None)
    bw_ref = [(s, r.get("ref_bw_GB_per_s")) for s, r in zip(sizes, rows, strict=True)]
    bw_ref = [(s, v) for s, v in bw_ref if v]
    if bw_ref:
        ax_bw.plot(*zip(*bw_ref, strict=True), "s--", color="C1", label=str(ref))
    lat_ref = [(s, r.get("ref_lat_us")) for s, r in zip(sizes, rows, strict=True)]
    lat_ref = [(s, v) for s, v in lat_ref if v]
    if lat_ref:
        ax_lat.plot(*zip(*lat_ref, strict=True), "s--", color="C1", label=str(ref))
    for ax, ylabel in ((ax_bw, "bandwidth [GB/s]"), (ax_lat, "latency [µs]")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("message size [bytes]")
        ax.set_ylabel(ylabel)
        ax.xaxis.set_major_formatter(FuncFormatter(_label))
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=8, loc="best")
    ax_bw.set_title("bandwidth vs size")
    ax_lat.set_title("latency per operation vs size")
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    fig.savefig(os.fspath(out))
    plt.close(fig)
