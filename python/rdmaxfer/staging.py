"""Device memory over any transport: GPUDirect when the memory is registered for it, else the
C++ staging pipeline (csrc/protocol/staging.h) through pinned host bounce buffers.

This module is the glue between :class:`~rdmaxfer.endpoint.Endpoint` and ``_core.Stager``:
one Stager per (engine, GPU), created on first use and closed with the engine. No Python
runs per chunk: each operation is one call that returns a ``_core.Request``.

:func:`host_standin` is a test hook: inside it host memory stands in for device memory
(``_core.HostCopier`` does the "device" copies), so the whole GPU path of the Endpoint API
(send, recv into a device array, write, read) runs over the real transports without a GPU.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from . import _core, _meta, cuda
from ._args import byte_range
from .errors import InvalidArgumentError, RdmaxferError
from .transfer import HeaderStep, Transfer

if TYPE_CHECKING:
    from .endpoint import Endpoint
    from .engine import Engine

__all__ = ["close_engine", "host_standin", "stager_for"]

CopierFactory = Callable[[int], _core.DeviceCopier]

_factory: CopierFactory | None = None
_lock = threading.Lock()


@contextlib.contextmanager
def host_standin(factory: CopierFactory | None = None) -> Iterator[None]:
    """Test hook: treat host memory as device memory, with ``factory(device)`` (default: a
    plain ``_core.HostCopier()``) doing the copies. Engines created inside should be closed
    inside."""
    global _factory
    previous = (_factory, cuda._standin)
    _factory = factory if factory is not None else (lambda _device: _core.HostCopier())
    cuda._standin = True
    try:
        yield
    finally:
        _factory, cuda._standin = previous


def _make_copier(device: int) -> _core.DeviceCopier:
    if _factory is not None:
        return _factory(device)
    return _core.CudaCopier(device)


def stager_for(engine: Engine, device: int) -> _core.Stager:
    """The engine's Stager for GPU ``device`` (created on first use).

    Raises:
        UnsupportedError: CUDA is not usable here.
        EndpointClosedError: the engine is closed.
    """
    engine._check_open()
    stagers: dict[int, _core.Stager] = engine._stagers
    with _lock:
        stager = stagers.get(device)
        if stager is None:
            stager = _core.Stager(engine.core, _make_copier(device))
            stagers[device] = stager
        return stager


def close_engine(engine: Engine, timeout: float = 5.0) -> None:
    """Close the engine's Stagers (after its endpoints: their operations then end at once)."""
    with _lock:
        stagers = list(engine._stagers.values())
        engine._stagers.clear()
    for stager in stagers:
        with contextlib.suppress(RdmaxferError):
            stager.close(timeout)


def gpu_direct_region(engine: Engine, view: cuda.CudaArray) -> tuple[Any, int] | None:
    """A live GPUDirect registration covering ``view`` (region, byte offset), else None."""
    for region in engine._device_regions():
        if region.contains(view.ptr, view.nbytes):
            return region, view.ptr - region.addr
    return None


def _backstop_s() -> float:
    """The pipeline's own inactivity bound: a backstop behind ``Transfer.wait(timeout)``, which
    aborts the endpoint when the caller's timeout runs out (the pipeline then stops at once)."""
    from ._config import resolve_timeout

    return max(600.0, 10.0 * resolve_timeout(None))


def post_send(ep: Endpoint, view: cuda.CudaArray, chunk_size: int, streams: int) -> Transfer[None]:
    """``Endpoint.post_send`` of device memory: D2H into a pinned message buffer, then one
    ordinary message (any receiver, GPU or not, sees the sender's dtype and shape)."""
    meta = _meta.encode(view.dtype, view.shape)
    stager = stager_for(ep.engine, view.device)
    request = stager.post_send(ep.core, view.ptr, view.nbytes, meta, _backstop_s(), streams)
    return ep._track(Transfer(ep, "send", view.nbytes, request, keep=[view], temps=[], result=None))


