"""DLPack, the C ABI by which PyTorch, JAX, CuPy, NumPy... hand each other tensors (private).

Reads a producer's capsule without copying: the legacy ``"dltensor"`` capsule and DLPack 1.x's
``"dltensor_versioned"`` (whose flags carry read-only). The capsule is not consumed: it stays
alive as long as the view, and the producer's deleter runs when both are gone.

dtypes (``DLDataType`` code, bits): NumPy's integer, float, complex and bool types, plus the
ones NumPy lacks, as ``ml_dtypes`` types with the same bits (a DLPack bfloat16 1.0 is the word
0x3F80 and so is an ``ml_dtypes.bfloat16`` 1.0): bfloat16 (code 4) and the float8 codes 7-14
(e3m4, e4m3, e4m3b11fnuz, e4m3fn, e4m3fnuz, e5m2, e5m2fnuz, e8m0fnu).

Sub-byte codes (int/uint of 1, 2 or 4 bits, float6 codes 15-16, float4 code 17) are packed in
memory (element i at bits ``i * bits`` of the buffer, little bit-endian), which no NumPy or
ml_dtypes dtype represents (``ml_dtypes.int4`` and ``float4_e2m1fn`` take one byte per value).
Such a tensor is viewed as its bytes, unchanged: ``uint8`` of the tensor's shape when
``bits * lanes == 8`` (one byte per element, as PyTorch's ``float4_e2m1fn_x2``), else ``uint8``
of shape ``(nbytes,)``.

Source of the codes: dlpack.h 1.1 (``DLDataTypeCode``), as shipped in PyTorch's include/ATen.
"""

from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from ..errors import InvalidArgumentError
from .allocation import Allocation, torch_storage
from .dtypes import DtypeTable

__all__ = [
    "HOST_DEVICES",
    "KDL_CPU",
    "KDL_CUDA",
    "KDL_CUDA_HOST",
    "KDL_CUDA_MANAGED",
    "DLView",
    "check_contiguous",
    "contiguous_fix",
    "dtype_code",
    "host_array",
    "parse",
]

KDL_CPU = 1
KDL_CUDA = 2
KDL_CUDA_HOST = 3
KDL_CUDA_MANAGED = 13
KDL_ROCM_HOST = 11
HOST_DEVICES = (KDL_CPU, KDL_CUDA_HOST, KDL_ROCM_HOST)
"""Device types whose memory the CPU addresses directly (``kDLCPU``, ``kDLCUDAHost``,
``kDLROCMHost``)."""

_READ_ONLY_FLAG = 1  # DLPACK_FLAG_BITMASK_READ_ONLY


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [
        ("dl_tensor", _DLTensor),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", ctypes.c_void_p),
    ]


class _DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class _DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [
        ("version", _DLPackVersion),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", ctypes.c_void_p),
        ("flags", ctypes.c_uint64),
        ("dl_tensor", _DLTensor),
    ]


# (DLDataTypeCode, bits) -> dtype (ml_dtypes is imported on the first lookup of one of its types).
_DTYPES: DtypeTable[tuple[int, int]] = DtypeTable(
    [
        ((0, 8), np.dtype(np.int8)),
        ((0, 16), np.dtype(np.int16)),
        ((0, 32), np.dtype(np.int32)),
        ((0, 64), np.dtype(np.int64)),
        ((1, 8), np.dtype(np.uint8)),
        ((1, 16), np.dtype(np.uint16)),
        ((1, 32), np.dtype(np.uint32)),
        ((1, 64), np.dtype(np.uint64)),
        ((2, 16), np.dtype(np.float16)),
        ((2, 32), np.dtype(np.float32)),
        ((2, 64), np.dtype(np.float64)),
        ((4, 16), "bfloat16"),
        ((5, 64), np.dtype(np.complex64)),
        ((5, 128), np.dtype(np.complex128)),
        ((6, 8), np.dtype(np.bool_)),
        ((7, 8), "float8_e3m4"),
        ((8, 8), "float8_e4m3"),
        ((9, 8), "float8_e4m3b11fnuz"),
        ((10, 8), "float8_e4m3fn"),
        ((11, 8), "float8_e4m3fnuz"),
        ((12, 8), "float8_e5m2"),
        ((13, 8), "float8_e5m2fnuz"),
        ((14, 8), "float8_e8m0fnu"),
    ]
)
# Sub-byte (packed) codes and the bit widths DLPack defines for them.
_PACKED: dict[int, tuple[int, ...]] = {0: (1, 2, 4), 1: (1, 2, 4), 15: (6,), 16: (6,), 17: (4,)}


