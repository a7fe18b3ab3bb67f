"""Endpoint, one-sided: WRITE/READ between two engines in this process (offsets, every size,
typed arrays, many in flight) and their refusals: ranges out of bounds, access the region lacks,
deregistered keys, read-only memory, bad descriptor bytes, local ranges."""

from __future__ import annotations

import time

import ml_dtypes
import numpy as np
import pytest

from _common import Pair
from _peers import make_array, same_bytes
from rdmaxfer import Engine, InvalidArgumentError, ProtocolError, RemoteAccessError

MiB = 1 << 20
SIZES = [0, 1, 4095, MiB + 3]


def test_write_and_read_with_offsets(pair: Pair, seed: int) -> None:
    target = make_array(seed, 10_000)
    region = pair.server.register(target, "rw")
    src = make_array(seed + 1, 3000)
    pair.a.write(src, region.descriptor(), offset=100, remote_offset=4321, nbytes=2500, timeout=30)
    expected = make_array(seed, 10_000)
    expected[4321 : 4321 + 2500] = src[100:2600]
    assert same_bytes(target, expected)
    back = make_array(seed + 2, 6000)
    before = back.copy()
    pair.a.read(back, region.descriptor().pack(), offset=7, remote_offset=4000, nbytes=5000)
    before[7:5007] = expected[4000:9000]
    assert same_bytes(back, before)


@pytest.mark.parametrize("nbytes", SIZES)
def test_write_read_sizes(pair: Pair, nbytes: int, seed: int) -> None:
    target = np.empty(nbytes, np.uint8)
    region = pair.server.register(target, "rw")
    src = make_array(seed, nbytes)
    pair.a.write(src, region, timeout=30)
    assert same_bytes(target, src)
    back = make_array(seed + 1, nbytes)
    pair.a.read(back, region.descriptor(), timeout=30)
    assert same_bytes(back, src)


def test_write_of_typed_arrays_between_pinned_buffers(pair: Pair, seed: int) -> None:
    from rdmaxfer import Buffer

    remote = Buffer.empty((128, 3), ml_dtypes.bfloat16, engine=pair.server, access="w")
    local = Buffer.empty((128, 3), ml_dtypes.bfloat16, engine=pair.client, access="none")
    local.numpy()[...] = make_array(seed, (128, 3), ml_dtypes.bfloat16)
    pair.a.write(local, remote.descriptor(), timeout=30)
    assert same_bytes(remote.numpy(), local.numpy())


def test_many_writes_and_reads_in_flight(pair: Pair, seed: int) -> None:
    sizes = [1 + 1021 * k for k in range(64)]
    offsets = np.cumsum([0, *sizes])
    total = int(offsets[-1])
    target = np.empty(total, np.uint8)
    source_remote = make_array(seed, total)
    t_region = pair.server.register(target, "w")
    s_region = pair.server.register(source_remote, "r")
    src = make_array(seed + 1, total)
    dst = np.empty(total, np.uint8)
    transfers = []
    for k, n in enumerate(sizes):
        off = int(offsets[k])
        transfers.append(
            pair.a.post_write(src, t_region.descriptor(), offset=off, remote_offset=off, nbytes=n)
        )
        transfers.append(
            pair.a.post_read(dst, s_region.descriptor(), offset=off, remote_offset=off, nbytes=n)
        )
    # (How many are still in flight here depends on timing; they were all posted first.)
    for t in transfers:
        t.wait(60)
    assert all(t.done() and not t.failed() for t in transfers)
    assert same_bytes(target, src) and same_bytes(dst, source_remote)
    assert pair.a.inflight == 0


@pytest.mark.parametrize("n", [200, MiB], ids=["one-chunk", "many-chunks"])
def test_out_of_bounds_write_and_read_are_refused(pair: Pair, n: int, seed: int) -> None:
    """Checked against the descriptor before posting: refused whole (no chunk lands, even of a
    multi-chunk write), InvalidArgumentError, and the endpoint stays up."""
    size = 4 * MiB
    target = make_array(seed, size)
    before = target.copy()
    region = pair.server.register(target, "rw")
    src = make_array(seed + 1, n)
    with pytest.raises(InvalidArgumentError, match=r"outside the remote region.*nothing was sent"):
        pair.a.post_write(
            src, region.descriptor(), remote_offset=size - n + 1, chunk_size=64 * 1024
        )
    assert pair.a.inflight == 0
    time.sleep(0.2)  # a chunk that had been posted would have landed by now
    assert same_bytes(target, before), "a refused write changes nothing"
    with pytest.raises(InvalidArgumentError, match=r"outside the remote region"):
        pair.a.read(np.empty(n, np.uint8), region.descriptor(), remote_offset=size - n + 1)
    assert not pair.a.closed and not pair.b.closed
    pair.a.write(src, region.descriptor(), remote_offset=size - n, timeout=10)  # the last n
    before[size - n :] = src
    assert same_bytes(target, before)


