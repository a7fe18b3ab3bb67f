"""Batches of one-sided WRITEs or READs, and the WRITE notification that follows them.

One call posts many ``(local, remote_descriptor, remote_offset)`` entries (Mooncake's
``batch_transfer``, NIXL's descriptor lists): neighbours contiguous on both sides become one
operation, zero-length entries are skipped, and at most a window of channel requests (256
unless said otherwise; an operation posted alone or a gathered group of small ones counts one)
is outstanding at once, so a batch of hundreds of thousands of entries holds a bounded number
of requests. Each entry succeeds or fails on its own
(:class:`BatchResult`). The C++ side (``csrc/protocol/batch.h``) is the same for every
transport; a notification is a NOTIFY control message sent once every operation of the
request completed on every lane that carried it, so the target sees it only after all the
bytes are in its memory.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

import numpy as np

from .. import _core as _native
from .. import errors
from ..errors import InvalidArgumentError, RdmaxferError
from ..memory.region import MemoryRegion
from .args import descriptor_of, operand, remote_offset_of
from .transfer import Inflight, Transfer, TransferOwner

if TYPE_CHECKING:
    from .domain import MemoryDomain

__all__ = ["BatchOps", "BatchResult", "Notify", "PreparedBatch"]

#: A notification payload (``notify=`` of ``write``/``write_batch``; what
#: ``Engine.wait_notification`` returns after the peer's address): bytes, at most 64, or an int
#: in 0..2**32-1 (an IMM's 32 bits). Anything else raises InvalidArgumentError before any
#: byte moves.
Notify = bytes | int

#: Channel requests outstanding at once (``csrc/protocol/batch.h``:
#: ``BatchRun::kDefaultWindow``).
DEFAULT_WINDOW = 256

_CLEANUP_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class BatchResult:
    """What one posted batch did (``write_batch``/``read_batch``, ``PreparedBatch.post``).

    Entries are numbered as given (0-based), zero-length ones included. A batch fails whole
    (the call raises instead of returning a result) only when the endpoint fails under it:
    ConnectionFailedError, EndpointClosedError, TransferTimeoutError.

    Attributes:
        entries: entries in the batch (zero-length ones included).
        nbytes: bytes moved by the entries that completed (an int, bytes).
        failed: ``{entry index: error}`` for the entries that failed, each an
            :class:`~rdmaxfer.errors.RdmaxferError` subclass naming why:
            :class:`~rdmaxfer.errors.InvalidArgumentError` for a range outside its local
            region or the remote descriptor (checked before anything is posted, so its bytes
            never move), :class:`~rdmaxfer.errors.RemoteAccessError` when the peer refused it
            (unknown key, out of bounds, region not writable/readable). Every other non-empty
            entry completed.
        skipped: zero-length entries (not moved, not failed).
        operations: operations posted after merging neighbours contiguous on both sides.
        window: the most channel requests allowed outstanding at once (256 by default): an
            operation posted alone counts one, and so does a gathered group of small ones.
        peak_outstanding: the most channel requests that were outstanding at once
            (1..window).
        notified: True when a notification was asked for and sent (it is sent only when no
            entry failed).
    """

    entries: int
    nbytes: int
    failed: dict[int, RdmaxferError] = field(default_factory=dict)
    skipped: int = 0
    operations: int = 0
    window: int = DEFAULT_WINDOW
    peak_outstanding: int = 0
    notified: bool = False

    @property
    def ok(self) -> bool:
        """True when no entry failed."""
        return not self.failed

    def check(self) -> None:
        """Raise the first failed entry's error, if any.

        Raises:
            RdmaxferError: the lowest-numbered failed entry's error class, its message
                starting ``"batch entry <index> (of <n> failed): "``.
        """
        if self.failed:
            index = min(self.failed)
            error = self.failed[index]
            raise type(error)(f"batch entry {index} (of {len(self.failed)} failed): {error}")


def _failure(cls_name: str, reason: str) -> RdmaxferError:
    cls = getattr(errors, cls_name, RdmaxferError)
    return cast(RdmaxferError, cls(reason))


class _Plan:
    """Entries turned into a ``_native.BatchPlan``, with what must stay alive while it is used."""

    def __init__(
        self,
        engine: MemoryDomain,
        op: str,
        entries: Iterable[object],
        transport: str,
        chunk_size: int = 0,
        streams: int = 0,
    ) -> None:
        self.op = op
        self.transport = transport  # the connection's: which GPU registrations it moves directly
        self.writes = op == "read"  # a READ lands in the local memory
        self.engine = engine
        self.keep: list[object] = []
        self.temps: list[MemoryRegion] = []
        self._last: MemoryRegion | None = None
        try:
            # Entries of the common shape ((region, offset, nbytes), remote, remote_offset) are
            # read in C++; any other goes through _entry (the checks and registrations).
            region_objs, regions, remote_objs, remotes, table = _native.batch_table(
                entries, MemoryRegion, self._entry, descriptor_of
            )
        except BaseException:
            engine.release_temps(self.temps, _CLEANUP_TIMEOUT_S, failed=True)
            raise
        self.keep.extend(region_objs)
        self.keep.extend(remote_objs)
        self.core = _native.BatchPlan(op, regions, remotes, table, chunk_size, streams)

    def _entry(self, i: int, entry: object) -> tuple[MemoryRegion, int, int, object, int]:
        """Entry ``i`` checked: (local region, byte offset in it, length, remote, remote
        offset)."""
        if not isinstance(entry, tuple) or len(entry) != 3:
            raise InvalidArgumentError(
                f"batch entry {i}: {type(entry).__name__} is not a "
                "(local, remote_descriptor, remote_offset) tuple"
            )
        local, remote, remote_offset = entry
        try:
            at = remote_offset_of(remote_offset)
        except InvalidArgumentError as exc:
            raise InvalidArgumentError(f"batch entry {i}: {exc}") from None
        region, offset, nbytes, self._last = self._local(
            self.engine, i, local, self.writes, self._last
        )
        return region, offset, nbytes, remote, at

    def _local(
        self,
        engine: MemoryDomain,
        i: int,
        local: object,
        writes: bool,
        last: MemoryRegion | None,
    ) -> tuple[MemoryRegion, int, int, MemoryRegion | None]:
        """(region, byte offset in it, length, the region to try first next time)."""
        if isinstance(local, tuple):
            if len(local) != 3 or not isinstance(local[0], MemoryRegion):
                raise InvalidArgumentError(
                    f"batch entry {i}: a tuple local must be (MemoryRegion, offset, nbytes)"
                )
            region, offset, nbytes = local
            for name, value in (("offset", offset), ("nbytes", nbytes)):
                if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                    raise InvalidArgumentError(
                        f"batch entry {i}: {name}={value!r} must be an integer >= 0"
                    )
            return region, offset, nbytes, last
        if isinstance(local, MemoryRegion):
            return local, 0, local.nbytes, last
        what = f"local of batch entry {i}"
        mem = operand(local, writable=writes, what=what)
        self.keep.append(mem)
        if not isinstance(mem, np.ndarray):
            direct = engine.device_direct(mem, self.transport)
            if direct is None:
                raise InvalidArgumentError(
                    f"{what}: GPU memory in a batch must be registered for GPUDirect "
                    "(engine.register(array)), or go over a same-host shm connection (CUDA "
                    "IPC); staged GPU memory cannot be batched"
                )
            self.temps.extend(direct[2])
            return direct[0], direct[1], int(mem.nbytes), last
        addr = _native.address_of(mem)
        nbytes = int(mem.nbytes)
        if (
            last is not None
            and last.registered
            and last.contains(addr, nbytes)
            and (not writes or last.core.local_write)
        ):
            return last, addr - last.addr, nbytes, last
        region, offset, temps = engine.host_region(mem, writes=writes)
        self.temps.extend(temps)
        return region, offset, nbytes, region


def _result(run: _native.BatchRun, plan: _native.BatchPlan) -> BatchResult:
    failed = {index: _failure(cls, reason) for index, cls, reason in run.failures()}
    return BatchResult(
        entries=plan.entries,
        nbytes=run.bytes_done,
        failed=failed,
        skipped=plan.skipped,
        operations=run.operations,
        window=run.window,
        peak_outstanding=run.peak_outstanding,
        notified=run.notified,
    )


def no_staged_notify(notify: Notify | None) -> None:
    """Raise unless ``notify`` is None: memory moved through the staging pipeline (GPU memory
    without a GPUDirect registration) cannot carry a notification."""
    if notify is not None:
        raise InvalidArgumentError(
            "notify= needs host memory or GPU memory registered for GPUDirect "
            "(engine.register(array)); staged GPU memory cannot carry a notification"
        )


class PreparedBatch:
    """A batch validated and looked up once (``Endpoint.prepare_batch``), posted as often as
    wanted: each :meth:`post` skips the entry checks and registration lookups, like NIXL's
    prepared descriptor lists. The entries keep naming the same memory: change the bytes in
    it between posts, not the arrays. Holds its arrays and temporary registrations until
    :meth:`close` (a context manager; also when the endpoint closes).

    Lifecycle: prepared -> posted any number of times (posts may overlap; each returns its
    own :class:`~rdmaxfer.transport.transfer.Transfer`) -> closed (later posts raise).
    """

    def __init__(self, endpoint: BatchOps, op: str, plan: _Plan) -> None:
        self._endpoint = endpoint
        self._op = op
        self._plan: _Plan | None = plan

    @property
    def op(self) -> str:
        """``"write"`` or ``"read"``."""
        return self._op

    @property
    def entries(self) -> int:
        """Entries in the batch (zero-length and invalid ones included)."""
        return self._live().core.entries

    @property
    def operations(self) -> int:
        """Operations after merging contiguous neighbours (and leaving out invalid and
        zero-length entries)."""
        return self._live().core.operations

    @property
    def nbytes(self) -> int:
        """Bytes of the valid entries (what one post moves when none fails)."""
        return self._live().core.bytes

    def post(self, *, notify: Notify | None = None) -> Transfer[BatchResult]:
        """Post the batch again; the Transfer's ``wait()`` returns its :class:`BatchResult`.

        Raises:
            InvalidArgumentError: ``notify`` is not bytes of at most 64 or an int in
                0..2**32-1, or is given for a READ batch; the batch was closed.
            EndpointClosedError: the endpoint is closed.
        """
        plan = self._live()
        return self._endpoint._post_plan(plan, notify, keep=[self])

    def close(self) -> None:
        """Hand back the temporary registrations (idempotent); later posts raise."""
        plan, self._plan = self._plan, None
        if plan is not None:
            self._endpoint._engine.release_temps(plan.temps, _CLEANUP_TIMEOUT_S)

    def __enter__(self) -> PreparedBatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _live(self) -> _Plan:
        if self._plan is None:
            raise InvalidArgumentError("this prepared batch was closed; prepare it again")
        return self._plan


class BatchOps:
    """The batch operations of :class:`~rdmaxfer.transport.endpoint.Endpoint` (a mixin: the
    endpoint provides the engine, the ``_core.Endpoint`` and the in-flight table)."""

    _engine: MemoryDomain
    _core: _native.Endpoint
    _inflight: Inflight

    # -- prepared ----------------------------------------------------------------------------
    def prepare_batch(self, entries: Iterable[object], *, op: str = "write") -> PreparedBatch:
        """Validate ``entries`` and look up their registrations once, for posting many times.

        Args:
            entries: ``(local, remote_descriptor, remote_offset)`` tuples. ``local`` is an
                array or :class:`~rdmaxfer.memory.buffer.Buffer` (all its bytes), or
                ``(MemoryRegion, offset, nbytes)``; ``remote_descriptor`` the peer's
                region (a Descriptor or its packed bytes); ``remote_offset`` bytes into it.
            op: ``"write"`` (local -> peer) or ``"read"`` (peer -> local).

        Raises:
            InvalidArgumentError: an entry is not such a tuple, an offset is negative, a local
                array is not contiguous (or read-only for a READ), ``op`` is neither. A range
                outside its region does not raise: that entry fails alone when posted.
        """
        if op not in ("write", "read"):
            raise InvalidArgumentError(f"op={op!r} must be 'write' or 'read'")
        return PreparedBatch(self, op, _Plan(self._engine, op, entries, self._core.transport))

    # -- WRITE -------------------------------------------------------------------------------
    def post_write_batch(
        self, entries: Iterable[object], *, notify: Notify | None = None
    ) -> Transfer[BatchResult]:
        """Post a batch of WRITEs (see :meth:`prepare_batch` for ``entries``).

        Args:
            notify: a payload the peer gets from ``Engine.wait_notification`` as
                ``(peer, payload)`` once every byte of the batch is in its memory: bytes (at
                most 64) or an int in 0..2**32-1. Sent only when no entry failed.

        Returns:
            A Transfer whose ``wait()`` returns the :class:`BatchResult`.

        Raises:
            InvalidArgumentError: as :meth:`prepare_batch`; a bad ``notify``.
            EndpointClosedError: the endpoint is closed.
        """
        return self._post_once("write", entries, notify)

    def write_batch(
        self,
        entries: Iterable[object],
        *,
        notify: Notify | None = None,
        timeout: float | None = None,
    ) -> BatchResult:
        """Blocking :meth:`post_write_batch`: returns the :class:`BatchResult` once every
        entry completed or failed.

        Args:
            timeout: inactivity bound in seconds (default ``RDMAXFER_TIMEOUT`` or 60): fails
                when no byte of any operation moved for that long (each operation's bytes count
                as they move, not only when it completes); the endpoint is then aborted.

        Raises:
            TransferTimeoutError: no progress for ``timeout`` seconds.
            ConnectionFailedError: the endpoint failed during the batch.
            InvalidArgumentError: as :meth:`post_write_batch`.
        """
        return self.post_write_batch(entries, notify=notify).wait(timeout)

    async def awrite_batch(
        self,
        entries: Iterable[object],
        *,
        notify: Notify | None = None,
        timeout: float | None = None,
    ) -> BatchResult:
        """Asyncio twin of :meth:`write_batch`."""
        return await self.post_write_batch(entries, notify=notify).wait_async(timeout)

    # -- READ --------------------------------------------------------------------------------
    def post_read_batch(self, entries: Iterable[object]) -> Transfer[BatchResult]:
        """Post a batch of READs: each entry's ``local`` (writable) receives the peer's bytes.
        Same entries, result and errors as :meth:`post_write_batch` (no ``notify``)."""
        return self._post_once("read", entries, None)

    def read_batch(self, entries: Iterable[object], *, timeout: float | None = None) -> BatchResult:
        """Blocking :meth:`post_read_batch` (``timeout`` as :meth:`write_batch`)."""
        return self.post_read_batch(entries).wait(timeout)

    async def aread_batch(
        self, entries: Iterable[object], *, timeout: float | None = None
    ) -> BatchResult:
        """Asyncio twin of :meth:`read_batch`."""
        return await self.post_read_batch(entries).wait_async(timeout)

    # -- internals ---------------------------------------------------------------------------
    def _post_direct(
        self,
        op: str,
        region: MemoryRegion,
        local_offset: int,
        remote: _native.Descriptor,
        remote_offset: int,
        nbytes: int,
        chunk_size: int,
        streams: int,
        notify: Notify | None,
    ) -> _native.Request:
        """One WRITE or READ from/into a registration; a WRITE with ``notify`` goes as a batch
        of one that fails whole."""
        if notify is None:
            post = self._core.post_read if op == "read" else self._core.post_write
            return post(
                region.core, local_offset, remote, remote_offset, nbytes, chunk_size, streams
            )
        table = np.array([[0, local_offset, 0, remote_offset, nbytes]], dtype=np.uint64)
        plan = _native.BatchPlan("write", [region.core], [remote], table, chunk_size, streams)
        for _index, cls, reason in plan.invalid():
            raise _failure(cls, reason)
        return _native.post_batch(self._core, plan, notify, whole=True).request

    def _post_once(
        self, op: str, entries: Iterable[object], notify: Notify | None
    ) -> Transfer[BatchResult]:
        _native.check_notify(notify)
        plan = _Plan(self._engine, op, entries, self._core.transport)
        try:
            return self._post_plan(plan, notify, keep=[], temps=plan.temps)
        except BaseException:
            self._engine.release_temps(plan.temps, _CLEANUP_TIMEOUT_S, failed=True)
            raise

    def _post_plan(
        self,
        plan: _Plan,
        notify: Notify | None,
        *,
        keep: list[object],
        temps: list[MemoryRegion] | None = None,
    ) -> Transfer[BatchResult]:
        run = _native.post_batch(self._core, plan.core, notify)
        transfer: Transfer[BatchResult] = Transfer(
            cast(TransferOwner, self),
            plan.op,
            plan.core.bytes,
            run.request,
            keep=[plan, *keep],
            temps=list(temps or []),
            result=BatchResult(entries=plan.core.entries, nbytes=0),
        )

        def settle() -> None:
            transfer.set_result(_result(run, plan.core), plan.core.bytes)

        transfer.set_on_done(settle)
        self._inflight.add(transfer)
        return transfer
