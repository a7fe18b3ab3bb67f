"""The registration cache (python/rdmaxfer/transport/regcache.py): temporary registrations of
unregistered host memory are reused across transfers, never outlive their memory's owner, are
dropped when the memory is registered or deregistered by the user, and stay within their bounds.
On TCP through the public Endpoint, and on the loopback transport through the memory domain."""

from __future__ import annotations

import ctypes
import gc
import zlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from _common import Pair
from rdmaxfer import _core
from rdmaxfer.transport.domain import MemoryDomain

NBYTES = 64 << 10
REPEATS = 100
TIMEOUT_S = 10.0


def crc(arr: npt.NDArray[Any]) -> int:
    return zlib.crc32(np.ascontiguousarray(arr).tobytes())


def test_repeated_writes_of_one_array_register_it_once(
    pair: Pair, rng: np.random.Generator
) -> None:
    target = pair.server.register(np.zeros(NBYTES, np.uint8), "rw")
    desc = target.descriptor()
    src = rng.integers(0, 256, NBYTES, dtype=np.uint8)
    base = pair.client.registered_count()
    pair.a.write(src, desc, timeout=TIMEOUT_S)
    after_first = pair.client.registered_count()
    assert after_first == base + 1, "the temporary registration stays for the next write"
    for _ in range(REPEATS):
        src[:] = rng.integers(0, 256, NBYTES, dtype=np.uint8)  # same memory, new bytes
        pair.a.write(src, desc, timeout=TIMEOUT_S)
        assert crc(target.numpy()) == crc(src)
    assert pair.client.registered_count() == after_first
    assert pair.client._temps.hits == REPEATS


def test_repeated_reads_into_one_array_register_it_once(
    pair: Pair, rng: np.random.Generator
) -> None:
    source = pair.server.register(rng.integers(0, 256, NBYTES, dtype=np.uint8), "r")
    dst = np.zeros(NBYTES, np.uint8)
    base = pair.client.registered_count()
    pair.a.read(dst, source.descriptor(), timeout=TIMEOUT_S)
    after_first = pair.client.registered_count()
    assert after_first == base + 1
    for _ in range(REPEATS):
        dst[:] = 0
        pair.a.read(dst, source.descriptor(), timeout=TIMEOUT_S)
        assert crc(dst) == crc(source.numpy())
    assert pair.client.registered_count() == after_first


def test_user_registration_and_deregistration_drop_the_cached_one(
    pair: Pair, rng: np.random.Generator
) -> None:
    desc = pair.server.register(np.zeros(NBYTES, np.uint8), "rw").descriptor()
    src = rng.integers(0, 256, NBYTES, dtype=np.uint8)
    base = pair.client.registered_count()
    pair.a.write(src, desc, timeout=TIMEOUT_S)
    assert pair.client.registered_count() == base + 1
    cached = pair.client._temps.lookup(src)
    assert cached is not None
    user = pair.client.register(src, "r")
    assert not cached.registered, "registering the memory drops the cached registration"
    assert pair.client.registered_count() == base + 1  # only the user's
    pair.a.write(src, desc, timeout=TIMEOUT_S)  # through the user's registration
    assert pair.client.registered_count() == base + 1
    user.deregister()
    assert pair.client.registered_count() == base
    misses = pair.client._temps.misses
    pair.a.write(src, desc, timeout=TIMEOUT_S)  # registers again
    assert pair.client._temps.misses == misses + 1
    assert pair.client.registered_count() == base + 1


def _owned_view(addr: int, nbytes: int) -> npt.NDArray[np.uint8]:
    """A new owner object (a ctypes array) for memory at ``addr``: what a freed-and-reused
    address looks like to the cache."""
    return np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(addr))


def test_memory_at_a_reused_address_never_meets_a_stale_registration(
    pair: Pair, rng: np.random.Generator
) -> None:
    target = pair.server.register(np.zeros(NBYTES, np.uint8), "rw")
    memory = rng.integers(0, 256, NBYTES, dtype=np.uint8)
    base = pair.client.registered_count()
    first = _owned_view(memory.ctypes.data, NBYTES)
    pair.a.write(first, target.descriptor(), timeout=TIMEOUT_S)
    stale = pair.client._temps.lookup(first)
    assert stale is not None
    del first
    gc.collect()
    memory[:] = rng.integers(0, 256, NBYTES, dtype=np.uint8)
    second = _owned_view(memory.ctypes.data, NBYTES)  # same address, another owner
    misses = pair.client._temps.misses
    pair.a.write(second, target.descriptor(), timeout=TIMEOUT_S)
    assert pair.client._temps.misses == misses + 1, "a new owner must not hit the old entry"
    assert not stale.registered, "the dead owner's registration is deregistered"
    fresh = pair.client._temps.lookup(second)
    assert fresh is not None and fresh is not stale
    assert pair.client.registered_count() == base + 1
    assert crc(target.numpy()) == crc(memory)


