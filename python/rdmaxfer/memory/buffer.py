"""Arrays that transfers read from and write into, in host or GPU memory.

* :func:`as_array` turns anything that exposes its memory (an ndarray, the buffer protocol,
  ``__array_interface__`` or ``__dlpack__``) into a zero-copy :class:`numpy.ndarray`, refusing
  what a transfer cannot use (non-contiguous, object dtype, read-only destinations).
* :func:`device_view` is where the memory kind of an object is decided: a
  :class:`~rdmaxfer.memory.cuda.CudaArray` for GPU memory, None for host memory.
* :class:`Buffer` is one C-contiguous array in host memory (allocated pinned by an engine, or
  wrapped), optionally registered (:class:`~rdmaxfer.memory.region.MemoryRegion`); or in GPU
  memory (``Buffer.empty(..., device="cuda:0")``, or a wrapped CuPy/PyTorch/
  ``__cuda_array_interface__``/CUDA ``__dlpack__`` array), which CuPy and PyTorch see through
  ``__cuda_array_interface__`` and ``__dlpack__`` (no copy).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from .. import _core
from ..errors import InvalidArgumentError
from .dtypes import parse_dtype
from .region import MemoryRegion, Registrar, access_bits

if TYPE_CHECKING:
    from types import TracebackType

    from .cuda import CudaArray

__all__ = [
    "Buffer",
    "as_array",
    "byte_view",
    "device_view",
    "set_default_registrar",
]

#: Makes the engine that ``Buffer.empty(pinned=True)`` allocates from when none is given: the
#: process-wide default engine, installed by :mod:`rdmaxfer.transport.api` (a layer above this
#: one) when it is imported, which ``import rdmaxfer`` does.
_default_registrar: Callable[[], Registrar] | None = None


def set_default_registrar(factory: Callable[[], Registrar]) -> None:
    """Install what makes the default engine of ``Buffer.empty`` (see ``_default_registrar``)."""
    global _default_registrar
    _default_registrar = factory


def device_view(obj: object, *, writable: bool, what: str = "array") -> CudaArray | None:
    """The memory kind of ``obj``, decided once: a view of its GPU memory, or None for host
    memory. A device :class:`Buffer` is its own view; other objects are asked through
    :func:`rdmaxfer.memory.cuda.array_view`, loaded only for an object that may be GPU memory
    (not an ndarray, bytes or host Buffer), so host transfers never load the CUDA module.

    Raises:
        InvalidArgumentError: GPU memory that is read-only while ``writable``, non-contiguous
            or malformed.
        UnsupportedError: GPU memory but CUDA unusable here.
    """
    if isinstance(obj, (np.ndarray, bytes, bytearray, memoryview)):
        return None
    if isinstance(obj, Buffer):
        view = obj._cuda
        if view is not None and writable and view.readonly:
            raise InvalidArgumentError(
                f"the {what} (device array, shape {view.shape}, dtype {view.dtype}) is "
                "read-only and cannot receive data"
            )
        return view
    from . import cuda

    return cuda.array_view(obj, writable=writable, what=what)


def _exposes_buffer(obj: object) -> bool:
    try:
        with memoryview(obj):  # type: ignore[arg-type]
            return True
    except TypeError:
        return False


def as_array(obj: object, writable: bool, *, what: str = "buffer") -> npt.NDArray[Any]:
    """View ``obj``'s memory as a C-contiguous ndarray, without copying.

    Args:
        obj: an ndarray, a :class:`Buffer` or :class:`MemoryRegion` (viewed as its array / its
            bytes), or any object exposing the buffer protocol, ``__array_interface__`` or
            ``__dlpack__`` (host memory only).
        writable: the memory will be written (a receive or read destination).
        what: how error messages name the object ("destination", "source"...).

    Returns:
        An ndarray of ``obj``'s dtype and shape sharing its memory.

    Raises:
        InvalidArgumentError: ``obj`` exposes no memory, is not C-contiguous, has an object
            dtype, or is read-only while ``writable`` is True.
    """
    arr: npt.NDArray[Any]
    if isinstance(obj, np.ndarray):
        arr = obj
    elif isinstance(obj, (Buffer, MemoryRegion)):
        arr = obj.numpy()
    elif hasattr(obj, "__array_interface__"):
        arr = np.asarray(obj)
    elif _exposes_buffer(obj):
        # Through a memoryview: np.asarray(b"...") would make a 0-d string array (a copy).
        arr = np.asarray(memoryview(obj))  # type: ignore[arg-type]
    elif hasattr(obj, "__dlpack__"):
        from . import dlpack

        try:
            arr = dlpack.host_array(obj, what=what)
        except (InvalidArgumentError, BufferError, RuntimeError, TypeError, ValueError) as exc:
            raise InvalidArgumentError(
                f"cannot view the {what} ({type(obj).__name__}) through DLPack: {exc}; only "
                "host (CPU) memory in a dtype DLPack knows can be used here"
            ) from exc
    else:
        raise InvalidArgumentError(
            f"the {what} ({type(obj).__name__}) exposes neither the buffer protocol, "
            "__array_interface__ nor __dlpack__; pass a numpy array, a Buffer or a bytearray"
        )
    if arr.dtype.hasobject:
        raise InvalidArgumentError(
            f"the {what} has dtype {arr.dtype}, which holds Python object pointers; "
            "convert it to a numeric dtype first"
        )
    if not arr.flags.c_contiguous:
        from .dlpack import contiguous_fix

        raise InvalidArgumentError(
            f"the {what} (shape {arr.shape}, dtype {arr.dtype}) is not C-contiguous: its strides "
            f"are {arr.strides} bytes (itemsize {arr.itemsize}); a transfer needs one contiguous "
            "range of memory: " + contiguous_fix(writable)
        )
    if writable and not arr.flags.writeable:
        raise InvalidArgumentError(
            f"the {what} (shape {arr.shape}, dtype {arr.dtype}) is read-only and cannot receive "
            "data; pass a writable array (e.g. np.empty_like(arr), or arr.copy())"
        )
    return arr


def byte_view(arr: npt.NDArray[Any]) -> npt.NDArray[np.uint8]:
    """The bytes of a C-contiguous array as a 1-D uint8 view (no copy)."""
    return arr.reshape(-1).view(np.uint8)


def _normalize_shape(shape: int | Sequence[int]) -> tuple[int, ...]:
    dims = (shape,) if isinstance(shape, int) else tuple(shape)
    for dim in dims:
        if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or dim < 0:
            raise InvalidArgumentError(
                f"shape {shape!r}: every dimension must be an integer >= 0, got {dim!r}"
            )
    return tuple(int(dim) for dim in dims)


class Buffer:
    """One C-contiguous array in host memory, optionally registered with an engine.

    Lifecycle: created by :meth:`empty` (allocated; pinned memory comes registered) or
    :meth:`wrap` (existing memory, not registered) -> optionally :meth:`register`-ed -> closed
    (``close()`` deregisters; the array stays usable). NumPy sees a Buffer as its array:
    ``np.asarray(buf)`` and ``np.from_dlpack(buf)`` are zero-copy views.
    """

    def __init__(self, array: npt.NDArray[Any], region: MemoryRegion | None = None) -> None:
        self._array = as_array(array, writable=False)
        self._region = region
        self._cuda: CudaArray | None = None

    @classmethod
    def from_device(cls, view: CudaArray) -> Buffer:
        """Internal: a Buffer over the device array ``view`` (no copy)."""
        buf = cls(np.empty(0, dtype=view.dtype))
        buf._cuda = view
        return buf

    def device_array(self) -> CudaArray:
        """Internal: the device array of a GPU Buffer.

        Raises:
            InvalidArgumentError: this Buffer is host memory.
        """
        if self._cuda is None:
            raise InvalidArgumentError("this Buffer is host memory, not a device array")
        return self._cuda

    def _host_only(self, what: str) -> None:
        if self._cuda is not None:
            raise InvalidArgumentError(
                f"{what}: this Buffer is GPU memory (cuda:{self._cuda.device}); view it with "
                "cupy.asarray(buf) or torch.from_dlpack(buf), or copy it with buf.copy_to_host()"
            )

    @classmethod
    def empty(
        cls,
        shape: int | Sequence[int],
        dtype: npt.DTypeLike = np.uint8,
        *,
        pinned: bool = True,
        engine: Registrar | None = None,
        access: str = "rw",
        device: str | int | None = None,
    ) -> Buffer:
        """Allocate an uninitialised buffer.

        Args:
            shape: dimensions (elements).
            dtype: any numpy dtype, including ml_dtypes ones (``ml_dtypes.bfloat16``).
            pinned: allocate page-aligned memory locked in RAM by ``engine.alloc_pinned`` and
                registered with ``access``; False allocates with numpy (registered with
                ``access`` only when ``engine`` is given).
            engine: the engine to allocate/register with (default: the default engine of
                :mod:`rdmaxfer.transport.api` when ``pinned``).
            access: what a peer may do with the memory: ``"rw"``, ``"r"``, ``"w"``, ``"none"``.
            device: ``None``/``"cpu"`` for host memory, or ``"cuda:N"`` (``"cuda"``, N) for GPU
                memory (cuMemAlloc; ``pinned``/``engine``/``access`` do not apply: register it
                with ``engine.register`` for GPUDirect RDMA).

        Raises:
            InvalidArgumentError: a negative dimension, an unknown access or device.
            RegistrationError: pinning failed (e.g. the memlock limit; the message says how to
                raise it), or the GPU is out of memory.
            UnsupportedError: a GPU device without CUDA here (the message says why).
        """
        dims = _normalize_shape(shape)
        dt = parse_dtype(dtype)
        if dt.hasobject:
            raise InvalidArgumentError(f"dtype {dt} holds Python objects; use a numeric dtype")
        if device is not None and device != "cpu":
            return cls.from_device(_alloc_device(dims, dt, device))
        access_bits(access)
        if not pinned:
            array: npt.NDArray[Any] = np.empty(dims, dtype=dt)
            region = engine.register(array, access) if engine is not None else None
            return cls(array, region)
        if engine is None:
            if _default_registrar is None:
                raise InvalidArgumentError("no engine given and no default engine: pass engine=")
            engine = _default_registrar()
        nbytes = math.prod(dims) * dt.itemsize
        region = engine.alloc_pinned(nbytes, access)
        array = region.numpy().view(dt).reshape(dims)
        return cls(array, region)

    @classmethod
    def wrap(cls, obj: object) -> Buffer:
        """Wrap existing memory without copying (kept alive by the Buffer).

        Args:
            obj: an ndarray, or any object exposing the buffer protocol, ``__array_interface__``
                or ``__dlpack__`` (host memory); a MemoryRegion is wrapped with its bytes.

        Raises:
            InvalidArgumentError: not C-contiguous (the message gives the strides and the fix),
                object dtype, or no way to reach the memory.
        """
        if isinstance(obj, Buffer):
            return obj
        if isinstance(obj, MemoryRegion):
            return cls(obj.numpy(), obj)
        view = device_view(obj, writable=False, what="wrapped object")
        if view is not None:
            return cls.from_device(view)
        return cls(as_array(obj, writable=False, what="wrapped object"))

    # -- views -----------------------------------------------------------------------------
    def numpy(self) -> npt.NDArray[Any]:
        """The buffer as an ndarray of its dtype and shape (a view: no copy).

        Raises:
            InvalidArgumentError: a GPU buffer (use :meth:`copy_to_host`, or CuPy/DLPack).
        """
        self._host_only("numpy()")
        return self._array

    @property
    def device(self) -> str:
        """``"cpu"`` or ``"cuda:N"``."""
        return "cpu" if self._cuda is None else f"cuda:{self._cuda.device}"

    @property
    def shape(self) -> tuple[int, ...]:
        """Dimensions, in elements."""
        return self._cuda.shape if self._cuda is not None else tuple(self._array.shape)

    @property
    def dtype(self) -> np.dtype[Any]:
        """Element type."""
        return self._array.dtype

    @property
    def nbytes(self) -> int:
        """Size in bytes."""
        return self._cuda.nbytes if self._cuda is not None else int(self._array.nbytes)

    @property
    def addr(self) -> int:
        """Address of the first byte (a device address for GPU buffers)."""
        return self._cuda.ptr if self._cuda is not None else int(self._array.ctypes.data)

    @property
    def readonly(self) -> bool:
        """True when the memory cannot be written (it then cannot receive data)."""
        if self._cuda is not None:
            return self._cuda.readonly
        return not self._array.flags.writeable

    def copy_to_host(self) -> npt.NDArray[Any]:
        """A new host ndarray with the buffer's contents (a copy; blocking for GPU buffers)."""
        if self._cuda is None:
            return self._array.copy()
        from .cuda import copy_to_host

        return copy_to_host(self._cuda)

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        """CUDA Array Interface v3 of a GPU buffer (``cupy.asarray(buf)``, Numba, PyTorch);
        ``stream`` is None: the data is ready when a transfer into it has completed.
        Absent (AttributeError) on host buffers and for dtypes the interface cannot name."""
        view = self._cuda
        if view is None:
            raise AttributeError("__cuda_array_interface__: this Buffer is host memory")
        if view.dtype.isbuiltin == 2:
            raise AttributeError(f"__cuda_array_interface__ cannot describe dtype {view.dtype}")
        return {
            "version": 3,
            "shape": view.shape,
            "typestr": view.dtype.str,
            "data": (view.ptr, view.readonly),
            "strides": None,
            "descr": [("", view.dtype.str)],
            "stream": None,
        }

    @property
    def region(self) -> MemoryRegion | None:
        """The registration, if any (None when wrapped and never registered)."""
        return self._region

    @property
    def __array_interface__(self) -> dict[str, Any]:
        """NumPy's array interface of the view (so ``np.asarray(buf)`` shares the memory).

        Absent (AttributeError) for extension dtypes such as bfloat16, which the interface
        cannot name: NumPy then uses ``__array__``, which keeps the dtype.
        """
        if self._cuda is not None:
            raise AttributeError("__array_interface__: this Buffer is GPU memory")
        if self._array.dtype.isbuiltin == 2:
            raise AttributeError(
                f"__array_interface__ cannot describe dtype {self._array.dtype}; use __array__"
            )
        return self._array.__array_interface__

    def __array__(
        self, dtype: npt.DTypeLike | None = None, copy: bool | None = None
    ) -> npt.NDArray[Any]:
        """The view (no copy unless ``copy=True`` or another ``dtype`` is asked for).

        Raises TypeError for GPU buffers (an implicit device-to-host copy would hide a cost)."""
        if self._cuda is not None:
            raise TypeError(
                "a GPU Buffer cannot be converted to a NumPy array implicitly; use "
                "buf.copy_to_host()"
            )
        if dtype is not None and (wanted := parse_dtype(dtype)) != self._array.dtype:
            if copy is False:
                raise ValueError(f"cannot view dtype {self._array.dtype} as {dtype} without a copy")
            return self._array.astype(wanted)
        return self._array.copy() if copy else self._array

    def __dlpack__(self, **kwargs: Any) -> Any:
        """DLPack capsule of the view (``np.from_dlpack(buf)``, ``torch.from_dlpack(buf)``).

        NumPy's dtypes go through NumPy's own export; bfloat16 and the float8 types
        (``ml_dtypes``) are exported with DLPack's codes for them, the bits unchanged (a
        legacy ``"dltensor"`` capsule). GPU buffers export a ``kDLCUDA`` tensor; the data is
        ready (transfers into it completed), so ``stream`` needs no synchronization.

        Raises:
            BufferError: a dtype DLPack has no code for (ml_dtypes' one-byte int4, float4...),
                or a read-only ml_dtypes array (a legacy capsule cannot say read-only).
        """
        from . import dlpack

        if self._cuda is not None:
            return self._export(self._cuda.ptr, dlpack.KDL_CUDA, self._cuda.device)
        if self._array.dtype.isbuiltin != 2:  # NumPy's own dtypes
            return self._array.__dlpack__(**kwargs)
        if not self._array.flags.writeable:
            raise BufferError(
                f"a read-only {self._array.dtype} array cannot be exported through DLPack"
            )
        return self._export(int(self._array.ctypes.data), dlpack.KDL_CPU, 0)

    def _export(self, ptr: int, device_type: int, device_id: int) -> Any:
        from . import dlpack

        try:
            code, bits = dlpack.dtype_code(self.dtype)
        except InvalidArgumentError as exc:
            raise BufferError(str(exc)) from None
        return _core.dlpack_capsule(self, ptr, device_type, device_id, list(self.shape), code, bits)

    def __dlpack_device__(self) -> tuple[int, int]:
        """``(kDLCPU, 0)`` for host memory, ``(kDLCUDA, N)`` for GPU memory on cuda:N."""
        if self._cuda is not None:
            return 2, self._cuda.device
        device = self._array.__dlpack_device__()
        return int(device[0]), int(device[1])

    def __len__(self) -> int:
        if self._cuda is not None:
            if not self._cuda.shape:
                raise TypeError("len() of a 0-d GPU buffer")
            return self._cuda.shape[0]
        return len(self._array)

    # -- registration ----------------------------------------------------------------------
    def register(self, engine: Registrar, access: str = "rw") -> MemoryRegion:
        """Register the buffer with ``engine`` (cached: registering again returns the same
        region) and remember the registration.

        Raises:
            InvalidArgumentError: unknown access, or ``"w"``/``"rw"`` on read-only memory.
            RegistrationError: the transport could not register the memory.
        """
        region = engine.register(self if self._cuda is not None else self._array, access)
        self._region = region
        return region

    def descriptor(self) -> _core.Descriptor:
        """The registration's descriptor (see :meth:`MemoryRegion.descriptor`).

        Raises:
            InvalidArgumentError: the buffer is not registered.
        """
        if self._region is None:
            raise InvalidArgumentError(
                "the buffer is not registered: call buf.register(engine, access) first"
            )
        return self._region.descriptor()

    def close(self) -> None:
        """Deregister the buffer's region, if any (idempotent); the array stays usable."""
        region = self._region
        if region is not None:
            region.close()

    def __enter__(self) -> Buffer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        reg = "unregistered" if self._region is None else repr(self._region)
        where = "" if self._cuda is None else f" device={self.device}"
        return f"<Buffer shape={self.shape} dtype={self.dtype} nbytes={self.nbytes}{where} {reg}>"


def _alloc_device(shape: tuple[int, ...], dtype: np.dtype[Any], device: str | int) -> CudaArray:
    from . import cuda

    ordinal = cuda.parse_device(device)
    nbytes = math.prod(shape) * dtype.itemsize
    if cuda.standin:  # test hook: host memory stands in for the GPU
        host = np.empty(max(nbytes, 1), dtype=np.uint8)
        return cuda.CudaArray(int(host.ctypes.data), shape, dtype, ordinal, False, host)
    memory = _core.DeviceMemory(ordinal, nbytes)
    return cuda.CudaArray(memory.ptr, shape, dtype, ordinal, False, memory)