@dataclass(frozen=True)
class DLView:
    """What a capsule describes. ``ptr`` includes ``byte_offset`` (bytes from the tensor's data
    pointer); ``shape`` and ``dtype`` are those of the NumPy view (see the module docstring for
    sub-byte types); ``nbytes`` is the size of the data in bytes."""

    ptr: int
    shape: tuple[int, ...]
    dtype: np.dtype[Any]
    device_type: int
    device_id: int
    readonly: bool
    byte_offset: int = 0

    @property
    def nbytes(self) -> int:
        """Size in bytes."""
        return math.prod(self.shape) * self.dtype.itemsize


def dtype_code(dtype: np.dtype[Any]) -> tuple[int, int]:
    """``(DLDataTypeCode, bits)`` of ``dtype``.

    Raises:
        InvalidArgumentError: DLPack has no code for it (ml_dtypes' one-byte-per-value int4,
            float4... types: DLPack's sub-byte codes mean packed values).
    """
    found = _DTYPES.key_of(dtype)
    if found is None:
        raise InvalidArgumentError(f"dtype {dtype} has no DLPack type code")
    return found


def _c_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    strides = []
    step = itemsize
    for dim in reversed(shape):
        strides.append(step)
        step *= max(dim, 1)
    return tuple(reversed(strides))


def contiguous_fix(writable: bool | None) -> str:
    """How to pass a non-contiguous array to a transfer, for an error message: a source as a
    contiguous copy; a destination (``writable``) not so, as a copy would receive the data and
    the caller's array would not, but as a contiguous array copied into the view after; both
    when which is not known (None)."""
    source = "pass a contiguous copy (np.ascontiguousarray(x) / x.contiguous())"
    destination = (
        "receive into a contiguous array (np.empty(x.shape, x.dtype)) and copy it into this "
        "view after (x[...] = received): a contiguous copy of x would receive the data, not x"
    )
    if writable is None:
        return f"as a source, {source}; as a destination, {destination}"
    return destination if writable else source


def check_contiguous(
    shape: tuple[int, ...], strides: tuple[int, ...] | None, itemsize: int, what: str
) -> None:
    """Raise unless ``strides`` (bytes; None means C order) are C order for ``shape``; an
    array of no element is contiguous whatever its strides (PyTorch gives zeros).

    Raises:
        InvalidArgumentError: other strides (the message names them and the fix).
    """
    if strides is None or 0 in shape:
        return
    expected = _c_strides(shape, itemsize)
    if len(strides) != len(shape) or any(
        dim > 1 and got != want for dim, got, want in zip(shape, strides, expected, strict=False)
    ):
        raise InvalidArgumentError(
            f"the {what} (shape {shape}) is not C-contiguous: its strides are {strides} bytes, "
            f"C order would be {expected}; a transfer needs one contiguous range: "
            + contiguous_fix(None)
        )


def _tensor(capsule: object, what: str) -> tuple[_DLTensor, bool]:
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype = ctypes.c_void_p
    get.argtypes = [ctypes.py_object, ctypes.c_char_p]
    valid = ctypes.pythonapi.PyCapsule_IsValid
    valid.restype = ctypes.c_int
    valid.argtypes = [ctypes.py_object, ctypes.c_char_p]
    if valid(capsule, b"dltensor_versioned"):
        managed = _DLManagedTensorVersioned.from_address(get(capsule, b"dltensor_versioned"))
        if managed.version.major != 1:
            raise InvalidArgumentError(
                f"the {what}'s DLPack capsule is version {managed.version.major}."
                f"{managed.version.minor}; rdmaxfer reads 1.x"
            )
        return managed.dl_tensor, bool(managed.flags & _READ_ONLY_FLAG)
    if valid(capsule, b"dltensor"):
        return _DLManagedTensor.from_address(get(capsule, b"dltensor")).dl_tensor, False
    raise InvalidArgumentError(
        f"the {what}'s __dlpack__ did not return an unused 'dltensor' or 'dltensor_versioned' "
        "capsule"
    )


