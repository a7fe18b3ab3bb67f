"""``rdmaxfer bench``: the bandwidth/latency sweep (a perftest-style table), its batch cases
and, with ``--json``, JSON Lines: one object per row, printed as soon as the row is measured.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from .. import _transports
from ..transport.engine import resolve_transport
from . import bench

__all__ = ["cmd_bench"]


def _emit(row: dict[str, Any]) -> None:
    print(json.dumps(row), flush=True)


def cmd_bench(args: argparse.Namespace) -> int:
    if args.op == "load":
        from .cli_load import cmd_bench_load

        return cmd_bench_load(args)
    if args.op == "fetch":
        from .bench_fetch import cmd_bench_fetch

        return cmd_bench_fetch(args)
    transport = resolve_transport(args.transport)
    caps = _transports.capabilities(transport)
    if args.reference and not caps.network:
        print(
            f"--reference: {transport}'s reference (same host) is a single-process memcpy; run "
            "bench/shm_vs_memcpy.py",
            file=sys.stderr,
        )
        return 2
    sizes = bench.parse_sizes(args.size)
    rdma = (
        bench.RdmaSetup.resolve(args.device, args.peer_device, args.bind, args.rails)
        if caps.rails
        else None
    )
    if args.batch or args.kv_cache:
        return _bench_batches(args, transport, sizes, rdma)

    def measured(row: bench.BenchResult) -> None:
        # The reference tool runs for this size right after rdmaxfer did, so the two
        # alternate size by size and a row is complete (and printed with --json) at once.
        if args.reference:
            from . import bench_reference

            if caps.rails:  # a verbs device: perftest; sockets: iperf3
                ref = bench_reference.perftest_reference([row.bytes], row.iters)
            else:
                ref = bench_reference.iperf3_reference([row.bytes], row.iters)
            row.attach_reference(ref[row.bytes])
        if args.json:
            _emit(row.as_dict())

    results = bench.run_bench(
        transport=transport,
        op=args.op,
        sizes=sizes,
        iters=args.iters,
        warmup=args.warmup,
        streams=args.streams,
        chunk_size=bench.parse_size(args.chunk_size) if args.chunk_size else 0,
        loop=args.loop,
        qd=args.qd,
        duration=args.duration,
        rdma=rdma,
        stats=args.stats,
        on_row=measured,
    )
    where = "loopback"
    if rdma is not None:
        where = f"{rdma.device or 'default device'} -> {rdma.peer_device or 'same'} at {rdma.bind}"
    title = f"rdmaxfer {args.op} over {transport} ({where}), qd {args.qd}"
    if args.plot:
        from .bench_plot import plot_results

        plot_results([r.as_dict() for r in results], args.plot, title=title)
    if args.json:
        return 0
    print(f"# {title}, GB/s = 1e9 B/s")
    print(bench.format_table(results))
    if args.reference:
        print()
        print(bench.format_reference_table(results))
    if args.stats:
        print()
        print("# counters of this side's endpoint per size (see rdmaxfer.transport.stats)")
        print(bench.format_stats_table(results))
    if args.plot:
        print(f"wrote {args.plot}")
    return 0


def _bench_batches(
    args: argparse.Namespace, transport: str, sizes: list[int], rdma: bench.RdmaSetup | None
) -> int:
    from . import bench_batch as bb

    cases = [bb.BatchCase("scattered", args.batch, size) for size in sizes] if args.batch else []
    if args.kv_cache:
        layers, kv, pages, page = bb.KV_CACHE
        cases.append(bb.BatchCase("kv-cache", layers * kv * pages, page))
    rows = bb.run_batch_bench(
        cases,
        transport=transport,
        op=args.op,
        iters=args.iters,
        streams=args.streams,
        rdma=rdma,
        on_row=(lambda row: _emit(row.as_dict())) if args.json else None,
    )
    if args.json:
        return 0
    print(f"# rdmaxfer {args.op} batches over {transport}: batch vs the same bytes contiguous, "
          "same run, medians of --iters, GB/s = 1e9 B/s")  # fmt: skip
    print(bb.format_batch_table(rows))
    return 0
