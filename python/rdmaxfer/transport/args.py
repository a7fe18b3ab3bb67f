"""The checks of an operation's arguments, made before anything is posted and, by
``rdmaxfer.send``/``recv``, before anything is connected: a wrong argument fails on this side
with nothing on the wire. Here each operation decides the memory kind of its array, once:
:func:`operand` (and :func:`sendable`/:func:`receivable`) return a
:class:`~rdmaxfer.memory.cuda.CudaArray` for GPU memory, else a host ndarray."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from .. import _core
from ..errors import InvalidArgumentError
from ..memory import meta as _meta
from ..memory.buffer import Buffer, as_array, device_view
from ..memory.region import MemoryRegion

if TYPE_CHECKING:
    from ..memory import cuda

__all__ = [
    "byte_range",
    "descriptor_of",
    "operand",
    "receivable",
    "remote_offset_of",
    "sendable",
]


def descriptor_of(remote: object) -> _core.Descriptor:
    """The Descriptor named by ``remote`` (see ``endpoint.RemoteLike``).

    Raises:
        InvalidArgumentError: ``remote`` names no region. ProtocolError: malformed bytes.
    """
    if isinstance(remote, _core.Descriptor):
        return remote
    if isinstance(remote, (bytes, bytearray, memoryview)):
        return _core.Descriptor.unpack(bytes(remote))
    if isinstance(remote, (MemoryRegion, Buffer)):
        return remote.descriptor()
    raise InvalidArgumentError(
        f"remote {type(remote).__name__} does not name a registered region; pass the peer's "
        "Descriptor or its packed bytes (MemoryRegion.descriptor().pack())"
    )


def operand(obj: object, *, writable: bool, what: str) -> cuda.CudaArray | npt.NDArray[Any]:
    """``obj`` as an operation reads (or, ``writable``, writes) it: a CudaArray for GPU
    memory, else a host ndarray (``what`` names it in errors).

    Raises:
        InvalidArgumentError: not contiguous, no memory exposed, read-only while ``writable``.
        UnsupportedError: GPU memory but CUDA unusable here.
    """
    view = device_view(obj, writable=writable, what=what)
    return view if view is not None else as_array(obj, writable=writable, what=what)


def sendable(array: object, *, host: bool = False) -> cuda.CudaArray | npt.NDArray[Any]:
    """``array`` as a message carries it: a CudaArray for GPU memory, else a host ndarray.
    ``host``: GPU memory is copied whole to a new host ndarray (a blocking device-to-host
    copy), which is then what is sent (``send(..., checksum=True)`` hashes that copy).

    Called before anything is sent (and by ``rdmaxfer.send`` before it connects), so a bad
    argument fails on this side, with nothing on the wire.

    Raises:
        InvalidArgumentError: not contiguous, no memory exposed, or a dtype (object,
            structured...) or rank (over 64 dimensions) a message cannot carry.
    """
    arr = operand(array, writable=False, what="array to send")
    _meta.encode(arr.dtype, tuple(arr.shape))
    if host and not isinstance(arr, np.ndarray):
        from ..memory import cuda

        return cuda.copy_to_host(arr)
    return arr


def receivable(out: object) -> cuda.CudaArray | npt.NDArray[Any]:
    """``out`` as a receive fills it: a CudaArray for GPU memory, else a writable host ndarray
    (called before anything is received, and by ``rdmaxfer.recv`` before it connects).

    Raises:
        InvalidArgumentError: read-only, not contiguous, or no memory exposed.
    """
    return operand(out, writable=True, what="recv destination")


def byte_range(total: int, offset: int, nbytes: int | None, what: str) -> int:
    """The length of ``[offset, offset + nbytes)`` in a buffer of ``total`` bytes (``nbytes``
    None: to the end).

    Raises:
        InvalidArgumentError: the range is not inside the buffer.
    """
    if isinstance(offset, bool) or not isinstance(offset, int) or not 0 <= offset <= total:
        raise InvalidArgumentError(
            f"offset={offset!r} is outside the {what} of {total} bytes (0..{total})"
        )
    if nbytes is None:
        return total - offset
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
        raise InvalidArgumentError(f"nbytes={nbytes!r} must be an integer >= 0")
    if offset + nbytes > total:
        raise InvalidArgumentError(
            f"offset={offset} + nbytes={nbytes} is past the end of the {what} ({total} bytes)"
        )
    return nbytes


def remote_offset_of(remote_offset: object) -> int:
    """``remote_offset`` of a one-sided operation, checked.

    Raises:
        InvalidArgumentError: not an integer >= 0.
    """
    if isinstance(remote_offset, bool) or not isinstance(remote_offset, int) or remote_offset < 0:
        raise InvalidArgumentError(f"remote_offset={remote_offset!r} must be an integer >= 0")
    return remote_offset