def parse(capsule: object, *, what: str = "array") -> DLView:
    """Read a DLPack capsule (legacy or versioned) without consuming it.

    Raises:
        InvalidArgumentError: not an unused DLPack capsule, a version other than 1.x, vector
            lanes, a dtype with no mapping (the message names its code and bits), or
            non-contiguous strides.
    """
    t, readonly = _tensor(capsule, what)
    code, bits, lanes = int(t.dtype.code), int(t.dtype.bits), int(t.dtype.lanes)
    shape = tuple(int(t.shape[i]) for i in range(t.ndim))
    element_strides = tuple(int(t.strides[i]) for i in range(t.ndim)) if t.strides else None
    if bits in _PACKED.get(code, ()) and (lanes == 1 or bits * lanes == 8):
        check_contiguous(shape, element_strides, 1, what)
        count = math.prod(shape)
        if bits * lanes == 8:
            view_shape = shape
        elif count * bits * lanes % 8:
            raise InvalidArgumentError(
                f"the {what} holds {count} packed {bits}-bit values, which do not fill whole "
                "bytes; pad it to a multiple of 8 bits"
            )
        else:
            view_shape = (count * bits * lanes // 8,)
        dtype = np.dtype(np.uint8)
    else:
        found = _DTYPES.get((code, bits))
        if found is None or lanes != 1:
            raise InvalidArgumentError(
                f"the {what} has DLPack dtype code {code} bits {bits} lanes {lanes}, which "
                "rdmaxfer does not map (it maps NumPy's types, bfloat16, the float8 types and "
                "packed sub-byte types)"
            )
        dtype = found
        strides = None
        if element_strides is not None:
            strides = tuple(s * dtype.itemsize for s in element_strides)
        check_contiguous(shape, strides, dtype.itemsize, what)
        view_shape = shape
    ptr = int(t.data or 0) + int(t.byte_offset)
    return DLView(
        ptr,
        view_shape,
        dtype,
        int(t.device.device_type),
        int(t.device.device_id),
        readonly,
        int(t.byte_offset),
    )


class _Owner:
    """Keeps the capsule (and so the producer's tensor) alive under the NumPy view, and names
    the allocation holding it (:mod:`.allocation`)."""

    def __init__(self, capsule: object, view: DLView, producer: object) -> None:
        self.capsule = capsule
        self.producer = producer
        self._start = view.ptr - view.byte_offset
        self._nbytes = view.byte_offset + view.nbytes
        self.__array_interface__ = {
            "data": (view.ptr, view.readonly),
            "shape": (view.nbytes,),
            "typestr": "|u1",
            "version": 3,
        }

    def rdmaxfer_allocation(self) -> Allocation:
        """A PyTorch tensor's storage; for any other producer, the producer object owning the
        bytes from the tensor's data pointer to the end of the view."""
        found = torch_storage(self.producer)
        return found if found is not None else Allocation(self.producer, self._start, self._nbytes)


def host_array(obj: Any, *, what: str = "array") -> npt.NDArray[Any]:
    """A zero-copy ndarray of the host memory behind ``obj.__dlpack__()``, in the dtype
    table of the module docstring; read-only when the producer flags it read-only.

    Raises:
        InvalidArgumentError: device (not host) memory, or anything :func:`parse` refuses.
        BufferError, TypeError, RuntimeError: the producer's own refusal to export.
    """
    try:
        capsule = obj.__dlpack__(max_version=(1, 0))
    except TypeError:  # a producer older than DLPack 1.0 (no max_version)
        capsule = obj.__dlpack__()
    view = parse(capsule, what=what)
    if view.device_type not in HOST_DEVICES:
        raise InvalidArgumentError(
            f"the {what} is in DLPack device type {view.device_type} memory, not host memory; "
            "copy it to the CPU first (x.cpu())"
        )
    if view.nbytes == 0:
        return np.zeros(view.shape, view.dtype)
    raw: npt.NDArray[Any] = np.asarray(_Owner(capsule, view, obj))
    return raw.view(view.dtype).reshape(view.shape)
