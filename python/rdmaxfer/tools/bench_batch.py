"""``rdmaxfer bench --batch N``: scattered batches against the same bytes as one transfer.

Each case moves N entries of one size per call with ``write_batch`` / ``read_batch`` (a
prepared batch, posted ``iters`` times), local and remote pages both scattered (random slots
of twice as many, so no two entries merge), and in the same run the same number of bytes as
one contiguous ``write`` / ``read``; the ratio is batch GB/s over contiguous GB/s. The
KV-cache case is the shape serving frameworks move: 32 layers x 2 (K and V) x 256 pages of
16 KiB, scattered.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import _transports
from .._config import format_address
from ..errors import InvalidArgumentError
from ..transport.engine import resolve_transport
from .bench import RdmaSetup, _engine, peer_process

__all__ = ["KV_CACHE", "BatchCase", "BatchRow", "format_batch_table", "run_batch_bench"]

#: The KV-cache case: (layers, K and V, pages per layer, page bytes).
KV_CACHE = (32, 2, 256, 16 * 1024)


@dataclass(frozen=True)
class BatchCase:
    """One row to measure: ``entries`` entries of ``size`` bytes each."""

    name: str
    entries: int
    size: int


@dataclass
class BatchRow:
    """What one case measured (seconds are medians over the iterations)."""

    case: BatchCase
    op: str
    transport: str
    batch_s: float
    contiguous_s: float
    operations: int

    @property
    def nbytes(self) -> int:
        return self.case.entries * self.case.size

    @property
    def batch_gbps(self) -> float:
        return self.nbytes / self.batch_s / 1e9

    @property
    def contiguous_gbps(self) -> float:
        return self.nbytes / self.contiguous_s / 1e9

    @property
    def ratio(self) -> float:
        """Batch bandwidth over the contiguous transfer's, measured in the same run."""
        return self.contiguous_s / self.batch_s

    def as_dict(self) -> dict[str, Any]:
        """The row as a flat dict (``rdmaxfer bench --batch N --json``): seconds are medians,
        GB/s = 1e9 bytes/s."""
        return {
            "case": self.case.name,
            "entries": self.case.entries,
            "entry_bytes": self.case.size,
            "bytes": self.nbytes,
            "op": self.op,
            "transport": self.transport,
            "operations": self.operations,
            "batch_s": self.batch_s,
            "contiguous_s": self.contiguous_s,
            "batch_GB_per_s": self.batch_gbps,
            "contiguous_GB_per_s": self.contiguous_gbps,
            "ratio": self.ratio,
        }


def run_batch_bench(
    cases: Sequence[BatchCase],
    *,
    transport: str = "tcp",
    op: str = "write",
    iters: int = 5,
    streams: int = 0,
    rdma: RdmaSetup | None = None,
    on_row: Callable[[BatchRow], None] | None = None,
) -> list[BatchRow]:
    """Measure every case against a peer process (as ``rdmaxfer bench``); ``on_row`` is called
    with each row as soon as it is measured.

    Raises:
        InvalidArgumentError: op not write/read, no case, an empty case, iters < 1.
    """
    transport = resolve_transport(transport)
    if op not in ("write", "read"):
        raise InvalidArgumentError(f"op={op!r}: a batch benchmark is 'write' or 'read'")
    if not cases or iters < 1 or min(min(c.entries, c.size) for c in cases) < 1:
        raise InvalidArgumentError("need at least one case of >= 1 entry of >= 1 byte, iters >= 1")
    on_rails = _transports.capabilities(transport).rails
    setup = (rdma or RdmaSetup.resolve()) if on_rails else RdmaSetup()
    secret = secrets.token_hex(16)
    remote_bytes = max(2 * c.entries * c.size for c in cases)
    rows: list[BatchRow] = []
    with peer_process(transport, remote_bytes, streams, setup, secret) as (_, port, descriptor):
        rng = np.random.default_rng(0)
        local = rng.integers(0, 256, remote_bytes, dtype=np.uint8)
        with _engine(transport, streams, setup.device, secret) as engine:
            region = engine.register(local, access="none")
            with engine.connect(format_address(setup.bind, port), timeout=30) as ep:
                for case in cases:
                    rows.append(_measure(ep, region, descriptor, case, op, transport, iters, rng))
                    if on_row is not None:
                        on_row(rows[-1])
    return rows


def _measure(
    ep: Any,
    region: Any,
    descriptor: bytes,
    case: BatchCase,
    op: str,
    transport: str,
    iters: int,
    rng: np.random.Generator,
) -> BatchRow:
    n, size = case.entries, case.size
    here = rng.permutation(2 * n)[:n]
    there = rng.permutation(2 * n)[:n]
    entries = [
        ((region, int(a) * size, size), descriptor, int(b) * size)
        for a, b in zip(here, there, strict=True)
    ]
    contiguous = ep.post_read if op == "read" else ep.post_write
    with ep.prepare_batch(entries, op=op) as prepared:
        operations = prepared.operations
        prepared.post().wait(120)  # warm-up
        contiguous(region, descriptor, nbytes=n * size).wait(120)
        batch_s, contiguous_s = [], []
        for _ in range(iters):
            start = time.perf_counter()
            result = prepared.post().wait(120)
            batch_s.append(time.perf_counter() - start)
            result.check()
            start = time.perf_counter()
            contiguous(region, descriptor, nbytes=n * size).wait(120)
            contiguous_s.append(time.perf_counter() - start)
    return BatchRow(
        case, op, transport, float(np.median(batch_s)), float(np.median(contiguous_s)), operations
    )


def format_batch_table(rows: Sequence[BatchRow]) -> str:
    """A fixed-width table, one line per case (GB/s = 1e9 B/s)."""
    lines = [
        f"{'case':<12} {'entries':>8} {'entry':>7} {'MB':>8} {'batch GB/s':>11} "
        f"{'contig GB/s':>12} {'ratio':>6}"
    ]
    for r in rows:
        lines.append(
            f"{r.case.name:<12} {r.case.entries:>8} {_size(r.case.size):>7} "
            f"{r.nbytes / 1e6:>8.1f} {r.batch_gbps:>11.3f} {r.contiguous_gbps:>12.3f} "
            f"{r.ratio:>6.2f}"
        )
    return "\n".join(lines)


def _size(n: int) -> str:
    for unit, shift in (("M", 20), ("K", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift}{unit}"
    return str(n)
