"""Loopback benchmark of rdmaxfer transfers, reported the way perftest reports them.

A peer process (``multiprocessing`` spawn) listens and exposes a registered buffer; this
process connects and runs ``iters`` timed transfers per size after ``warmup`` untimed ones:

- ``write`` / ``read``: one-sided, each completes when the bytes are placed (WRITE) or have
  arrived (READ); for small sizes the time is one round trip.
- ``send``: two-sided; the peer receives every message into a preallocated array.

Figures per size (GB/s = 1e9 bytes per second; latencies in microseconds, per operation):
``bw_peak_gbps`` (fastest iteration), ``bw_avg_gbps`` (all bytes / all time), ``msg_rate_mpps``
(operations per second / 1e6), ``lat_us_min``, ``lat_us_p50`` (perftest's t_typical),
``lat_us_avg``, ``lat_us_p99``, ``lat_us_p999``.
"""

from __future__ import annotations

import multiprocessing as mp
import re
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from .engine import Engine
from .errors import InvalidArgumentError

__all__ = ["BenchResult", "format_table", "parse_size", "parse_sizes", "run_bench"]

OPS = ("write", "read", "send")
_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str) -> int:
    """Parse ``"4096"``, ``"64K"``, ``"1MiB"``, ``"1G"`` (binary units) into bytes.

    Raises:
        InvalidArgumentError: not a size.
    """
    m = re.fullmatch(r"\s*(\d+)\s*([KMGT]?)(?:i?B)?\s*", text, flags=re.IGNORECASE)
    if m is None:
        raise InvalidArgumentError(f"size {text!r} is not a size; write e.g. 4096, 64K, 1M, 1G")
    return int(m.group(1)) * _UNITS[m.group(2).upper()]


def parse_sizes(text: str) -> list[int]:
    """Parse a comma-separated list of sizes, or a power-of-two sweep ``"2:1G"``."""
    if ":" in text:
        lo_text, hi_text = text.split(":", 1)
        lo, hi = parse_size(lo_text), parse_size(hi_text)
        if lo < 1 or hi < lo:
            raise InvalidArgumentError(f"sweep {text!r} needs 1 <= low <= high")
        sizes = []
        size = lo
        while size <= hi:
            sizes.append(size)
            size *= 2
        return sizes
    return [parse_size(part) for part in text.split(",") if part.strip()]


@dataclass
class BenchResult:
    """One row of the table (see the module docstring for units)."""

    transport: str
    op: str
    bytes: int
    iters: int
    streams: int
    bw_peak_gbps: float
    bw_avg_gbps: float
    msg_rate_mpps: float
    lat_us_min: float
    lat_us_p50: float
    lat_us_avg: float
    lat_us_p99: float
    lat_us_p999: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _peer(conn: Connection, transport: str, nbytes: int, op: str, streams: int) -> None:
    with Engine(transport, streams=streams) as engine:
        port = engine.listen("127.0.0.1", 0)
        buf = np.empty(max(nbytes, 1), dtype=np.uint8)
        buf[::4096] = 1  # fault the pages in before timing
        region = engine.register(buf, access="rw")
        conn.send((port, region.descriptor().pack()))
        with engine.accept(timeout=60) as ep:
            if op == "send":
                for size in conn.recv():
                    ep.recv(out=buf[:size], timeout=120)
            conn.recv()  # the benchmark is over


def run_bench(
    *,
    transport: str = "tcp",
    op: str = "write",
    sizes: Sequence[int] = (1 << 20,),
    iters: int = 10,
    warmup: int = 2,
    streams: int = 0,
    chunk_size: int = 0,
) -> list[BenchResult]:
    """Run the benchmark; one :class:`BenchResult` per size.

    Raises:
        InvalidArgumentError: unknown op, no sizes, iters < 1.
    """
    if op not in OPS:
        raise InvalidArgumentError(f"op={op!r}: choose one of {', '.join(OPS)}")
    if not sizes or min(sizes) < 0 or iters < 1 or warmup < 0:
        raise InvalidArgumentError("need at least one size >= 0, iters >= 1 and warmup >= 0")
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    top = max(sizes)
    peer = ctx.Process(target=_peer, args=(child, transport, top, op, streams), daemon=True)
    peer.start()
    results: list[BenchResult] = []
    try:
        if not parent.poll(60):
            raise RuntimeError("the benchmark peer did not start within 60 s")
        port, descriptor = parent.recv()
        if op == "send":
            parent.send([s for s in sizes for _ in range(warmup + iters)])
        src = np.random.default_rng(0).integers(0, 256, max(top, 1), dtype=np.uint8)
        with Engine(transport, streams=streams) as engine:
            engine.register(src, access="none")
            with engine.connect(f"127.0.0.1:{port}", timeout=30) as ep:
                for size in sizes:
                    times = []
                    for i in range(warmup + iters):
                        t0 = time.perf_counter()
                        if op == "write":
                            ep.write(src, descriptor, nbytes=size, chunk_size=chunk_size)
                        elif op == "read":
                            ep.read(src, descriptor, nbytes=size, chunk_size=chunk_size)
                        else:
                            ep.send(src[:size], chunk_size=chunk_size)
                        if i >= warmup:
                            times.append(time.perf_counter() - t0)
                    results.append(_summarise(transport, op, size, ep.streams, times))
            parent.send("done")
    finally:
        peer.join(timeout=30)
        if peer.is_alive():
            peer.kill()
    return results


def _summarise(transport: str, op: str, size: int, streams: int, times: list[float]) -> BenchResult:
    t = np.array(times)
    us = t * 1e6
    return BenchResult(
        transport=transport,
        op=op,
        bytes=size,
        iters=len(times),
        streams=streams,
        bw_peak_gbps=size / float(t.min()) / 1e9,
        bw_avg_gbps=size * len(times) / float(t.sum()) / 1e9,
        msg_rate_mpps=len(times) / float(t.sum()) / 1e6,
        lat_us_min=float(us.min()),
        lat_us_p50=float(np.percentile(us, 50)),
        lat_us_avg=float(us.mean()),
        lat_us_p99=float(np.percentile(us, 99)),
        lat_us_p999=float(np.percentile(us, 99.9)),
    )


def format_table(results: Sequence[BenchResult]) -> str:
    """perftest-style table: bandwidth columns, then latency percentiles (microseconds)."""
    lines = [
        f"{'#bytes':>12} {'#iterations':>12} {'BW peak[GB/s]':>14} {'BW average[GB/s]':>17} "
        f"{'MsgRate[Mpps]':>14} {'t_min[us]':>10} {'t_typical[us]':>14} {'t_avg[us]':>10} "
        f"{'t_99[us]':>10} {'t_99.9[us]':>11}"
    ]
    for r in results:
        lines.append(
            f"{r.bytes:>12} {r.iters:>12} {r.bw_peak_gbps:>14.3f} {r.bw_avg_gbps:>17.3f} "
            f"{r.msg_rate_mpps:>14.6f} {r.lat_us_min:>10.1f} {r.lat_us_p50:>14.1f} "
            f"{r.lat_us_avg:>10.1f} {r.lat_us_p99:>10.1f} {r.lat_us_p999:>11.1f}"
        )
    return "\n".join(lines)
