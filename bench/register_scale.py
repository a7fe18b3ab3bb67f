"""Registration cost against the number of regions: register + deregister of N regions, and the
implicit registration of a batch of N views, per region, with the core's own calls as the
reference in the same run.

For each N (``--counts``, default 1,000, 10,000, 100,000):

* ``views``: ``Engine.register`` of N ``--region-bytes`` views of one array, then
  ``MemoryRegion.deregister`` of each; ``arrays``: the same with N separate arrays. Reference:
  the core's ``_core.Engine.register``/``deregister`` of the same ranges (no Python layer:
  what a registration costs the transport itself). Rounds alternate the two, ``--rounds`` each.
* ``batch``: ``prepare_batch`` of N ``--region-bytes`` views of one unregistered array (the
  lookups and temporary registrations of a batch, nothing posted) and its ``close``, with the
  registrations it made (one per allocation: 1). Reference: the same batch of
  ``(MemoryRegion, offset, nbytes)`` entries of a registration of the array.

Times are microseconds per region (the median over rounds); ``flat`` is the largest N's time per
region over the smallest N's (targets: <= 2 each way, and <= 20 us per region each way on tcp
and shm). The rows run in order of N, so the smallest N meets a fresh engine whose tables and
objects fit the CPU caches; ``flat_alternating`` measures ``views`` again with rounds that
alternate the smallest and the largest N in the same engine, so both meet the same state;
``load`` is the host's 1-minute load average at the end of each row. Engines run in this
process, connected over loopback (rdma: the rxe guest's devices, see
``rdmaxfer.tools.bench.RdmaSetup``).

    python bench/register_scale.py --transport tcp [--counts 1000,10000,100000] [--rounds 3]
        [--json bench/results/register-scale-tcp.json]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import secrets
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from rdmaxfer import Engine, _core
from rdmaxfer._config import format_address
from rdmaxfer.tools.bench import RdmaSetup

Timing = tuple[float, float]  # (register, deregister) seconds for all N


def api_regions(engine: Engine, arrays: list[Any]) -> Timing:
    start = time.perf_counter()
    regions = [engine.register(a, "r") for a in arrays]
    middle = time.perf_counter()
    for region in regions:
        region.deregister()
    return middle - start, time.perf_counter() - middle


def core_regions(engine: Engine, arrays: list[Any]) -> Timing:
    core = engine.core
    ranges = [(a.ctypes.data, a.nbytes) for a in arrays]
    start = time.perf_counter()
    regions = [core.register(addr, n, _core.ACCESS_REMOTE_READ) for addr, n in ranges]
    middle = time.perf_counter()
    for region in regions:
        core.deregister(region, 5.0)
    return middle - start, time.perf_counter() - middle


def views_of(n: int, size: int) -> list[Any]:
    big = np.ones(n * size, np.uint8)
    return [big[i * size : (i + 1) * size] for i in range(n)]


def separate(n: int, size: int) -> list[Any]:
    return [np.ones(size, np.uint8) for _ in range(n)]


def alternate(rounds: int, cases: dict[str, Callable[[], Timing]]) -> dict[str, list[Timing]]:
    """Run each case once per round, in turn (unpinned, alternating), after one warm-up."""
    out: dict[str, list[Timing]] = {name: [] for name in cases}
    for case in cases.values():
        case()
    for _ in range(rounds):
        for name, case in cases.items():
            gc.collect()
            out[name].append(case())
    return out


def per_region_us(times: list[Timing], n: int) -> dict[str, float]:
    return {
        "register_us": statistics.median(t[0] for t in times) / n * 1e6,
        "deregister_us": statistics.median(t[1] for t in times) / n * 1e6,
    }


def measure_regions(engine: Engine, n: int, size: int, rounds: int) -> dict:
    """Register + deregister of N views of one array and of N arrays, and the core's own."""
    views, arrays = views_of(n, size), separate(n, size)
    times = alternate(
        rounds,
        {
            "views": lambda: api_regions(engine, views),
            "views_core": lambda: core_regions(engine, views),
            "arrays": lambda: api_regions(engine, arrays),
            "arrays_core": lambda: core_regions(engine, arrays),
        },
    )
    return {name: per_region_us(t, n) for name, t in times.items()}


def batch_case(
    ep: Any, remote: Any, n: int, size: int, local: Callable[[], list[Any]]
) -> Callable[[], Timing]:
    """prepare_batch of N entries whose locals ``local()`` makes (outside the timing) and the
    batch's close."""

    def run() -> Timing:
        entries = [(x, remote, i * size) for i, x in enumerate(local())]
        start = time.perf_counter()
        prepared = ep.prepare_batch(entries)
        middle = time.perf_counter()
        prepared.close()
        return middle - start, time.perf_counter() - middle

    return run


