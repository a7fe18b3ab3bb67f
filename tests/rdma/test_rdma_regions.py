"""Registrations on verbs: deregistration revokes the rkey at once, and one-sided requests are
checked against the remote descriptor before any WR is posted."""

from __future__ import annotations

import time

import numpy as np
import pytest

from rdmaxfer import Engine
from rdmaxfer.errors import InvalidArgumentError, RemoteAccessError

from .rdma_helpers import (
    RW,
    WAIT_S,
    RdmaPair,
    api_pair,
    rails,
    random_bytes,
    region_array,
    wait_ok,
)

pytestmark = pytest.mark.rdma


@pytest.mark.parametrize("how", ["deregister", "close"])
@pytest.mark.parametrize("op", ["write", "read"])
def test_deregistration_revokes_the_rkey_at_once(
    rng: np.random.Generator, how: str, op: str
) -> None:
    """The MR is destroyed by deregister()/close(), not when the object is collected: a WRITE or
    READ with the old descriptor fails with RemoteAccessError and the memory is unchanged."""
    with api_pair() as (server, _, ep, _):
        target = random_bytes(rng, 8192)
        before = target.copy()
        region = server.register(target, "rw")
        descriptor = region.descriptor()
        source = random_bytes(rng, 8192)
        ep.write(source[:16], descriptor, timeout=WAIT_S)  # the key works while registered
        before[:16] = source[:16]
        np.testing.assert_array_equal(target, before)
        region.deregister(timeout=WAIT_S) if how == "deregister" else region.close()
        assert not region.registered and region.core is not None  # the object lives on
        with pytest.raises(RemoteAccessError, match=r"IBV_WC_REM_ACCESS_ERR"):
            if op == "write":
                ep.write(source, descriptor, timeout=WAIT_S)
            else:
                ep.read(np.zeros(8192, np.uint8), descriptor, timeout=WAIT_S)
        np.testing.assert_array_equal(target, before)


def test_out_of_bounds_is_refused_before_posting(
    rdma_pair: RdmaPair, rng: np.random.Generator
) -> None:
    """A multi-WR WRITE or READ that reaches past the descriptor is refused whole with
    InvalidArgumentError: no chunk lands and the connection stays up."""
    src = rdma_pair.client.alloc_pinned(16384, 0)
    region_array(src)[:] = random_bytes(rng, 16384)
    dst = rdma_pair.server.alloc_pinned(8192, RW)
    before = random_bytes(rng, 8192)
    region_array(dst)[:] = before
    desc = dst.descriptor()
    with pytest.raises(InvalidArgumentError, match=r"outside the remote region"):
        rdma_pair.a.post_write(src, 0, desc, 4096, 8192, 1024)  # 8 WRs, the last 4 outside
    with pytest.raises(InvalidArgumentError, match=r"outside the remote region"):
        rdma_pair.a.post_read(src, 0, desc, 1, 8192, 1024)
    time.sleep(0.5)  # a WR that had been posted would have landed by now
    np.testing.assert_array_equal(region_array(dst), before)
    assert not rdma_pair.a.closed and not rdma_pair.b.closed
    wait_ok(rdma_pair.a.post_write(src, 0, desc, 0, 8192, 1024))  # the same endpoint works
    np.testing.assert_array_equal(region_array(dst), region_array(src)[:8192])


def test_a_descriptor_of_another_engine_is_refused(rng: np.random.Generator) -> None:
    """A descriptor of an engine other than the endpoint's peer is refused before anything is
    posted, naming both engines; the endpoint then works with the peer's own descriptor."""
    with api_pair() as (server, _, ep, _), Engine("rdma", rdma_devices=rails(1)) as other:
        target = np.zeros(4096, np.uint8)
        ours = server.register(target, access="rw").descriptor()
        theirs = other.register(np.zeros(4096, np.uint8), access="rw").descriptor()
        data = random_bytes(rng, 4096)
        for attempt in (
            lambda: ep.write(data, theirs, timeout=WAIT_S),
            lambda: ep.read(np.zeros(4096, np.uint8), theirs, timeout=WAIT_S),
        ):
            with pytest.raises(InvalidArgumentError) as caught:
                attempt()
            message = str(caught.value)
            assert f"rdma engine {other.engine_id:016x}" in message
            assert f"connects to the engine {server.engine_id:016x}" in message
        assert not target.any()
        ep.write(data, ours, timeout=WAIT_S)
        np.testing.assert_array_equal(target, data)


def test_repeated_writes_reuse_one_temporary_mr(rng: np.random.Generator) -> None:
    """An unregistered source array gets one temporary MR (the registration cache) for every
    write of it; registering the memory drops that MR, and after deregistration a write
    registers it again."""
    with api_pair() as (server, client, ep, _):
        target = server.register(np.zeros(8192, np.uint8), "rw")
        source = random_bytes(rng, 8192)
        base = client.registered_count()
        for _ in range(20):
            source[:] = random_bytes(rng, 8192)
            ep.write(source, target.descriptor(), timeout=WAIT_S)
            np.testing.assert_array_equal(target.numpy(), source)
            assert client.registered_count() == base + 1
        cached = client._temps.lookup(source)
        assert cached is not None
        user = client.register(source, "r")
        assert not cached.registered
        user.deregister(timeout=WAIT_S)
        assert client.registered_count() == base
        source[:] = random_bytes(rng, 8192)
        ep.write(source, target.descriptor(), timeout=WAIT_S)
        np.testing.assert_array_equal(target.numpy(), source)
        assert client.registered_count() == base + 1


def test_a_batch_of_views_of_one_array_registers_one_mr(rng: np.random.Generator) -> None:
    """1,000 views of one unregistered array in a batch get one temporary registration: one
    ibv_reg_mr of the whole array (one rail), without local write for a source; a READ batch
    into views of another array gets one more, with local write. The bytes arrive exactly."""
    n, page = 1000, 4096
    with api_pair() as (server, client, ep, _):
        target = np.zeros(n * page, np.uint8)
        desc = server.register(target, "rw").descriptor()
        source = random_bytes(rng, n * page)
        slots = [int(s) for s in rng.permutation(n)]
        base, misses = client.registered_count(), client._temps.misses
        entries = [(source[i * page : (i + 1) * page], desc, s * page) for i, s in enumerate(slots)]
        with ep.prepare_batch(entries) as prepared:
            assert client.registered_count() == base + 1, "one MR for every view"
            assert prepared.post().wait(WAIT_S).ok
        assert client._temps.misses == misses + 1
        mr = client._temps.lookup(source)
        assert mr is not None and not mr.core.local_write
        assert (mr.addr, mr.nbytes) == (source.ctypes.data, source.nbytes)
        np.testing.assert_array_equal(target.reshape(n, page)[slots].reshape(-1), source)
        back = np.zeros_like(source)
        views = [(back[i * page : (i + 1) * page], desc, s * page) for i, s in enumerate(slots)]
        assert ep.read_batch(views, timeout=WAIT_S).ok
        np.testing.assert_array_equal(back, source)
        assert client._temps.misses == misses + 2
        assert client.registered_count() == base + 2
        landing = client._temps.lookup(back)
        assert landing is not None and landing.core.local_write
