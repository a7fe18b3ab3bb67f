"""DLPack dtypes NumPy lacks (bfloat16, float8, packed sub-byte) from torch or any producer:
viewed with the bits kept, sent, received into, registered, and exported back. TCP here; the
verbs twin is tests/rdma/test_rdma_dlpack.py."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import pytest
import torch

from _common import Pair
from _dlpack_cases import TORCH_TO_ML, one_sided, random_tensor, send_recv_both_ways, tensor_bytes
from rdmaxfer import Buffer, InvalidArgumentError, _core, as_array
from rdmaxfer.memory import dlpack as _dlpack


def test_bfloat16_tensor_is_viewed_with_its_bits() -> None:
    t = torch.tensor([1.0, -2.0, 0.5], dtype=torch.bfloat16)
    arr = as_array(t, writable=True)
    assert arr.dtype == np.dtype(ml_dtypes.bfloat16)
    assert arr.view(np.uint16).tolist() == [0x3F80, 0xC000, 0x3F00]
    assert arr.ctypes.data == t.data_ptr()  # a view, not a copy
    arr[1] = 4.0
    assert t[1].item() == 4.0


def test_a_tensor_of_no_element_is_contiguous_whatever_its_strides() -> None:
    """torch gives an empty tensor's DLPack view zero strides: it is still a destination."""
    t = torch.zeros((0, 512), dtype=torch.int64)
    arr = as_array(t, writable=True)
    assert arr.shape == (0, 512) and arr.dtype == np.int64
    with pytest.raises(InvalidArgumentError, match="not C-contiguous"):
        as_array(torch.zeros((4, 6)).t(), writable=True)


@pytest.mark.parametrize("dtype", list(TORCH_TO_ML), ids=str)
def test_every_mapped_torch_dtype_keeps_its_bits(dtype: torch.dtype) -> None:
    t = random_tensor(7, (5, 6), dtype)
    arr = as_array(t, writable=False)
    assert arr.dtype == np.dtype(TORCH_TO_ML[dtype]) and arr.shape == (5, 6)
    assert arr.tobytes() == tensor_bytes(t)


def test_torch_float4_x2_is_viewed_as_its_bytes() -> None:
    raw = torch.tensor([0x21, 0x7F, 0x80, 0xF3], dtype=torch.uint8)
    t = raw.view(torch.float4_e2m1fn_x2)  # DLPack code 17, bits 4, lanes 2: a byte per element
    arr = as_array(t, writable=False)
    assert arr.dtype == np.uint8 and arr.shape == (4,)
    assert arr.tolist() == [0x21, 0x7F, 0x80, 0xF3]


class _Producer:
    """A minimal DLPack producer (legacy capsule) of ``count`` packed values of ``bits`` bits
    over the bytes of ``backing``."""

    def __init__(self, backing: np.ndarray, code: int, bits: int, count: int) -> None:
        self.backing, self.code, self.bits, self.count = backing, code, bits, count

    def __dlpack__(self, **kwargs: Any) -> Any:
        ptr = int(self.backing.ctypes.data)
        return _core.dlpack_capsule(self, ptr, 1, 0, [self.count], self.code, self.bits)

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)


@pytest.mark.parametrize(("code", "bits"), [(17, 4), (0, 4), (1, 2), (15, 6)])
def test_packed_sub_byte_tensors_are_viewed_as_their_bytes(code: int, bits: int) -> None:
    backing = np.random.default_rng(3).integers(1, 256, size=6, dtype=np.uint8)
    count = 6 * 8 // bits
    arr = as_array(_Producer(backing, code, bits, count), writable=True)
    assert arr.dtype == np.uint8 and arr.shape == (6,)
    assert arr.ctypes.data == backing.ctypes.data
    assert arr.tolist() == backing.tolist()


def test_packed_values_that_do_not_fill_bytes_are_refused() -> None:
    producer = _Producer(np.zeros(3, np.uint8), 17, 4, 5)
    with pytest.raises(InvalidArgumentError, match=r"5 packed 4-bit values.*whole bytes"):
        as_array(producer, writable=False)