def measure_batch(ep: Any, engine: Engine, remote: Any, n: int, size: int, rounds: int) -> dict:
    """The implicit registration of a batch of N views of one unregistered array: of a fresh
    array every round (one registration of its allocation, N look-ups), of the same array
    again (cached: N look-ups), against the same entries as (region, offset, nbytes) of a
    registration."""
    cache = engine._temps
    misses = cache.misses
    with ep.prepare_batch([(v, remote, i * size) for i, v in enumerate(views_of(n, size))]):
        registrations = cache.misses - misses
    again = views_of(n, size)
    registered = np.ones(n * size, np.uint8)
    region = engine.register(registered, "none")
    explicit = [(region, i * size, size) for i in range(n)]
    times = alternate(
        rounds,
        {
            "implicit_fresh": batch_case(ep, remote, n, size, lambda: views_of(n, size)),
            "implicit_cached": batch_case(ep, remote, n, size, lambda: again),
            "registered": batch_case(ep, remote, n, size, lambda: explicit),
        },
    )
    region.deregister()
    return {
        **{name: per_region_us(t, n) for name, t in times.items()},
        "registrations": registrations,
    }


@contextmanager
def engine_pair(transport: str, nbytes: int) -> Iterator[tuple[Engine, Any, Any]]:
    """(this side's engine, its endpoint, the peer's descriptor of ``nbytes``)."""
    setup = RdmaSetup.resolve() if transport == "rdma" else RdmaSetup()
    secret = secrets.token_hex(16)

    def make(device: str | None) -> Engine:
        if transport == "rdma":
            return Engine("rdma", rdma_devices=device, secret=secret)
        return Engine(transport, secret=secret)

    with make(setup.peer_device) as server, make(setup.device) as client:
        port = server.listen(setup.bind, 0)
        ep = client.connect(format_address(setup.bind, port), timeout=30)
        server.accept(timeout=30)
        target = server.register(np.zeros(nbytes, np.uint8), "rw")
        yield client, ep, target.descriptor()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--transport", default="tcp", choices=("tcp", "shm", "rdma"))
    parser.add_argument("--counts", default="1000,10000,100000")
    parser.add_argument("--region-bytes", type=int, default=4096)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()
    counts = [int(c) for c in args.counts.split(",")]
    size = args.region_bytes
    rows = []
    with engine_pair(args.transport, max(counts) * size) as (engine, ep, remote):
        for n in counts:
            row = {"regions": n, **measure_regions(engine, n, size, args.rounds)}
            row["batch"] = measure_batch(ep, engine, remote, n, size, args.rounds)
            row["load"] = os.getloadavg()[0]  # 1-minute load average, at the end of the row
            rows.append(row)
            print_row(row)
        flat_alternating = alternating_flat(engine, counts[0], counts[-1], size, args.rounds)
    first, last = rows[0], rows[-1]
    flat = {
        f"{case}_{way}": last[case][f"{way}_us"] / first[case][f"{way}_us"]
        for case in ("views", "arrays")
        for way in ("register", "deregister")
    }
    for case in ("implicit_fresh", "implicit_cached"):
        flat[f"batch_{case}"] = (
            last["batch"][case]["register_us"] / first["batch"][case]["register_us"]
        )
    print("flat (largest N over smallest N, per region):", _fmt(flat))
    print("flat, the two N alternating in one engine:", _fmt(flat_alternating))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "transport": args.transport,
                    "region_bytes": size,
                    "rounds": args.rounds,
                    "rows": rows,
                    "flat": flat,
                    "flat_alternating": flat_alternating,
                },
                f,
                indent=2,
            )


def alternating_flat(
    engine: Engine, small: int, large: int, size: int, rounds: int
) -> dict[str, float]:
    """``views`` register + deregister of ``large`` regions over ``small`` ones, per region,
    from rounds that alternate the two in one engine."""
    times = alternate(
        rounds,
        {
            "small": lambda: api_regions(engine, views_of(small, size)),
            "large": lambda: api_regions(engine, views_of(large, size)),
        },
    )
    per = {
        name: per_region_us(t, n)
        for (name, t), n in zip(times.items(), (small, large), strict=True)
    }
    return {
        f"views_{way}": per["large"][f"{way}_us"] / per["small"][f"{way}_us"]
        for way in ("register", "deregister")
    }


def _fmt(values: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.2f}" for k, v in values.items())


def print_row(row: dict) -> None:
    n = row["regions"]
    for case in ("views", "arrays"):
        api, core = row[case], row[f"{case}_core"]
        print(
            f"{n:>7} {case:>6}: register {api['register_us']:6.1f} us/region "
            f"(core {core['register_us']:5.1f}), deregister {api['deregister_us']:6.1f} "
            f"(core {core['deregister_us']:5.1f})"
        )
    batch = row["batch"]
    cells = ", ".join(
        f"{case} {batch[case]['register_us']:.2f}+{batch[case]['deregister_us']:.2f}"
        for case in ("implicit_fresh", "implicit_cached", "registered")
    )
    print(
        f"{n:>7}  batch: prepare+close us/entry: {cells}; registrations made by one batch: "
        f"{batch['registrations']}"
    )


if __name__ == "__main__":
    main()
