"""GPU memory as rdmaxfer sees it: the CUDA driver's status, device selection, and views of
device arrays from CuPy, PyTorch, ``__cuda_array_interface__`` (v3) and CUDA ``__dlpack__``.

libcuda.so.1 is loaded by the C++ core at run time (csrc/cuda/cuda_api.h); without it
:func:`unavailable_reason` says why ("no CUDA: libcuda.so.1 not found (...)") and GPU features
raise :class:`~rdmaxfer.errors.UnsupportedError` with that reason; importing never fails.

A :class:`CudaArray` is a zero-copy view of device memory: address, shape, dtype, device
ordinal, read-only flag, and the object that owns the memory (kept alive by the view).
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import _core
from ..errors import InvalidArgumentError, UnsupportedError
from . import dlpack
from .dlpack import KDL_CUDA, KDL_CUDA_MANAGED, check_contiguous

__all__ = [
    "CudaArray",
    "array_view",
    "available",
    "parse_cuda_array_interface",
    "parse_device",
    "status",
    "unavailable_reason",
]


_status: dict[str, Any] | None = None

#: Test hook (see rdmaxfer.gpu.staging.host_standin): host memory stands in for the device.
standin = False


def status() -> dict[str, Any]:
    """``_core.cuda_status()``, cached: ``{"unavailable": reason or "", "driver_version": int
    (12040 = 12.4), "get_handle_for_address_range": bool, "gpus": [{"index", "name",
    "pci_bus_id", "total_memory" (bytes), "compute_capability", "gpu_direct_rdma",
    "dma_buf"}]}``."""
    global _status
    if _status is None:
        _status = _core.cuda_status()
    return _status


def available() -> bool:
    """True when the CUDA driver loaded and sees at least one GPU."""
    return standin or (not status()["unavailable"] and bool(status()["gpus"]))


def unavailable_reason() -> str:
    """Why GPU memory cannot be used here ("" when it can)."""
    if available():
        return ""
    s = status()
    return str(s["unavailable"]) or "no CUDA: the driver loaded but sees no GPU"


def driver_version_text(version: int) -> str:
    """12040 -> "12.4"."""
    return f"{version // 1000}.{(version % 1000) // 10}"


def parse_device(device: object) -> int:
    """The GPU ordinal named by ``device``: ``"cuda"`` (0), ``"cuda:N"``, or an int N.

    Raises:
        InvalidArgumentError: anything else, or a GPU that does not exist.
        UnsupportedError: CUDA is not usable here (the message gives the reason).
    """
    ordinal: int | None = None
    if isinstance(device, bool):
        ordinal = None
    elif isinstance(device, int):
        ordinal = device
    elif isinstance(device, str):
        text = device.strip().lower()
        if text == "cuda":
            ordinal = 0
        elif text.startswith("cuda:") and text[5:].isdigit():
            ordinal = int(text[5:])
    if ordinal is None or ordinal < 0:
        raise InvalidArgumentError(
            f"device={device!r} must be 'cuda', 'cuda:N' or a GPU ordinal N >= 0"
        )
    if not available():
        raise UnsupportedError(f"device={device!r}: {unavailable_reason()}")
    if not standin:
        count = len(status()["gpus"])
        if ordinal >= count:
            raise InvalidArgumentError(
                f"device={device!r}: this machine has {count} GPU(s) (cuda:0..cuda:{count - 1})"
            )
    return ordinal


@dataclass(frozen=True)
class CudaArray:
    """A zero-copy view of C-contiguous device memory.

    ``ptr``: device address of the first byte; ``shape`` in elements; ``dtype``; ``device``:
    the GPU ordinal; ``readonly``; ``owner``: what keeps the memory alive.
    """

    ptr: int
    shape: tuple[int, ...]
    dtype: np.dtype[Any]
    device: int
    readonly: bool
    owner: object

    @property
    def nbytes(self) -> int:
        """Size in bytes."""
        return math.prod(self.shape) * self.dtype.itemsize


def parse_cuda_array_interface(
    cai: Mapping[str, Any], *, what: str = "array"
) -> tuple[int, tuple[int, ...], np.dtype[Any], bool, int | None]:
    """Read a ``__cuda_array_interface__`` dict (versions 0-3).

    Returns:
        ``(ptr, shape, dtype, readonly, stream)``; ``stream`` is None when the producer needs
        no synchronization, else the stream handle to synchronize on before reading the data
        (1: the legacy default stream, 2: the per-thread default stream).

    Raises:
        InvalidArgumentError: a missing or malformed field, a mask, ``stream`` 0 (which v3
            forbids), or non-C-contiguous strides.
    """
    if not isinstance(cai, Mapping):
        raise InvalidArgumentError(f"the {what}'s __cuda_array_interface__ is not a dict")
    try:
        shape = tuple(int(d) for d in cai["shape"])
        typestr = cai["typestr"]
        ptr, readonly = cai["data"]
    except (KeyError, TypeError, ValueError) as exc:
        raise InvalidArgumentError(
            f"the {what}'s __cuda_array_interface__ lacks shape/typestr/data: {exc!r}"
        ) from exc
    version = cai.get("version", 0)
    if not isinstance(version, int) or version < 0:
        raise InvalidArgumentError(f"__cuda_array_interface__ version {version!r} is not an int")
    if any(d < 0 for d in shape):
        raise InvalidArgumentError(f"the {what} has a negative dimension in shape {shape}")
    try:
        dtype = np.dtype(typestr)
    except TypeError as exc:
        raise InvalidArgumentError(f"the {what} has an unknown typestr {typestr!r}") from exc
    if dtype.hasobject:
        raise InvalidArgumentError(f"the {what} has an object dtype")
    if cai.get("mask") is not None:
        raise InvalidArgumentError(f"the {what} has a mask; masked arrays cannot be transferred")
    raw_strides = cai.get("strides")
    strides = None if raw_strides is None else tuple(int(s) for s in raw_strides)
    check_contiguous(shape, strides, dtype.itemsize, what)
    stream = cai.get("stream") if version >= 3 else None
    if stream is not None:
        if isinstance(stream, bool) or not isinstance(stream, int):
            raise InvalidArgumentError(f"__cuda_array_interface__ stream {stream!r} is not an int")
        if stream == 0:
            raise InvalidArgumentError(
                "__cuda_array_interface__ stream 0 is disallowed by the v3 protocol (ambiguous "
                "between the legacy and per-thread default streams)"
            )
    ptr = int(ptr or 0)
    if ptr == 0 and math.prod(shape) > 0:
        raise InvalidArgumentError(f"the {what} has a null data pointer")
    return ptr, shape, dtype, bool(readonly), stream


def _device_of(ptr: int, what: str) -> int:
    if standin:
        return 0
    kind, device = _core.pointer_kind(ptr)
    if kind not in ("device", "managed"):
        raise InvalidArgumentError(
            f"the {what} claims CUDA memory but its pointer is {kind} memory to the CUDA driver"
        )
    return int(device)


def synchronize(device: int, stream: int) -> None:
    """Block until work queued on a producer's ``stream`` handle finished (what
    ``__cuda_array_interface__`` v3 asks of a consumer that reads the data)."""
    if not standin:
        _core.cuda_synchronize_stream(device, stream)


def _cuda_array_interface(obj: object) -> Any:
    """``obj.__cuda_array_interface__``, or None when absent or not expressible (PyTorch raises
    TypeError for bfloat16, whose tensors then go through DLPack)."""
    try:
        return obj.__cuda_array_interface__  # type: ignore[attr-defined]
    except (AttributeError, TypeError, ValueError, RuntimeError):
        return None


def array_view(obj: object, *, writable: bool, what: str = "array") -> CudaArray | None:
    """A view of ``obj`` when it is another library's device array, else None (host memory:
    the caller's path). rdmaxfer's own Buffers are seen by
    :func:`rdmaxfer.memory.buffer.device_view`, the entry point that calls this one.

    Recognises ``__cuda_array_interface__`` (CuPy, PyTorch, Numba...; its ``stream`` is
    synchronized on before returning), and ``__dlpack__`` with a CUDA ``__dlpack_device__``
    (asked for the legacy default stream, then synchronized).

    Raises:
        InvalidArgumentError: non-contiguous, read-only while ``writable``, or malformed.
        UnsupportedError: device memory but CUDA unusable here.
    """
    view: CudaArray
    if (cai := _cuda_array_interface(obj)) is not None:
        if not available():
            raise UnsupportedError(f"the {what} is CUDA memory: {unavailable_reason()}")
        ptr, shape, dtype, readonly, stream = parse_cuda_array_interface(cai, what=what)
        device = _device_of(ptr, what) if ptr else 0
        if stream is not None:
            synchronize(device, stream)
        view = CudaArray(ptr, shape, dtype, device, readonly, obj)
    elif hasattr(obj, "__dlpack_device__") and hasattr(obj, "__dlpack__"):
        try:
            dev_type, _dev_id = obj.__dlpack_device__()
        except Exception:
            return None
        if int(dev_type) not in (KDL_CUDA, KDL_CUDA_MANAGED):
            return None
        if not available():
            raise UnsupportedError(f"the {what} is CUDA memory: {unavailable_reason()}")
        try:
            capsule = obj.__dlpack__(stream=1)  # the producer orders its work before stream 1
        except TypeError:  # a producer without the stream argument (DLPack < 0.6)
            capsule = obj.__dlpack__()
        dl = dlpack.parse(capsule, what=what)
        synchronize(dl.device_id, 1)
        view = CudaArray(dl.ptr, dl.shape, dl.dtype, dl.device_id, dl.readonly, (obj, capsule))
    else:
        return None
    if writable and view.readonly:
        raise InvalidArgumentError(
            f"the {what} (device array, shape {view.shape}, dtype {view.dtype}) is read-only "
            "and cannot receive data"
        )
    return view


def copy_to_host(view: CudaArray, out: np.ndarray[Any, Any] | None = None) -> np.ndarray[Any, Any]:
    """``view``'s bytes in host memory (a blocking device-to-host copy): into ``out`` (a
    C-contiguous array of ``view.nbytes`` bytes) or a new array of the view's dtype and shape.

    Raises:
        InvalidArgumentError: ``out`` has another size or is not C-contiguous.
    """
    if out is None:
        out = np.empty(view.shape, dtype=view.dtype)
    elif out.nbytes != view.nbytes or not out.flags.c_contiguous:
        raise InvalidArgumentError(
            f"copy_to_host: out of {out.nbytes} bytes for a device array of {view.nbytes} bytes"
        )
    if view.nbytes:
        if standin:
            ctypes.memmove(out.ctypes.data, view.ptr, view.nbytes)
        else:
            _core.cuda_copy_to_host(view.device, int(out.ctypes.data), view.ptr, view.nbytes)
    return out


def copy_from_host(view: CudaArray, host: np.ndarray[Any, Any]) -> None:
    """Copy a C-contiguous host array of ``view.nbytes`` bytes into ``view`` (blocking).

    Raises:
        InvalidArgumentError: the sizes differ or ``host`` is not C-contiguous.
    """
    if host.nbytes != view.nbytes or not host.flags.c_contiguous:
        raise InvalidArgumentError(
            f"copy_from_host: host array of {host.nbytes} bytes (contiguous: "
            f"{host.flags.c_contiguous}) into a device array of {view.nbytes} bytes"
        )
    if view.nbytes:
        if standin:
            ctypes.memmove(view.ptr, host.ctypes.data, view.nbytes)
        else:
            _core.cuda_copy_to_device(view.device, view.ptr, int(host.ctypes.data), view.nbytes)
