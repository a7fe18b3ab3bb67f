"""Registered memory: what a peer may do with it (the access names), and the registration.

:class:`MemoryRegion` is memory registered with an engine (any :class:`Registrar`, which
:class:`~rdmaxfer.transport.engine.Engine` is): it keeps the object that owns the memory alive
while the region's key is live, and names the region to a peer through
:meth:`MemoryRegion.descriptor`.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import numpy.typing as npt

from .. import _core
from .._config import resolve_timeout
from ..errors import InvalidArgumentError, TransferTimeoutError

if TYPE_CHECKING:
    from types import TracebackType

__all__ = [
    "ACCESS",
    "LOCAL_WRITE",
    "MemoryRegion",
    "Registrar",
    "access_bits",
    "access_name",
]


class Registrar(Protocol):
    """What registers memory: an engine, seen from the memory layer (the engine sits above it).

    ``register``/``alloc_pinned`` are :meth:`Engine.register` and :meth:`Engine.alloc_pinned`;
    ``_inherited`` is True in a child of ``os.fork()``; ``_deregister_region`` kills a region's
    key and waits ``timeout_s`` seconds for the operations that use it.
    """

    def register(
        self, obj: object, access: str = ..., *, local_write: bool | None = ...
    ) -> MemoryRegion: ...

    def alloc_pinned(self, nbytes: int, access: str = ...) -> MemoryRegion: ...

    def inherited(self) -> bool: ...

    def deregister_region(self, region: MemoryRegion, timeout_s: float) -> None: ...


#: Access names accepted by ``Engine.register`` -> the access bits a peer gets.
ACCESS: dict[str, int] = {
    "none": _core.ACCESS_LOCAL,
    "r": _core.ACCESS_REMOTE_READ,
    "w": _core.ACCESS_REMOTE_WRITE,
    "rw": _core.ACCESS_REMOTE_READ | _core.ACCESS_REMOTE_WRITE,
}

#: The access bit that lets local operations write a region (a READ or RECV destination); the
#: transport is asked for it only where a use needs it (see ``Engine.register``).
LOCAL_WRITE: int = _core.ACCESS_LOCAL_WRITE


def access_bits(access: str) -> int:
    """The access bits for ``"rw"``, ``"r"``, ``"w"`` or ``"none"`` (what a peer may do).

    Raises:
        InvalidArgumentError: any other value.
    """
    try:
        return ACCESS[access]
    except (KeyError, TypeError):
        raise InvalidArgumentError(
            f"access={access!r} is not one of 'rw', 'r', 'w', 'none' (what a peer may do with "
            "the region: read it, write it, both, or nothing)"
        ) from None


def access_name(bits: int) -> str:
    """The inverse of :func:`access_bits`."""
    for name, value in ACCESS.items():
        if value == bits:
            return name
    return f"0x{bits:x}"


# (region, owner) pairs whose deregistration timed out: operations may still touch the memory,
# so it must never be freed.
_stranded: list[tuple[_core.Region, object]] = []

# Guards every region's registered flag (one lock for all: a region holds no lock of its own,
# so a hundred thousand regions cost no hundred thousand locks).
_state_lock = threading.Lock()


class MemoryRegion:
    """Memory registered with an engine: a key that names it to peers, and its owner kept alive.

    Lifecycle: registered (by ``Engine.register`` or ``Engine.alloc_pinned``; the engine holds
    it, so it cannot be freed while a peer may access it) -> deregistered (``deregister()``,
    ``close()``, leaving a ``with`` block, or the engine's ``close()``; idempotent). After
    deregistration peers that use the old descriptor get a RemoteAccessError; the memory itself
    stays valid as long as this object (or an array viewing it) lives.
    """

    __slots__ = (
        "__weakref__",
        "_data",
        "_device",
        "_engine",
        "_owner",
        "_region",
        "_registered",
        "_temporary",
    )

    def __init__(
        self,
        engine: Registrar,
        region: _core.Region,
        owner: object,
        data: npt.NDArray[Any],
        *,
        temporary: bool = False,
        device: int | None = None,
    ) -> None:
        """``data``: the registered memory as a C-contiguous host array (any dtype and shape:
        :meth:`numpy` views it as bytes on first use), or an empty one for GPU memory."""
        self._engine = engine
        self._device = device
        self._region = region
        self._owner = owner
        self._data = data
        self._temporary = temporary
        self._registered = True

    # -- properties ------------------------------------------------------------------------
    @property
    def engine(self) -> Registrar:
        """The engine this region is registered with."""
        return self._engine

    @property
    def core(self) -> _core.Region:
        """The underlying ``_core.Region`` (buffer protocol: the raw bytes, 1-D, writable)."""
        return self._region

    @property
    def owner(self) -> object:
        """The object that owns the memory (the registered array, or the pinned region)."""
        return self._owner

    @property
    def addr(self) -> int:
        """Virtual address of the first byte."""
        return self._region.addr

    @property
    def nbytes(self) -> int:
        """Length in bytes."""
        return self._region.length

    @property
    def key(self) -> int:
        """The key peers name the region by (an rkey on RDMA)."""
        return self._region.key

    @property
    def access(self) -> str:
        """What a peer may do: ``"rw"``, ``"r"``, ``"w"`` or ``"none"``."""
        return access_name(self._region.access)

    @property
    def pinned(self) -> bool:
        """True when the engine allocated (and mlock-ed) the memory."""
        return self._region.pinned

    @property
    def registered(self) -> bool:
        """False once deregistered."""
        return self._registered

    @property
    def temporary(self) -> bool:
        """True for a registration the engine made for one or more transfers of unregistered
        memory (never shown to peers)."""
        return self._temporary

    @property
    def device(self) -> int | None:
        """The GPU ordinal for GPU memory registered for GPUDirect RDMA, else None."""
        return self._device

    @property
    def readonly(self) -> bool:
        """True when the owner's memory is read-only for this process."""
        return not self._data.flags.writeable

    def numpy(self) -> npt.NDArray[np.uint8]:
        """The region's bytes as a 1-D uint8 ndarray of ``nbytes`` elements (no copy).

        Raises:
            InvalidArgumentError: GPU memory (it has no host view).
        """
        if self._device is not None:
            raise InvalidArgumentError(
                f"region (key {self.key}) is GPU memory on cuda:{self._device}: no host view"
            )
        data = self._data
        if data.ndim != 1 or data.dtype != np.uint8:
            data = self._data = data.reshape(-1).view(np.uint8)
        return data

    def host_array(self) -> npt.NDArray[Any]:
        """Internal: the host memory as the array it was registered from (no byte view made; empty
        for GPU memory)."""
        return self._data

    def contains(self, addr: int, nbytes: int) -> bool:
        """True when ``[addr, addr + nbytes)`` lies inside the region."""
        base = self.addr
        return base <= addr and addr + nbytes <= base + self.nbytes

    def descriptor(self) -> _core.Descriptor:
        """The descriptor a peer passes to ``Endpoint.write``/``read`` to access this region.

        Send ``descriptor().pack()`` (40 bytes, plus 4 per extra rail on a multi-rail rdma
        engine) to the peer; ``Descriptor.unpack`` reads it.

        Raises:
            InvalidArgumentError: the region was deregistered.
        """
        if not self._registered:
            raise InvalidArgumentError(
                f"region (key {self.key}, {self.nbytes} bytes) was deregistered; register the "
                "memory again to get a descriptor"
            )
        return self._region.descriptor()

    # -- lifecycle -------------------------------------------------------------------------
    def deregister(self, timeout: float | None = None) -> None:
        """Kill the region's key, then wait until no in-flight operation uses the memory.

        Idempotent: a second call does nothing.

        Args:
            timeout: seconds to wait for in-flight operations (default: RDMAXFER_TIMEOUT or 60).

        Raises:
            TransferTimeoutError: operations still used the memory when the timeout ran out (the
                key is dead regardless; the memory is then kept alive for good).
        """
        timeout_s = resolve_timeout(timeout)
        if self._engine.inherited():  # a child of os.fork(): the registration is the parent's
            self._registered = False
            return
        with _state_lock:
            if not self._registered:
                return
            self._registered = False
        try:
            self._engine.deregister_region(self, timeout_s)
        except TransferTimeoutError:
            _stranded.append((self._region, self._owner))
            raise

    def close(self) -> None:
        """Deregister with the default timeout (see :meth:`deregister`); idempotent."""
        self.deregister()

    def __enter__(self) -> MemoryRegion:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "registered" if self._registered else "deregistered"
        kind = "pinned" if self.pinned else "host"
        return (
            f"<MemoryRegion {state} {kind} addr=0x{self.addr:x} nbytes={self.nbytes} "
            f"key={self.key} access={self.access!r}>"
        )