def test_unknown_dlpack_code_names_code_and_bits() -> None:
    producer = _Producer(np.zeros(4, np.uint8), 3, 32, 1)  # kDLOpaqueHandle
    with pytest.raises(InvalidArgumentError, match="DLPack dtype code 3 bits 32 lanes 1"):
        as_array(producer, writable=False)


class _ReadOnly:
    """A producer whose versioned capsule flags the memory read-only (like JAX's)."""

    def __init__(self, array: np.ndarray) -> None:
        self.array = array

    def __dlpack__(self, **kwargs: Any) -> Any:
        return self.array.__dlpack__(**kwargs)


def test_versioned_read_only_capsule_is_not_a_destination() -> None:
    src = np.arange(6, dtype=np.float32)
    src.flags.writeable = False
    view = as_array(_ReadOnly(src), writable=False)
    assert view.ctypes.data == src.ctypes.data and not view.flags.writeable
    with pytest.raises(InvalidArgumentError, match="read-only"):
        as_array(_ReadOnly(src), writable=True)


def test_buffer_exports_bfloat16_and_float8_to_torch() -> None:
    for ml, torch_dtype in [
        (ml_dtypes.bfloat16, torch.bfloat16),
        (ml_dtypes.float8_e4m3fn, torch.float8_e4m3fn),
    ]:
        arr = np.array([1.0, -2.0, 0.5], dtype=ml)
        buf = Buffer.wrap(arr)
        t = torch.from_dlpack(buf)
        assert t.dtype == torch_dtype and t.data_ptr() == arr.ctypes.data
        assert t.tolist() == [1.0, -2.0, 0.5]
    assert torch.from_dlpack(Buffer.wrap(arr.view(np.uint8))).dtype == torch.uint8


def test_buffer_refuses_dtypes_dlpack_cannot_name() -> None:
    with pytest.raises(BufferError, match="int4 has no DLPack type code"):
        Buffer.wrap(np.zeros(4, ml_dtypes.int4)).__dlpack__()
    frozen = np.zeros(4, ml_dtypes.bfloat16)
    frozen.flags.writeable = False
    with pytest.raises(BufferError, match="read-only"):
        Buffer.wrap(frozen).__dlpack__()


def test_parse_reads_versioned_capsules() -> None:
    t = torch.tensor([1.0, 2.0], dtype=torch.bfloat16)
    view = _dlpack.parse(t.__dlpack__(max_version=(1, 0)))
    assert (view.ptr, view.shape, view.dtype, view.readonly) == (
        t.data_ptr(),
        (2,),
        np.dtype(ml_dtypes.bfloat16),
        False,
    )


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn], ids=str)
def test_send_and_recv_torch_tensors_over_tcp(pair: Pair, dtype: torch.dtype) -> None:
    send_recv_both_ways(pair.a, pair.b, dtype, seed=11)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e5m2], ids=str)
def test_register_write_read_torch_tensors_over_tcp(pair: Pair, dtype: torch.dtype) -> None:
    one_sided(pair.server, pair.a, dtype, seed=12)


def test_api_send_recv_torch_bfloat16() -> None:
    import threading

    import rdmaxfer

    src = random_tensor(13, (64,), torch.bfloat16)
    got: dict[str, np.ndarray] = {}
    with rdmaxfer.Engine("tcp") as engine:
        port = engine.listen("127.0.0.1", 0)

        def receive() -> None:
            with engine.accept(timeout=30) as ep:
                got["x"] = ep.recv(timeout=30)

        thread = threading.Thread(target=receive)
        thread.start()
        rdmaxfer.send(src, to=f"127.0.0.1:{port}", timeout=30)
        thread.join(30)
    assert got["x"].dtype == np.dtype(ml_dtypes.bfloat16)
    assert got["x"].tobytes() == tensor_bytes(src)
