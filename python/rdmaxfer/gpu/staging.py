"""Device memory over any transport without GPUDirect: the C++ staging pipeline
(csrc/protocol/staging.h) through pinned host bounce buffers.

A :class:`StagerPool` holds an engine's pipelines: one ``_core.Stager`` per GPU, created on
first use and closed with the engine. No Python runs per chunk: each operation is one call on
a Stager that returns a ``_core.Request`` (the endpoint posts it: ``rdmaxfer.transport``).

:func:`host_standin` is a test hook: inside it host memory stands in for device memory
(``_core.HostCopier`` does the "device" copies), so the whole GPU path of the Endpoint API
(send, recv into a device array, write, read) runs over the real transports without a GPU.
"""

from __future__ import annotations

import contextlib
import importlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

from .. import _core
from ..errors import RdmaxferError
from ..memory import cuda
from ..memory import meta as _meta

__all__ = ["StagerPool", "device_copier", "host_standin", "post_device_send", "to_user_array"]

CopierFactory = Callable[[int], _core.DeviceCopier]

_factory: CopierFactory | None = None


@contextlib.contextmanager
def host_standin(factory: CopierFactory | None = None) -> Iterator[None]:
    """Test hook: treat host memory as device memory, with ``factory(device)`` (default: a
    plain ``_core.HostCopier()``) doing the copies. Engines created inside should be closed
    inside."""
    global _factory
    previous = (_factory, cuda.standin)
    _factory = factory if factory is not None else (lambda _device: _core.HostCopier())
    cuda.standin = True
    try:
        yield
    finally:
        _factory, cuda.standin = previous


def device_copier(device: int) -> _core.DeviceCopier:
    """What copies between host memory and GPU ``device``: a ``_core.CudaCopier``, or the
    stand-in's copier inside :func:`host_standin`.

    Raises:
        UnsupportedError: CUDA is not usable here.
    """
    if _factory is not None:
        return _factory(device)
    return _core.CudaCopier(device)


class StagerPool:
    """An engine's staging pipelines: one ``_core.Stager`` per GPU ordinal. Thread-safe."""

    def __init__(self, engine: _core.Engine) -> None:
        self._engine = engine
        self._lock = threading.Lock()
        self._stagers: dict[int, _core.Stager] = {}

    def get(self, device: int) -> _core.Stager:
        """The Stager for GPU ``device`` (created on first use).

        Raises:
            UnsupportedError: CUDA is not usable here.
        """
        with self._lock:
            stager = self._stagers.get(device)
            if stager is None:
                stager = _core.Stager(self._engine, device_copier(device))
                self._stagers[device] = stager
            return stager

    def close(self) -> None:
        """Close every Stager (after the engine's endpoints: their operations then end at
        once, each within one wait slice; their slabs go back to the engine's bounce pool)."""
        with self._lock:
            stagers = list(self._stagers.values())
            self._stagers.clear()
        for stager in stagers:
            with contextlib.suppress(RdmaxferError):
                stager.close()


def post_device_send(
    stager: _core.Stager,
    endpoint: _core.Endpoint,
    view: cuda.CudaArray,
    direct: tuple[Any, int] | None,
    timeout: float,
    chunk_size: int,
    streams: int,
) -> _core.Request:
    """Post the send of the GPU array ``view`` as one message (its dtype and shape in the
    metadata): by GPUDirect when ``direct`` is its registration (a ``MemoryRegion`` and the
    array's byte offset in it), else staged through the engine's bounce slabs, in windows of
    ``chunk_size`` bytes (0: a slab) when longer; ``timeout``: the staging's inactivity bound in
    seconds. ``stager.stats()`` counts which path each message took."""
    meta = _meta.encode(view.dtype, tuple(view.shape))
    if direct is not None:
        region, offset = direct
        return stager.post_send_direct(
            endpoint, region.core, offset, int(view.nbytes), meta, streams, chunk_size
        )
    return stager.post_send(
        endpoint, view.ptr, int(view.nbytes), meta, timeout, streams, chunk_size
    )


def to_user_array(buffer: Any) -> Any:
    """A received device Buffer as a CuPy array (zero-copy) when CuPy is importable, else the
    Buffer itself (``torch.from_dlpack(buf)`` / ``cupy.asarray(buf)`` also work on it). Dtypes
    CuPy has no type for (bfloat16, float8: no ``__cuda_array_interface__`` typestr names
    them) stay Buffers, which ``torch.from_dlpack`` reads."""
    if cuda.standin or not hasattr(buffer, "__cuda_array_interface__"):
        return buffer
    try:
        cupy = importlib.import_module("cupy")
    except ImportError:
        return buffer
    return cupy.asarray(buffer)
