"""The group of ranks of :mod:`rdmaxfer.distributed`: its engine and listener, the
connections made on first use (with the hello), point-to-point send/recv, barrier and the
broadcast ring (:mod:`.broadcast`)."""

from __future__ import annotations

import contextlib
import logging
import secrets
import threading
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import Any, NoReturn, TypeVar, overload

import numpy as np
import numpy.typing as npt

from .._config import Deadline, format_address, parse_address, resolve_timeout
from ..errors import (
    ConnectionFailedError,
    EndpointClosedError,
    InvalidArgumentError,
    ProtocolError,
    RdmaxferError,
    TransferTimeoutError,
)
from ..memory import cuda
from ..transport.endpoint import Endpoint
from ..transport.engine import Engine, resolve_transport
from .broadcast import ArrayDict, Source, decode_meta, destination, encode_meta, relay
from .broadcast import ring as broadcast_ring
from .broadcast import source as broadcast_source
from .store import PROTOCOL_VERSION, Record, Store, check_int, hello, reachable_host

__all__ = ["DEFAULT_CHUNK_BYTES", "DEFAULT_NAMESPACE", "PROTOCOL_VERSION", "RdmaGroup"]

log = logging.getLogger("rdmaxfer.distributed")

DEFAULT_CHUNK_BYTES = 8 << 20
"""Broadcast piece size in bytes: large enough to amortise per-message costs, small enough
that a ring of 4 ranks is busy end to end after the first few pieces."""
DEFAULT_NAMESPACE = "rdmaxfer"
_ACCEPT_POLL_S = 0.25
_CLOSE_JOIN_S = 5.0

_generations: dict[str, int] = {}
_generations_lock = threading.Lock()

T = TypeVar("T")


