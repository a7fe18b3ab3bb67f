"""Benchmark of rdmaxfer transfers (``rdmaxfer bench``), reported the way perftest reports them.

A peer process (``multiprocessing`` spawn) listens and exposes a registered buffer; this
process connects and runs ``iters`` timed transfers per size (or as many as fit in
``duration`` seconds) after ``warmup`` untimed ones, at most ``qd`` in flight:

- ``write`` / ``read``: one-sided, each completes when the bytes are placed (WRITE) or have
  arrived (READ); for small sizes the time is one round trip.
- ``send``: two-sided; the peer receives every message into a preallocated array.

``loop="cpp"`` (write/read only) times the operations in C++ (``_core.Endpoint.timed_loop``, one
operation in flight, the wait driving completions itself) instead of one blocking Python call per
operation: the transport's own latency, without the interpreter's per-call cost.

Transports: ``tcp`` on loopback, or ``rdma`` with the two engines on two devices
(:class:`RdmaSetup`: in the rxe guest rxe0 -> rxe1 listening on 10.77.0.2, from
``RDMAXFER_RXE_*``) or on one device over loopback. ``--reference`` runs iperf3 (tcp) or
ib_write_bw/ib_write_lat (rdma) for the same sizes (:mod:`rdmaxfer.bench_reference`), and
``--plot`` draws both (:mod:`rdmaxfer.bench_plot`).

Figures per size (GB/s = 1e9 bytes per second; latencies in microseconds, per operation, from
post to observed completion): ``bw_peak_GB_per_s`` (fastest iteration; with qd > 1 the best rate
over max(4 qd, iterations / 10) consecutive completions), ``bw_avg_GB_per_s`` (all bytes / all
time), ``msg_rate_mpps`` (operations per second / 1e6), ``lat_us_min``, ``lat_us_p50``
(perftest's t_typical), ``lat_us_avg``, ``lat_us_p99``, ``lat_us_p999``, ``qd`` and
``seconds`` (timed wall time).
"""

from __future__ import annotations

import collections
import contextlib
import math
import multiprocessing as mp
import re
import secrets
import signal
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from multiprocessing.connection import Connection
from typing import Any

import numpy as np
import numpy.typing as npt

from .. import _core, _transports
from .._config import format_address
from .._test_hooks import rxe_guest
from ..errors import InvalidArgumentError
from ..transport.engine import Engine, resolve_transport

__all__ = [
    "BenchResult",
    "RdmaSetup",
    "format_reference_table",
    "format_stats_table",
    "format_table",
    "parse_size",
    "parse_sizes",
    "run_bench",
]

OPS = ("write", "read", "send")
LOOPS = ("python", "cpp")
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
    """One row of the table (see the module docstring for units).

    With a reference tool (``--reference``) the ``ref_*`` fields hold its figures for the same
    size and ``bw_ratio``/``lat_ratio`` are rdmaxfer divided by the reference.
    """

    transport: str
    op: str
    bytes: int
    iters: int
    streams: int
    bw_peak_GB_per_s: float
    bw_avg_GB_per_s: float
    msg_rate_mpps: float
    lat_us_min: float
    lat_us_p50: float
    lat_us_avg: float
    lat_us_p99: float
    lat_us_p999: float
    qd: int = 1
    seconds: float = 0.0
    ref_tool: str | None = None
    ref_bw_GB_per_s: float | None = None
    ref_lat_us: float | None = None
    ref_error: str | None = None
    bw_ratio: float | None = None
    lat_ratio: float | None = None
    stats: dict[str, int] | None = None  # with stats=True: this side's counters for the size

    def as_dict(self) -> dict[str, Any]:
        """The row as a dict; the ``ref_*``/ratio keys only when a reference ran."""
        out = asdict(self)
        if self.ref_tool is None:
            for key in ("ref_tool", "ref_bw_GB_per_s", "ref_lat_us", "ref_error"):
                del out[key]
            del out["bw_ratio"], out["lat_ratio"]
        if self.stats is None:
            del out["stats"]
        return out

    def attach_reference(self, ref: dict[str, Any]) -> None:
        """Record a reference tool's figures for this size (see bench_reference)."""
        self.ref_tool = str(ref.get("tool"))
        self.ref_bw_GB_per_s = ref.get("bw_GB_per_s")
        self.ref_lat_us = ref.get("lat_us")
        self.ref_error = ref.get("error")
        self.bw_ratio = (
            self.bw_avg_GB_per_s / self.ref_bw_GB_per_s if self.ref_bw_GB_per_s else None
        )
        self.lat_ratio = self.lat_us_p50 / self.ref_lat_us if self.ref_lat_us else None


