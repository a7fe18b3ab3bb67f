"""``rdmaxfer bench --op fetch --url URL``: :func:`rdmaxfer.fetch` against curl, wget and
aria2c on the same file, in alternating rounds, with wall time and CPU seconds per GB.

Each round runs every client once, in turn (every other round in the reverse order), each
download to the same file in a work directory, then checks its SHA-256 against the first
one's (outside the timing):

- ``rdmaxfer``: ``rdmaxfer.fetch(url, out)`` with its defaults, in this process;
- ``curl -sf -o``, ``wget -q -O`` and ``aria2c -x8 -s8 -k1M`` (8 connections), each one
  that is installed.

CPU seconds: user + system time of the client (this process's for rdmaxfer, the child's for
the others). GB = 1e9 bytes.
"""

from __future__ import annotations

import hashlib
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = [
    "REFERENCES", "clients", "cmd_bench_fetch", "format_fetch_table", "run_rounds", "sha256_of",
    "summary",
]  # fmt: skip

Run = Callable[[], dict[str, Any]]

#: The reference clients: name -> command before ``OUT URL`` are placed (see :func:`clients`).
REFERENCES = ("curl", "wget", "aria2c -x8")
#: Longest a reference client may take for one download (seconds).
CLIENT_TIMEOUT_S = 900


