"""The ofi transport on two rails per engine over libfabric's verbs;ofi_rxm provider in the
test VM started with ``run-in-vm.sh --rails 2``: the client's engine on rxe0 and rxe2, the
server's on rxe1 and rxe3 (rail i of one with rail i of the other). A large WRITE and READ
stripe over both rails bit-exact; a rail failing mid-WRITE (the fault hook
RDMAXFER_OFI_TEST_RAIL_ERR), or whose link goes down mid-WRITE (``ip link set veth2 down``:
rxe fails the rail's QP), moves its parts to the other rail and the transfer completes
bit-exact, the peer told; a rail throttled with tc gets a share of striped WRITEs that
follows its rate, and wins it back once the throttle is lifted; the main job (the MiniLM file
served and pulled) runs bit-exact over the two rails.

Run by tests/rdma/test_rdma_ofi.py in a pytest process of its own (see there why)."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest

from rdmaxfer import Endpoint, Engine, _core, pull_weights, serve_weights

from .rdma_helpers import WAIT_S, addrs, rails, random_bytes, set_link, wait_for
from .test_rdma_rails_adaptive import RECOVER_S, THROTTLE_MBIT, throttled
from .test_rdma_weights import digests, model_file, pulled_bit_exact

pytestmark = pytest.mark.rdma

PROVIDER = "verbs;ofi_rxm"
SECRET = "rxe-ofi-rails"
BIG = 8 << 20  # striped: each rail carries a share


def ofi_engine(monkeypatch: pytest.MonkeyPatch, side: int) -> Engine:
    """An ofi engine on verbs;ofi_rxm over side `side`'s two rails (0: rxe0,rxe2; 1: rxe1,rxe3);
    skips in a VM of one rail or where libfabric cannot open them."""
    names = rails(side)
    if len(names) < 2:
        pytest.skip(f"one rail per side here ({names}): run-in-vm.sh --rails 2 gives two")
    monkeypatch.setenv("RDMAXFER_OFI_PROVIDER", PROVIDER)
    monkeypatch.setenv("RDMAXFER_OFI_IFACE", ",".join(names))
    why = _core.available_transports().get("ofi", "unknown transport")
    if why:
        pytest.skip(f"libfabric's {PROVIDER} provider is unavailable on {names}: {why}")
    return Engine("ofi", secret=SECRET)


@contextmanager
def connected(
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[tuple[Endpoint, Endpoint, Engine, Engine]]:
    """(the client's endpoint, the server's, the client's engine, the server's), connected."""
    with ofi_engine(monkeypatch, 1) as server, ofi_engine(monkeypatch, 0) as client:
        port = server.listen(addrs()[1], 0)
        ep = client.connect(addrs()[1], port, timeout=WAIT_S)
        yield ep, server.accept(timeout=WAIT_S), client, server


@pytest.fixture()
def pair(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Endpoint, Endpoint, Engine]]:
    """(the client's endpoint, the server's, the server's engine)."""
    with connected(monkeypatch) as (ep, peer, _, server):
        yield ep, peer, server


def digest(data: np.ndarray) -> str:
    return hashlib.sha256(data.tobytes()).hexdigest()


def carried(ep: Endpoint, side: int) -> list[int]:
    return [int(ep.info[f"rail_{name}_bytes"]) for name in rails(side)]


def test_write_and_read_stripe_over_two_rails_bit_exact(
    pair: tuple[Endpoint, Endpoint, Engine], rng: np.random.Generator
) -> None:
    ep, peer, server = pair
    assert ep.info["domains"] == ",".join(rails(0))
    assert peer.info["domains"] == ",".join(rails(1))
    dst = np.zeros(BIG, np.uint8)
    desc = server.register(dst, "rw").descriptor()
    src = random_bytes(rng, BIG)
    ep.write(src, desc, timeout=WAIT_S)
    assert digest(dst) == digest(src)
    assert min(carried(ep, 0)) >= BIG // 4, carried(ep, 0)
    back = np.zeros(BIG // 4, np.uint8)  # READs under TCG move a tenth of WRITEs' rate
    ep.read(back, desc, timeout=WAIT_S * 3)
    assert digest(back) == digest(src[: BIG // 4])
    assert sum(carried(ep, 0)) == BIG + BIG // 4


def test_a_rail_failing_mid_write_moves_its_parts_to_the_other(
    monkeypatch: pytest.MonkeyPatch, rng: np.random.Generator
) -> None:
    monkeypatch.setenv("RDMAXFER_OFI_TEST_RAIL_ERR", f"{rails(0)[1]}:{1 << 20}")
    monkeypatch.setenv("RDMAXFER_OFI_TEST_REJOIN_S", "3600")  # the rail stays failed here
    with connected(monkeypatch) as (ep, peer, client, server):
        dst = np.zeros(BIG, np.uint8)
        desc = server.register(dst, "rw").descriptor()
        src = random_bytes(rng, BIG)
        ep.write(src, desc, timeout=WAIT_S)
        assert digest(dst) == digest(src)
        assert ep.info[f"rail_{rails(0)[1]}_up"] == 0 and ep.info[f"rail_{rails(0)[0]}_up"] == 1
        assert "RDMAXFER_OFI_TEST_RAIL_ERR" in ep.describe()
        # The peer was told: its own WRITEs leave the rail too.
        mine = np.zeros(BIG, np.uint8)
        theirs = client.register(mine, "rw").descriptor()
        wait_for("the peer told", lambda: peer.info[f"rail_{rails(1)[1]}_up"] == 0)
        peer.write(src, theirs, timeout=WAIT_S)
        assert digest(mine) == digest(src)
        assert peer.info[f"rail_{rails(1)[1]}_up"] == 0
        assert peer.info[f"rail_{rails(1)[1]}_bytes"] == 0


def test_a_rail_whose_link_goes_down_mid_write_fails_over_and_rejoins(
    monkeypatch: pytest.MonkeyPatch, rng: np.random.Generator
) -> None:
    """rxe fails the rail's QP (ofi_rxm's connection to the peer stays in error; set_link makes
    the route to the peer a blackhole while the link is down, so no packet of the rail arrives);
    once the link is up, the rail rejoins the endpoint on both sides (new AV entries, so a new
    connection, and each side's probe word read over it) and striped WRITEs both ways use it
    again."""
    mine, theirs = f"rail_{rails(0)[1]}", f"rail_{rails(1)[1]}"
    with connected(monkeypatch) as (ep, peer, client, server):
        nbytes = 64 << 20  # several seconds under TCG: the link goes down while it is in flight
        dst = np.zeros(nbytes, np.uint8)
        desc = server.register(dst, "rw").descriptor()
        netdev = "veth2"  # rxe2's (guest.sh), the client's second rail
        src = random_bytes(rng, nbytes)
        transfer = ep.post_write(src, desc)

        def failed_or_write_again() -> bool:
            # A WRITE that ended before the link went down (a quick guest) is followed by
            # another, which goes out with the link down and meets the failing rail.
            nonlocal transfer
            if ep.info[f"{mine}_up"] == 0:
                return True
            if transfer.done():
                transfer.wait(0)
                transfer = ep.post_write(src, desc)
            return False

        try:
            set_link(netdev, "down")
            wait_for("the rail to fail with its link down", failed_or_write_again, WAIT_S * 2)
        finally:
            set_link(netdev, "up")
        transfer.wait(WAIT_S * 5)
        assert digest(dst) == digest(src)
        assert ep.info[f"{mine}_up"] == 0 or ep.info[f"{mine}_rejoins"] >= 1, (
            "the rail never failed: " + ep.describe()
        )
        # The peer is told, and the rail comes back (it may have while the WRITE still ran on
        # the other): the first attempt 1 s after the failure, the next ones 2, 4, 8 s... later
        # while the link is still down.
        wait_for(
            "the rail to rejoin on both sides",
            lambda: ep.info[f"{mine}_rejoins"] >= 1 and peer.info[f"{theirs}_rejoins"] >= 1,
            timeout=WAIT_S * 4,
        )
        assert ep.info[f"{mine}_up"] == peer.info[f"{theirs}_up"] == 1
        assert f"{rails(0)[1]} up (rejoined 1x, last failure: WRITE with " in ep.describe()
        assert f"{rails(1)[1]} up (rejoined 1x, last failure: the peer's end failed" in (
            peer.describe()
        )
        for sender, receiver, side in ((ep, server, 0), (peer, client, 1)):
            size = BIG
            into = np.zeros(size, np.uint8)
            desc2 = receiver.register(into, "rw").descriptor()
            data = random_bytes(rng, size)
            before = carried(sender, side)
            sender.write(data, desc2, timeout=WAIT_S * 3)
            assert digest(into) == digest(data)
            moved = [b - a for a, b in zip(before, carried(sender, side), strict=True)]
            assert sum(moved) == size and min(moved) > 0, (moved, sender.describe())


def test_shares_follow_a_throttled_rail_and_come_back(
    pair: tuple[Endpoint, Endpoint, Engine], rng: np.random.Generator
) -> None:
    """Adaptive striping, as on verbs (transport/rail_meter.h): with rxe2's link throttled
    (a token bucket on veth2's egress, which no port speed shows), its share of a striped WRITE
    falls to a few percent or none; with the throttle lifted it wins its share back."""
    ep, _, server = pair
    fast, slow = rails(0)
    size = BIG + 4096 * 3 + 17
    dst = np.zeros(size, np.uint8)
    desc = server.register(dst, "rw").descriptor()
    src = random_bytes(rng, size)

    def write_exact() -> list[int]:
        before = carried(ep, 0)
        dst[:] = 0
        ep.write(src, desc, timeout=WAIT_S * 3)
        assert digest(dst) == digest(src)
        moved = [after - was for was, after in zip(before, carried(ep, 0), strict=True)]
        assert sum(moved) == size, moved
        return moved

    def rail_info() -> dict[str, int]:
        return {k: int(v) for k, v in ep.info.items() if k.startswith("rail_")}

    with throttled("veth2", THROTTLE_MBIT):
        first = write_exact()  # neither rail measured yet: equal shares, both measured
        assert min(first) > 0, first
        for _ in range(2):
            moved = write_exact()
        info = rail_info()
        assert 0 < info[f"rail_{slow}_rate"] * 3 < info[f"rail_{fast}_rate"], info
        # About 2 MB/s against 16 or more: a share of a few percent, or none (under 5 %).
        assert moved[1] < size // 4 and info[f"rail_{slow}_share_pct"] < 25, (moved, info)
        assert info[f"rail_{fast}_share_pct"] > 75, info
        assert "MB/s" in ep.describe() and "% of the last striped transfer" in ep.describe()
    # Lifted: the rail is measured again (at once, or after kProbeS when it was left out).
    deadline = time.monotonic() + RECOVER_S
    while True:
        moved = write_exact()
        info = rail_info()
        if info[f"rail_{slow}_share_pct"] >= 35 and moved[1] >= size * 0.35:
            break
        assert time.monotonic() < deadline, f"{slow} did not win its share back: {info}"


def test_minilm_served_and_pulled_bit_exact_over_two_rails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path = model_file()
    with (
        ofi_engine(monkeypatch, 1) as server,
        serve_weights(path, host=addrs()[1], engine=server, timeout=WAIT_S * 5) as weights,
        ofi_engine(monkeypatch, 0) as client,
    ):
        arrays = pull_weights(f"{addrs()[1]}:{weights.port}", engine=client, timeout=WAIT_S * 5)
        differ = pulled_bit_exact(arrays, path, client)
        pulled = digests(arrays)
    assert not differ, differ
    assert digests(arrays) == pulled  # the caller's arrays: closing the engines leaves them be