@dataclass(frozen=True)
class RdmaSetup:
    """Where the two engines of an rdma benchmark run: this process on ``device``, the peer on
    ``peer_device`` listening on ``bind`` (an address of the peer device's netdev, or loopback
    when both use one device). A device may be a comma-separated list: one rail each."""

    device: str | None = None
    peer_device: str | None = None
    bind: str = "127.0.0.1"

    @classmethod
    def resolve(
        cls,
        device: str | None = None,
        peer_device: str | None = None,
        bind: str | None = None,
        rails: int = 1,
    ) -> RdmaSetup:
        """Fill what is not given from the rxe guest's ``RDMAXFER_RXE_DEVICES`` (``"rxe0
        rxe1"``: this side, peer side) and ``RDMAXFER_RXE_ADDRS`` (the peer listens on the
        second address); else the engine's default device and loopback. ``rails`` > 1 takes
        that many devices a side from ``RDMAXFER_RXE_RAIL_DEVICES`` (``"rxe0,rxe2 rxe1,rxe3"``,
        ``run-in-vm.sh --rails 2``); raises InvalidArgumentError when it has fewer."""
        devs, addrs, sides = rxe_guest()
        if rails > 1:
            if len(sides) != 2 or min(len(s) for s in sides) < rails:
                raise InvalidArgumentError(
                    f"--rails {rails}: RDMAXFER_RXE_RAIL_DEVICES lists "
                    f"{sides or 'no devices'}; run in tests/rxe/run-in-vm.sh --rails {rails}, "
                    "or give --device and --peer-device as comma-separated lists"
                )
            devs = [",".join(side[:rails]) for side in sides]
        if device is None and len(devs) >= 2:
            device = devs[0]
        if peer_device is None:
            peer_device = devs[1] if len(devs) >= 2 else device
        if bind is None:
            rxe_peer = len(devs) >= 2 and len(addrs) >= 2 and peer_device == devs[1]
            bind = addrs[1] if rxe_peer else "127.0.0.1"
        return cls(device, peer_device, bind)


#: Seconds a benchmark peer may take to start (:func:`peer_process`).
PEER_START_S = 60.0


def _engine(transport: str, streams: int, device: str | None, secret: str) -> Engine:
    if _transports.capabilities(transport).rails:  # runs on named devices
        return Engine(transport, streams=streams, rdma_devices=device, secret=secret)
    return Engine(transport, streams=streams, secret=secret)


