"""Two rails, one of them throttled, against the fast rail alone, in the rxe guest.

    tests/rxe/run-in-vm.sh --rails 2 -- python bench/rails_throttle_bench.py [--rounds 3]

The client has rxe0 (veth0) and rxe2 (veth2), the server rxe1 and rxe3. rxe2's link is
throttled with a token bucket on veth2's egress (``tc qdisc ... tbf``, queueing rather than
dropping) to 1/2, 1/5 and 1/20 of the rate one rail delivers alone, measured first in the same
run; "none" leaves it as it is. For each throttle, rounds alternate: striped WRITEs of
``--size`` bytes over both rails, then the same WRITEs over rxe0 alone (a one-rail engine pair).
Each round gives the GB/s of its timed WRITEs after ``--warmup`` untimed ones; the rails'
measured rates and shares come from ``Endpoint.info`` (``rail_<device>_rate``,
``rail_<device>_share_pct``). Writes ``bench/results/rails-throttled-rxe.json``.

It does this in two regimes. In the first, rxe0's link is left as it is, so the guest's two
vCPUs (which run every rail's soft-RoCE work) set its pace, not a link. In the second, rxe0's
link (veth0's egress) is capped too, at ``--link-fraction`` of what one rail delivers alone,
and rxe2's throttles (1/1 too) are fractions of that cap: the links set the pace, as they do
for NICs, whose rate is their link's and not the host CPU's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rdmaxfer import _core

RW = _core.ACCESS_LOCAL_WRITE | _core.ACCESS_REMOTE_WRITE
OUT = Path(__file__).resolve().parent / "results" / "rails-throttled-rxe.json"


def write_gbps(
    devices: tuple[list[str], list[str]], size: int, warmup: int, iters: int
) -> dict[str, Any]:
    host = os.environ["RDMAXFER_RXE_ADDRS"].split()[1]
    client = _core.Engine("rdma", rdma_devices=devices[0])
    server = _core.Engine("rdma", rdma_devices=devices[1])
    try:
        port = server.listen(host, 0)
        ep = client.connect(host, port, 0, 60.0)
        peer = server.accept(60.0)  # kept: a dropped endpoint closes
        src = client.alloc_pinned(size, 0)
        dst = server.alloc_pinned(size, RW)
        desc = dst.descriptor()
        for _ in range(warmup):
            ep.post_write(src, 0, desc, 0, size).wait(120.0)
        start = time.perf_counter()
        for _ in range(iters):
            ep.post_write(src, 0, desc, 0, size).wait(120.0)
        seconds = time.perf_counter() - start
        attrs = ep.attributes()
        rails = {
            k[5:-5]: {
                "rate_MB_per_s": round(int(v) / 1e6, 2),
                "share_pct": int(attrs[k[:-5] + "_share_pct"]),
            }
            for k, v in attrs.items()
            if k.startswith("rail_") and k.endswith("_rate")
        }
        peer.close()
        return {"GB_per_s": round(size * iters / seconds / 1e9, 5), "rails": rails}
    finally:
        client.close()
        server.close()


@contextmanager
def throttled(netdev: str, mbit: float | None) -> Iterator[None]:
    if mbit is None:
        yield
        return
    # A large limit: the bucket queues rather than drops (rxe retransmits on loss).
    subprocess.run(
        ["tc", "qdisc", "add", "dev", netdev, "root", "tbf", "rate", f"{mbit:.3f}mbit",
         "burst", "64kb", "limit", "32mb"],
        check=True, timeout=30,
    )  # fmt: skip
    try:
        yield
    finally:
        subprocess.run(["tc", "qdisc", "del", "dev", netdev, "root"], check=True, timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--size", type=int, default=16 << 20, help="bytes per WRITE")
    parser.add_argument("--iters", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument(
        "--link-fraction",
        type=float,
        default=0.25,
        help="rxe0's link cap in the second regime, as a fraction of one rail alone",
    )
    args = parser.parse_args()
    ours, theirs = (d.split(",") for d in os.environ["RDMAXFER_RXE_RAIL_DEVICES"].split())
    one = ([ours[0]], [theirs[0]])
    two = (ours, theirs)
    alone = write_gbps(one, args.size, args.warmup, args.iters)["GB_per_s"]
    mbit_alone = alone * 8e3
    print(f"one rail alone: {alone:.4f} GB/s ({mbit_alone:.0f} Mbit/s)", flush=True)
    rows = []
    for fast_mbit in (None, mbit_alone * args.link_fraction):
        top = mbit_alone if fast_mbit is None else fast_mbit
        with throttled("veth0", fast_mbit):
            # Capped links: "1/1" is rxe2 capped at rxe0's rate, the equal rails of this regime.
            for factor in (None, 2, 5, 20) if fast_mbit is None else (1, 2, 5, 20):
                mbit = None if factor is None else top / factor
                with throttled("veth2", mbit):
                    for r in range(args.rounds):
                        both = write_gbps(two, args.size, args.warmup, args.iters)
                        single = write_gbps(one, args.size, args.warmup, args.iters)
                        row = {
                            "fast_link_mbit": None if fast_mbit is None else round(fast_mbit, 1),
                            "throttle": "none" if factor is None else f"1/{factor}",
                            "throttle_mbit": None if mbit is None else round(mbit, 1),
                            "round": r,
                            "two_rails_GB_per_s": both["GB_per_s"],
                            "fast_rail_alone_GB_per_s": single["GB_per_s"],
                            "ratio": round(both["GB_per_s"] / single["GB_per_s"], 3),
                            "rails": both["rails"],
                        }
                        print(json.dumps(row), flush=True)
                        rows.append(row)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "size_bytes": args.size,
        "iters": args.iters,
        "warmup": args.warmup,
        "rounds": args.rounds,
        "one_rail_alone_GB_per_s": alone,
        "netdev_throttled": "veth2 (rxe2)",
        "link_fraction": args.link_fraction,
    }
    OUT.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
