"""Rails that heal (``tests/rxe/run-in-vm.sh --rails 2``): a rail whose port went down and came
back rejoins the same endpoints on both sides with no user call (its QPs reset, brought up
again over the control lane and probed, ``csrc/transport/rdma/rdma_healing.cc``), and a rail
that flaps fails no transfer, and a device deleted and added back (``rdma link delete`` /
``add``) is opened again by the running engine and rejoins with new QPs. ``ip link set veth2
down`` takes rxe2 and rxe3 (the two ends of the veth pair) down together."""

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
    deleted_within_bound,
    deleting,
    port_active,
    rail_bytes,
    rail_pair,
    random_bytes,
    region_array,
    send_and_notify,
    set_link,
    wait_for,
    wait_ok,
)

pytestmark = [pytest.mark.rdma, TWO_RAILS]

SIZE = 8 * MIB + 4096 + 5


def _up(ep: _core.Endpoint, device: str) -> int:
    return int(ep.attributes()[f"rail_{device}_up"])


def _write_exact(
    rng: np.random.Generator,
    a: _core.Endpoint,
    src: _core.Region,
    dst: _core.Region,
    descriptor: _core.Descriptor | None = None,
) -> dict[str, int]:
    """A striped WRITE of fresh random bytes into `dst` (through `descriptor`, else a new one of
    it), checked; the bytes each rail of `a` carried."""
    data = random_bytes(rng, SIZE)
    region_array(src)[:] = data
    before = rail_bytes(a)
    wait_ok(a.post_write(src, 0, descriptor or dst.descriptor(), 0, SIZE))
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
            set_link("veth2", "down")
            wait_for("rxe2 failed over", lambda: _up(a, "rxe2") == 0 and _up(b, "rxe3") == 0)
            moved = _write_exact(rng, a, src, dst)
            assert moved["rxe2"] == 0 and moved["rxe0"] >= SIZE, moved
        finally:
            set_link("veth2", "up")
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


FLAP_S = 30.0
FLAP_EVERY_S = 2.0


def test_flapping_rail_fails_no_transfer(rng: np.random.Generator) -> None:
    """rxe2's port down and up every 2 s for 30 s while WRITEs and READs run back to back:
    every one completes byte-exact; then the rail rejoins for good."""
    stop = threading.Event()
    errors: list[BaseException] = []

    def flap() -> None:
        try:
            end = time.monotonic() + FLAP_S
            down = False
            while time.monotonic() < end and not stop.wait(FLAP_EVERY_S):
                down = not down
                set_link("veth2", "down" if down else "up")
        except BaseException as e:  # handed to the test thread
            errors.append(e)
        finally:
            set_link("veth2", "up")

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

        # The last flap can fail the rail again just after it showed as up, and a flapping
        # rail backs off longer each time (up to 60 s): WRITE (each checked byte-exact) until
        # one stripes over the rail again.
        def striped() -> bool:
            moved = _write_exact(rng, a, src, dst)
            return moved["rxe2"] > 0 and moved["rxe0"] > 0

        wait_for("a WRITE striped over rxe2 after the flapping", striped, timeout=3 * WAIT_S)
        assert _up(a, "rxe2") == 1 and _up(b, "rxe3") == 1


def test_device_deleted_and_added_back_rejoins(rng: np.random.Generator) -> None:
    """The client's rxe2 deleted (the engine lets go of it, the deletion completes) and added
    back: the running engine opens it again, registers its memory there again (new rkeys), and
    the same endpoint rejoins over it on both sides with new QPs. The client's WRITEs stripe over
    it again; the server, writing into the client's memory, leaves the rail out for a descriptor
    taken before the device came back (its rkey there named the old device's MR) and stripes
    over it for a new one: every transfer byte-exact."""
    with rail_pair() as (client, server, a, b):
        src, dst = client.alloc_pinned(SIZE, 0), server.alloc_pinned(SIZE, RW)
        theirs, mine = server.alloc_pinned(SIZE, 0), client.alloc_pinned(SIZE, RW)
        old = mine.descriptor()
        assert old.generation == 0 and len(old.rail_keys) == 1
        with deleting("rxe2", "veth2") as delete:
            deleted_within_bound(delete, a)
            wait_for("rxe3 failed over", lambda: _up(b, "rxe3") == 0)
            assert a.attributes()["rail_rxe2_removed"] == 1
        # deleting() added rxe2 back and waited for its port and IPv4 GID.
        wait_for("rxe2 to rejoin", lambda: _up(a, "rxe2") == 1 and _up(b, "rxe3") == 1)
        attrs = a.attributes()
        assert attrs["rail_rxe2_removed"] == 0 and attrs["rail_rxe2_rejoins"] == 1, a.describe()
        assert "rxe2 up (rejoined 1x, last failure: device rxe2 was removed" in a.describe()
        assert "removed" not in client.describe(), client.describe()
        moved = _write_exact(rng, a, src, dst)
        assert moved["rxe2"] > 0 and moved["rxe0"] > 0, moved
        new = mine.descriptor()
        assert new.generation == 1 and new.rail_keys != old.rail_keys, (new, old)
        for descriptor, over_rxe3 in ((old, False), (new, True)):
            moved = _write_exact(rng, b, theirs, mine, descriptor)
            assert (moved["rxe3"] > 0) == over_rxe3, (descriptor.generation, moved)
            assert moved["rxe1"] > 0
        assert not a.closed and not b.closed


def test_acceptors_control_device_added_back_rejoins(rng: np.random.Generator) -> None:
    """The server's rxe1 (its rail 0, the control rail's device on its side) deleted and added
    back: the server, which accepted, tells the client (RAIL_BACK) and the client asks for the
    rejoin at once. A descriptor of the server's memory taken before the return has a stale key
    on its rail 0 (the descriptor's own key field): the client leaves rxe0 out for it and
    stripes over both rails for a new one. Messages and notifications go on both ways."""
    with rail_pair() as (client, server, a, b):
        src, theirs = client.alloc_pinned(SIZE, 0), server.alloc_pinned(SIZE, RW)
        old = theirs.descriptor()
        with deleting("rxe1", "veth1") as delete:
            deleted_within_bound(delete, b)
            wait_for("rxe0 failed over", lambda: _up(a, "rxe0") == 0)
        wait_for("rxe1 to rejoin", lambda: _up(a, "rxe0") == 1 and _up(b, "rxe1") == 1)
        assert b.attributes()["rail_rxe1_rejoins"] == 1, b.describe()
        assert "its device came back 1x" in server.describe(), server.describe()
        new = theirs.descriptor()
        assert new.generation == 1 and new.key != old.key, (new.key, old.key)
        for descriptor, over_rxe0 in ((old, False), (new, True)):
            moved = _write_exact(rng, a, src, theirs, descriptor)
            assert (moved["rxe0"] > 0) == over_rxe0, (descriptor.generation, moved)
            assert moved["rxe2"] > 0
        send_and_notify(rng, (client, a), (server, b))
        send_and_notify(rng, (server, b), (client, a))
        assert not a.closed and not b.closed
