"""The checks of an operation's arguments, made before anything is posted and, by
``rdmaxfer.send``/``recv``, before anything is connected: a wrong argument fails on this side
with nothing on the wire. Here each operation decides the memory kind of its array, once:
:func:`operand` (and :func:`sendable`/:func:`receivable`) return a
:class:`~rdmaxfer.memory.cuda.CudaArray` for GPU memory, else a host ndarray.

Both forms of an operation use these same functions: the posted one (``Endpoint.post_*``) and
the lean blocking one (:mod:`.blocking`), so both accept and refuse exactly the same arguments.
:func:`message_of` and :func:`one_sided_of` are all of a send's and a WRITE/READ's checks.
Facts that do not change are cached here (a message's metadata record by dtype and shape, a
peer's packed descriptor), and plain in-range ints pass a quicker test that accepts exactly
what the full one accepts: these checks sit on the path of every small operation."""

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
    "message_of",
    "message_record",
    "one_sided_of",
    "operand",
    "receivable",
    "remote_offset_of",
    "sendable",
]

#: Entries each cache holds before it starts over.
_CACHE_MAX = 512

_records: dict[tuple[np.dtype[Any], tuple[int, ...]], tuple[np.dtype[Any], bytes]] = {}
_descriptors: dict[bytes, _core.Descriptor] = {}
_WHAT = ("source of the write", "destination of the read")


def _cached(cache: dict[Any, Any], key: object, value: object) -> None:
    if len(cache) >= _CACHE_MAX:
        cache.clear()
    cache[key] = value


def descriptor_of(remote: object) -> _core.Descriptor:
    """The Descriptor named by ``remote`` (see ``endpoint.RemoteLike``).

    Raises:
        InvalidArgumentError: ``remote`` names no region. ProtocolError: malformed bytes.
    """
    if type(remote) is bytes:  # a peer's packed descriptor: unpacked once
        found = _descriptors.get(remote)
        if found is None:
            found = _core.Descriptor.unpack(remote)
            _cached(_descriptors, remote, found)
        return found
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
    if type(obj) is np.ndarray:  # host memory: device_view would answer None
        return as_array(obj, writable=writable, what=what)
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
    message_record(arr)  # a dtype or rank a message cannot carry raises here
    if host and not isinstance(arr, np.ndarray):
        from ..memory import cuda

        return cuda.copy_to_host(arr)
    return arr


def message_record(arr: cuda.CudaArray | npt.NDArray[Any], digest: int | None = None) -> bytes:
    """The metadata record of a message carrying ``arr`` (``meta.encode``), with the payload's
    ``digest`` when checksummed; records without one are cached by (dtype, shape).

    Raises:
        InvalidArgumentError: a dtype or rank a message cannot carry.
    """
    dtype, shape = arr.dtype, tuple(arr.shape)
    if digest is not None:
        return _meta.encode(dtype, shape, digest)
    hit = _records.get((dtype, shape))
    if hit is not None and hit[0] is dtype:
        return hit[1]
    record = _meta.encode(dtype, shape)
    _cached(_records, (dtype, shape), (dtype, record))
    return record


def message_of(
    array: object, *, checksum: bool = False
) -> tuple[cuda.CudaArray | npt.NDArray[Any], bytes | None]:
    """A send's checks: ``(arr, record)``, ``arr`` as :func:`sendable` gives it (GPU memory
    copied to the host with ``checksum``) and, for host memory, the message's metadata record
    (with the payload's XXH3-64 when ``checksum``); None for GPU memory, whose record the
    device path makes.

    Raises:
        InvalidArgumentError: as :func:`sendable`.
    """
    if type(array) is np.ndarray and not checksum:  # the common case: sendable's checks, once
        host = as_array(array, writable=False, what="array to send")
        return host, message_record(host)
    arr = sendable(array, host=checksum)
    if not isinstance(arr, np.ndarray):
        return arr, None
    return arr, message_record(arr, _meta.payload_checksum(arr) if checksum else None)


def one_sided_of(
    op: str, local: object, remote: object, offset: int, remote_offset: int, nbytes: int | None
) -> tuple[cuda.CudaArray | npt.NDArray[Any], _core.Descriptor, int, int]:
    """A WRITE's or READ's (``op``: "write" or "read") checks, in order: ``(local memory, the
    peer's descriptor, length in bytes, remote offset)``.

    Raises:
        InvalidArgumentError: ``local`` is not contiguous (or read-only for a READ), ``remote``
            names no region, the range is outside ``local``, a bad ``remote_offset``.
        ProtocolError: malformed descriptor bytes.
    """
    writable = op == "read"
    what = _WHAT[writable]
    # The common case (a host ndarray, a packed descriptor seen before, plain in-range ints)
    # takes the quick form of each check inline: these checks are on the path of every small
    # operation. Anything else goes through the full functions, which accept the same.
    if type(local) is np.ndarray:
        mem: cuda.CudaArray | npt.NDArray[Any] = as_array(local, writable=writable, what=what)
    else:
        mem = operand(local, writable=writable, what=what)
    descriptor = _descriptors.get(remote) if type(remote) is bytes else None
    if descriptor is None:
        descriptor = descriptor_of(remote)
    total = mem.nbytes
    if (
        type(nbytes) is int
        and type(offset) is int
        and 0 <= offset
        and 0 <= nbytes <= total - offset
    ):
        length = nbytes
    else:
        length = byte_range(int(total), offset, nbytes, what)
    if type(remote_offset) is not int or remote_offset < 0:
        remote_offset = remote_offset_of(remote_offset)
    return mem, descriptor, length, remote_offset


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
    if (
        type(nbytes) is int
        and type(offset) is int
        and 0 <= offset
        and 0 <= nbytes <= total - offset
    ):
        return nbytes  # the common case, quickly: plain ints, in range
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
    if type(remote_offset) is int and remote_offset >= 0:
        return remote_offset
    if isinstance(remote_offset, bool) or not isinstance(remote_offset, int) or remote_offset < 0:
        raise InvalidArgumentError(f"remote_offset={remote_offset!r} must be an integer >= 0")
    return remote_offset
