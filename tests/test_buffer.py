"""Buffer, MemoryRegion and as_array: zero-copy views, refusals, registration lifecycle."""

from __future__ import annotations

import array
import gc
import weakref
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from _peers import make_array, same_bytes
from rdmaxfer import Buffer, Engine, InvalidArgumentError, MemoryRegion, ProtocolError, _core
from rdmaxfer.memory.buffer import as_array


class InterfaceOnly:
    """Exposes memory only through __array_interface__."""

    def __init__(self, arr: np.ndarray) -> None:
        self._arr = arr
        self.__array_interface__ = arr.__array_interface__


class DLPackOnly:
    """Exposes memory only through __dlpack__ (like a CPU tensor of another library)."""

    def __init__(self, arr: np.ndarray) -> None:
        self._arr = arr

    def __dlpack__(self, **kwargs: Any) -> Any:
        return self._arr.__dlpack__(**kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._arr.__dlpack_device__()


class OwnedBytes(bytearray):
    """A bytearray that can be weak-referenced (to watch its lifetime)."""


def _shares(view: np.ndarray, base: Any) -> bool:
    return bool(np.shares_memory(view, np.asarray(base)))


# --- as_array ---------------------------------------------------------------------------------


def _exporter(kind: str, data: bytes) -> tuple[Any, Any]:
    """An object of the given kind over ``data``, and a function reading its first 4 bytes."""
    if kind == "bytearray":
        ba = bytearray(data)
        return ba, lambda: bytes(ba[:4])
    if kind == "array":
        aa = array.array("B", data)
        return aa, lambda: aa[:4].tobytes()
    backing = np.frombuffer(data, dtype=np.uint8).copy()
    wrapper = {
        "ndarray": lambda: backing,
        "memoryview": lambda: memoryview(backing),
        "interface": lambda: InterfaceOnly(backing),
        "dlpack": lambda: DLPackOnly(backing),
    }[kind]()
    return wrapper, lambda: backing[:4].tobytes()


@pytest.mark.parametrize(
    "kind", ["ndarray", "bytearray", "memoryview", "array", "interface", "dlpack"]
)
def test_as_array_is_zero_copy_for_every_exporter(kind: str, rng: np.random.Generator) -> None:
    data = rng.integers(1, 200, size=64, dtype=np.uint8).tobytes()
    obj, first4 = _exporter(kind, data)
    view = as_array(obj, writable=True)
    assert view.nbytes == 64 and view.tobytes() == data
    view.reshape(-1).view(np.uint8)[:4] = [201, 202, 203, 204]
    assert first4() == bytes([201, 202, 203, 204]), "the write must land in the exporter's memory"


def test_as_array_keeps_dtype_and_shape(rng: np.random.Generator) -> None:
    arr = make_array(int(rng.integers(1, 1000)), (3, 5), np.float32)
    view = as_array(arr, writable=False)
    assert view is arr
    typed = as_array(array.array("f", arr.reshape(-1).tolist()), writable=False)
    assert typed.dtype == np.float32 and typed.shape == (15,)


@pytest.mark.parametrize(
    "make",
    [
        lambda a: a[:, ::2],
        lambda a: a.T,
        lambda a: a[::-1],
    ],
    ids=["strided-columns", "transposed", "reversed"],
)
def test_non_contiguous_is_refused_with_strides_and_fix(make: Any) -> None:
    base = make_array(7, (6, 8), np.float32)
    view = make(base)
    with pytest.raises(InvalidArgumentError, match=r"not C-contiguous.*strides are \(") as info:
        as_array(view, writable=False)
    assert str(view.strides) in str(info.value)
    assert "np.ascontiguousarray" in str(info.value)
    # the fix works
    assert as_array(np.ascontiguousarray(view), writable=False).flags.c_contiguous


def test_read_only_refused_as_destination_but_fine_as_source() -> None:
    ro = make_array(11, 32)
    ro.flags.writeable = False
    assert as_array(ro, writable=False) is ro
    with pytest.raises(InvalidArgumentError, match=r"read-only and cannot receive data"):
        as_array(ro, writable=True)
    with pytest.raises(InvalidArgumentError, match=r"read-only"):
        as_array(b"immutable bytes", writable=True)


def test_object_dtype_and_plain_python_objects_are_refused() -> None:
    with pytest.raises(InvalidArgumentError, match=r"Python object pointers"):
        as_array(np.array([object(), 1], dtype=object), writable=False)
    with pytest.raises(InvalidArgumentError, match=r"exposes neither the buffer protocol"):
        as_array([1, 2, 3], writable=False)


def test_as_array_reads_a_core_region_through_the_buffer_protocol(server: Engine) -> None:
    region = server.alloc_pinned(100, "none")
    raw = memoryview(region.core)
    assert raw.nbytes == 100 and not raw.readonly
    view = as_array(region.core, writable=True)
    view[:] = make_array(3, 100)
    assert bytes(raw) == make_array(3, 100).tobytes()


# --- Buffer -----------------------------------------------------------------------------------


def test_wrap_is_zero_copy_and_numpy_sees_it(rng: np.random.Generator) -> None:
    arr = make_array(int(rng.integers(1, 1000)), (4, 6), np.int16)
    buf = Buffer.wrap(arr)
    assert buf.shape == (4, 6) and buf.dtype == np.int16 and buf.nbytes == 48
    assert buf.region is None and not buf.readonly
    for view in (buf.numpy(), np.asarray(buf), np.from_dlpack(buf)):
        assert _shares(view, arr)
        assert same_bytes(view, arr)
    np.asarray(buf)[0, 0] = 12345
    assert arr[0, 0] == 12345


def test_wrap_refuses_non_contiguous() -> None:
    arr = make_array(5, (8, 8), np.float64)
    with pytest.raises(InvalidArgumentError, match=r"strides"):
        Buffer.wrap(arr[:, 1])


def test_wrap_of_bytes_is_read_only_and_cannot_receive() -> None:
    buf = Buffer.wrap(b"\x01\x02\x03")
    assert buf.readonly
    with pytest.raises(InvalidArgumentError, match=r"read-only"):
        as_array(buf, writable=True)


@pytest.mark.parametrize("dtype", [np.uint8, np.int16, np.float32, np.float64, ml_dtypes.bfloat16])
def test_empty_pinned_has_dtype_shape_and_is_registered(server: Engine, dtype: Any) -> None:
    with Buffer.empty((3, 7), dtype, engine=server) as buf:
        arr = buf.numpy()
        assert arr.dtype == np.dtype(dtype) and arr.shape == (3, 7)
        assert buf.region is not None and buf.region.pinned and buf.region.registered
        assert buf.region.addr % 4096 == 0, "pinned memory is page-aligned"
        assert buf.region.nbytes == arr.nbytes
        fill = make_array(21, (3, 7), dtype)
        arr[...] = fill
        # the raw bytes of the underlying _core.Region are the array's bytes
        assert bytes(memoryview(buf.region.core)) == fill.tobytes()
        region = buf.region
    assert not region.registered
    assert same_bytes(buf.numpy(), fill), "the memory outlives the registration"


def test_empty_pinned_zero_bytes(server: Engine) -> None:
    buf = Buffer.empty((0, 4), np.float32, engine=server)
    assert buf.shape == (0, 4) and buf.nbytes == 0
    assert buf.region is not None and buf.region.nbytes == 0
    buf.close()


def test_empty_unpinned(server: Engine) -> None:
    plain = Buffer.empty(10, np.float64, pinned=False)
    assert plain.region is None and plain.shape == (10,)
    registered = Buffer.empty(10, np.float64, pinned=False, engine=server, access="r")
    assert registered.region is not None and registered.region.access == "r"
    assert not registered.region.pinned


def test_empty_refuses_bad_shape_and_access(server: Engine) -> None:
    with pytest.raises(InvalidArgumentError, match=r"dimension must be an integer >= 0"):
        Buffer.empty((2, -1), np.uint8, engine=server)
    with pytest.raises(InvalidArgumentError, match=r"access='x' is not one of"):
        Buffer.empty(4, np.uint8, engine=server, access="x")


def test_bfloat16_buffer_leaves_through_dlpack_with_its_bits(server: Engine) -> None:
    import torch

    buf = Buffer.empty(4, ml_dtypes.bfloat16, engine=server)
    buf.numpy()[...] = make_array(9, 4, ml_dtypes.bfloat16)
    view = np.asarray(buf)
    assert view.dtype == ml_dtypes.bfloat16, "np.asarray keeps the extension dtype"
    assert _shares(view, buf.numpy()) and same_bytes(view, make_array(9, 4, ml_dtypes.bfloat16))
    tensor = torch.from_dlpack(buf)  # DLPack's bfloat16 code: a zero-copy torch view
    assert tensor.dtype == torch.bfloat16 and tensor.data_ptr() == buf.addr
    assert tensor.view(torch.int16).numpy().tobytes() == view.tobytes()
    with pytest.raises(RuntimeError, match="Unsupported dtype"):
        np.from_dlpack(buf)  # NumPy has no bfloat16: its own refusal


# --- MemoryRegion and the engine's registrations ----------------------------------------------


def test_register_gives_a_descriptor_naming_the_memory(server: Engine, transport: str) -> None:
    arr = make_array(31, 4096)
    region = server.register(arr, "rw")
    assert isinstance(region, MemoryRegion)
    assert region.registered and region.key != 0 and region.access == "rw"
    assert region.addr == arr.__array_interface__["data"][0] and region.nbytes == 4096
    desc = region.descriptor()
    assert (desc.addr, desc.length, desc.key) == (region.addr, 4096, region.key)
    assert desc.engine_id == server.engine_id and desc.transport == transport
    packed = desc.pack()
    assert len(packed) == _core.Descriptor.SIZE == 40
    again = _core.Descriptor.unpack(packed)
    assert (again.addr, again.length, again.key, again.access) == (
        desc.addr,
        desc.length,
        desc.key,
        desc.access,
    )


def test_descriptor_unpack_refuses_bad_bytes(server: Engine) -> None:
    packed = bytearray(server.register(make_array(1, 64), "r").descriptor().pack())
    with pytest.raises(ProtocolError, match=r"expected 40 bytes, got 39"):
        _core.Descriptor.unpack(bytes(packed[:-1]))
    packed[0:4] = b"NOPE"
    with pytest.raises(ProtocolError, match=r"bad magic"):
        _core.Descriptor.unpack(bytes(packed))


def test_registration_cache_returns_the_same_region_until_deregistered(server: Engine) -> None:
    arr = make_array(41, (16, 16), np.float32)
    first = server.register(arr, "rw")
    count = server.registered_count()
    assert server.register(arr, "rw") is first
    assert server.register(arr.view(), "rw") is first, "same memory, same registration"
    assert server.registered_count() == count
    other_access = server.register(arr, "r")
    assert other_access is not first and other_access.access == "r"
    first.deregister()
    assert not first.registered
    fresh = server.register(arr, "rw")
    assert fresh is not first and fresh.registered
    assert server.registered_count() == count + 1  # first gone; the 'r' one and fresh live


def test_deregister_and_close_are_idempotent(server: Engine) -> None:
    region = server.register(make_array(2, 128), "w")
    before = server.registered_count()
    region.deregister(timeout=5)
    region.deregister(timeout=5)
    region.close()
    assert not region.registered
    assert server.registered_count() == before - 1
    with pytest.raises(InvalidArgumentError, match=r"was deregistered"):
        region.descriptor()


def test_region_is_a_context_manager(server: Engine) -> None:
    with server.register(make_array(3, 64), "rw") as region:
        assert region.registered
    assert not region.registered


def test_read_only_memory_cannot_be_exposed_for_remote_writes(server: Engine) -> None:
    ro = make_array(4, 256)
    ro.flags.writeable = False
    for access in ("w", "rw"):
        with pytest.raises(InvalidArgumentError, match=r"read-only memory .* cannot be registered"):
            server.register(ro, access)
    assert server.register(ro, "r").access == "r"
    assert server.register(b"constant bytes", "r").nbytes == len(b"constant bytes")


def test_register_refuses_unknown_access(server: Engine) -> None:
    with pytest.raises(InvalidArgumentError, match=r"not one of 'rw', 'r', 'w', 'none'"):
        server.register(make_array(5, 8), "read")


def test_region_keeps_its_owner_alive_until_deregistered(server: Engine) -> None:
    owner = OwnedBytes(make_array(6, 512).tobytes())
    ref = weakref.ref(owner)
    region = server.register(owner, "rw")
    del owner
    gc.collect()
    assert ref() is not None, "a registered region must keep its memory alive"
    assert bytes(region.numpy()) == make_array(6, 512).tobytes()
    region.deregister()
    del region
    gc.collect()
    assert ref() is None, "after deregistration nothing holds the memory"


def test_engine_close_deregisters_everything() -> None:
    engine = Engine("tcp")
    regions = [engine.register(make_array(i, 64 + i), "rw") for i in range(5)]
    pinned = engine.alloc_pinned(1000, "r")
    engine.close()
    assert not any(r.registered for r in [*regions, pinned])
    engine.close()  # idempotent


def test_buffer_register_and_descriptor(server: Engine) -> None:
    buf = Buffer.wrap(make_array(8, (2, 2), np.float64))
    with pytest.raises(InvalidArgumentError, match=r"not registered"):
        buf.descriptor()
    region = buf.register(server, "r")
    assert buf.region is region and buf.descriptor().key == region.key
    assert server.register(buf, "r") is region
