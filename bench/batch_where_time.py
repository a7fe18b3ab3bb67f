#!/usr/bin/env python3
"""Where a verbs batch of scattered 4 KiB WRITEs spends its time (run in the rxe guest).

For batches of 500, 2,000 and 8,000 entries (prepared ``write_batch``, window 256, as in
``bench/batch_vs_perftest.py``) and for each client poll mode given (``event``, ``busy``; the
peer stays in event mode), prints one JSON line per timed batch: wall time, how long
``post()`` took, Gb/s (1e9 bit/s), the client process's user and system CPU time and its
voluntary / involuntary context switches over the batch (``getrusage(RUSAGE_SELF)``: the
caller and the completion thread together)::

    tests/rxe/run-in-vm.sh -- .venv/bin/python bench/batch_where_time.py event busy

Wall time growing in proportion to the entries (no fixed cost per batch) with no user CPU
time says the batch runs at the pace of rxe's kernel work, not of rdmaxfer's own.
"""

from __future__ import annotations

import json
import resource
import secrets
import sys
import time

import numpy as np

from rdmaxfer import Engine
from rdmaxfer._config import format_address
from rdmaxfer.tools.bench import RdmaSetup, peer_process

SIZE = 4096
ENTRIES = (500, 2000, 8000)
ITERS = 3


def _usage() -> np.ndarray:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return np.array([time.perf_counter(), r.ru_utime, r.ru_stime, r.ru_nvcsw, r.ru_nivcsw])


def main() -> int:
    modes = sys.argv[1:] or ["event", "busy"]
    setup = RdmaSetup.resolve()
    remote = 2 * max(ENTRIES) * SIZE
    secret = secrets.token_hex(8)
    with peer_process("rdma", remote, 0, setup, secret) as (_, port, descriptor):
        rng = np.random.default_rng(0)
        local = rng.integers(0, 256, remote, dtype=np.uint8)
        for mode in modes:
            with Engine("rdma", rdma_devices=setup.device, secret=secret, poll_mode=mode) as eng:
                region = eng.register(local, access="none")
                with eng.connect(format_address(setup.bind, port), timeout=30) as ep:
                    for n in ENTRIES:
                        here = rng.permutation(2 * n)[:n]
                        there = rng.permutation(2 * n)[:n]
                        entries = [
                            ((region, int(a) * SIZE, SIZE), descriptor, int(b) * SIZE)
                            for a, b in zip(here, there, strict=True)
                        ]
                        with ep.prepare_batch(entries) as prepared:
                            prepared.post().wait(120)  # warm-up
                            for _ in range(ITERS):
                                before = _usage()
                                transfer = prepared.post()
                                posted = _usage()
                                transfer.wait(120).check()
                                d = _usage() - before
                                rec = {
                                    "mode": mode,
                                    "entries": n,
                                    "wall_ms": round(d[0] * 1e3, 3),
                                    "post_ms": round((posted - before)[0] * 1e3, 3),
                                    "gbps": round(n * SIZE * 8 / d[0] / 1e9, 4),
                                    "user_ms": round(d[1] * 1e3, 3),
                                    "sys_ms": round(d[2] * 1e3, 3),
                                    "voluntary_switches": int(d[3]),
                                    "involuntary_switches": int(d[4]),
                                }
                                print(json.dumps(rec), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
