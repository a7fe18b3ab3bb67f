"""Several rails per engine (``tests/rxe/run-in-vm.sh --rails 2``): the client on rxe0+rxe2, the
server on rxe1+rxe3 (rxe0/rxe1 on 10.77.0.0/24, rxe2/rxe3 on 10.78.0.0/24). Striping is byte
exact and loads both rails; only rails that reach each other pair. Each rail makes its CQs on
demand, so a two-rail engine holds 512 connections, with the fabric settings on every QP.
Failover when a rail fails is in test_rdma_rails_failover.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from rdmaxfer import Engine, _core
from rdmaxfer.errors import ConnectionFailedError, InvalidArgumentError

from .rdma_helpers import (
    MIB,
    RW,
    TWO_RAILS,
    WAIT_S,
    addrs,
    connect_many,
    peers_by_tag,
    rail_bytes,
    rail_pair,
    rails,
    raise_fd_limit,
    random_bytes,
    region_array,
    wait_ok,
)

pytestmark = [pytest.mark.rdma, TWO_RAILS]


def test_engine_lists_its_rails_and_registers_on_each() -> None:
    with rail_pair() as (client, server, a, b):
        assert client.rails() == rails(0) and server.rails() == rails(1)
        text = client.describe()
        assert "2 rail(s): rxe0 (10.77.0.1/24" in text and "rxe2 (10.78.0.1/24" in text, text
        region = server.alloc_pinned(4096, RW)
        d = region.descriptor()
        assert d.key == region.key and len(d.rail_keys) == 1 and d.rail_keys[0] != 0, d
        packed = d.pack()
        assert len(packed) == _core.Descriptor.SIZE + 4
        assert _core.Descriptor.unpack(packed).rail_keys == d.rail_keys
        # One QP on each pair of rails that reach each other: rxe0-rxe1 and rxe2-rxe3.
        assert a.streams == 2 and b.streams == 2
        assert a.attributes()["rails"] == 2 and set(rail_bytes(a)) == {"rxe0", "rxe2"}
        assert set(rail_bytes(b)) == {"rxe1", "rxe3"}
        assert "RC QP(s) on rxe0+rxe2, control rail rxe0" in a.describe(), a.describe()


def test_devices_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RDMAXFER_RDMA_DEVICES", ",".join(rails(0)))
    engine = _core.Engine("rdma")
    try:
        assert engine.rails() == rails(0)
    finally:
        engine.close()
    monkeypatch.setenv("RDMAXFER_RDMA_DEVICES", "auto")
    engine = _core.Engine("rdma")
    try:  # every active port of the guest: rxe0..rxe3
        assert sorted(engine.rails()) == sorted(rails(0) + rails(1)), engine.rails()
    finally:
        engine.close()
    with pytest.raises(InvalidArgumentError, match="names rxe0 twice"):
        _core.Engine("rdma", rdma_devices=["rxe0", "rxe0"])


def test_info_lists_the_rails(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {**os.environ, "RDMAXFER_RDMA_DEVICES": ",".join(rails(0))}
    out = subprocess.run(
        [sys.executable, "-m", "rdmaxfer", "info", "--json"],
        env=env, capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    assert json.loads(out.stdout)["rdma_rails"] == rails(0), out.stdout


def test_striped_write_and_read_are_exact_and_use_both_rails(
    rng: np.random.Generator,
) -> None:
    size = 8 * MIB + 12345
    with rail_pair() as (client, server, a, _):
        src = client.alloc_pinned(size, 0)
        dst = server.alloc_pinned(size, RW)
        back = client.alloc_pinned(size, _core.ACCESS_LOCAL_WRITE)
        data = random_bytes(rng, size)
        region_array(src)[:] = data
        wait_ok(a.post_write(src, 0, dst.descriptor(), 0, size))
        assert np.array_equal(region_array(dst), data)
        per_rail = rail_bytes(a)
        assert per_rail["rxe0"] > 0 and per_rail["rxe2"] > 0, per_rail
        assert sum(per_rail.values()) == size, per_rail
        # Equal link speeds: equal shares, within one chunk.
        assert abs(per_rail["rxe0"] - per_rail["rxe2"]) <= 2 * MIB, per_rail
        wait_ok(a.post_read(back, 0, dst.descriptor(), 0, size))
        assert np.array_equal(region_array(back), data)
        assert sum(rail_bytes(a).values()) == 2 * size
        text = a.describe()
        assert "rxe0 up" in text and "rxe2 up" in text, text


def test_small_transfers_take_one_rail(rng: np.random.Generator) -> None:
    with rail_pair() as (client, server, a, _):
        src = client.alloc_pinned(64 * 1024, 0)
        dst = server.alloc_pinned(64 * 1024, RW)
        data = random_bytes(rng, 64 * 1024)
        region_array(src)[:] = data
        src.home_rail = 1  # rxe2: as if it were the NIC nearest the buffer's GPU
        wait_ok(a.post_write(src, 0, dst.descriptor(), 0, 64 * 1024))
        assert np.array_equal(region_array(dst), data)
        assert rail_bytes(a) == {"rxe0": 0, "rxe2": 64 * 1024}


def test_only_rails_that_reach_each_other_pair() -> None:
    # rxe2 (10.78.0.0/24) cannot reach rxe1 (10.77.0.0/24): only rxe0-rxe1 pairs.
    with rail_pair(server_rails=rails(1)[:1]) as (_, _, a, b):
        assert a.streams == 1 and b.streams == 1 and set(rail_bytes(a)) == {"rxe0"}
    server = _core.Engine("rdma", rdma_devices=rails(1)[:1])
    client = _core.Engine("rdma", rdma_devices=rails(0)[1:])
    try:
        port = server.listen(addrs()[1], 0)
        with pytest.raises(ConnectionFailedError, match=r"no rail of this engine .* reaches"):
            client.connect(addrs()[1], port, 0, WAIT_S)
    finally:
        client.close()
        server.close()


OLD_RAIL_LIMIT = 56
N_RAIL_CONNECTIONS = 512


def test_two_rail_engine_holds_512_connections_with_fabric_settings(
    rng: np.random.Generator,
) -> None:
    """Each rail makes CQs on demand (its own CqSet): 512 connections with a QP on each of the
    two rails, the fabric settings on every QP, a tag each way exact, striped bytes on both
    rails of a sample."""
    raise_fd_limit(4 * N_RAIL_CONNECTIONS + 256, f"{N_RAIL_CONNECTIONS} connections")
    fabric = {"service_level": 3, "traffic_class": 104, "min_rnr_timer": 12}
    with (
        Engine("rdma", rdma_devices=rails(1), **fabric) as server,
        Engine("rdma", rdma_devices=rails(0), **fabric) as client,
    ):
        port = server.listen(addrs()[1], 0)
        ours, theirs = connect_many(client, server, addrs()[1], port, N_RAIL_CONNECTIONS)
        assert len(ours) > OLD_RAIL_LIMIT
        assert all(ep.streams == 2 for ep in ours + theirs)
        peer_of = peers_by_tag(rng, ours, theirs)

        size = MIB + 4321  # striped: both rails' QPs (and so both rails' CQs) carry bytes
        for i in rng.choice(N_RAIL_CONNECTIONS, size=4, replace=False):
            mine, yours = ours[peer_of[int(i)]], theirs[int(i)]
            data = random_bytes(rng, size)
            target = np.zeros(size, np.uint8)
            mine.write(data, server.register(target, access="rw"))
            assert np.array_equal(target, data)
            info = mine.info
            assert info["rails"] == 2, info
            assert int(info["rail_rxe0_bytes"]) > 0 and int(info["rail_rxe2_bytes"]) > 0, info
            for ep in (mine, yours):
                assert ep.info["applied_min_rnr_timer"] == 12 and ep.info["min_rnr_timer"] == 12
                assert ep.info["applied_traffic_class"] == 104 and ep.info["roce"] == 1
                assert ep.info["traffic_class"] == 104
