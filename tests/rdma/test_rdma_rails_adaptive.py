"""Adaptive striping (``tests/rxe/run-in-vm.sh --rails 2``): each rail's share of a striped
transfer follows the rate it delivers now, measured from the connection's completions
(``csrc/transport/rail_meter.h``), not its port's nominal speed. rxe2's link (veth2) is
throttled with a token bucket on its egress (``tc qdisc ... tbf``), which its port speed does
not show."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest

from rdmaxfer import _core

from .rdma_helpers import (
    MIB,
    RW,
    TWO_RAILS,
    rail_bytes,
    rail_pair,
    random_bytes,
    region_array,
    wait_ok,
)

pytestmark = [pytest.mark.rdma, TWO_RAILS]

# 16 Mbit/s is 2 MB/s: between 1/8 and 1/15 of what one rxe rail delivers in the guest.
THROTTLE_MBIT = 16
SIZE = 8 * MIB + 4096 * 3 + 17
# How long a rail left out of striping may wait for its next measurement (rail_meter.h:
# kProbeS, 5 s), with room for a loaded machine.
RECOVER_S = 60.0


def _tc(*args: str) -> None:
    subprocess.run(["tc", "qdisc", *args], check=True, timeout=60, capture_output=True)


@contextmanager
def throttled(netdev: str, mbit: float) -> Iterator[None]:
    """``netdev``'s egress limited to ``mbit`` Mbit/s; the bucket queues rather than drops."""
    _tc(
        "add", "dev", netdev, "root", "tbf", "rate", f"{mbit}mbit", "burst", "64kb", "limit", "32mb"
    )
    try:
        yield
    finally:
        _tc("del", "dev", netdev, "root")


def _write_exact(
    a: _core.Endpoint, src: _core.Region, dst: _core.Region, data: np.ndarray
) -> dict[str, int]:
    """One striped WRITE of ``data``, checked byte for byte; the bytes each rail carried."""
    before = rail_bytes(a)
    region_array(dst)[:] = 0
    wait_ok(a.post_write(src, 0, dst.descriptor(), 0, data.size))
    assert np.array_equal(region_array(dst), data)
    after = rail_bytes(a)
    moved = {rail: after[rail] - before[rail] for rail in after}
    assert sum(moved.values()) == data.size, moved
    return moved


def _rails_info(a: _core.Endpoint) -> dict[str, int]:
    """The endpoint's ``rail_*`` attributes (all numbers)."""
    return {k: int(v) for k, v in a.attributes().items() if k.startswith("rail_")}


def test_share_follows_a_throttled_rail_and_comes_back(rng: np.random.Generator) -> None:
    with rail_pair() as (client, server, a, _):
        src = client.alloc_pinned(SIZE, 0)
        dst = server.alloc_pinned(SIZE, RW)
        data = random_bytes(rng, SIZE)
        region_array(src)[:] = data
        with throttled("veth2", THROTTLE_MBIT):
            # The first WRITE splits by the equal port speeds and measures both rails.
            first = _write_exact(a, src, dst, data)
            assert first["rxe0"] > 0 and first["rxe2"] > 0, first
            for _ in range(2):
                moved = _write_exact(a, src, dst, data)
            info = _rails_info(a)
            assert 0 < info["rail_rxe2_rate"] * 3 < info["rail_rxe0_rate"], info
            # About 2 MB/s against 16 or more: a share of a few percent, or none (under 5 %).
            assert moved["rxe2"] < SIZE // 4 and info["rail_rxe2_share_pct"] < 25, (moved, info)
            assert info["rail_rxe0_share_pct"] > 75, info
            assert "MB/s" in a.describe() and "% of the last striped transfer" in a.describe()
        # The throttle lifted: rxe2 is measured again (at once, or after kProbeS when it was
        # left out) and wins its share back.
        deadline = time.monotonic() + RECOVER_S
        while True:
            moved = _write_exact(a, src, dst, data)
            info = _rails_info(a)
            if info["rail_rxe2_share_pct"] >= 35 and moved["rxe2"] >= SIZE * 0.35:
                break
            assert time.monotonic() < deadline, f"rxe2 did not win its share back: {info}"
        # Measured at full speed again: within 4x of rxe0 (the guest's rates drift 2x from one
        # transfer to the next), not at the throttle's 1/16 or less.
        assert info["rail_rxe2_rate"] * 4 > info["rail_rxe0_rate"], info


def test_small_transfers_leave_a_slow_home_rail(rng: np.random.Generator) -> None:
    """A transfer below the striping threshold goes on its region's home rail, unless that rail
    delivers less than half what the fastest does: then on the rail that drains first."""
    size = 256 * 1024
    with rail_pair() as (client, server, a, _):
        big = client.alloc_pinned(SIZE, 0)
        big_dst = server.alloc_pinned(SIZE, RW)
        src = client.alloc_pinned(size, 0)
        dst = server.alloc_pinned(size, RW)
        data = random_bytes(rng, size)
        region_array(src)[:] = data
        src.home_rail = 1  # rxe2
        wait_ok(a.post_write(src, 0, dst.descriptor(), 0, size))
        assert rail_bytes(a) == {"rxe0": 0, "rxe2": size}
        with throttled("veth2", THROTTLE_MBIT):
            wait_ok(a.post_write(big, 0, big_dst.descriptor(), 0, SIZE))  # measures both
            before = rail_bytes(a)
            region_array(dst)[:] = 0
            wait_ok(a.post_write(src, 0, dst.descriptor(), 0, size))
            assert np.array_equal(region_array(dst), data)
            after = rail_bytes(a)
            assert after["rxe0"] - before["rxe0"] == size, (before, after, a.attributes())
            assert after["rxe2"] == before["rxe2"]