def sha256_of(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _cpu(who: int) -> float:
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


def in_process(call: Callable[[], Any]) -> Run:
    """Time ``call()`` here: wall seconds, this process's CPU seconds and, for a
    :class:`~rdmaxfer.tools.fetch.FetchResult`, the connection counts and range sizes."""

    def run() -> dict[str, Any]:
        cpu0, t0 = _cpu(resource.RUSAGE_SELF), time.perf_counter()
        result = call()
        seconds = time.perf_counter() - t0
        row: dict[str, Any] = {"seconds": seconds, "cpu_s": _cpu(resource.RUSAGE_SELF) - cpu0}
        if hasattr(result, "connection_steps"):
            row["connections"] = result.connections
            row["connection_steps"] = [s["connections"] for s in result.connection_steps]
            row["range_size"] = result.range_size
        return row

    return run


def child(cmd: list[str]) -> Run:
    """Time the command: wall seconds and its CPU seconds."""

    def run() -> dict[str, Any]:
        cpu0, t0 = _cpu(resource.RUSAGE_CHILDREN), time.perf_counter()
        subprocess.run(
            cmd, check=True, timeout=CLIENT_TIMEOUT_S, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )  # fmt: skip
        seconds = time.perf_counter() - t0
        return {"seconds": seconds, "cpu_s": _cpu(resource.RUSAGE_CHILDREN) - cpu0}

    return run


def clients(url: str, out: Path, fetch_call: Callable[[], Any] | None = None) -> dict[str, Run]:
    """rdmaxfer (``fetch_call``, default ``fetch(url, out)``) and each reference client that
    is installed, every one writing ``out``."""
    if fetch_call is None:
        from .fetch import fetch

        def fetch_call() -> Any:
            return fetch(url, out, resume=False)

    aria2c = ["aria2c", "-q", "-x8", "-s8", "-k1M", "--allow-overwrite=true",
              "--auto-file-renaming=false", "--file-allocation=none"]  # fmt: skip
    commands = {
        "curl": ["curl", "-sf", "-o", str(out), url],
        "wget": ["wget", "-q", "-O", str(out), url],
        "aria2c -x8": [*aria2c, "-d", str(out.parent), "-o", out.name, url],
    }
    found = {"rdmaxfer": in_process(fetch_call)}
    found.update({n: child(c) for n, c in commands.items() if shutil.which(c[0])})
    return found


def run_rounds(
    runs: dict[str, Run],
    out: Path,
    repeat: int,
    digest: str | None = None,
    on_row: Callable[[dict[str, Any]], None] | None = None,
    size: int = 0,
) -> list[dict[str, Any]]:
    """Each client once per round, ``repeat`` rounds, every other round in the reverse
    order; every download's SHA-256 checked against ``digest`` (default: the first one's).
    Before each, the file system's pending writes are flushed (``os.sync``), so that no
    client pays for the writes of the one before. A client that writes no ``out`` (into
    memory) counts ``size`` bytes, unchecked.

    Returns:
        one row per download: ``tool``, ``round``, ``bytes``, ``seconds``, ``GB_per_s``,
        ``cpu_s``, ``cpu_s_per_GB``, ``load_avg_1min`` (before it), ``sha256``, and
        rdmaxfer's connection counts and range size.

    Raises:
        RuntimeError: a download's bytes differ from the others'.
    """
    rows: list[dict[str, Any]] = []
    for r in range(repeat):
        for name, run in list(runs.items())[:: -1 if r % 2 else 1]:
            out.unlink(missing_ok=True)
            os.sync()
            load = os.getloadavg()[0]
            row = {"op": "fetch", "tool": name, "round": r, **run()}
            nbytes, got = size, None
            if out.exists():
                nbytes, got = out.stat().st_size, sha256_of(out)
                digest = digest or got
                if got != digest:
                    raise RuntimeError(
                        f"{name}: the downloaded file's SHA-256 is {got}, the others' {digest}"
                    )
            row.update(bytes=nbytes, GB_per_s=nbytes / row["seconds"] / 1e9, sha256=got,
                       cpu_s_per_GB=row["cpu_s"] / (nbytes / 1e9) if nbytes else 0.0,
                       load_avg_1min=round(load, 2))  # fmt: skip
            rows.append(row)
            if on_row is not None:
                on_row(row)
    out.unlink(missing_ok=True)
    return rows


def summary(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per client: the best and the median GB/s and CPU s/GB over its rounds, and the best
    time over each reference's best (``x_curl``...: above 1 is faster than it)."""
    tools: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        tools.setdefault(row["tool"], []).append(row)
    best = {name: min(r["seconds"] for r in runs) for name, runs in tools.items()}
    out: dict[str, dict[str, float]] = {}
    for name, runs in tools.items():
        out[name] = {
            "best_GB_per_s": max(r["GB_per_s"] for r in runs),
            "median_GB_per_s": statistics.median(r["GB_per_s"] for r in runs),
            "median_cpu_s_per_GB": statistics.median(r["cpu_s_per_GB"] for r in runs),
            **{f"x_{ref.split()[0]}": best[ref] / best[name] for ref in REFERENCES if ref in best},
        }
    return out


def format_fetch_table(rows: list[dict[str, Any]]) -> str:
    """A Markdown table of :func:`summary`."""
    lines = [
        "| client | best GB/s | median GB/s | median CPU s/GB | vs curl | vs aria2c -x8 |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, s in summary(rows).items():
        ratios = [f"{s[k]:.2f}x" if k in s else "-" for k in ("x_curl", "x_aria2c")]
        lines.append(
            f"| {name} | {s['best_GB_per_s']:.3f} | {s['median_GB_per_s']:.3f} | "
            f"{s['median_cpu_s_per_GB']:.2f} | {' | '.join(ratios)} |"
        )
    return "\n".join(lines)


def cmd_bench_fetch(args: Any) -> int:
    """``bench --op fetch``: ``--iters`` rounds against ``--url``, downloads in ``--dir``
    (default: a temporary folder); ``--json`` prints one JSON object per download as it
    ends, else a table at the end."""
    import json
    import tempfile

    if not args.url:
        print("bench --op fetch needs --url URL (the file to download)", file=sys.stderr)
        return 2
    work = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="rdmaxfer-bench-"))
    try:
        work.mkdir(parents=True, exist_ok=True)
        out = work / "bench-fetch.out"
        emit = (lambda row: print(json.dumps(row), flush=True)) if args.json else None
        rows = run_rounds(clients(args.url, out), out, args.iters, on_row=emit)
    finally:
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)
    if args.json:
        return 0
    load = ", ".join(f"{r['load_avg_1min']:.1f}" for r in rows)
    print(f"# fetch {args.url} ({rows[0]['bytes']} bytes), {args.iters} rounds, "
          f"GB = 1e9 bytes, load average before each: {load}")  # fmt: skip
    print(format_fetch_table(rows))
    return 0
