"""An initiator killed (SIGKILL) while its WRITE batches have several gathered groups in flight
leaves the target usable, on every host transport: the target's endpoint closes, its
registration is released in full (nothing still held by a group being copied), and the next
initiator's batch lands byte for byte."""

from __future__ import annotations

import time

import numpy as np
import pytest

from _batch_writer import PAGE, write_forever, write_once
from _common import WITH_AUTO
from _peers import Peer, make_array
from rdmaxfer import Engine

#: 256 MiB of 4 KiB pages: 32 gathered groups a batch on shm, many frames on TCP.
PAGES = 65_536
#: Seconds the target may take to see the initiator gone (generous: a loaded machine).
CLOSE_S = 30.0


@pytest.mark.parametrize("transport", WITH_AUTO, indirect=True)
def test_an_initiator_killed_mid_batch_leaves_the_target_usable(transport: str) -> None:
    target = np.zeros(PAGES * PAGE, np.uint8)
    with Engine(transport) as engine:
        port = engine.listen("127.0.0.1", 0)
        address = f"127.0.0.1:{port}"
        region = engine.register(target, access="rw")
        descriptor = region.descriptor().pack()
        writer = Peer(write_forever, address, descriptor, PAGES)
        try:
            ep = engine.accept(timeout=60)
            assert writer.get(timeout=120) == "WRITING"
            writer.kill()
        finally:
            writer.close()
        end = time.monotonic() + CLOSE_S
        while not ep.closed:
            assert time.monotonic() < end, f"the endpoint did not close within {CLOSE_S} s"
            time.sleep(0.01)

        slots = [int(s) for s in np.random.default_rng(3).permutation(PAGES)[:1000]]
        target[:] = 0
        second = Peer(write_once, address, descriptor, 4, slots)
        try:
            engine.accept(timeout=60)
            assert second.get(timeout=120) == "DONE"
        finally:
            second.close()
        want = make_array(4, len(slots) * PAGE).reshape(-1, PAGE)
        pages = target.reshape(-1, PAGE)
        assert np.array_equal(pages[slots], want)
        untouched = np.ones(PAGES, bool)
        untouched[slots] = False
        assert not pages[untouched].any()

        region.close()
        assert engine.registered_count() == 0
