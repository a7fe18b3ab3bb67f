"""A connection to one peer: two-sided messages and one-sided READ/WRITE.

Every operation comes in three forms: blocking (``send``), asyncio (``asend``) and posted
(``post_send``, returning a :class:`~rdmaxfer.transfer.Transfer`). Two-sided messages carry the
array's dtype and shape (see :mod:`rdmaxfer._meta`), so ``recv()`` can allocate the array or
check ``out`` before any byte is written.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import numpy.typing as npt

from . import _core, _meta
from ._args import byte_range, descriptor_of, receivable, sendable
from .buffer import Buffer, MemoryRegion, as_array, device_view
from .errors import ChecksumError, EndpointClosedError, InvalidArgumentError, RdmaxferError
from .transfer import HeaderStep, Transfer

if TYPE_CHECKING:
    from types import TracebackType

    from .engine import Engine

__all__ = ["Endpoint", "RemoteLike"]

#: What names a peer's registered region: a Descriptor, its 40 packed bytes, or (same process)
#: the MemoryRegion or registered Buffer itself.
RemoteLike = _core.Descriptor | bytes | bytearray | memoryview | MemoryRegion | Buffer

_SWEEP_MIN = 64

T = TypeVar("T")


class Endpoint:
    """A connection to one peer, made by ``Engine.connect`` or ``Engine.accept``.

    Lifecycle: connected -> closed, by ``close()`` (graceful), ``abort()``, the engine's
    ``close()``, or a failure: a transfer that times out or finds the peer gone closes the
    endpoint, since its stream can no longer be trusted (connect again; the engine stays
    usable). A receive that times out while still waiting for a message leaves it open.
    Objects used by in-flight transfers stay alive until the transfers end. Thread-safe.
    """

    def __init__(self, engine: Engine, core: _core.Endpoint) -> None:
        self._engine = engine
        self._core = core
        self._lock = threading.Lock()
        self._inflight: dict[int, Transfer[Any]] = {}
        self._ids = itertools.count(1)
        self._sweep_at = _SWEEP_MIN

    # -- properties ------------------------------------------------------------------------
    @property
    def engine(self) -> Engine:
        """The engine that made this endpoint."""
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
        """What this connection is and what was negotiated with the peer.

        Keys: ``transport`` (``"tcp"``/``"rdma"``), ``peer`` (``host:port``), ``streams``; on
        rdma also ``path_mtu`` (bytes: the smaller active MTU of the two ports),
        ``max_rd_atomic`` (RDMA READs this side keeps outstanding: the minimum of its
        initiator depth and the peer's responder resources), ``max_dest_rd_atomic`` (READs it
        serves at once: its responder resources against the peer's initiator depth, both from
        the endpoint records), ``max_inline`` (bytes) and ``rnr_retry``.
        """
        info: dict[str, int | str] = {
            "transport": self._engine.transport,
            "peer": self.peer,
            "streams": self.streams,
        }
        info.update(self._core.attributes())
        return info

    def describe(self) -> str:
        """One line naming the peer, the streams and the negotiated settings (see
        :attr:`info`), e.g. ``"rdma to 10.77.0.2:5555, 1 RC QP(s) on rxe0, path_mtu 4096,
        max_rd_atomic 16, max_dest_rd_atomic 16, ..."``."""
        text = self._core.describe()
        return (
            text if text.startswith(self._engine.transport) else f"{self._engine.transport} {text}"
        )

    def stats(self) -> dict[str, int]:
        """This endpoint's counters: operations, bytes (per kind and per lane), errors, retries
        and credit stalls; every key and unit is listed in :mod:`rdmaxfer.stats`."""
        return self._core.stats()

    @property
    def inflight(self) -> int:
        """Number of posted transfers not yet observed terminal."""
        with self._lock:
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
                raising :class:`~rdmaxfer.errors.ChecksumError` on a mismatch.

        Returns:
            A Transfer whose ``wait()`` returns None once the receiver has the bytes.

        Raises:
            InvalidArgumentError: non-contiguous array (the message gives its strides and the
                fix), object or structured dtype.
            EndpointClosedError: the endpoint is closed.
        """
        arr = sendable(array)
        if not isinstance(arr, np.ndarray):  # GPU memory: staged through pinned host buffers
            from . import staging

            return staging.post_send(self, arr, chunk_size, streams)
        digest = _meta.payload_checksum(arr) if checksum else None
        meta = _meta.encode(arr.dtype, tuple(arr.shape), digest)
        nbytes = int(arr.nbytes)
        region, offset, temps = self._engine._local(arr, writes=False)
        try:
            request = self._core.post_send(region.core, offset, nbytes, meta, chunk_size, streams)
        except BaseException:
            self._release(temps)
            raise
        return self._track(
            Transfer(self, "send", nbytes, request, keep=[arr, region], temps=temps, result=None)
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
                is filled through the staging pipeline.
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
        # GPU memory (``out`` on a GPU, or device="cuda:N"): see rdmaxfer.staging.post_recv.
        if dest is not None and not isinstance(dest, np.ndarray):
            from . import staging

            return staging.post_recv(self, dest, out, dest.device)
        if device is not None and device != "cpu":
            from . import cuda, staging

            return staging.post_recv(self, None, out, cuda.parse_device(device))
        request = self._core.post_recv_header()
        transfer: Transfer[npt.NDArray[Any]] = Transfer(
            self,
            "recv",
            -1,
            request,
            keep=[] if dest is None else [dest],
            temps=[],
            result=np.empty(0, np.uint8) if dest is None else dest,
            on_header=self._make_recv_step(dest),
        )
        self._track(transfer)
        # Place the bytes as soon as the message is announced, even if no one waits yet.
        self._engine._notifications.call_when_done(request, transfer.done)
        return transfer

    def _make_recv_step(self, dest: npt.NDArray[Any] | None) -> HeaderStep:
        def step(transfer: Transfer[Any], header: _core.Request) -> _core.Request:
            msg_id, length, meta = header.message()
            rejected = False

            def reject(reason: str) -> None:
                nonlocal rejected
                rejected = True
                with contextlib.suppress(RdmaxferError):
                    self._core.reject(msg_id, reason)

            try:
                try:
                    dtype, shape = _meta.decode(meta, length)
                except RdmaxferError as exc:
                    reject(f"receiver could not read the message metadata: {exc}")
                    raise
                if dest is not None:
                    if dest.dtype != dtype or tuple(dest.shape) != shape:
                        reason = (
                            f"the message is dtype {_meta.dtype_token(dtype)} shape {shape} "
                            f"({length} bytes) but out is dtype {_token(dest.dtype)} shape "
                            f"{tuple(dest.shape)} ({dest.nbytes} bytes)"
                        )
                        reject(reason)
                        raise InvalidArgumentError(
                            f"recv from {self._core.peer}: {reason}; nothing was written to out "
                            "and the message was rejected: pass an out of that dtype and shape, "
                            "or out=None to allocate one"
                        )
                    target = dest
                else:
                    target = np.empty(shape, dtype=dtype)
                region, offset, temps = self._engine._local(target, writes=True)
                transfer._add_resources([target, region], temps)
                transfer._set_result(target, length)
                expected = _meta.checksum(meta)
                if expected is not None:
                    transfer._on_done = _checksum_verifier(target, expected, self._core.peer)
                return self._core.post_recv(msg_id, region.core, offset, length)
            except BaseException as exc:
                if not rejected:
                    reject(f"receiver failed: {exc}")
                raise

        return step

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
        self.post_send(array, chunk_size=chunk_size, streams=streams, checksum=checksum).wait(
            timeout, deadline=deadline
        )

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
        """Asyncio twin of :meth:`send`."""
        await self.post_send(
            array, chunk_size=chunk_size, streams=streams, checksum=checksum
        ).wait_async(timeout, deadline=deadline)

    async def arecv(
        self,
        out: object = None,
        *,
        timeout: float | None = None,
        deadline: float | None = None,
        device: str | int | None = None,
    ) -> npt.NDArray[Any]:
        """Asyncio twin of :meth:`recv`."""
        return await self.post_recv(out, device=device).wait_async(timeout, deadline=deadline)

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
    ) -> Transfer[None]:
        writable = op == "read"
        what = "destination of the read" if writable else "source of the write"
        view = device_view(local, writable=writable, what=what)
        if view is not None:  # GPU memory: GPUDirect if registered for it, else staged
            from . import staging

            return staging.post_one_sided(
                self,
                op,
                view,
                descriptor_of(remote),
                offset,
                remote_offset,
                nbytes,
                chunk_size,
                streams,
            )
        arr = as_array(local, writable=writable, what=what)
        descriptor = descriptor_of(remote)
        length = byte_range(int(arr.nbytes), offset, nbytes, what)
        if isinstance(remote_offset, bool) or not isinstance(remote_offset, int):
            raise InvalidArgumentError(f"remote_offset={remote_offset!r} must be an integer")
        if remote_offset < 0:
            raise InvalidArgumentError(f"remote_offset={remote_offset} must be >= 0")
        region, base, temps = self._engine._local(arr, writes=writable)
        post = self._core.post_read if writable else self._core.post_write
        try:
            request = post(
                region.core, base + offset, descriptor, remote_offset, length, chunk_size, streams
            )
        except BaseException:
            self._release(temps)
            raise
        return self._track(
            Transfer(self, op, length, request, keep=[arr, region], temps=temps, result=None)
        )

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
    ) -> Transfer[None]:
        """Post a one-sided WRITE of ``local``'s bytes into the peer's registered region.

        Args:
            local: the source (array, Buffer, MemoryRegion, buffer-protocol object).
            remote: the peer's region: a Descriptor or its 40 packed bytes.
            offset: first byte of ``local`` to send.
            remote_offset: where in the remote region the bytes go.
            nbytes: how many bytes (default: the rest of ``local`` from ``offset``).

        Raises (here, or from ``wait()``):
            InvalidArgumentError: non-contiguous source, range outside ``local``.
            ProtocolError: malformed descriptor bytes.
            RemoteAccessError: the peer refused: unknown/deregistered key, range outside its
                region, or the region does not allow remote writes.
        """
        return self._post_one_sided(
            "write", local, remote, offset, remote_offset, nbytes, chunk_size, streams
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
    ) -> None:
        """Blocking :meth:`post_write`: returns once the bytes are placed in the peer's memory.

        Args: as :meth:`post_write`, plus ``timeout``: inactivity bound in seconds (default
        ``RDMAXFER_TIMEOUT`` or 60: fails when no byte moved for that long) and ``deadline``:
        optional bound on the whole call in seconds (None: none).

        Raises:
            TransferTimeoutError: no progress for ``timeout`` seconds, or past ``deadline``;
                the endpoint is then aborted.
            RemoteAccessError, InvalidArgumentError, ProtocolError, ConnectionFailedError.
        """
        self.post_write(
            local,
            remote,
            offset=offset,
            remote_offset=remote_offset,
            nbytes=nbytes,
            chunk_size=chunk_size,
            streams=streams,
        ).wait(timeout, deadline=deadline)

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
        self.post_read(
            local,
            remote,
            offset=offset,
            remote_offset=remote_offset,
            nbytes=nbytes,
            chunk_size=chunk_size,
            streams=streams,
        ).wait(timeout, deadline=deadline)

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
    ) -> None:
        """Asyncio twin of :meth:`write`."""
        transfer = self.post_write(
            local,
            remote,
            offset=offset,
            remote_offset=remote_offset,
            nbytes=nbytes,
            chunk_size=chunk_size,
            streams=streams,
        )
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
        """Asyncio twin of :meth:`read`."""
        transfer = self.post_read(
            local,
            remote,
            offset=offset,
            remote_offset=remote_offset,
            nbytes=nbytes,
            chunk_size=chunk_size,
            streams=streams,
        )
        await transfer.wait_async(timeout, deadline=deadline)

    # -- lifecycle -------------------------------------------------------------------------
    def close(self) -> None:
        """Close gracefully (idempotent): the peer is told, pending transfers fail with
        EndpointClosedError, their memory is released. (In a child of ``os.fork()`` an
        inherited endpoint is the parent's: closing it does nothing.)"""
        if self._engine._inherited():
            return
        with contextlib.suppress(RdmaxferError):
            self._core.close()
        self._settle_all()
        self._engine._forget_endpoint(self)

    def abort(self, reason: str = "aborted by the application") -> None:
        """Tear down at once: pending transfers fail with ``reason``."""
        self._abort_core(reason, timed_out=False)
        self._settle_all()
        self._engine._forget_endpoint(self)

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

    # -- internals -------------------------------------------------------------------------
    def _abort_core(self, reason: str, *, timed_out: bool) -> None:
        with contextlib.suppress(RdmaxferError):
            self._core.abort(reason, timed_out)

    def _settle_all(self) -> None:
        with self._lock:
            transfers = list(self._inflight.values())
        for transfer in transfers:
            transfer._settle(EndpointClosedError(f"endpoint to {self.peer} was closed"))

    def _track(self, transfer: Transfer[T]) -> Transfer[T]:
        with self._lock:
            transfer.id = next(self._ids)
            self._inflight[transfer.id] = transfer
            sweep = len(self._inflight) >= self._sweep_at
            candidates = list(self._inflight.values()) if sweep else []
        for other in candidates:
            other.done()
        if sweep:
            with self._lock:
                self._sweep_at = max(_SWEEP_MIN, 2 * len(self._inflight))
        return transfer

    def _untrack(self, transfer: Transfer[Any]) -> None:
        with self._lock:
            self._inflight.pop(transfer.id, None)

    @staticmethod
    def _release(temps: list[MemoryRegion]) -> None:
        for region in temps:
            with contextlib.suppress(RdmaxferError):
                region.deregister()


def _token(dtype: np.dtype[Any]) -> str:
    try:
        return _meta.dtype_token(dtype)
    except InvalidArgumentError:
        return str(dtype)


def _checksum_verifier(target: npt.NDArray[Any], expected: int, peer: str) -> Callable[[], None]:
    def verify() -> None:
        got = _meta.payload_checksum(target)
        if got != expected:
            raise ChecksumError(
                f"recv from {peer}: the {target.nbytes} bytes that arrived have XXH3-64 "
                f"{got:016x} but the sender computed {expected:016x}; the data was corrupted "
                "on the way (check the NIC/link, or retry)"
            )

    return verify