def _peer(
    conn: Connection,
    transport: str,
    nbytes: int,
    streams: int,
    device: str | None,
    bind: str,
    secret: str,
    accept_timeout_s: float = PEER_START_S,
) -> None:
    """The passive side: exposes a registered buffer; for ``send`` it receives every message
    announced over ``conn`` (``("recv", size, count, qd)``) until ``("done",)``. Ctrl-C is for
    the parent, which ends this process."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with _engine(transport, streams, device, secret) as engine:
        port = engine.listen(bind, 0)
        buf = np.empty(max(nbytes, 1), dtype=np.uint8)
        buf[::4096] = 1  # fault the pages in before timing
        region = engine.register(buf, access="rw")
        conn.send((port, region.descriptor().pack()))
        with engine.accept(timeout=accept_timeout_s) as ep:
            while conn.poll(_PEER_IDLE_S):
                msg = conn.recv()
                if msg[0] != "recv":
                    return
                _, size, count, qd = msg
                pending: collections.deque[Any] = collections.deque()
                for _ in range(count):
                    pending.append(ep.post_recv(out=buf[:size]))
                    if len(pending) >= qd:
                        pending.popleft().wait(_OP_TIMEOUT_S)
                while pending:
                    pending.popleft().wait(_OP_TIMEOUT_S)


@contextlib.contextmanager
def peer_process(
    transport: str,
    nbytes: int,
    streams: int,
    setup: RdmaSetup,
    secret: str,
    start_timeout_s: float = PEER_START_S,
) -> Iterator[tuple[Connection, int, bytes]]:
    """Runs :func:`_peer` in a new process exposing ``nbytes``; yields the control pipe, the
    peer's port and its region's packed descriptor, and ends the peer on exit (at once when
    the caller failed or was interrupted). ``start_timeout_s``: seconds the peer may take to
    start, import rdmaxfer and register its buffer (far more than 60 under TCG emulation)."""
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    args = (
        child,
        transport,
        nbytes,
        streams,
        setup.peer_device,
        setup.bind,
        secret,
        start_timeout_s,
    )
    peer = ctx.Process(target=_peer, args=args, daemon=True)
    peer.start()
    try:
        if not parent.poll(start_timeout_s):
            raise RuntimeError(
                f"the benchmark peer did not start within {start_timeout_s:g} s; give it "
                "longer (--peer-start-timeout) on a slow or emulated host"
            )
        port, descriptor = parent.recv()
        yield parent, port, descriptor
        parent.send(("done",))
        peer.join(timeout=30)
    finally:
        if peer.is_alive():
            peer.kill()
            peer.join()


_PEER_IDLE_S = 600.0
_OP_TIMEOUT_S = 120.0


class _Runner:
    """Times operations of one size on a connected endpoint."""

    def __init__(
        self,
        ep: Any,
        op: str,
        src: npt.NDArray[np.uint8],
        descriptor: bytes,
        chunk_size: int,
        qd: int,
        control: Connection,
    ) -> None:
        self.ep, self.op, self.src, self.descriptor = ep, op, src, descriptor
        self.chunk_size, self.qd, self.control = chunk_size, qd, control

    def _post(self, size: int) -> Any:
        if self.op == "write":
            return self.ep.post_write(
                self.src, self.descriptor, nbytes=size, chunk_size=self.chunk_size
            )
        if self.op == "read":
            return self.ep.post_read(
                self.src, self.descriptor, nbytes=size, chunk_size=self.chunk_size
            )
        return self.ep.post_send(self.src[:size], chunk_size=self.chunk_size)

    def _blocking(self, size: int) -> None:
        if self.op == "write":
            self.ep.write(self.src, self.descriptor, nbytes=size, chunk_size=self.chunk_size)
        elif self.op == "read":
            self.ep.read(self.src, self.descriptor, nbytes=size, chunk_size=self.chunk_size)
        else:
            self.ep.send(self.src[:size], chunk_size=self.chunk_size)

    def batch(self, size: int, count: int) -> tuple[list[float], list[float], float]:
        """Run ``count`` operations, at most ``qd`` in flight.

        Returns:
            (per-operation latencies from post to observed completion, completion times,
            elapsed seconds from the first post to the last completion).
        """
        if self.op == "send":
            self.control.send(("recv", size, count, self.qd))
        lat: list[float] = []
        stamps: list[float] = []
        start = time.perf_counter()
        if self.qd == 1:
            for _ in range(count):
                t0 = time.perf_counter()
                self._blocking(size)
                t1 = time.perf_counter()
                lat.append(t1 - t0)
                stamps.append(t1)
            return lat, stamps, sum(lat)
        window: collections.deque[tuple[Any, float]] = collections.deque()

        def reap() -> None:
            transfer, t0 = window.popleft()
            transfer.wait(_OP_TIMEOUT_S)
            t1 = time.perf_counter()
            lat.append(t1 - t0)
            stamps.append(t1)

        for _ in range(count):
            if len(window) >= self.qd:
                reap()
            window.append((self._post(size), time.perf_counter()))
        while window:
            reap()
        return lat, stamps, time.perf_counter() - start


def run_bench(
    *,
    transport: str = "tcp",
    op: str = "write",
    sizes: Sequence[int] = (1 << 20,),
    iters: int = 10,
    warmup: int = 2,
    streams: int = 0,
    chunk_size: int = 0,
    loop: str = "python",
    qd: int = 1,
    duration: float | None = None,
    rdma: RdmaSetup | None = None,
    stats: bool = False,
    on_row: Callable[[BenchResult], None] | None = None,
) -> list[BenchResult]:
    """Run the benchmark; one :class:`BenchResult` per size.

    Args:
        transport: ``"tcp"`` or ``"rdma"`` (``"auto"`` resolves as for :class:`Engine`).
        op: ``"write"``, ``"read"`` (one-sided) or ``"send"`` (two-sided).
        sizes: message sizes in bytes.
        iters: timed operations per size (ignored when ``duration`` is given).
        warmup: untimed operations per size first.
        streams: TCP streams / RDMA queue pairs per connection (0: the engine's default).
        chunk_size: bytes per wire chunk (0: chosen from the size).
        loop: ``"python"`` or ``"cpp"`` (write/read, qd 1, iterations: timed in C++).
        qd: operations in flight (queue depth); latency is then post -> observed completion.
        duration: seconds of timed operations per size instead of ``iters``.
        rdma: devices and bind address for ``transport="rdma"`` (default:
            :meth:`RdmaSetup.resolve`).
        stats: also record, per size, how much each of the connecting side's counters
            (:mod:`rdmaxfer.transport.stats`, warmup included) grew, in :attr:`BenchResult.stats`.
        on_row: called with each row as soon as its size is measured (``rdmaxfer bench
            --json`` prints it then), before the next size runs.

    Raises:
        InvalidArgumentError: unknown op or loop, loop="cpp" with op="send", qd>1 or a
            duration, no sizes, iters < 1, qd < 1, duration <= 0.
    """
    transport = resolve_transport(transport)
    if op not in OPS:
        raise InvalidArgumentError(f"op={op!r}: choose one of {', '.join(OPS)}")
    if loop not in LOOPS or (loop == "cpp" and (op == "send" or qd != 1 or duration)):
        raise InvalidArgumentError(
            f"loop={loop!r}: choose python, or cpp for write/read with qd=1 and iterations"
        )
    if not sizes or min(sizes) < 0 or iters < 1 or warmup < 0:
        raise InvalidArgumentError("need at least one size >= 0, iters >= 1 and warmup >= 0")
    if isinstance(qd, bool) or not isinstance(qd, int) or not 1 <= qd <= 4096:
        raise InvalidArgumentError(f"qd={qd!r}: the queue depth is an integer from 1 to 4096")
    if duration is not None and not (duration > 0 and math.isfinite(duration)):
        raise InvalidArgumentError(f"duration={duration!r}: give a number of seconds > 0")
    on_rails = _transports.capabilities(transport).rails
    setup = (rdma or RdmaSetup.resolve()) if on_rails else RdmaSetup()
    secret = secrets.token_hex(16)  # the peer may listen beyond loopback (rdma bind address)
    top = max(sizes)
    results: list[BenchResult] = []
    with peer_process(transport, top, streams, setup, secret) as (parent, port, descriptor):
        src = np.random.default_rng(0).integers(0, 256, max(top, 1), dtype=np.uint8)
        with _engine(transport, streams, setup.device, secret) as engine:
            src_region = engine.register(src, access="none", local_write=False)
            with engine.connect(format_address(setup.bind, port), timeout=30) as ep:
                runner = _Runner(ep, op, src, descriptor, chunk_size, qd, parent)
                for size in sizes:
                    before = ep.stats() if stats else {}
                    if loop == "cpp":
                        remote = _core.Descriptor.unpack(descriptor)
                        times = ep.core.timed_loop(
                            op, src_region.core, 0, remote, 0, size, iters, warmup, 1, 120
                        )
                        row = _summarise(transport, op, size, ep.streams, times, sum(times), [], 1)
                    else:
                        if warmup:
                            runner.batch(size, warmup)
                        if duration is None:
                            lat, stamps, elapsed = runner.batch(size, iters)
                        else:
                            lat, stamps, elapsed = [], [], 0.0
                            step = max(qd * 2, 8)
                            while elapsed < duration:
                                more, more_stamps, more_s = runner.batch(size, step)
                                lat += more
                                stamps += more_stamps
                                elapsed += more_s
                        row = _summarise(transport, op, size, ep.streams, lat, elapsed, stamps, qd)
                    if stats:
                        row.stats = {k: v - before.get(k, 0) for k, v in ep.stats().items()}
                    results.append(row)
                    if on_row is not None:
                        on_row(row)
    return results


def _summarise(
    transport: str,
    op: str,
    size: int,
    streams: int,
    times: list[float],
    elapsed: float,
    stamps: list[float],
    qd: int,
) -> BenchResult:
    t = np.array(times)
    us = t * 1e6
    n = len(times)
    avg = size * n / elapsed / 1e9
    window = max(4 * qd, n // 10)  # completions are observed in bursts: judge over several
    if qd == 1 or len(stamps) <= window:
        peak = size / float(t.min()) / 1e9 if qd == 1 else avg
    else:  # best rate over `window` consecutive completions
        c = np.array(stamps)
        spans = c[window:] - c[:-window]
        peak = size * window / float(spans[spans > 0].min()) / 1e9 if (spans > 0).any() else avg
    return BenchResult(
        transport=transport,
        op=op,
        bytes=size,
        iters=n,
        streams=streams,
        bw_peak_GB_per_s=max(peak, avg),
        bw_avg_GB_per_s=avg,
        msg_rate_mpps=n / elapsed / 1e6,
        lat_us_min=float(us.min()),
        lat_us_p50=float(np.percentile(us, 50)),
        lat_us_avg=float(us.mean()),
        lat_us_p99=float(np.percentile(us, 99)),
        lat_us_p999=float(np.percentile(us, 99.9)),
        qd=qd,
        seconds=elapsed,
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
            f"{r.bytes:>12} {r.iters:>12} {r.bw_peak_GB_per_s:>14.3f} {r.bw_avg_GB_per_s:>17.3f} "
            f"{r.msg_rate_mpps:>14.6f} {r.lat_us_min:>10.1f} {r.lat_us_p50:>14.1f} "
            f"{r.lat_us_avg:>10.1f} {r.lat_us_p99:>10.1f} {r.lat_us_p999:>11.1f}"
        )
    return "\n".join(lines)


def format_stats_table(results: Sequence[BenchResult]) -> str:
    """The counters recorded with ``stats=True``: one row per counter that moved, one column
    per size in bytes (counter keys and units in :mod:`rdmaxfer.transport.stats`)."""
    names: list[str] = []
    for r in results:
        names += [k for k, v in (r.stats or {}).items() if v and k not in names]
    width = max([len("#counter"), *map(len, names)])
    lines = [f"{'#counter':<{width}}" + "".join(f" {r.bytes:>14}" for r in results)]
    for name in names:
        counts = "".join(f" {(r.stats or {}).get(name, 0):>14}" for r in results)
        lines.append(f"{name:<{width}}{counts}")
    return "\n".join(lines)


def format_reference_table(results: Sequence[BenchResult]) -> str:
    """rdmaxfer vs the reference tool per size: bandwidth (GB/s), latency (us), ratios
    (rdmaxfer / reference: > 1 is better for bandwidth, < 1 is better for latency)."""
    tool = next((r.ref_tool for r in results if r.ref_tool), "reference")
    lines = [
        f"{'#bytes':>12} {'BW[GB/s]':>10} {'ref BW':>10} {'BW ratio':>9} "
        f"{'t_typ[us]':>10} {'ref t[us]':>10} {'t ratio':>8}   reference: {tool}"
    ]

    def num(v: float | None, fmt: str) -> str:
        return format(v, fmt) if v is not None else "-"

    for r in results:
        line = (
            f"{r.bytes:>12} {r.bw_avg_GB_per_s:>10.3f} {num(r.ref_bw_GB_per_s, '10.3f'):>10} "
            f"{num(r.bw_ratio, '9.2f'):>9} {r.lat_us_p50:>10.1f} {num(r.ref_lat_us, '10.1f'):>10} "
            f"{num(r.lat_ratio, '8.2f'):>8}"
        )
        if r.ref_error:
            line += f"   ({r.ref_error[:60]})"
        lines.append(line)
    return "\n".join(lines)