def post_one_sided(
    ep: Endpoint,
    op: str,
    view: cuda.CudaArray,
    descriptor: _core.Descriptor,
    offset: int,
    remote_offset: int,
    nbytes: int | None,
    chunk_size: int,
    streams: int,
) -> Transfer[None]:
    """``Endpoint.post_write/post_read`` of device memory: straight from/into GPU memory when
    it is registered for GPUDirect RDMA on this engine, else through the staging pipeline."""
    length = byte_range(view.nbytes, offset, nbytes, what=f"{op} buffer")
    if isinstance(remote_offset, bool) or not isinstance(remote_offset, int) or remote_offset < 0:
        raise InvalidArgumentError(f"remote_offset={remote_offset!r} must be an integer >= 0")
    direct = gpu_direct_region(ep.engine, view)
    if direct is not None:
        region, base = direct
        post = ep.core.post_read if op == "read" else ep.core.post_write
        request = post(
            region.core, base + offset, descriptor, remote_offset, length, chunk_size, streams
        )
        return ep._track(
            Transfer(ep, op, length, request, keep=[view, region], temps=[], result=None)
        )
    stager = stager_for(ep.engine, view.device)
    post_staged = stager.post_read if op == "read" else stager.post_write
    request = post_staged(
        ep.core,
        view.ptr + offset,
        length,
        descriptor,
        remote_offset,
        chunk_size,
        0,
        _backstop_s(),
        streams,
    )
    return ep._track(Transfer(ep, op, length, request, keep=[view], temps=[], result=None))


def post_recv(
    ep: Endpoint, dest: cuda.CudaArray | None, result: object, device: int
) -> Transfer[Any]:
    """``Endpoint.post_recv`` into device memory: ``dest`` (returned as ``result``), or a new
    device array on GPU ``device`` of the sender's dtype and shape (a CuPy array when CuPy is
    importable, else a device :class:`~rdmaxfer.buffer.Buffer`)."""
    request = ep.core.post_recv_header()
    transfer: Transfer[Any] = Transfer(
        ep,
        "recv",
        -1,
        request,
        keep=[] if dest is None else [dest],
        temps=[],
        result=result,
        on_header=_recv_step(ep, dest, device),
    )
    ep._track(transfer)
    ep.engine._notifications.call_when_done(request, transfer.done)
    return transfer


def _recv_step(ep: Endpoint, dest: cuda.CudaArray | None, device: int) -> HeaderStep:
    def step(transfer: Transfer[Any], header: _core.Request) -> _core.Request:
        from .buffer import Buffer

        msg_id, length, meta = header.message()
        rejected = False

        def reject(reason: str) -> None:
            nonlocal rejected
            rejected = True
            with contextlib.suppress(RdmaxferError):
                ep.core.reject(msg_id, reason)

        try:
            try:
                dtype, shape = _meta.decode(meta, length)
            except RdmaxferError as exc:
                reject(f"receiver could not read the message metadata: {exc}")
                raise
            if dest is not None:
                if dest.dtype != dtype or dest.shape != shape:
                    reason = (
                        f"the message is dtype {dtype} shape {shape} ({length} bytes) but out "
                        f"is device array dtype {dest.dtype} shape {dest.shape}"
                    )
                    reject(reason)
                    raise InvalidArgumentError(
                        f"recv from {ep.peer}: {reason}; nothing was written to out and the "
                        "message was rejected: pass an out of that dtype and shape"
                    )
                target = dest
            else:
                buffer = Buffer.empty(shape, dtype, device=f"cuda:{device}")
                target = buffer._device_view()
                transfer._set_result(cuda.to_user_array(buffer), length)
            transfer._add_resources([target], [])
            if dest is not None:
                transfer._set_result(transfer._result, length)
            stager = stager_for(ep.engine, target.device)
            return stager.post_recv(ep.core, msg_id, target.ptr, length, _backstop_s())
        except BaseException as exc:
            if not rejected:
                reject(f"receiver failed: {exc}")
            raise

    return step
