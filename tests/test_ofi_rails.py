"""The ofi transport on several rails (one libfabric domain per NIC, ``RDMAXFER_OFI_IFACE``
listing them or ``auto``), on the host over tcp;ofi_rxm with one rail per network interface
(``lo`` and the host's others: the bytes stay on this host). Large one-sided transfers are
striped over the rails, small ones take one; a rail that fails mid-transfer (the fault hook
RDMAXFER_OFI_TEST_RAIL_ERR) moves its parts to the live rail and the transfer completes
bit-exact; the peer learns of it; a notified write on a failed rail fails alone and the next
one goes on a live rail. The rxe guest runs the same over verbs;ofi_rxm on two soft-RoCE
devices per side (tests/rdma/ofi_rail_cases.py)."""

from __future__ import annotations

import hashlib
import struct
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest

from _common import ofi_record, wait_for
from rdmaxfer import (
    ConnectionFailedError,
    Descriptor,
    Endpoint,
    Engine,
    InvalidArgumentError,
    ProtocolError,
    UnsupportedError,
    _core,
)

SECRET = "ofi-rails"
WAIT_S = 60.0
BIG = 48 << 20  # striped: both rails carry a share
SMALL = 64 << 10  # below the stripe threshold: one rail


def tcp_domains() -> list[str]:
    """The tcp;ofi_rxm domains of this host (one per interface), found as an engine on
    ``auto`` finds them; skips with fewer than two."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RDMAXFER_OFI_PROVIDER", "tcp;ofi_rxm")
        mp.setenv("RDMAXFER_OFI_IFACE", "auto")
        mp.delenv("FI_TCP_IFACE", raising=False)
        why = _core.available_transports().get("ofi", "unknown transport")
        if why:
            pytest.skip(f"transport 'ofi' is unavailable here: {why}")
        with Engine("ofi", secret=SECRET) as probe:
            names = probe.core.rails()
    if len(names) < 2:
        pytest.skip(f"tcp;ofi_rxm lists one domain here ({names}): two rails need two interfaces")
    return names


@pytest.fixture()
def rails(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    names = tcp_domains()[:2]
    monkeypatch.setenv("RDMAXFER_OFI_PROVIDER", "tcp;ofi_rxm")
    monkeypatch.setenv("RDMAXFER_OFI_IFACE", ",".join(names))
    monkeypatch.delenv("FI_TCP_IFACE", raising=False)
    return names


@contextmanager
def connected() -> Iterator[tuple[Endpoint, Endpoint, Engine, Engine]]:
    """(client endpoint, server endpoint, client engine, server engine): two engines on the
    rails the environment names, connected."""
    with Engine("ofi", secret=SECRET) as server, Engine("ofi", secret=SECRET) as client:
        port = server.listen("127.0.0.1", 0)
        ep = client.connect("127.0.0.1", port, timeout=WAIT_S)
        yield ep, server.accept(timeout=WAIT_S), client, server


@pytest.fixture()
def pair(rails: list[str]) -> Iterator[tuple[Endpoint, Endpoint, Engine, Engine]]:
    """connected() on `rails`."""
    with connected() as four:
        yield four


def digest(data: np.ndarray) -> str:
    return hashlib.sha256(data.tobytes()).hexdigest()


def rail_bytes(ep: Endpoint, names: list[str]) -> list[int]:
    return [int(ep.info[f"rail_{n}_bytes"]) for n in names]


def striped_write(
    ep: Endpoint, src: np.ndarray, desc: Descriptor, dst: np.ndarray, names: list[str]
) -> list[int]:
    """WRITEs `src` through `ep` into `dst` (described by `desc`), checks the bytes, and
    returns what each rail of `names` carried."""
    before = rail_bytes(ep, names)
    dst[:] = 0
    ep.write(src, desc, timeout=WAIT_S)
    assert digest(dst) == digest(src)
    return [b - a for a, b in zip(before, rail_bytes(ep, names), strict=True)]


def test_an_engine_opens_one_domain_per_listed_rail(
    rails: list[str], pair: tuple[Endpoint, Endpoint, Engine, Engine]
) -> None:
    ep, peer, client, server = pair
    assert client.core.rails() == server.core.rails() == rails
    assert f"rail 1: {rails[1]}" in client.describe()
    assert ep.info["rails"] == peer.info["rails"] == 2
    assert ep.info["domains"] == ",".join(rails)
    assert f"(rails: {rails[0]} up, " in ep.describe()


def test_a_large_write_and_read_stripe_over_both_rails_bit_exact(
    rails: list[str],
    pair: tuple[Endpoint, Endpoint, Engine, Engine],
    rng: np.random.Generator,
) -> None:
    ep, _, _, server = pair
    dst = np.zeros(BIG, np.uint8)
    desc = server.register(dst, access="rw").descriptor()
    assert len(desc.rail_keys) == 1 and desc.rail_keys[0] != 0
    src = rng.integers(0, 256, BIG, dtype=np.uint8)
    ep.write(src, desc, timeout=WAIT_S)
    assert digest(dst) == digest(src)
    carried = rail_bytes(ep, rails)
    assert sum(carried) == BIG and min(carried) >= BIG // 4, carried
    back = np.zeros(BIG, np.uint8)
    ep.read(back, desc, timeout=WAIT_S)
    assert digest(back) == digest(src)
    assert sum(rail_bytes(ep, rails)) == 2 * BIG


def test_a_small_write_takes_one_rail_the_home_rail_when_set(
    rails: list[str],
    pair: tuple[Endpoint, Endpoint, Engine, Engine],
    rng: np.random.Generator,
) -> None:
    ep, _, client, server = pair
    dst = np.zeros(SMALL, np.uint8)
    desc = server.register(dst).descriptor()
    src = rng.integers(0, 256, SMALL, dtype=np.uint8)
    local = client.register(src)
    local.core.home_rail = 1
    for _ in range(5):
        ep.write(local, desc, timeout=WAIT_S)
    assert digest(dst) == digest(src)
    assert rail_bytes(ep, rails) == [0, 5 * SMALL]


def test_a_rail_that_fails_mid_write_moves_its_parts_to_the_live_rail(
    monkeypatch: pytest.MonkeyPatch, rails: list[str], rng: np.random.Generator
) -> None:
    monkeypatch.setenv("RDMAXFER_OFI_TEST_RAIL_ERR", f"{rails[1]}:{4 << 20}")
    monkeypatch.setenv("RDMAXFER_OFI_TEST_REJOIN_S", "3600")  # the rail stays failed here
    with connected() as (ep, peer, client, server):
        dst = np.zeros(BIG, np.uint8)
        desc = server.register(dst, access="rw").descriptor()
        src = rng.integers(0, 256, BIG, dtype=np.uint8)
        ep.write(src, desc, timeout=WAIT_S)
        assert digest(dst) == digest(src)
        assert ep.info[f"rail_{rails[1]}_up"] == 0 and ep.info[f"rail_{rails[0]}_up"] == 1
        assert f"{rails[1]} failed (WRITE with " in ep.describe()
        assert "RDMAXFER_OFI_TEST_RAIL_ERR" in ep.describe()
        # The peer was told, and its own transfers leave the rail too.
        back = np.zeros(BIG, np.uint8)
        local = server.register(back)
        mine = client.register(src, access="rw").descriptor()
        wait_for("the peer told", lambda: peer.info[f"rail_{rails[1]}_up"] == 0)
        peer.read(local, mine, timeout=WAIT_S)
        assert digest(back) == digest(src)
        assert peer.info[f"rail_{rails[1]}_up"] == 0
        assert peer.info[f"rail_{rails[1]}_bytes"] == 0
        assert "the peer's end failed" in peer.describe()
        # Later transfers on the endpoint go on the live rail alone.
        before = rail_bytes(ep, rails)
        src2 = rng.integers(0, 256, BIG, dtype=np.uint8)
        ep.write(src2, desc, timeout=WAIT_S)
        assert digest(dst) == digest(src2)
        after = rail_bytes(ep, rails)
        assert (after[0] - before[0], after[1] - before[1]) == (BIG, 0)


def test_a_read_part_reported_done_without_its_bytes_is_read_again_when_its_rail_fails(
    monkeypatch: pytest.MonkeyPatch, rails: list[str], rng: np.random.Generator
) -> None:
    """A provider may report a READ part done whose bytes never landed, just before the rail's
    connection fails (verbs;ofi_rxm on soft-RoCE has). The hook zeroes the first READ part
    done on rail 1 and fails the rail: the parts that rail completed for the READ still in
    flight go again on rail 0, and the READ completes bit-exact."""
    monkeypatch.setenv("RDMAXFER_OFI_TEST_LOST_READ", f"{rails[1]}:1")
    monkeypatch.setenv("RDMAXFER_OFI_TEST_REJOIN_S", "3600")  # the rail stays failed here
    with connected() as (ep, _, _, server):
        src = rng.integers(0, 256, BIG, dtype=np.uint8)
        desc = server.register(src, access="r").descriptor()
        back = np.zeros(BIG, np.uint8)
        ep.read(back, desc, timeout=WAIT_S)
        differ = np.flatnonzero(back != src)
        assert differ.size == 0, f"{differ.size} bytes differ, from byte {differ[0]}"
        assert ep.info[f"rail_{rails[1]}_up"] == 0
        assert "RDMAXFER_OFI_TEST_LOST_READ" in ep.describe()
        # The next READ goes on the live rail alone, bit-exact.
        back[:] = 0
        ep.read(back, desc, timeout=WAIT_S)
        assert digest(back) == digest(src)


def test_a_notified_write_on_a_failed_rail_fails_alone_and_the_next_goes_on_a_live_one(
    monkeypatch: pytest.MonkeyPatch, rails: list[str], rng: np.random.Generator
) -> None:
    # A SEND above the eager limit is a notified write into the receiver's grant, whose key is
    # on the lowest live rail: the first goes on rail 0, which the hook fails once its bytes
    # landed, as when a rail fails before the acknowledgement. The receiver then has them if
    # their notification reached it before the sender's abort did, else its RECV fails saying
    # so: never other bytes.
    monkeypatch.setenv("RDMAXFER_OFI_TEST_RAIL_ERR", f"{rails[0]}:1")
    monkeypatch.setenv("RDMAXFER_OFI_TEST_REJOIN_S", "3600")
    with connected() as (ep, peer, _, _):
        received: list[str] = []

        def receive() -> None:
            out = np.zeros(SMALL, np.uint8)
            try:
                peer.recv(out=out, timeout=WAIT_S)
            except ConnectionFailedError as e:
                assert "gave up on message" in str(e) and "not delivered" in str(e), str(e)
                received.append("not delivered")
                return
            received.append(digest(out))

        for attempt in range(2):
            src = rng.integers(0, 256, SMALL, dtype=np.uint8)
            receiver = threading.Thread(target=receive)
            receiver.start()
            try:
                if attempt == 0:
                    with pytest.raises(
                        ConnectionFailedError, match="stays on its grant's rail: write again"
                    ):
                        ep.send(src, timeout=WAIT_S)
                    assert not ep.closed
                    assert ep.info[f"rail_{rails[0]}_up"] == 0
                else:
                    ep.send(src, timeout=WAIT_S)
            finally:
                receiver.join(WAIT_S)
            assert received[-1] in (
                (digest(src), "not delivered") if attempt == 0 else (digest(src),)
            )
        assert ep.info[f"rail_{rails[1]}_bytes"] == SMALL


def test_a_failed_rail_rejoins_on_both_sides_and_carries_its_share_again(
    monkeypatch: pytest.MonkeyPatch, rails: list[str], rng: np.random.Generator
) -> None:
    """The rail fails (the hook) and comes back by itself: each side renews the other's AV
    entry on it and reads the other's probe word over it (ofi_heal.cc); striped transfers in
    both directions use it again, bit-exact."""
    monkeypatch.setenv("RDMAXFER_OFI_TEST_RAIL_ERR", f"{rails[1]}:{4 << 20}")
    with connected() as (ep, peer, client, server):
        dst = np.zeros(BIG, np.uint8)
        desc = server.register(dst, access="rw").descriptor()
        src = rng.integers(0, 256, BIG, dtype=np.uint8)
        ep.write(src, desc, timeout=WAIT_S)
        assert digest(dst) == digest(src)
        key = f"rail_{rails[1]}"
        wait_for(
            "the rail rejoined on both sides",
            lambda: ep.info[f"{key}_rejoins"] == 1 and peer.info[f"{key}_rejoins"] == 1,
            timeout=WAIT_S,
        )
        assert ep.info[f"{key}_up"] == peer.info[f"{key}_up"] == 1
        text = ep.describe()
        assert f"{rails[1]} up (rejoined 1x, last failure: WRITE with " in text, text
        assert "RDMAXFER_OFI_TEST_RAIL_ERR" in text
        assert f"{rails[1]} up (rejoined 1x, last failure: the peer's end failed" in (
            peer.describe()
        )
        src2 = rng.integers(0, 256, BIG, dtype=np.uint8)
        moved = striped_write(ep, src2, desc, dst, rails)
        assert sum(moved) == BIG and min(moved) > 0, moved
        # (The hook fails the peer's rail once too, after its first 4 MiB there: the WRITE
        # completes all the same.)
        back = np.zeros(BIG, np.uint8)
        mine = client.register(back, access="rw").descriptor()
        peer.write(src2, mine, timeout=WAIT_S)
        assert digest(back) == digest(src2)
        assert min(rail_bytes(peer, rails)) > 0, rail_bytes(peer, rails)


def test_two_endpoints_to_one_peer_rejoin_a_failed_rail_both(
    monkeypatch: pytest.MonkeyPatch, rails: list[str], rng: np.random.Generator
) -> None:
    """Two endpoints between the same two engines share each rail's AV entry (the provider's
    one connection to the peer): the rail fails on both (the hook fires once per endpoint),
    the entry is renewed once on each side, and both endpoints rejoin it and stripe over it."""
    monkeypatch.setenv("RDMAXFER_OFI_TEST_RAIL_ERR", f"{rails[1]}:{4 << 20}")
    with Engine("ofi", secret=SECRET) as server, Engine("ofi", secret=SECRET) as client:
        port = server.listen("127.0.0.1", 0)
        pairs = []
        for _ in range(2):
            ep = client.connect("127.0.0.1", port, timeout=WAIT_S)
            pairs.append((ep, server.accept(timeout=WAIT_S)))
        dst = np.zeros(BIG, np.uint8)
        desc = server.register(dst, access="rw").descriptor()
        src = rng.integers(0, 256, BIG, dtype=np.uint8)
        for ep, _ in pairs:
            dst[:] = 0
            ep.write(src, desc, timeout=WAIT_S)
            assert digest(dst) == digest(src)
        key = f"rail_{rails[1]}_rejoins"
        wait_for(
            "the rail to rejoin both endpoints on both sides",
            lambda: all(int(ep.info[key]) >= 1 and int(peer.info[key]) >= 1 for ep, peer in pairs),
            timeout=WAIT_S,
        )
        for ep, _ in pairs:
            moved = striped_write(ep, src, desc, dst, rails)
            assert sum(moved) == BIG and min(moved) > 0, (moved, ep.describe())


@pytest.mark.parametrize(
    ("iface", "message"),
    [
        ("lo,lo", "lists lo twice"),
        ("auto,lo", "lists auto among other names"),
        (",".join(f"d{i}" for i in range(9)), "lists 9 domains; an engine opens at most 8"),
    ],
)
def test_a_bad_rail_list_is_refused_naming_it(
    monkeypatch: pytest.MonkeyPatch, iface: str, message: str
) -> None:
    monkeypatch.setenv("RDMAXFER_OFI_PROVIDER", "tcp;ofi_rxm")
    monkeypatch.setenv("RDMAXFER_OFI_IFACE", iface)
    if "libfabric" in _core.available_transports().get("ofi", ""):
        pytest.skip("libfabric is not installed here")
    with pytest.raises(InvalidArgumentError, match=message):
        Engine("ofi", secret=SECRET)


def test_a_domain_the_provider_does_not_list_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    tcp_domains()
    monkeypatch.setenv("RDMAXFER_OFI_PROVIDER", "tcp;ofi_rxm")
    monkeypatch.setenv("RDMAXFER_OFI_IFACE", "lo,nosuchnic0")
    monkeypatch.delenv("FI_TCP_IFACE", raising=False)
    with pytest.raises(
        UnsupportedError, match=r"nosuchnic0: no domain of that name \(listed: .*lo"
    ):
        Engine("ofi", secret=SECRET)


def test_the_endpoint_record_carries_an_address_per_rail_and_refuses_a_bad_one() -> None:
    kind = "ofi_endpoint_record"
    one = ofi_record([b"A" * 16], b"efa")
    assert _core.parse_record(kind, one) == f"{kind} provider=efa rails=1 address_bytes=16"
    three = ofi_record([b"A" * 16, b"B" * 24, b"C" * 8], b"efa")
    assert _core.parse_record(kind, three) == f"{kind} provider=efa rails=3 address_bytes=16"
    with pytest.raises(ProtocolError, match="4 bytes after the last rail's address"):
        _core.parse_record(kind, three[:-10] + struct.pack("<H", 4) + b"CCCC" + b"zzzz")
    with pytest.raises(ProtocolError, match="rail 2's address of 60000 bytes does not fit"):
        _core.parse_record(kind, three[:-10] + struct.pack("<H", 60000) + b"C" * 8)
    with pytest.raises(ProtocolError, match="version 1 with extra rails"):
        _core.parse_record(kind, three[:4] + struct.pack("<H", 1) + three[6:])
    many = ofi_record([b"A" * 16] * 9, b"efa")
    with pytest.raises(ProtocolError, match="8 extra rails"):
        _core.parse_record(kind, many)
