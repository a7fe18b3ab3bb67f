"""The initiator of tests/test_batch_peer_death.py, run in a spawned process (no pytest here):
WRITE batches of scattered 4 KiB pages into a peer's region."""

from __future__ import annotations

from multiprocessing.connection import Connection

import numpy as np

from _peers import host_transport, make_array
from rdmaxfer import Engine

PAGE = 4096


def write_forever(conn: Connection, address: str, descriptor: bytes, pages: int) -> None:
    """Connects, then posts WRITE batches of `pages` scattered pages, one after another, until
    killed; says WRITING once the first completed (so later ones have groups in flight)."""
    data = make_array(1, pages * PAGE)
    slots = np.random.default_rng(2).permutation(pages)
    with Engine(host_transport()) as engine, engine.connect(address, timeout=30) as ep:
        local = engine.register(data)
        entries = [
            ((local, i * PAGE, PAGE), descriptor, int(s) * PAGE) for i, s in enumerate(slots)
        ]
        ep.write_batch(entries, timeout=60).check()
        conn.send("WRITING")
        while True:
            ep.post_write_batch(entries)
            ep.write_batch(entries, timeout=60).check()


def write_once(
    conn: Connection, address: str, descriptor: bytes, seed: int, slots: list[int]
) -> None:
    """Connects and WRITEs page i of make_array(seed) into slot slots[i]; says DONE."""
    data = make_array(seed, len(slots) * PAGE)
    with Engine(host_transport()) as engine, engine.connect(address, timeout=30) as ep:
        entries = [
            (data[i * PAGE : (i + 1) * PAGE], descriptor, s * PAGE) for i, s in enumerate(slots)
        ]
        ep.write_batch(entries, timeout=60).check()
        conn.send("DONE")
