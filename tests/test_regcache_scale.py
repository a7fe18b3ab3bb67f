"""One registration per allocation (python/rdmaxfer/memory/allocation.py and
transport/regcache.py): views of one array, of one torch storage, of one bytearray share the
registration of the memory that holds them; an address reused by another owner misses; read-only
memory registers without local write; user registrations of the allocation take over from the
cached one; allocations over the byte bound register in windows. Structural: registrations are
counted, never timed (speed: bench/register_scale.py). Plus the cover index
(transport/region_index.py) against a brute-force search."""

from __future__ import annotations

import ctypes
import gc
import mmap
import random
import zlib
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
import torch

from _common import Pair
from rdmaxfer import Engine
from rdmaxfer.errors import InvalidArgumentError
from rdmaxfer.transport import regcache
from rdmaxfer.transport.region_index import CoverIndex, SortedInts

PAGE = 4096
TIMEOUT_S = 60.0


def crc(data: Any) -> int:
    return zlib.crc32(np.ascontiguousarray(data).tobytes())


def scattered(rng: np.random.Generator, n: int) -> list[int]:
    return [int(s) for s in rng.permutation(n)]


def test_a_batch_of_10000_views_of_one_array_makes_one_registration(
    pair: Pair, rng: np.random.Generator
) -> None:
    n = 10_000
    target = np.zeros(n * PAGE, np.uint8)
    desc = pair.server.register(target).descriptor()
    src = rng.integers(0, 256, n * PAGE, dtype=np.uint8)
    slots = scattered(rng, n)
    engine, cache = pair.client, pair.client._temps
    base, misses = engine.registered_count(), cache.misses
    entries = [(src[i * PAGE : (i + 1) * PAGE], desc, s * PAGE) for i, s in enumerate(slots)]
    with pair.a.prepare_batch(entries) as prepared:
        assert engine.registered_count() == base + 1, "one registration for all the views"
        assert cache.misses == misses + 1
        assert prepared.post().wait(TIMEOUT_S).ok
    assert crc(target.reshape(n, PAGE)[slots]) == crc(src)
    # Read back into views of another array: one more registration, with local write.
    back = np.zeros_like(src)
    result = pair.a.read_batch(
        [(back[i * PAGE : (i + 1) * PAGE], desc, s * PAGE) for i, s in enumerate(slots)],
        timeout=TIMEOUT_S,
    )
    assert result.ok and crc(back) == crc(src)
    assert cache.misses == misses + 2
    region = cache.lookup(back)
    assert region is not None and region.core.local_write
    assert (region.addr, region.nbytes) == (back.ctypes.data, back.nbytes)
    source = cache.lookup(src)
    assert source is not None and not source.core.local_write, "a source needs no local write"


def _owned(addr: int, nbytes: int) -> npt.NDArray[np.uint8]:
    """A new owner object (a ctypes array) of the memory at ``addr``: what a freed and
    reallocated array looks like to the cache."""
    return np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(addr))


def test_a_view_of_a_freed_and_reallocated_array_misses(
    pair: Pair, rng: np.random.Generator
) -> None:
    target = pair.server.register(np.zeros(PAGE, np.uint8))
    memory = rng.integers(0, 256, 16 * PAGE, dtype=np.uint8)
    first = _owned(memory.ctypes.data, memory.nbytes)
    pair.a.write(first[3 * PAGE : 4 * PAGE], target.descriptor(), timeout=TIMEOUT_S)
    stale = pair.client._temps.lookup(first)
    assert stale is not None and (stale.addr, stale.nbytes) == (memory.ctypes.data, memory.nbytes)
    del first
    gc.collect()
    memory[:] = rng.integers(0, 256, memory.nbytes, dtype=np.uint8)
    second = _owned(memory.ctypes.data, memory.nbytes)  # the same addresses, another owner
    misses = pair.client._temps.misses
    pair.a.write(second[3 * PAGE : 4 * PAGE], target.descriptor(), timeout=TIMEOUT_S)
    assert pair.client._temps.misses == misses + 1, "another owner never hits the old entry"
    assert not stale.registered, "the dead owner's registration was deregistered"
    assert crc(target.numpy()) == crc(memory[3 * PAGE : 4 * PAGE])


