#!/usr/bin/env python3
"""The ofi transport striped over two rails against one, beside rdmaxfer's verbs transport on
the same rails, on the soft-RoCE devices of the test VM, in one run:

    tests/rxe/run-in-vm.sh --rails 2 -- .venv/bin/python bench/ofi_rails_bench.py

Each round, in turn: ofi (verbs;ofi_rxm) on one rail and on two, then rdma on one and on two
(the client's engine on rxe0[,rxe2], the server's on rxe1[,rxe3]). Bandwidth: ``--iters``
WRITEs of each size with ``--depth`` in flight, timed in C++ (``Endpoint.timed_loop``, as in
bench/ofi_guest_bench.py) from the first post to the last completion; transfers of 512 KiB
and more are striped. Medians over the rounds; the 1-minute load average of each round is
recorded. Under TCG emulation both rails share the guest's two vCPUs: read the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path
from typing import Any

from ofi_guest_bench import RESULTS, measure

RUNS = (("ofi", 1), ("ofi", 2), ("rdma", 1), ("rdma", 2))


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--sizes", default="1048576,16777216")
    parser.add_argument("--iters", type=int, default=40)
    parser.add_argument("--depth", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", default=str(RESULTS / "ofi-rails-rxe.json"))
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    runs: dict[str, list[dict[int, float]]] = {f"{t}-{n}": [] for t, n in RUNS}
    loads = []
    for r in range(args.rounds):
        loads.append(os.getloadavg()[0])
        for transport, rails in RUNS:
            got = measure(transport, sizes, args.iters, args.depth, 1, rails)
            runs[f"{transport}-{rails}"].append(got["Gbit_per_s"])
        print(f"round {r + 1}: {json.dumps({k: v[-1] for k, v in runs.items()})}", flush=True)
    rows: list[dict[str, Any]] = []
    for size in sizes:
        row: dict[str, Any] = {"bytes": size}
        for key, values in runs.items():
            row[f"{key.replace('-', '_')}_rails_Gbit_per_s"] = statistics.median(
                v[size] for v in values
            )
        row["ofi_two_vs_one"] = row["ofi_2_rails_Gbit_per_s"] / row["ofi_1_rails_Gbit_per_s"]
        row["rdma_two_vs_one"] = row["rdma_2_rails_Gbit_per_s"] / row["rdma_1_rails_Gbit_per_s"]
        rows.append(row)
        print(row)
    result = {
        "what": "ofi (verbs;ofi_rxm) on two rails vs one, beside rdma, on rxe (TCG)",
        "rounds": args.rounds, "iters": args.iters, "depth": args.depth,
        "sizes": rows, "loadavg_1min": loads, "runs": runs,
    }  # fmt: skip
    if args.json:
        Path(args.json).parent.mkdir(exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
