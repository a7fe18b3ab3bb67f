"""Reference tools run side by side with ``rdmaxfer bench --reference``.

- TCP: ``iperf3`` (one stream on loopback, ``-n`` bytes in blocks of the message size, at most
  1 MiB, iperf3's limit): bandwidth only (iperf3 measures no per-message latency).
- RDMA: perftest's ``ib_write_bw`` and ``ib_write_lat`` between the two devices of the rxe
  guest, through ``tests/rxe/perftest-ref.sh`` (server on the second device of
  ``RDMAXFER_RXE_DEVICES``, client on the first). Its latency is ``t_typical``, half a
  ping-pong round trip; a one-sided WRITE completes after one round trip, so the comparison
  uses ``2 * t_typical``.

Each function returns ``{bytes: {"tool": ..., "bw_GB_per_s": GB/s or None, "lat_us": us or None,
"error": text or None}}``; a tool that fails gives an ``error`` entry, never an exception
(GB/s = 1e9 bytes/s).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import UnsupportedError

__all__ = ["find_perftest_script", "iperf3_reference", "perftest_reference"]

IPERF3_MAX_BLOCK = 1 << 20
#: Seconds each reference process may run.
TOOL_TIMEOUT_S = 300.0


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _entry(tool: str, bw: float | None = None, lat: float | None = None, error: str | None = None
           ) -> dict[str, Any]:  # fmt: skip
    return {"tool": tool, "bw_GB_per_s": bw, "lat_us": lat, "error": error}


def iperf3_reference(
    sizes: Sequence[int], iters: int, *, host: str = "127.0.0.1"
) -> dict[int, dict[str, Any]]:
    """iperf3 bandwidth on loopback for each size (``size * iters`` bytes, at least
    ``min(16 MiB, 20000 * size)`` so the run is long enough to time).

    Raises:
        UnsupportedError: iperf3 is not installed (``apt-get install iperf3``).
    """
    binary = shutil.which("iperf3")
    if binary is None:
        raise UnsupportedError("--reference over tcp needs iperf3: apt-get install -y iperf3")
    out: dict[int, dict[str, Any]] = {}
    for size in sizes:
        block = max(1, min(size, IPERF3_MAX_BLOCK))
        total = max(size * iters, min(16 << 20, size * 20000))
        out[size] = _iperf3_once(binary, host, block, total)
    return out


def _iperf3_once(binary: str, host: str, block: int, total: int) -> dict[str, Any]:
    port = _free_port()
    server = subprocess.Popen(
        [binary, "-s", "-1", "-B", host, "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while True:  # a refused connect never reaches the server: retry until it listens
            done = subprocess.run(
                [binary, "-c", host, "-p", str(port), "-l", str(block), "-n", str(total), "-J"],
                capture_output=True,
                text=True,
                timeout=TOOL_TIMEOUT_S,
            )
            try:
                report = json.loads(done.stdout)
            except ValueError:
                report = {"error": done.stderr.strip() or "no output"}
            err = report.get("error")
            if err and "connect" in str(err) and time.monotonic() < deadline:
                time.sleep(0.1)
                continue
            if err:
                return _entry("iperf3", error=str(err))
            end = report["end"]
            # very short runs can end before the receiver's first report: use the sender's
            bps = float(end["sum_received"]["bits_per_second"]) or float(
                end["sum_sent"]["bits_per_second"]
            )
            return _entry("iperf3", bw=bps / 8 / 1e9)
    except (subprocess.TimeoutExpired, KeyError, TypeError) as exc:
        return _entry("iperf3", error=f"{type(exc).__name__}: {exc}")
    finally:
        if server.poll() is None:
            server.kill()
        server.wait(timeout=10)


def find_perftest_script() -> Path | None:
    """``tests/rxe/perftest-ref.sh`` of the source tree (this package's, or the current
    directory's), or None."""
    here = Path(__file__).resolve()
    for base in (Path.cwd(), *here.parents):
        script = base / "tests" / "rxe" / "perftest-ref.sh"
        if script.is_file():
            return script
    return None


def perftest_reference(
    sizes: Sequence[int], iters: int, *, script: str | os.PathLike[str] | None = None
) -> dict[int, dict[str, Any]]:
    """ib_write_bw (bandwidth) and ib_write_lat (``2 * t_typical``) for each size.

    Raises:
        UnsupportedError: the perftest script or the perftest tools are missing.
    """
    path = Path(script) if script is not None else find_perftest_script()
    if path is None or not path.is_file():
        raise UnsupportedError(
            "--reference over rdma runs tests/rxe/perftest-ref.sh: run from the rdmaxfer "
            "source tree (inside tests/rxe/run-in-vm.sh)"
        )
    if shutil.which("ib_write_bw") is None:
        raise UnsupportedError("--reference over rdma needs perftest: apt-get install perftest")
    cmd = [str(path), "-n", str(max(iters, 5)), "-t", "both", *(str(s) for s in sizes)]
    out = {size: _entry("ib_write_bw/ib_write_lat") for size in sizes}
    try:
        done = subprocess.run(
            cmd, capture_output=True, text=True, timeout=TOOL_TIMEOUT_S * max(1, len(sizes))
        )
    except subprocess.TimeoutExpired as exc:
        for timed_out in out.values():
            timed_out["error"] = f"perftest-ref.sh timed out after {exc.timeout} s"
        return out
    for line in done.stdout.splitlines():
        if not line.startswith("{"):
            continue
        rec = json.loads(line)
        entry = out.get(int(rec["bytes"]))
        if entry is None:
            continue
        if rec.get("error"):
            entry["error"] = f"{rec['tool']}: {rec['error']}"
        elif rec["tool"] == "ib_write_bw":
            entry["bw_GB_per_s"] = (
                float(rec["bw_Gbit_per_s"]) / 8 or None
            )  # Gb/s -> GB/s; 0: no figure
        else:
            entry["lat_us"] = 2 * float(rec["lat_us_typical"])
    return out
