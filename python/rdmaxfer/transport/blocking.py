"""The lean path of the blocking operations (``Endpoint.send/recv/write/read``) for host NumPy
arrays: the same checks, the same ``_core`` calls and the same errors as posting a
:class:`~rdmaxfer.transport.transfer.Transfer` and waiting on it, without the per-call cost of
the handle when nothing goes wrong.

Each call checks its arguments with the very functions the posted forms use
(:func:`.args.message_of`, :func:`.args.one_sided_of`, :func:`.args.receivable`), takes the
registration from the engine (``MemoryDomain.host_region``), posts one ``_core`` request and
waits for it: a send, WRITE or
READ in the same ``_core`` call (``Endpoint.post_*_wait``: one release of the GIL, and no
Request object in Python when it completes), a receive's steps each in one ``Request.wait`` (in
C++, GIL released, Ctrl-C seen every 0.1 s). Only when the request fails,
is still pending at the wait's bound, or the wait is interrupted does a Transfer take over
(tracked by the endpoint, its WaitLimits made then, from the time the wait started), under the
same bounds as the wait started, and decide the outcome exactly as ``Transfer.wait`` does. A
received message that needs more than placing its bytes in host memory (a checksum, a dtype or
shape other than ``out``'s, unreadable metadata) goes to the general receive step the same way.

A received record's dtype and shape are cached here (a message's metadata record and a peer's
packed descriptor are cached by :mod:`.args`).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any, Protocol, cast

import numpy as np
import numpy.typing as npt

from .. import _core
from .._config import default_timeout, resolve_deadline, resolve_timeout
from ..errors import InvalidArgumentError, RdmaxferError
from ..memory import meta as _meta
from .args import message_of, one_sided_of, receivable
from .domain import MemoryDomain
from .receive import host_array, recv_step
from .transfer import CLEANUP_TIMEOUT_S, MIN_WAIT_S, Transfer, TransferOwner, WaitLimits


class Owner(TransferOwner, Protocol):
    """What the lean path needs of the :class:`~rdmaxfer.transport.endpoint.Endpoint` it
    serves (which sits above this module)."""

    @property
    def engine(self) -> MemoryDomain: ...

    def track(self, transfer: Transfer[Any]) -> Transfer[Any]: ...


__all__ = ["one_sided", "recv", "send"]

#: Entries each cache holds before it starts over.
_CACHE_MAX = 512

_decoded: dict[tuple[bytes, int], tuple[np.dtype[Any], tuple[int, ...]]] = {}

Bounds = tuple[float, float | None]


def _bounds(timeout: float | None, deadline: float | None) -> Bounds | None:
    """``(timeout_s, deadline_s)`` resolved as ``Transfer.wait`` resolves them, or None when
    either is invalid: the caller then takes the general path, which raises the error where
    it always did (from the wait, once the operation is posted)."""
    try:
        timeout_s = default_timeout() if timeout is None else resolve_timeout(timeout)
        return timeout_s, None if deadline is None else resolve_deadline(deadline)
    except InvalidArgumentError:
        return None


def _cached(cache: dict[Any, Any], key: object, value: object) -> None:
    if len(cache) >= _CACHE_MAX:
        cache.clear()
    cache[key] = value


def _message_facts(meta: bytes, length: int) -> tuple[np.dtype[Any], tuple[int, ...]] | None:
    """The dtype and shape of a message without a checksum, or None when the general receive
    step must look at it (a checksum to verify, metadata it rejects)."""
    facts = _decoded.get((meta, length))
    if facts is not None:
        return facts
    try:
        facts = _meta.decode(meta, length)
    except RdmaxferError:
        return None
    if _meta.checksum(meta) is not None:
        return None
    _cached(_decoded, (meta, length), facts)
    return facts


#: What :func:`_settle` returns when the request ended well.
_DONE: Any = object()


def _fresh(wait: Bounds, started: float) -> float:
    """``WaitLimits(*wait, started).fresh()`` without making the WaitLimits (only a wait that
    does not end in one call needs one): the seconds a request posted now may be waited for."""
    left, deadline_s = wait
    if deadline_s is not None:
        left = min(left, deadline_s - (time.monotonic() - started))
    return left if left > MIN_WAIT_S else 0.0


def _settle(
    ep: Owner,
    request: _core.Request,
    left: float,
    wait: Bounds,
    started: float,
    handle: Callable[[], Transfer[Any]],
) -> Any:
    """Wait for ``request`` (just posted; ``left``: :func:`_fresh`, taken before posting so
    that the wait starts at once, before the peer's answer can wake an I/O thread) in one call:
    :data:`_DONE` when it completed. Otherwise the Transfer ``handle()`` makes takes over,
    tracked, under the bounds ``wait`` of a wait that started at ``started``: its outcome is
    returned or raised (a failed request, a bound run out), or it withdraws/aborts on an
    interruption."""
    try:
        if left > 0 and request.wait(left) and not request.failed():
            return _DONE
    except BaseException as exc:  # Ctrl-C: the operation cannot be left half-done
        transfer = ep.track(handle())
        transfer.interrupt(request, f"interrupted by {type(exc).__name__}")
        raise
    return ep.track(handle()).wait_within(WaitLimits(*wait, started))


def _run(
    ep: Owner,
    op: str,
    nbytes: int,
    keep: list[object],
    temps: list[Any],
    wait: Bounds,
    post_wait: Callable[..., bool],
    args: tuple[object, ...],
) -> None:
    """Post a send, WRITE or READ and wait for it in one ``_core`` call (``post_wait(*args,
    wait_s, slot)``: ``Endpoint.post_*_wait``); ``keep``: the objects it uses, ``temps``: its
    temporary registrations, handed back when it is done (or fails to post). A request that
    did not complete in that call (failed, pending at the bound, or interrupted while it
    waited) comes back in ``slot`` and a Transfer takes over, as in :func:`_settle`."""
    started = time.monotonic()
    slot: list[_core.Request | None] = [None]
    try:
        done = post_wait(*args, _fresh(wait, started), slot)
    except BaseException as exc:
        request = slot[0]
        if request is None:  # not posted (or done before a signal handler raised)
            ep.release_temps(temps)
            raise
        transfer = ep.track(_transfer(ep, op, nbytes, request, keep, temps))
        transfer.interrupt(request, f"interrupted by {type(exc).__name__}")
        raise
    if done:
        if temps:
            ep.release_temps(temps, CLEANUP_TIMEOUT_S, failed=False)
        return
    request = cast(_core.Request, slot[0])  # set by post_wait whenever it answers False
    ep.track(_transfer(ep, op, nbytes, request, keep, temps)).wait_within(
        WaitLimits(*wait, started)
    )


def _transfer(
    ep: Owner, op: str, nbytes: int, request: _core.Request, keep: list[object], temps: list[Any]
) -> Transfer[Any]:
    return Transfer(ep, op, nbytes, request, keep=keep, temps=temps, result=None)


def one_sided(
    ep: Owner,
    op: str,
    local: object,
    remote: object,
    offset: int,
    remote_offset: int,
    nbytes: int | None,
    chunk_size: int,
    streams: int,
    timeout: float | None,
    deadline: float | None,
) -> bool:
    """A blocking WRITE (``op="write"``, without a notification) or READ, done here when
    ``local`` is a host ndarray and the bounds are valid (True); else False, untouched."""
    wait = _bounds(timeout, deadline)
    if wait is None or type(local) is not np.ndarray:
        return False
    mem, descriptor, length, remote_at = one_sided_of(
        op, local, remote, offset, remote_offset, nbytes
    )
    arr: npt.NDArray[Any] = mem  # type: ignore[assignment]  # a host ndarray, as local is
    writable = op == "read"
    region, base, temps = ep.engine.host_region(arr, writes=writable)
    core = ep.core
    post = core.post_read_wait if writable else core.post_write_wait
    args = (region.core, base + offset, descriptor, remote_at, length, chunk_size, streams)
    _run(ep, op, length, [arr, region], temps, wait, post, args)
    return True


def send(
    ep: Owner,
    array: object,
    checksum: bool,
    chunk_size: int,
    streams: int,
    timeout: float | None,
    deadline: float | None,
) -> bool:
    """A blocking send, done here when ``array`` is a host ndarray, without a checksum and the
    bounds are valid (True); else False, untouched."""
    wait = _bounds(timeout, deadline)
    if wait is None or checksum or type(array) is not np.ndarray:
        return False
    mem, record = message_of(array)
    arr: npt.NDArray[Any] = mem  # type: ignore[assignment]  # a host ndarray, as array is
    nbytes = int(arr.nbytes)
    region, offset, temps = ep.engine.host_region(arr, writes=False)
    args = (region.core, offset, nbytes, record, chunk_size, streams)
    _run(ep, "send", nbytes, [arr, region], temps, wait, ep.core.post_send_wait, args)
    return True


def recv(
    ep: Owner,
    out: object,
    device: str | int | None,
    timeout: float | None,
    deadline: float | None,
) -> npt.NDArray[Any] | None:
    """A blocking receive into host memory, done here when ``out`` is a host ndarray or None
    (a new array) and the bounds are valid: the array received into; else None, untouched."""
    wait = _bounds(timeout, deadline)
    if wait is None or device not in (None, "cpu") or not (out is None or type(out) is np.ndarray):
        return None
    dest = None if out is None else cast(npt.NDArray[Any], receivable(out))
    core = ep.core
    started = time.monotonic()
    left = _fresh(wait, started)
    header = core.post_recv_header()

    def general() -> Transfer[Any]:  # the general receive step, from the header on
        result = np.empty(0, np.uint8) if dest is None else dest
        return Transfer(
            ep, "recv", -1, header, keep=[] if dest is None else [dest], temps=[],
            result=result, on_header=recv_step(ep.engine, core, dest, None),
        )  # fmt: skip

    got = _settle(ep, header, left, wait, started, general)
    if got is not _DONE:
        return got  # type: ignore[no-any-return]
    msg_id, length, meta = header.message()
    facts = _message_facts(meta, length)
    if facts is None or (dest is not None and (dest.dtype != facts[0] or dest.shape != facts[1])):
        return ep.track(general()).wait_within(WaitLimits(*wait, started))  # type: ignore[no-any-return]
    temps: list[Any] = []
    try:
        target = host_array(facts[1], facts[0], length, core.peer) if dest is None else dest
        region, offset, temps = ep.engine.host_region(target, writes=True)
        keep: list[object] = [target, region]
        left = _fresh(wait, started)
        request = core.post_recv(msg_id, region.core, offset, length)
    except BaseException as exc:
        with contextlib.suppress(RdmaxferError):
            core.reject(msg_id, f"receiver failed: {exc}")
        ep.release_temps(temps, CLEANUP_TIMEOUT_S)
        raise
    handle = lambda: Transfer(ep, "recv", length, request, keep=keep, temps=temps, result=target)  # noqa: E731
    got = _settle(ep, request, left, wait, started, handle)
    if got is not _DONE:
        return got  # type: ignore[no-any-return]
    ep.release_temps(temps, CLEANUP_TIMEOUT_S, failed=False)
    return target