class RdmaGroup:
    """The ranks of a job connected through rdmaxfer (made by :func:`init`).

    Lifecycle: open (listening; the address is in the store) -> connections made lazily by the
    first exchange between two ranks -> broken (a collective failed or a connection died:
    every connection aborted, calls raise) -> closed (``close()`` or leaving a ``with`` block;
    idempotent). Methods are meant to be called from one thread per rank, in the same order
    on every rank (like ``torch.distributed``).
    """

    def __init__(
        self,
        store: Any,
        rank: int,
        world_size: int,
        *,
        transport: str = "auto",
        host: str | None = None,
        timeout: float | None = None,
        namespace: str = DEFAULT_NAMESPACE,
        streams: int = 0,
        io_threads: int = 0,
        rdma_device: str | None = None,
        gid_index: int | None = None,
        secret: str | bytes | None = None,
    ) -> None:
        self._world = check_int("world_size", world_size, 1)
        self._rank = check_int("rank", rank, 0, self._world)
        self._timeout = resolve_timeout(timeout)
        if not isinstance(namespace, str) or not namespace or "/" in namespace:
            raise InvalidArgumentError(
                f"namespace={namespace!r} must be a non-empty string without '/'"
            )
        self._store = Store(store)
        with _generations_lock:
            generation = _generations.get(namespace, 0)
            _generations[namespace] = generation + 1
        self._prefix = f"{namespace}/{generation}/"
        listen_host = host if host is not None else reachable_host(store)
        listen_host, _ = parse_address(listen_host, 0)
        self._engine = Engine(
            resolve_transport(transport),
            io_threads,
            0,
            streams,
            rdma_device=rdma_device,
            gid_index=gid_index,
            secret=secret,
        )
        self._token = secrets.randbits(62)
        self._lock = threading.Condition(threading.RLock())
        self._peer_locks = [threading.Lock() for _ in range(self._world)]
        self._endpoints: dict[int, Endpoint] = {}
        self._arrived: dict[int, Endpoint] = {}
        self._records: dict[int, Record] = {}
        self._broken: str | None = None
        self._closed = False
        self._barriers = 0
        try:
            port = self._engine.listen(listen_host, 0)
            self._address = format_address(listen_host, port)
            record = Record(self._address, self._engine.transport, self._world, self._token)
            self._store.set(self._key(f"rank/{self._rank}"), record.pack())
        except BaseException:
            self._engine.close()
            raise
        self._acceptor = threading.Thread(
            target=self._accept_loop, name=f"rdmaxfer-dist-accept-{self._rank}", daemon=True
        )
        self._acceptor.start()

    # -- properties ----------------------------------------------------------------------------
    @property
    def rank(self) -> int:
        """This rank."""
        return self._rank

    @property
    def world_size(self) -> int:
        """Number of ranks."""
        return self._world

    @property
    def address(self) -> str:
        """``host:port`` this rank listens on (published in the store)."""
        return self._address

    @property
    def transport(self) -> str:
        """``"tcp"`` or ``"rdma"``."""
        return self._engine.transport

    @property
    def engine(self) -> Engine:
        """The rank's engine (register memory on it for one-sided access by peers)."""
        return self._engine

    @property
    def timeout(self) -> float:
        """Default bound, in seconds, of every wait."""
        return self._timeout

    @property
    def broken(self) -> str | None:
        """Why the group is broken, or None."""
        return self._broken

    @property
    def closed(self) -> bool:
        """True once ``close()`` was called."""
        return self._closed

    # -- point to point --------------------------------------------------------------------------
    def endpoint(self, peer: int, *, timeout: float | None = None) -> Endpoint:
        """The connection to rank ``peer``, made now if needed (the lower rank connects).

        The other rank must take part (call an operation involving this rank) within
        ``timeout`` seconds.

        Raises:
            InvalidArgumentError: ``peer`` out of range, or this rank itself.
            TransferTimeoutError: the peer did not publish its address or connect in time.
            ConnectionFailedError: the peer cannot be reached, or the group is broken.
            ProtocolError: the peer's record is not an rdmaxfer record of this version.
        """
        peer = check_int("peer", peer, 0, self._world)
        if peer == self._rank:
            raise InvalidArgumentError(f"rank {peer} is this rank: pick another peer")
        return self._peer(peer, Deadline(self._resolve(timeout)))

    def send(self, array: object, dst: int, *, timeout: float | None = None) -> None:
        """Send ``array`` (any dtype and shape, C-contiguous) to rank ``dst``; returns once
        ``dst`` has placed the bytes. ``dst`` calls ``recv(src=this rank)``.

        Args:
            array: ndarray (or Buffer, or buffer-protocol object), C-contiguous; or GPU memory
                (CuPy, torch CUDA, any ``__cuda_array_interface__``/CUDA ``__dlpack__``
                object, a device Buffer), staged or by GPUDirect as the engine decides.
            dst: the receiving rank.
            timeout: seconds for the connection and for the transfer, each (default: the
                group's).

        Raises:
            InvalidArgumentError: bad ``dst`` or a non-contiguous array.
            ProtocolError: ``dst`` rejected the array (its ``out`` has another dtype/shape).
            TransferTimeoutError: ``dst`` did not connect or take the bytes in time.
            ConnectionFailedError: ``dst`` is gone (the group is then broken).
        """
        dst = check_int("dst", dst, 0, self._world)
        if dst == self._rank:
            raise InvalidArgumentError(f"dst={dst} is this rank: send to another rank")
        timeout_s = self._resolve(timeout)
        endpoint = self._peer(dst, Deadline(timeout_s))
        self._guard(
            endpoint, f"send to rank {dst}", lambda: endpoint.send(array, timeout=timeout_s)
        )

    def recv(
        self,
        src: int,
        out: object = None,
        *,
        timeout: float | None = None,
        device: str | int | None = None,
    ) -> Any:
        """Receive the next array sent by rank ``src``.

        Args:
            src: the sending rank.
            out: a writable C-contiguous array of the message's exact dtype and shape (host
                memory, or GPU memory as :meth:`send` takes it), or None to allocate one.
            timeout: seconds for the connection and for the receive, each (default: the
                group's).
            device: with ``out=None``: ``"cuda:N"`` allocates the array on that GPU (a CuPy
                array when CuPy is importable, else a device Buffer); None: host memory.

        Returns:
            The array (a host ``out`` viewed as an ndarray, a GPU ``out`` as given, or a new
            array of the sender's dtype and shape).

        Raises:
            InvalidArgumentError: bad ``src``; ``out`` does not match (``out`` untouched).
            TransferTimeoutError: nothing arrived in time (the connection stays usable if no
                byte had arrived).
            ConnectionFailedError: ``src`` is gone (the group is then broken).
        """
        src = check_int("src", src, 0, self._world)
        if src == self._rank:
            raise InvalidArgumentError(f"src={src} is this rank: receive from another rank")
        timeout_s = self._resolve(timeout)
        endpoint = self._peer(src, Deadline(timeout_s))
        return self._guard(
            endpoint,
            f"recv from rank {src}",
            lambda: endpoint.recv(out, timeout=timeout_s, device=device),
        )

    # -- collectives -----------------------------------------------------------------------------
    def barrier(self, *, timeout: float | None = None) -> None:
        """Return once every rank of the group has called ``barrier`` (through the store).

        Raises:
            TransferTimeoutError: not every rank arrived within ``timeout`` seconds (the
                message says how many did); the group is then broken.
        """
        self._check_usable()
        deadline = Deadline(self._resolve(timeout))
        self._barriers += 1
        key = self._key(f"barrier/{self._barriers}")
        try:
            if self._store.add(key, 1) >= self._world:
                self._store.set(key + "/done", b"1")
            self._store.get(key + "/done", deadline, f"barrier {self._barriers}")
        except TransferTimeoutError as exc:
            arrived = self._store.add(key, 0)
            message = (
                f"barrier {self._barriers}: {arrived} of {self._world} ranks arrived within "
                f"{deadline.timeout_s:g} s: a rank died, hangs, or did not call barrier()"
            )
            self._fail(message)
            raise TransferTimeoutError(message) from exc

    @overload
    def broadcast(
        self,
        obj: npt.NDArray[Any],
        src: int = 0,
        ranks: Sequence[int] | None = None,
        *,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        timeout: float | None = None,
        device: str | int | None = None,
    ) -> npt.NDArray[Any]: ...

    @overload
    def broadcast(
        self,
        obj: Mapping[str, Any],
        src: int = 0,
        ranks: Sequence[int] | None = None,
        *,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        timeout: float | None = None,
        device: str | int | None = None,
    ) -> ArrayDict: ...

    @overload
    def broadcast(
        self,
        obj: object,
        src: int = 0,
        ranks: Sequence[int] | None = None,
        *,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        timeout: float | None = None,
        device: str | int | None = None,
    ) -> Any: ...

    def broadcast(
        self,
        obj: object,
        src: int = 0,
        ranks: Sequence[int] | None = None,
        *,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        timeout: float | None = None,
        device: str | int | None = None,
    ) -> Any:
        """Broadcast an array, or a dict of arrays (model weights), from rank ``src`` to every
        rank of ``ranks``: a pipelined ring of point-to-point transfers (see the module doc).

        Every rank of ``ranks`` calls ``broadcast`` with the same ``src``, ``ranks`` and
        ``chunk_bytes``; ranks outside ``ranks`` do not call it.

        Args:
            obj: on ``src``: the C-contiguous array, or a ``{name: array}`` dict (any dtypes,
                bfloat16 and float8 included). Elsewhere: None to allocate the result, or an
                array / dict of arrays of the same names, dtypes and shapes to fill in place
                (torch-style). Any array may be GPU memory (a CuPy array, a torch CUDA tensor,
                any ``__cuda_array_interface__`` or CUDA ``__dlpack__`` object, a device
                Buffer), host and GPU arrays mixed in one dict.
            src: the rank holding the data.
            ranks: the ranks taking part (default: all); must contain ``src`` and this rank.
            chunk_bytes: piece size in bytes (default 8 MiB); every rank must pass the same.
            timeout: seconds bounding each wait (connection, metadata, each piece; default:
                the group's): a stalled or dead neighbour raises within that time of the last
                progress.
            device: on a receiving rank with ``obj`` None: ``"cuda:N"`` allocates the result
                on that GPU (CuPy arrays when CuPy is importable, else device Buffers); None:
                host memory.

        Returns:
            On ``src``: ``obj``. Elsewhere: the array, or a dict in ``src``'s order. Without
            ``out``, the arrays of a dict are views into one buffer (64-byte aligned).

        Raises:
            InvalidArgumentError: bad ``src``/``ranks``/``chunk_bytes``; ``obj`` on ``src`` is
                not an array or a dict of arrays; ``obj`` elsewhere does not match what ``src``
                sends (that rank raises; the ranks after it in the ring get a
                ConnectionFailedError).
            TransferTimeoutError: a neighbour did not connect or send in time.
            ConnectionFailedError: a neighbour died or the group is broken.
            ProtocolError: malformed metadata.
            UnsupportedError: ``device`` or a GPU array without a usable CUDA driver here.
        After any failure the group is broken (every connection aborted).
        """
        src = check_int("src", src, 0, self._world)
        chunk = check_int("chunk_bytes", chunk_bytes, 1)
        gpu = None if device is None or device == "cpu" else cuda.parse_device(device)
        order = broadcast_ring(self._rank, self._world, src, ranks)
        timeout_s = self._resolve(timeout)
        self._check_usable()
        position = order.index(self._rank)
        prev = order[position - 1] if position > 0 else None
        nxt = order[position + 1] if position + 1 < len(order) else None
        source: Source | None = None
        if prev is None:
            source = broadcast_source(self._rank, obj)  # bad input raises before any connection
        try:
            deadline = Deadline(timeout_s)
            ep_prev = None if prev is None else self._peer(prev, deadline)
            ep_next = None if nxt is None else self._peer(nxt, Deadline(timeout_s))
            if source is not None:
                if ep_next is not None:
                    ep_next.send(encode_meta(source.kind, chunk, source.items), timeout=timeout_s)
                    relay(
                        self._rank, None, ep_next, source.spans, source.total, chunk, timeout_s, nxt
                    )
                return source.result
            assert ep_prev is not None and prev is not None
            raw = ep_prev.recv(timeout=timeout_s)
            meta_send = None if ep_next is None else ep_next.post_send(raw)
            kind, got_chunk, items, total = decode_meta(raw, prev)
            if got_chunk != chunk:
                raise InvalidArgumentError(
                    f"broadcast: rank {src} uses chunk_bytes={got_chunk}, rank {self._rank} "
                    f"chunk_bytes={chunk}: pass the same chunk_bytes on every rank"
                )
            result, spans = destination(self._rank, obj, kind, items, total, gpu)
            if meta_send is not None:
                meta_send.wait(timeout_s)
            relay(self._rank, ep_prev, ep_next, spans, total, chunk, timeout_s, nxt, prev)
            return result
        except RdmaxferError as exc:
            ring = " -> ".join(str(r) for r in order)
            where = f"broadcast from rank {src} (ring {ring}), on rank {self._rank}"
            self._fail(f"{where}: {exc}")
            _reraise_in_context(exc, where)
        except BaseException as exc:
            self._fail(f"broadcast from rank {src} failed on rank {self._rank}: {exc!r}")
            raise

    # -- lifecycle -------------------------------------------------------------------------------
    def close(self) -> None:
        """Close every connection and the engine; stop the accept thread (idempotent)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            endpoints = list(self._endpoints.values()) + list(self._arrived.values())
            self._endpoints.clear()
            self._arrived.clear()
            self._lock.notify_all()
        for endpoint in endpoints:
            with contextlib.suppress(RdmaxferError):
                endpoint.close()
        self._engine.close()
        if self._acceptor is not threading.current_thread():
            self._acceptor.join(_CLOSE_JOIN_S)

    def __enter__(self) -> RdmaGroup:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("broken" if self._broken else "open")
        return (
            f"<RdmaGroup rank {self._rank}/{self._world} {self.transport} {self._address} {state}>"
        )

    # -- internals: connections ------------------------------------------------------------------
    def _key(self, suffix: str) -> str:
        return self._prefix + suffix

    def _resolve(self, timeout: float | None) -> float:
        return self._timeout if timeout is None else resolve_timeout(timeout)

    def _check_usable(self) -> None:
        if self._closed:
            raise EndpointClosedError(f"rank {self._rank}: the group is closed; call init() again")
        if self._broken is not None:
            raise ConnectionFailedError(
                f"rank {self._rank}: the group is broken ({self._broken}); call "
                "rdmaxfer.distributed.init() again on every rank"
            )

    def _fail(self, reason: str) -> None:
        """Break the group: abort every connection so that the peers fail at once too."""
        with self._lock:
            if self._broken is None:
                self._broken = reason
            endpoints = list(self._endpoints.values()) + list(self._arrived.values())
        for endpoint in endpoints:
            with contextlib.suppress(RdmaxferError):
                endpoint.abort(f"rank {self._rank}: {reason}")

    def _guard(self, endpoint: Endpoint, what: str, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except RdmaxferError as exc:
            if endpoint.closed:  # the connection is gone: the group cannot go on
                self._fail(f"{what}: {exc}")
            _reraise_in_context(exc, f"rank {self._rank}: {what}")

    def _record(self, peer: int, deadline: Deadline) -> Record:
        cached = self._records.get(peer)
        if cached is not None:
            return cached
        key = self._key(f"rank/{peer}")
        record = Record.unpack(
            self._store.get(key, deadline, f"rank {self._rank} looking for rank {peer}"), key
        )
        if record.world_size != self._world:
            raise InvalidArgumentError(
                f"rank {peer} was started with world_size={record.world_size}, rank "
                f"{self._rank} with {self._world}: pass the same world_size on every rank"
            )
        if record.transport != self._engine.transport:
            raise InvalidArgumentError(
                f"rank {peer} uses transport {record.transport!r}, rank {self._rank} "
                f"{self._engine.transport!r}: pass the same transport= on every rank (or set "
                "RDMAXFER_TRANSPORT)"
            )
        self._records[peer] = record
        return record

    def _peer(self, peer: int, deadline: Deadline) -> Endpoint:
        self._check_usable()
        with self._peer_locks[peer]:
            with self._lock:
                known = self._endpoints.get(peer)
            if known is not None:
                if known.closed:
                    reason = f"the connection to rank {peer} failed: {known.error or 'closed'}"
                    self._fail(reason)
                    raise ConnectionFailedError(f"rank {self._rank}: {reason}")
                return known
            endpoint = self._connect(peer, deadline) if peer > self._rank else None
            with self._lock:
                while endpoint is None:
                    self._check_usable()
                    endpoint = self._arrived.pop(peer, None)
                    if endpoint is None:
                        if deadline.remaining() <= 0:
                            raise TransferTimeoutError(
                                f"rank {peer} did not connect to rank {self._rank} within "
                                f"{deadline.timeout_s:g} s: did it die, or not call the "
                                "matching operation?"
                            )
                        self._lock.wait(min(deadline.remaining(), _ACCEPT_POLL_S))
                self._endpoints[peer] = endpoint
            return endpoint

    def _connect(self, peer: int, deadline: Deadline) -> Endpoint:
        record = self._record(peer, deadline)
        try:
            # The peer listened before it published its address: refused means it is gone.
            endpoint = self._engine.connect(
                record.address, timeout=max(deadline.remaining(), 0.001), retry_refused=False
            )
        except RdmaxferError as exc:
            raise type(exc)(
                f"rank {self._rank} could not connect to rank {peer} at {record.address}: {exc}"
            ) from exc
        try:
            endpoint.send(
                hello(self._rank, self._world, record.token),
                timeout=max(deadline.remaining(), 0.001),
            )
        except BaseException:
            endpoint.abort("hello failed")
            raise
        return endpoint

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                endpoint = self._engine.accept(timeout=_ACCEPT_POLL_S)
            except TransferTimeoutError:
                continue
            except RdmaxferError as exc:
                if self._closed or self._engine.closed:
                    return
                log.warning("rank %d: accept failed: %s", self._rank, exc)
                continue
            threading.Thread(
                target=self._take_hello, args=(endpoint,), name="rdmaxfer-dist-hello", daemon=True
            ).start()

    def _take_hello(self, endpoint: Endpoint) -> None:
        try:
            got = endpoint.recv(timeout=self._timeout)
            expected = hello(0, self._world, self._token)
            if got.dtype != np.int64 or got.shape != (5,):
                raise ProtocolError(f"hello is {got.dtype} {got.shape}, not int64 (5,)")
            magic, version, peer, world, token = (int(v) for v in got)
            if (magic, version, world, token) != (
                int(expected[0]),
                int(expected[1]),
                self._world,
                self._token,
            ):
                raise ProtocolError(
                    f"hello {got.tolist()} is not for this group (stale or foreign peer)"
                )
            if not 0 <= peer < self._rank:
                raise ProtocolError(
                    f"hello from rank {peer}: only lower ranks connect to {self._rank}"
                )
        except RdmaxferError as exc:
            log.warning("rank %d: refused a connection from %s: %s", self._rank, endpoint.peer, exc)
            endpoint.abort(str(exc))
            return
        with self._lock:
            if self._closed:
                endpoint.abort("group closed")
                return
            old = self._arrived.pop(peer, None)
            self._arrived[peer] = endpoint
            self._lock.notify_all()
        if old is not None:
            old.abort("replaced by a new connection from the same rank")


def _reraise_in_context(exc: RdmaxferError, where: str) -> NoReturn:
    """Raise the same kind of error, its message prefixed with where it happened (which
    ranks), chained to ``exc``."""
    try:
        again = type(exc)(f"{where}: {exc}")
    except TypeError:  # an error class with another constructor: keep it as it is
        raise exc from None
    raise again from exc
