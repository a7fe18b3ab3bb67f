"""The checks of an operation's arguments (private), made before anything is posted and, by
``rdmaxfer.send``/``recv``, before anything is connected: a wrong argument fails on this side
with nothing on the wire."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy.typing as npt

from . import _core, _meta
from .buffer import Buffer, MemoryRegion, as_array, device_view
from .errors import InvalidArgumentError

if TYPE_CHECKING:
    from . import cuda

__all__ = ["byte_range", "descriptor_of", "receivable", "sendable"]


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


def sendable(array: object) -> cuda.CudaArray | npt.NDArray[Any]:
    """``array`` as a message carries it: a CudaArray for GPU memory, else a host ndarray.

    Called before anything is sent (and by ``rdmaxfer.send`` before it connects), so a bad
    argument fails on this side, with nothing on the wire.

    Raises:
        InvalidArgumentError: not contiguous, no memory exposed, or a dtype (object,
            structured...) or rank (over 64 dimensions) a message cannot carry.
    """
    view = device_view(array, writable=False, what="array to send")
    arr = view if view is not None else as_array(array, writable=False, what="array to send")
    _meta.encode(arr.dtype, tuple(arr.shape))
    return arr


def receivable(out: object) -> cuda.CudaArray | npt.NDArray[Any]:
    """``out`` as a receive fills it: a CudaArray for GPU memory, else a writable host ndarray
    (called before anything is received, and by ``rdmaxfer.recv`` before it connects).

    Raises:
        InvalidArgumentError: read-only, not contiguous, or no memory exposed.
    """
    view = device_view(out, writable=True, what="recv destination")
    return view if view is not None else as_array(out, writable=True, what="recv destination")


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