def test_torch_views_of_one_storage_share_one_registration(
    pair: Pair, rng: np.random.Generator
) -> None:
    rows = 1000
    tensor = torch.from_numpy(rng.integers(0, 256, (rows, PAGE), dtype=np.uint8))
    target = np.zeros(rows * PAGE, np.uint8)
    desc = pair.server.register(target).descriptor()
    cache = pair.client._temps
    base, misses = pair.client.registered_count(), cache.misses
    slots = scattered(rng, rows)
    result = pair.a.write_batch(
        [(tensor[i], desc, s * PAGE) for i, s in enumerate(slots)], timeout=TIMEOUT_S
    )
    assert result.ok and cache.misses == misses + 1
    assert crc(target.reshape(rows, PAGE)[slots]) == crc(tensor.numpy())
    pair.a.write(tensor[7], desc, timeout=TIMEOUT_S)  # a later view: the same registration
    assert cache.misses == misses + 1 and pair.client.registered_count() == base + 1
    assert crc(target[:PAGE]) == crc(tensor[7].numpy())


def test_views_of_one_bytearray_share_a_registration_while_in_use(pair: Pair) -> None:
    """A bytearray takes no weak reference: its views share one registration during the
    operation, deregistered when it ends."""
    n = 256
    data = bytearray(random.Random(5).randbytes(n * PAGE))
    target = np.zeros(n * PAGE, np.uint8)
    desc = pair.server.register(target).descriptor()
    base, misses = pair.client.registered_count(), pair.client._temps.misses
    view = memoryview(data)
    entries = [(view[i * PAGE : (i + 1) * PAGE], desc, i * PAGE) for i in range(n)]
    with pair.a.prepare_batch(entries) as prepared:
        assert pair.client.registered_count() == base + 1
        assert prepared.post().wait(TIMEOUT_S).ok
    assert pair.client._temps.misses == misses + 1
    assert pair.client.registered_count() == base, "not kept once unused"
    assert target.tobytes() == bytes(data)


def test_read_only_memory_registers_without_local_write(
    pair: Pair, rng: np.random.Generator, tmp_path: Any
) -> None:
    n = 64
    payload = rng.integers(0, 256, n * PAGE, dtype=np.uint8)
    path = tmp_path / "weights.bin"
    path.write_bytes(payload.tobytes())
    target = np.zeros(n * PAGE, np.uint8)
    desc = pair.server.register(target).descriptor()
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        ro = np.frombuffer(mapped, np.uint8)
        assert not ro.flags.writeable
        misses = pair.client._temps.misses
        entries = [(ro[i * PAGE : (i + 1) * PAGE], desc, i * PAGE) for i in range(n)]
        assert pair.a.write_batch(entries, timeout=TIMEOUT_S).ok
        assert pair.client._temps.misses == misses + 1
        region = pair.client._temps.lookup(ro)
        assert region is not None and not region.core.local_write
        assert (region.addr, region.nbytes) == (ro.ctypes.data, len(mapped))
        assert crc(target) == crc(payload)
        del ro, entries, region
        gc.collect()  # no view of the mapping is left: it closes


def test_a_source_registration_is_replaced_when_a_view_becomes_a_destination(
    pair: Pair, rng: np.random.Generator
) -> None:
    remote = pair.server.register(rng.integers(0, 256, 8 * PAGE, dtype=np.uint8))
    local = rng.integers(0, 256, 8 * PAGE, dtype=np.uint8)
    pair.a.write(local[:PAGE], remote.descriptor(), timeout=TIMEOUT_S)
    source = pair.client._temps.lookup(local)
    assert source is not None and not source.core.local_write
    pair.a.read(local[PAGE : 2 * PAGE], remote.descriptor(), timeout=TIMEOUT_S)
    both = pair.client._temps.lookup(local)
    assert both is not None and both.core.local_write and not source.registered
    assert crc(local[PAGE : 2 * PAGE]) == crc(remote.numpy()[:PAGE])
    misses = pair.client._temps.misses
    pair.a.write(local[4 * PAGE :], remote.descriptor(), timeout=TIMEOUT_S)
    assert pair.client._temps.misses == misses, "a write-capable one serves sources too"


