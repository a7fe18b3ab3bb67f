"""A connection to one peer: two-sided messages and one-sided READ/WRITE.

Every operation comes in three forms: blocking (``send``), asyncio (``asend``) and posted
(``post_send``, returning a :class:`~rdmaxfer.transport.transfer.Transfer`). Two-sided messages
carry the array's dtype and shape (see :mod:`rdmaxfer.memory.meta`), so ``recv()`` can allocate
the array or check ``out`` before any byte is written.

Every operation decides the memory kind of its array once (:mod:`rdmaxfer.transport.args`):
host memory goes through a registration of the engine (its own, or a temporary one), GPU
memory straight from/into a GPUDirect registration or, on shm, a CUDA IPC export (registered,
or made on the fly: ``MemoryDomain.device_direct``), else through the engine's staging
pipeline;
then one ``_core`` call posts it and one :class:`Transfer` tracks it (blocking calls on host
ndarrays need one only when something goes wrong: :mod:`.blocking`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import numpy.typing as npt

from .. import _core, _transports
from .._config import resolve_timeout
from ..errors import EndpointClosedError, RdmaxferError
from ..memory.buffer import Buffer
from ..memory.region import MemoryRegion
from . import blocking
from .args import message_of, one_sided_of, receivable
from .batch import BatchOps, Notify, no_staged_notify
from .conninfo import connection_info, connection_text
from .domain import MemoryDomain, staged_backstop_s
from .notifications import Notifications
from .receive import recv_step
from .transfer import Inflight, Transfer, posted

if TYPE_CHECKING:
    from types import TracebackType

__all__ = ["Endpoint", "RemoteLike"]

#: What names a peer's registered region: a Descriptor, its 40 packed bytes, or (same process)
#: the MemoryRegion or registered Buffer itself.
RemoteLike = _core.Descriptor | bytes | bytearray | memoryview | MemoryRegion | Buffer

T = TypeVar("T")


class Endpoint(BatchOps):
    """A connection to one peer, made by ``Engine.connect`` or ``Engine.accept``.

    Lifecycle: connected -> closed, by ``close()`` (graceful), ``abort()``, the engine's
    ``close()``, or a failure: a transfer that times out or finds the peer gone closes the
    endpoint, since its stream can no longer be trusted (connect again; the engine stays
    usable). A receive that times out while still waiting for a message leaves it open.
    Objects used by in-flight transfers stay alive until the transfers end. Thread-safe.
    """

    def __init__(
        self,
        engine: MemoryDomain,
        core: _core.Endpoint,
        *,
        on_close: Callable[[Endpoint], None] | None = None,
    ) -> None:
        self._engine = engine
        self._core = core
        self._on_close = on_close
        self._inflight = Inflight()

    # -- properties ------------------------------------------------------------------------
    @property
    def engine(self) -> MemoryDomain:
        """The engine that made this endpoint (an :class:`~rdmaxfer.transport.engine.Engine`,
        seen here through its memory side)."""
        return self._engine

    @property
    def core(self) -> _core.Endpoint:
        """The underlying ``_core.Endpoint``."""
        return self._core

    @property
    def peer(self) -> str:
        """The peer's address, ``host:port``."""
        return self._core.peer

    @property
    def streams(self) -> int:
        """Number of parallel streams (TCP connections or queue pairs)."""
        return self._core.streams

    @property
    def closed(self) -> bool:
        """True once closed or failed."""
        return self._core.closed

    @property
    def error(self) -> str:
        """Why the endpoint failed ("" when it did not)."""
        return self._core.error

    @property
    def info(self) -> dict[str, int | str]:
        """What this connection is and what was negotiated with the peer: ``transport``,
        ``peer``, ``streams`` and, per transport, its settings (on rdma the path MTU, the READ
        depths, the rails and the fabric settings); every key and unit is listed in
        :mod:`rdmaxfer.transport.conninfo`."""
        info = connection_info(self._core, self._engine.core)
        if _transports.capabilities(str(info["transport"])).device_ipc:
            if why := self._engine.cuda_ipc_off():
                info["cuda_ipc_off"] = why
            elif why := self._engine.cuda_ipc_export_off():
                info["cuda_ipc_export_off"] = why
        return info

    def describe(self) -> str:
        """One line naming the peer, the streams and the negotiated settings (see
        :attr:`info`), e.g. ``"rdma to 10.77.0.2:5555, 1 RC QP(s) on rxe0, path_mtu 4096,
        max_rd_atomic 16, max_dest_rd_atomic 16, ..."``."""
        return connection_text(self._core)

    def stats(self) -> dict[str, int]:
        """This endpoint's counters: operations, bytes (per kind and per lane), errors, retries
        and credit stalls; every key and unit is listed in :mod:`rdmaxfer.transport.stats`."""
        return self._core.stats()

    @property
    def inflight(self) -> int:
        """Number of posted transfers not yet observed terminal."""
        return len(self._inflight)

    # -- two-sided -------------------------------------------------------------------------
    def post_send(
        self, array: object, *, chunk_size: int = 0, streams: int = 0, checksum: bool = False
    ) -> Transfer[None]:
        """Post a message carrying ``array`` (any dtype and shape, C-contiguous).

        Args:
            array: ndarray, Buffer, or an object exposing the buffer protocol,
                ``__array_interface__`` or ``__dlpack__``.
            chunk_size: bytes per wire chunk (0: chosen from the size).
            streams: how many of the endpoint's streams to spread over (0: all useful).
            checksum: end-to-end integrity: the XXH3-64 of the bytes (``xxhash``, about
                10 GB/s per core) travels with the message and the receiver verifies it,
                raising :class:`~rdmaxfer.errors.ChecksumError` on a mismatch. GPU memory is
                first copied whole to host memory (a blocking device-to-host copy made
                here), hashed there and sent from that copy.

        Returns:
            A Transfer whose ``wait()`` returns None once the receiver has the bytes.

        Raises:
            InvalidArgumentError: non-contiguous array (the message gives its strides and the
                fix), object or structured dtype.
            EndpointClosedError: the endpoint is closed.
        """
        arr, meta = message_of(array, checksum=checksum)  # a checksum is over host memory
        nbytes = int(arr.nbytes)
        temps: list[MemoryRegion] = []
        if isinstance(arr, np.ndarray):
            assert meta is not None  # host memory: message_of made its record
            region, offset, temps = self._engine.host_region(arr, writes=False)
            keep: list[object] = [arr, region]
            try:
                request = self._core.post_send(
                    region.core, offset, nbytes, meta, chunk_size, streams
                )
            except BaseException:
                self.release_temps(temps)
                raise
        else:  # GPU memory: GPUDirect or CUDA IPC when reachable, else staged through slabs
            request, keep, temps = self._engine.post_device_send(
                self._core, arr, chunk_size, streams
            )
        return self.track(
            Transfer(self, "send", nbytes, request, keep=keep, temps=temps, result=None)
        )

    def post_recv(
        self, out: object = None, *, device: str | int | None = None
    ) -> Transfer[npt.NDArray[Any]]:
        """Post the receive of one message.

        Args:
            out: where to place the bytes: a writable C-contiguous array (or Buffer...) of the
                message's exact dtype and shape. None allocates a new array of the sender's
                dtype and shape (bfloat16 as ``ml_dtypes.bfloat16``). A GPU array (CuPy,
                PyTorch, ``__cuda_array_interface__``, CUDA ``__dlpack__``, a device Buffer)
                is filled by CUDA IPC on a shm connection, by GPUDirect when registered for
                it, else through the staging pipeline.
            device: with ``out=None``, ``"cuda:N"`` allocates the new array on that GPU
                (returned as a CuPy array when CuPy is importable, else a device Buffer).

        Returns:
            A Transfer whose ``wait()`` returns the array (``out`` viewed as an ndarray, or
            the new array; a GPU ``out`` is returned as given).

        Raises (here, or from ``wait()`` once the header arrived):
            InvalidArgumentError: ``out`` is read-only or not contiguous; or the message's
                dtype/shape differ from ``out``'s: the message is then rejected before any
                byte is written (``out`` is untouched) and the sender gets a ProtocolError.
            ProtocolError: malformed message metadata (the message is rejected).
        """
        dest = None if out is None else receivable(out)
        gpu: int | None = None
        result: object = np.empty(0, np.uint8) if dest is None else dest
        if dest is not None and not isinstance(dest, np.ndarray):
            gpu, result = dest.device, out  # a GPU ``out`` is returned as given
        elif dest is None and device is not None and device != "cpu":
            from ..memory import cuda

            gpu, result = cuda.parse_device(device), None
        request = self._core.post_recv_header()
        transfer: Transfer[Any] = Transfer(
            self,
            "recv",
            -1,
            request,
            keep=[] if dest is None else [dest],
            temps=[],
            result=result,
            on_header=recv_step(self._engine, self._core, dest, gpu),
        )
        self.track(transfer)
        # Place the bytes as soon as the message is announced, even if no one waits yet.
        self._engine.notifications.call_when_done(request, transfer.done)
        return transfer

    def send(
        self,
        array: object,
        *,
        timeout: float | None = None,
        deadline: float | None = None,
        chunk_size: int = 0,
        streams: int = 0,
        checksum: bool = False,
    ) -> None:
        """Send ``array`` as one message and wait until the receiver has placed it.

        Args:
            array: see :meth:`post_send`.
            timeout: inactivity bound in seconds (default: ``RDMAXFER_TIMEOUT`` or 60): fails
                when no byte moved for that long (see :meth:`Transfer.wait`).
            deadline: optional bound on the whole call, in seconds (None: none).

        Raises:
            InvalidArgumentError: non-contiguous array, unsupported dtype.
            ProtocolError: the receiver rejected the message ("receiver rejected ...").
            TransferTimeoutError: no progress for ``timeout`` s, or past ``deadline`` (the
                endpoint is then aborted).
            ConnectionFailedError: the peer closed or reset the connection.
        """
        if not blocking.send(self, array, checksum, chunk_size, streams, timeout, deadline):
            post = self.post_send(array, chunk_size=chunk_size, streams=streams, checksum=checksum)
            post.wait(timeout, deadline=deadline)

    def recv(
        self,
        out: object = None,
        *,
        timeout: float | None = None,
        deadline: float | None = None,
        device: str | int | None = None,
    ) -> npt.NDArray[Any]:
        """Receive one message.

        Args:
            out: see :meth:`post_recv`.
            timeout: seconds (default: ``RDMAXFER_TIMEOUT`` or 60): the bound on the wait for a
                message, then on inactivity while its bytes arrive (no byte for that long). If
                no message arrives in time the wait is withdrawn and the endpoint stays usable;
                if the bytes stop arriving the endpoint is aborted.
            deadline: optional bound on the whole receive, in seconds (None: none).

        Returns:
            The array received into (of the sender's dtype and shape).

        Raises:
            InvalidArgumentError: ``out`` does not match the message (``out`` untouched; the
                sender gets a ProtocolError), is read-only or non-contiguous.
            TransferTimeoutError: nothing (or not everything) arrived in time.
            ConnectionFailedError: the peer closed or reset the connection.
            ProtocolError: malformed message metadata.
        """
        if (got := blocking.recv(self, out, device, timeout, deadline)) is not None:
            return got
        return self.post_recv(out, device=device).wait(timeout, deadline=deadline)

    async def asend(
        self,
        array: object,
        *,
        timeout: float | None = None,
        deadline: float | None = None,
        chunk_size: int = 0,
        streams: int = 0,
        checksum: bool = False,
    ) -> None:
        """Asyncio twin of :meth:`send` (posted off the event loop)."""
        transfer = await posted(
            lambda: self.post_send(array, chunk_size=chunk_size, streams=streams, checksum=checksum)
        )
        await transfer.wait_async(timeout, deadline=deadline)

    async def arecv(
        self,
        out: object = None,
        *,
        timeout: float | None = None,
        deadline: float | None = None,
        device: str | int | None = None,
    ) -> npt.NDArray[Any]:
        """Asyncio twin of :meth:`recv` (posted off the event loop)."""
        transfer = await posted(lambda: self.post_recv(out, device=device))
        return await transfer.wait_async(timeout, deadline=deadline)

    def reject(self, msg_id: int, reason: str) -> None:
        """Refuse an incoming message by id (low level: ``recv`` does this on a mismatch)."""
        self._core.reject(msg_id, reason)

    # -- one-sided -------------------------------------------------------------------------
    def _post_one_sided(
        self,
        op: str,
        local: object,
        remote: object,
        offset: int,
        remote_offset: int,
        nbytes: int | None,
        chunk_size: int,
        streams: int,
        notify: Notify | None = None,
    ) -> Transfer[None]:
        writable = op == "read"
        _core.check_notify(notify)
        local_mem, descriptor, length, remote_at = one_sided_of(
            op, local, remote, offset, remote_offset, nbytes
        )
        temps: list[MemoryRegion] = []
        if isinstance(local_mem, np.ndarray):
            region, base, temps = self._engine.host_region(local_mem, writes=writable)
            direct: tuple[MemoryRegion, int] | None = (region, base)
        else:  # GPU memory: straight from/into it (GPUDirect, CUDA IPC on shm), else staged
            found = self._engine.device_direct(local_mem, self._core.transport)
            direct, temps = (None, []) if found is None else ((found[0], found[1]), found[2])
        if direct is not None:
            region, base = direct
            keep: list[object] = [local_mem, region]
            try:
                request = self._post_direct(
                    op, region, base + offset, descriptor, remote_at, length, chunk_size, streams,
                    notify,
                )  # fmt: skip
            except BaseException:
                self.release_temps(temps)
                raise
        else:
            assert not isinstance(local_mem, np.ndarray)
            no_staged_notify(notify)
            stager = self._engine.stager(local_mem.device)
            post_staged = stager.post_read if writable else stager.post_write
            keep = [local_mem]
            request = post_staged(
                self._core, local_mem.ptr + offset, length, descriptor, remote_at, chunk_size, 0,
                staged_backstop_s(), streams,
            )  # fmt: skip
        return self.track(Transfer(self, op, length, request, keep=keep, temps=temps, result=None))

    def post_write(
        self,
        local: object,
        remote: RemoteLike,
        *,
        offset: int = 0,
        remote_offset: int = 0,
        nbytes: int | None = None,
        chunk_size: int = 0,
        streams: int = 0,
        notify: Notify | None = None,
    ) -> Transfer[None]:
        """Post a one-sided WRITE of ``local``'s bytes into the peer's registered region.

        Args:
            local: the source (array, Buffer, MemoryRegion, buffer-protocol object).
            remote: the peer's region: a Descriptor or its 40 packed bytes.
            offset: first byte of ``local`` to send.
            remote_offset: where in the remote region the bytes go.
            nbytes: how many bytes (default: the rest of ``local`` from ``offset``).
            notify: a payload (bytes, at most 64, or an int in 0..2**32-1) the peer gets from
                ``Engine.wait_notification`` once every byte is in its memory, on every lane
                that carried them (see :mod:`rdmaxfer.transport.batch`).

        Raises (here, or from ``wait()``):
            InvalidArgumentError: non-contiguous source, range outside ``local``.
            ProtocolError: malformed descriptor bytes.
            RemoteAccessError: the peer refused: unknown/deregistered key, range outside its
                region, or the region does not allow remote writes.
        """
        return self._post_one_sided(
            "write", local, remote, offset, remote_offset, nbytes, chunk_size, streams, notify
        )

    def post_read(
        self,
        local: object,
        remote: RemoteLike,
        *,
        offset: int = 0,
        remote_offset: int = 0,
        nbytes: int | None = None,
        chunk_size: int = 0,
        streams: int = 0,
    ) -> Transfer[None]:
        """Post a one-sided READ of the peer's registered region into ``local``.

        Same arguments and errors as :meth:`post_write`, with ``local`` the (writable)
        destination; RemoteAccessError when the region does not allow remote reads.
        """
        return self._post_one_sided(
            "read", local, remote, offset, remote_offset, nbytes, chunk_size, streams
        )

    def write(
        self,
        local: object,
        remote: RemoteLike,
        *,
        offset: int = 0,
        remote_offset: int = 0,
        nbytes: int | None = None,
        timeout: float | None = None,
        deadline: float | None = None,
        chunk_size: int = 0,
        streams: int = 0,
        notify: Notify | None = None,
    ) -> None:
        """Blocking :meth:`post_write`: returns once the bytes are placed in the peer's memory
        (and, with ``notify``, the notification is on its way).

        Args: as :meth:`post_write`, plus ``timeout``: inactivity bound in seconds (default
        ``RDMAXFER_TIMEOUT`` or 60: fails when no byte moved for that long) and ``deadline``:
        optional bound on the whole call in seconds (None: none).

        Raises:
            TransferTimeoutError: no progress for ``timeout`` seconds, or past ``deadline``;
                the endpoint is then aborted.
            RemoteAccessError, InvalidArgumentError, ProtocolError, ConnectionFailedError: the
                peer refused the access, an argument is bad, the peer broke the protocol, or the
                connection failed.
        """
        if notify is None and blocking.one_sided(
            self, "write", local, remote, offset, remote_offset, nbytes, chunk_size, streams,
            timeout, deadline,
        ):  # fmt: skip
            return
        self.post_write(
            local, remote, offset=offset, remote_offset=remote_offset, nbytes=nbytes,
            chunk_size=chunk_size, streams=streams, notify=notify,
        ).wait(timeout, deadline=deadline)  # fmt: skip

    def read(
        self,
        local: object,
        remote: RemoteLike,
        *,
        offset: int = 0,
        remote_offset: int = 0,
        nbytes: int | None = None,
        timeout: float | None = None,
        deadline: float | None = None,
        chunk_size: int = 0,
        streams: int = 0,
    ) -> None:
        """Blocking :meth:`post_read`: returns once the bytes are in ``local``.

        Raises: as :meth:`write`.
        """
        if blocking.one_sided(
            self, "read", local, remote, offset, remote_offset, nbytes, chunk_size, streams,
            timeout, deadline,
        ):  # fmt: skip
            return
        self.post_read(
            local, remote, offset=offset, remote_offset=remote_offset, nbytes=nbytes,
            chunk_size=chunk_size, streams=streams,
        ).wait(timeout, deadline=deadline)  # fmt: skip

    async def awrite(
        self,
        local: object,
        remote: RemoteLike,
        *,
        offset: int = 0,
        remote_offset: int = 0,
        nbytes: int | None = None,
        timeout: float | None = None,
        deadline: float | None = None,
        chunk_size: int = 0,
        streams: int = 0,
        notify: Notify | None = None,
    ) -> None:
        """Asyncio twin of :meth:`write` (posted off the event loop)."""
        args = (local, remote, offset, remote_offset, nbytes, chunk_size, streams, notify)
        transfer = await posted(lambda: self._post_one_sided("write", *args))
        await transfer.wait_async(timeout, deadline=deadline)

    async def aread(
        self,
        local: object,
        remote: RemoteLike,
        *,
        offset: int = 0,
        remote_offset: int = 0,
        nbytes: int | None = None,
        timeout: float | None = None,
        deadline: float | None = None,
        chunk_size: int = 0,
        streams: int = 0,
    ) -> None:
        """Asyncio twin of :meth:`read` (posted off the event loop)."""
        args = (local, remote, offset, remote_offset, nbytes, chunk_size, streams)
        transfer = await posted(lambda: self._post_one_sided("read", *args))
        await transfer.wait_async(timeout, deadline=deadline)

    # -- lifecycle -------------------------------------------------------------------------
    def close(self) -> None:
        """Close gracefully (idempotent): the peer is told, pending transfers fail with
        EndpointClosedError, their memory is released. (In a child of ``os.fork()`` an
        inherited endpoint is the parent's: closing it does nothing.)"""
        if self._engine.inherited():
            return
        with contextlib.suppress(RdmaxferError):
            self._core.close()
        self._settle_all()
        self._closed_now()

    def begin_close(self) -> None:
        """Internal: start a graceful close, not waiting for it (Engine.close, then close())."""
        with contextlib.suppress(RdmaxferError):
            self._core.begin_close()

    def abort(self, reason: str = "aborted by the application") -> None:
        """Tear down at once: pending transfers fail with ``reason``."""
        self.abort_core(reason, timed_out=False)
        self._settle_all()
        self._closed_now()

    def __enter__(self) -> Endpoint:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"<Endpoint {state} peer={self.peer} streams={self.streams}>"

    # -- internal: for the package's own modules (transfer, blocking), not part of the API -
    @property
    def notifications(self) -> Notifications:
        """Internal: the engine's completion notifications."""
        return self._engine.notifications

    def _closed_now(self) -> None:
        if self._on_close is not None:
            self._on_close(self)

    def abort_core(self, reason: str, *, timed_out: bool) -> None:
        """Internal: abort the connection (a transfer failed or timed out)."""
        with contextlib.suppress(RdmaxferError):
            self._core.abort(reason, timed_out)

    def _settle_all(self) -> None:
        self._inflight.settle_all(EndpointClosedError(f"endpoint to {self.peer} was closed"))

    def track(self, transfer: Transfer[T]) -> Transfer[T]:
        """Internal: hold ``transfer`` in flight until it is terminal; returns it."""
        self._inflight.add(transfer)
        return transfer

    def untrack(self, transfer: Transfer[Any]) -> None:
        """Internal: forget a terminal transfer."""
        self._inflight.remove(transfer)

    def release_temps(
        self, temps: list[MemoryRegion], timeout_s: float | None = None, *, failed: bool = True
    ) -> None:
        """Internal: hand back an operation's temporaries (kept cached after a success)."""
        if temps:  # most operations use registered memory: nothing to hand back
            self._engine.release_temps(temps, resolve_timeout(timeout_s), failed=failed)