def test_the_cache_stays_within_its_entry_and_byte_bounds(
    pair: Pair, rng: np.random.Generator
) -> None:
    desc = pair.server.register(np.zeros(NBYTES, np.uint8), "rw").descriptor()
    cache = pair.client._temps
    cache.max_entries, cache.max_bytes = 4, 3 * NBYTES
    base = pair.client.registered_count()
    arrays = [rng.integers(0, 256, NBYTES, dtype=np.uint8) for _ in range(10)]
    for arr in arrays:
        pair.a.write(arr, desc, timeout=TIMEOUT_S)
        assert len(cache) <= 3 and cache.nbytes <= 3 * NBYTES
        assert pair.client.registered_count() <= base + 3
    # The most recently used survive: writing the last one again is a hit.
    hits = cache.hits
    pair.a.write(arrays[-1], desc, timeout=TIMEOUT_S)
    assert cache.hits == hits + 1
    pair.a.write(arrays[0], desc, timeout=TIMEOUT_S)  # evicted long ago: a miss
    assert cache.hits == hits + 1


def test_bytes_objects_get_a_registration_per_operation(pair: Pair) -> None:
    desc = pair.server.register(np.zeros(16, np.uint8), "rw").descriptor()
    base = pair.client.registered_count()
    payload = bytes(range(16))
    pair.a.write(payload, desc, timeout=TIMEOUT_S)
    assert pair.client.registered_count() == base, "bytes take no weak reference: not cached"


@pytest.fixture
def loopback() -> Iterator[tuple[MemoryDomain, _core.Endpoint, _core.Engine]]:
    server = _core.Engine("loopback")
    client = MemoryDomain(_core.Engine("loopback"))
    port = server.listen("loopback", 0)
    ep = client.core.connect("loopback", port, streams=1, timeout=TIMEOUT_S)
    peer = server.accept(TIMEOUT_S)
    yield client, ep, server
    ep.close()
    peer.close()
    client._close_memory()
    client.core.close()
    server.close()


def test_loopback_domain_reuses_and_releases_its_temporary_registration(
    loopback: tuple[MemoryDomain, _core.Endpoint, _core.Engine], rng: np.random.Generator
) -> None:
    domain, ep, server = loopback
    target = np.zeros(NBYTES, np.uint8)
    remote = server.register(target.ctypes.data, NBYTES, _core.ACCESS_REMOTE_WRITE)
    src = rng.integers(0, 256, NBYTES, dtype=np.uint8)
    counts = set()
    for _ in range(REPEATS):
        region, offset, temps = domain.host_region(src, writes=False)
        request = ep.post_write(region.core, offset, remote.descriptor(), 0, NBYTES)
        assert request.wait(TIMEOUT_S)
        request.check()
        domain.release_temps(temps, TIMEOUT_S)
        counts.add(domain.core.registered_count())
    assert counts == {1}
    assert crc(target) == crc(src)
    region, _, temps = domain.host_region(src, writes=False)
    domain.release_temps(temps, TIMEOUT_S, failed=True)
    assert not region.registered and domain.core.registered_count() == 0


def test_user_registrations_found_for_a_transfer_follow_register_and_deregister(
    pair: Pair, rng: np.random.Generator
) -> None:
    """The engine remembers which user registration covers an array (domain.host_region); every
    register and deregister makes it look again, so a transfer always takes a live one, the
    exact range before a covering one, and a temporary one once none is left."""
    target = pair.server.register(np.zeros(NBYTES, np.uint8), "rw")
    big = rng.integers(0, 256, 4 * NBYTES, dtype=np.uint8)
    view = big[NBYTES : 2 * NBYTES]
    engine = pair.client

    def write_and_find() -> tuple[object, int, int]:
        view[:] = rng.integers(0, 256, NBYTES, dtype=np.uint8)
        pair.a.write(view, target.descriptor(), timeout=TIMEOUT_S)
        assert crc(target.numpy()) == crc(view)
        region, offset, temps = engine.host_region(view, writes=False)
        engine.release_temps(temps, TIMEOUT_S)
        return region, offset, len(temps)

    exact = engine.register(view, "none", local_write=False)
    assert write_and_find() == (exact, 0, 0)
    assert write_and_find() == (exact, 0, 0)  # remembered
    exact.deregister()
    region, offset, temps = write_and_find()
    # The temporary registration is the whole allocation's (big), at the view's offset.
    assert region is not exact and region.temporary and (offset, temps) == (NBYTES, 1)
    assert (region.addr, region.nbytes) == (big.ctypes.data, big.nbytes)
    covering = engine.register(big, "r")
    assert write_and_find() == (covering, NBYTES, 0)
    again = engine.register(view, "r")
    assert write_and_find() == (again, 0, 0)  # a new registration is seen at once
    again.close()
    assert write_and_find() == (covering, NBYTES, 0)
    covering.close()
    region, _, temps = write_and_find()
    assert region is not covering and region.registered and temps == 1