def test_deregistering_the_allocation_while_its_views_are_cached(
    pair: Pair, rng: np.random.Generator
) -> None:
    """A user registration of the array drops the cached one (still used by a prepared batch:
    it stays registered until the batch closes, and the batch keeps moving the right bytes);
    views then go through the user's registration; once it is deregistered, one new temporary
    registration serves them again."""
    n = 128
    target = np.zeros(n * PAGE, np.uint8)
    desc = pair.server.register(target).descriptor()
    big = rng.integers(0, 256, n * PAGE, dtype=np.uint8)
    entries = [(big[i * PAGE : (i + 1) * PAGE], desc, i * PAGE) for i in range(n)]
    engine, cache = pair.client, pair.client._temps
    base = engine.registered_count()
    prepared = pair.a.prepare_batch(entries)
    cached = cache.lookup(big)
    assert cached is not None and cached.registered
    user = engine.register(big, "r")
    assert cache.lookup(big) is None, "the user's registration drops the cached one"
    assert cached.registered, "the prepared batch still uses it"
    big[:] = rng.integers(0, 256, big.nbytes, dtype=np.uint8)
    assert prepared.post().wait(TIMEOUT_S).ok
    assert crc(target) == crc(big)
    prepared.close()
    assert not cached.registered and engine.registered_count() == base + 1
    misses = cache.misses
    big[:] = rng.integers(0, 256, big.nbytes, dtype=np.uint8)
    assert pair.a.write_batch(entries, timeout=TIMEOUT_S).ok
    assert cache.misses == misses, "the views went through the user's registration"
    assert crc(target) == crc(big)
    user.deregister()
    assert engine.registered_count() == base
    assert pair.a.write_batch(entries, timeout=TIMEOUT_S).ok
    assert cache.misses == misses + 1 and engine.registered_count() == base + 1


def test_an_allocation_over_the_byte_bound_registers_in_windows(
    pair: Pair, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    window = 16 * PAGE
    monkeypatch.setattr(regcache, "WINDOW_BYTES", window)
    cache = pair.client._temps
    cache.max_bytes = 2 * window
    n = 256  # 16 windows
    big = rng.integers(0, 256, n * PAGE, dtype=np.uint8)
    target = np.zeros(n * PAGE, np.uint8)
    desc = pair.server.register(target).descriptor()
    base, misses = pair.client.registered_count(), cache.misses
    entries = [(big[i * PAGE : (i + 1) * PAGE], desc, i * PAGE) for i in range(n)]
    with pair.a.prepare_batch(entries) as prepared:
        assert cache.misses == misses + n * PAGE // window, "one registration per window"
        assert prepared.post().wait(TIMEOUT_S).ok
    assert crc(target) == crc(big)
    assert cache.nbytes <= cache.max_bytes and pair.client.registered_count() <= base + 2
    across = big[window - PAGE : window + PAGE]  # a view across two windows
    region, offset, temps = pair.client.host_region(across, writes=False)
    assert (region.addr, region.nbytes, offset) == (big.ctypes.data, 2 * window, window - PAGE)
    pair.client.release_temps(temps, TIMEOUT_S)


def test_10000_user_registrations_come_and_go(pair: Pair) -> None:
    """Register views and arrays, deregister in another order: every index is emptied."""
    engine = pair.client
    base = engine.registered_count()
    big = np.zeros(5000 * 64, np.uint8)
    arrays = [np.zeros(64, np.uint8) for _ in range(5000)]
    regions = [engine.register(big[i * 64 : (i + 1) * 64], "r") for i in range(5000)]
    regions += [engine.register(a, "r") for a in arrays]
    assert engine.registered_count() == base + 10_000
    region, offset, temps = engine.host_region(big[64 * 17 : 64 * 18], writes=False)
    assert region is regions[17] and offset == 0 and not temps
    random.Random(3).shuffle(regions)
    for r in regions:
        r.deregister()
    assert engine.registered_count() == base
    assert not engine._by_range and not any(len(c) for c in engine._covers.values())


def test_the_cover_index_answers_as_a_search_of_every_range(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(SortedInts, "LOAD", 4)  # many blocks, splits and drops
    for trial in range(60):
        rnd = random.Random(trial)
        index: CoverIndex[int] = CoverIndex()
        live: dict[int, tuple[int, int]] = {}
        for key in range(400):
            if rnd.random() < 0.55 or not live:
                start, length = rnd.randrange(200), rnd.randrange(30)
                index.add(key, start, length, key)
                live[key] = (start, start + length)
            else:
                gone = rnd.choice(sorted(live))
                index.remove(gone)
                del live[gone]
            addr, nbytes = rnd.randrange(210), rnd.randrange(20)
            found = index.find(addr, nbytes)
            expected = [k for k, (s, e) in live.items() if s <= addr and addr + nbytes <= e]
            assert (found is not None) == bool(expected), (trial, key)
            assert found is None or found in expected
        assert len(index) == len(live)


@pytest.mark.parametrize("name", ["RDMAXFER_REGCACHE_ENTRIES", "RDMAXFER_REGCACHE_BYTES"])
def test_a_bad_cache_bound_raises_naming_the_variable(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(name, "lots")
    with pytest.raises(InvalidArgumentError, match=rf"{name}='lots' must be an integer >= 0"):
        Engine("tcp").close()
    monkeypatch.setenv(name, "7")
    with Engine("tcp") as engine:
        bounds = (engine._temps.max_entries, engine._temps.max_bytes)
        assert bounds[name.endswith("BYTES")] == 7
