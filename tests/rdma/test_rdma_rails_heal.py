"""Rails that heal (``tests/rxe/run-in-vm.sh --rails 2``): a rail whose port went down and came
back rejoins the same endpoints on both sides with no user call (its QPs reset, brought up
again over the control lane and probed, ``csrc/transport/rdma/rdma_healing.cc``), and a rail
that flaps fails no transfer. ``ip link set veth2 down`` takes rxe2 and rxe3 (the two ends of
the veth pair) down together."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from rdmaxfer import _core

from .rdma_helpers import (
    MIB,
    RW,
    TWO_RAILS,
    WAIT_S,
    port_active,
    rail_bytes,
    rail_pair,
    random_bytes,
    region_array,
    run_cmd,
    wait_for,
    wait_ok,
)

pytestmark = [pytest.mark.rdma, TWO_RAILS]

SIZE = 8 * MIB + 4096 + 5


def _up(ep: _core.Endpoint, device: str) -> int:
    return int(ep.attributes()[f"rail_{device}_up"])


def _write_exact(
    rng: np.random.Generator, a: _core.Endpoint, src: _core.Region, dst: _core.Region
) -> dict[str, int]:
    """A striped WRITE of fresh random bytes, checked; the bytes each rail of `a` carried."""
    data = random_bytes(rng, SIZE)
    region_array(src)[:] = data
    before = rail_bytes(a)
    wait_ok(a.post_write(src, 0, dst.descriptor(), 0, SIZE))
    assert np.array_equal(region_array(dst), data)
    after = rail_bytes(a)
    return {rail: after[rail] - before[rail] for rail in after}


def test_rail_rejoins_the_same_endpoint_after_its_port_comes_back(
    rng: np.random.Generator,
) -> None:
    with rail_pair() as (client, server, a, b):
        src, dst = client.alloc_pinned(SIZE, 0), server.alloc_pinned(SIZE, RW)
        back_src, back_dst = server.alloc_pinned(SIZE, 0), client.alloc_pinned(SIZE, RW)
        try:
            run_cmd("ip", "link", "set", "veth2", "down")
            wait_for("rxe2 failed over", lambda: _up(a, "rxe2") == 0 and _up(b, "rxe3") == 0)
            moved = _write_exact(rng, a, src, dst)
            assert moved["rxe2"] == 0 and moved["rxe0"] >= SIZE, moved
        finally:
            run_cmd("ip", "link", "set", "veth2", "up")
        wait_for("rxe2 ACTIVE again", lambda: port_active("rxe2") and port_active("rxe3"))
        active = time.monotonic()
        wait_for("rxe2 to rejoin", lambda: _up(a, "rxe2") == 1 and _up(b, "rxe3") == 1)
        rejoined_s = time.monotonic() - active
        assert a.attributes()["rail_rxe2_rejoins"] == 1, a.describe()
        assert b.attributes()["rail_rxe3_rejoins"] == 1, b.describe()
        assert "rxe2 up (rejoined 1x, last failure: " in a.describe(), a.describe()
        # Both directions stripe over the rejoined rail again, byte-exact.
        moved = _write_exact(rng, a, src, dst)
        assert moved["rxe2"] > 0 and moved["rxe0"] > 0, (moved, rejoined_s)
        moved = _write_exact(rng, b, back_src, back_dst)
        assert moved["rxe3"] > 0 and moved["rxe1"] > 0, moved
        assert not a.closed and not b.closed


FLAP_S = 12.0
FLAP_EVERY_S = 2.0


def test_flapping_rail_fails_no_transfer(rng: np.random.Generator) -> None:
    """rxe2's port down and up every 2 s for 12 s while WRITEs and READs run back to back:
    every one completes byte-exact; then the rail rejoins for good."""
    stop = threading.Event()
    errors: list[BaseException] = []

    def flap() -> None:
        try:
            end = time.monotonic() + FLAP_S
            down = False
            while time.monotonic() < end and not stop.wait(FLAP_EVERY_S):
                down = not down
                run_cmd("ip", "link", "set", "veth2", "down" if down else "up")
        except BaseException as e:  # handed to the test thread
            errors.append(e)
        finally:
            run_cmd("ip", "link", "set", "veth2", "up")

    with rail_pair() as (client, server, a, b):
        src, dst = client.alloc_pinned(SIZE, 0), server.alloc_pinned(SIZE, RW)
        back = client.alloc_pinned(SIZE, _core.ACCESS_LOCAL_WRITE)
        flapper = threading.Thread(target=flap)
        flapper.start()
        transfers = 0
        try:
            while flapper.is_alive():
                _write_exact(rng, a, src, dst)
                region_array(back)[:] = 0
                wait_ok(a.post_read(back, 0, dst.descriptor(), 0, SIZE))
                assert np.array_equal(region_array(back), region_array(dst))
                transfers += 2
        finally:
            stop.set()
            flapper.join(WAIT_S)
        assert not errors, errors
        assert transfers >= 4 and not a.closed and not b.closed
        wait_for("rxe2 ACTIVE again", lambda: port_active("rxe2") and port_active("rxe3"))
        # A flapping rail backs off longer each time (up to 60 s): allow for it.
        wait_for(
            "rxe2 to rejoin after the flapping",
            lambda: _up(a, "rxe2") == 1 and _up(b, "rxe3") == 1,
            timeout=3 * WAIT_S,
        )
        moved = _write_exact(rng, a, src, dst)
        assert moved["rxe2"] > 0 and moved["rxe0"] > 0, moved