def test_write_to_read_only_region_and_read_of_write_only_region_are_refused(
    pair: Pair, seed: int
) -> None:
    target = make_array(seed, 1024)
    before = target.copy()
    readable = pair.server.register(target, "r")
    with pytest.raises(RemoteAccessError, match=r"does not allow"):
        pair.a.write(make_array(seed + 1, 1024), readable.descriptor(), timeout=10)
    assert same_bytes(target, before)
    writable_only = pair.server.register(make_array(seed + 2, 64), "w")
    with pytest.raises(RemoteAccessError, match=r"does not allow"):
        pair.a.read(np.empty(64, np.uint8), writable_only.descriptor(), timeout=10)


def test_deregistered_key_is_refused(pair: Pair, seed: int) -> None:
    target = make_array(seed, 512)
    before = target.copy()
    region = pair.server.register(target, "rw")
    descriptor = region.descriptor()
    region.deregister(timeout=10)
    with pytest.raises(RemoteAccessError, match=r"no registered region has this key"):
        pair.a.write(make_array(seed + 1, 512), descriptor, timeout=10)
    assert same_bytes(target, before)


def test_a_descriptor_of_another_engine_is_refused(pair: Pair, transport: str, seed: int) -> None:
    """A descriptor of an engine other than the endpoint's peer (passed to the wrong endpoint)
    is refused before anything moves, naming both engines."""
    target = np.zeros(512, np.uint8)
    ours = pair.server.register(target, "rw").descriptor()
    with Engine(transport) as other:
        theirs = other.register(np.zeros(512, np.uint8), "rw").descriptor()
        for attempt in (
            lambda: pair.a.write(make_array(seed, 512), theirs, timeout=10),
            lambda: pair.a.read(np.zeros(512, np.uint8), theirs, timeout=10),
        ):
            with pytest.raises(InvalidArgumentError) as caught:
                attempt()
            message = str(caught.value)
            assert f"{other.engine_id:016x}" in message
            assert f"engine {pair.server.engine_id:016x}" in message
    assert not target.any()
    pair.a.write(make_array(seed, 512), ours, timeout=10)
    assert same_bytes(target, make_array(seed, 512))


def test_read_only_memory_is_a_source_only(pair: Pair, seed: int) -> None:
    """Rights from use: read-only memory registers without local write; a READ or RECV into it
    is refused before anything is posted, and the endpoint stays up."""
    frozen = make_array(seed, 4096)
    frozen.flags.writeable = False
    region = pair.server.register(frozen, "r")
    assert not region.core.local_write
    assert pair.server.register(make_array(seed + 1, 64), "r").core.local_write  # writable
    source_only = pair.server.register(make_array(seed + 2, 64), "r", local_write=False)
    assert not source_only.core.local_write
    with pytest.raises(InvalidArgumentError, match=r"local_write=True"):
        pair.server.register(frozen, "none", local_write=True)
    remote = pair.client.register(make_array(seed + 3, 4096), "rw")
    for local in (region, source_only):
        with pytest.raises(InvalidArgumentError, match=r"READ: .*without local write access"):
            pair.b.core.post_read(local.core, 0, remote.descriptor(), 0, 64)
    back = np.zeros(4096, np.uint8)
    pair.a.read(back, region.descriptor(), timeout=10)  # served to a remote READ
    assert same_bytes(back, frozen)
    pair.b.read(back, remote.descriptor(), timeout=10)  # and the endpoint still works
    assert same_bytes(back, make_array(seed + 3, 4096))
    assert not pair.a.closed and not pair.b.closed


def test_bad_descriptor_bytes_are_a_protocol_error(pair: Pair, seed: int) -> None:
    good = bytearray(pair.server.register(make_array(seed, 64), "rw").descriptor().pack())
    src = make_array(seed + 1, 64)
    with pytest.raises(ProtocolError, match=r"invalid memory descriptor.*expected 40 bytes"):
        pair.a.write(src, bytes(good[:20]))
    bad_version = bytearray(good)
    bad_version[4:6] = (7).to_bytes(2, "little")
    with pytest.raises(ProtocolError, match=r"unsupported version 7"):
        pair.a.write(src, bytes(bad_version))
    with pytest.raises(ProtocolError, match=r"bad magic"):
        pair.a.read(np.empty(64, np.uint8), make_array(seed + 2, 40).tobytes())
    with pytest.raises(InvalidArgumentError, match=r"does not name a registered region"):
        pair.a.write(src, "descriptor")  # type: ignore[arg-type]


def test_local_range_is_checked(pair: Pair, seed: int) -> None:
    region = pair.server.register(np.empty(100, np.uint8), "rw")
    src = make_array(seed, 50)
    with pytest.raises(InvalidArgumentError, match=r"offset=51 is outside"):
        pair.a.write(src, region.descriptor(), offset=51)
    with pytest.raises(InvalidArgumentError, match=r"past the end"):
        pair.a.write(src, region.descriptor(), offset=10, nbytes=41)
    with pytest.raises(InvalidArgumentError, match=r"remote_offset=-1"):
        pair.a.write(src, region.descriptor(), remote_offset=-1)
    ro = make_array(seed, 50)
    ro.flags.writeable = False
    with pytest.raises(InvalidArgumentError, match=r"read-only"):
        pair.a.read(ro, region.descriptor())
