"""Pushing weights (trainer -> inference): the receiver registers its own destination arrays
(:func:`receive_weights`), the trainer WRITEs every tensor into them in one batch whose
notification announces the version (:func:`push_weights`); :meth:`WeightReceiver.wait`
returns once a whole version has landed.

Protocol (two-sided messages as in :mod:`rdmaxfer.weights`, on a connection per push):

1. receiver -> pusher ``{"v": 3, "op": "targets", "regions": [<descriptor hex>, ...],
   "tensors": {name: {"dtype": ..., "shape": [...], "region": i, "offset": 0}}}``
2. pusher: ``write_batch`` of every tensor with ``notify=b"rdmaxfer.version:<v>"``
   (:data:`VERSION_PREFIX`); the receiver takes it from its engine's
   ``wait_notification``;
3. receiver -> pusher ``{"v": 3, "op": "landed", "version": v}`` once it recorded it;
   pusher -> receiver ``{"v": 3, "op": "done"}``.

Ordering: the engine delivers a batch's notification only after every byte of the batch is
in the target's memory, on every lane (QP or TCP stream) that carried it: the NOTIFY control
message leaves once every WRITE completed at the pusher, and a WRITE completes only once its
bytes are placed (an RC WRITE is acknowledged after placement on verbs; on TCP the target's
engine acknowledges after copying the bytes in). GPU sources without a GPUDirect
registration are written through the staging pipeline before the batch is posted. GPU
destinations the engine cannot register for GPUDirect RDMA receive into a registered host
mirror, copied to the GPU when the notification arrives (before the version is recorded).

The receiver's engine's notifications are the receiver's: with ``engine=`` given, nothing
else should call ``wait_notification`` on it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from .. import _core
from .._config import CallLimits, resolve_timeout
from ..errors import (
    InvalidArgumentError,
    ProtocolError,
    RdmaxferError,
    RegistrationError,
    TransferTimeoutError,
    UnsupportedError,
)
from ..memory import cuda
from ..memory.buffer import as_array, device_view
from ..memory.region import MemoryRegion
from ..transport.endpoint import Endpoint
from ..transport.engine import Engine
from ..transport.lifecycle import track_service
from .format import DTYPES, PROTOCOL_VERSION, decode, dtype_names, encode, name_of
from .moving import Piece, move
from .server import accept_next

__all__ = ["VERSION_PREFIX", "WeightReceiver", "push_weights", "receive_weights"]

log = logging.getLogger("rdmaxfer.weights")

#: A push's notification is this prefix and the version in decimal (at most 64 bytes).
VERSION_PREFIX = b"rdmaxfer.version:"
_MAX_VERSION = 2**63 - 1
#: How often the receiver looks at the pusher's endpoint while it waits for the notification.
_POLL_S = 0.2


class WeightReceiver:
    """The inference side of a push: registered destination arrays and the versions that
    landed in them. Made by :func:`receive_weights`; a context manager (:meth:`close`)."""

    def __init__(
        self,
        arrays: Mapping[str, Any],
        *,
        host: str,
        port: int,
        engine: Engine | None,
        transport: str,
        timeout: float | None,
    ) -> None:
        self._own_engine = engine is None
        self._engine = engine if engine is not None else Engine(transport)
        self._timeout = resolve_timeout(timeout)
        self._regions: list[MemoryRegion] = []
        self._mirrors: list[tuple[cuda.CudaArray, npt.NDArray[Any]]] = []
        self._tensors: dict[str, dict[str, Any]] = {}
        self._cond = threading.Condition()
        self._landed = 0  # the last version that landed
        self._seen = 0  # the last version wait() returned
        self._stop = threading.Event()
        self._current: Endpoint | None = None
        track_service(self)  # its threads stop quietly at interpreter exit
        try:
            for name, obj in arrays.items():
                self._register(name, obj)
            self._port = self._engine.listen(host, port)
        except BaseException:
            self.close()
            raise
        self._targets = encode(
            {
                "v": PROTOCOL_VERSION,
                "op": "targets",
                "regions": [r.descriptor().pack().hex() for r in self._regions],
                "tensors": self._tensors,
            }
        )
        self._thread = threading.Thread(target=self._serve, name="rdmaxfer-receive", daemon=True)
        self._thread.start()

    def _register(self, name: str, obj: object) -> None:
        what = f"destination of tensor {name!r}"
        view = device_view(obj, writable=True, what=what)
        if view is None:
            arr = as_array(obj, writable=True, what=what)
            dtype, shape = arr.dtype, arr.shape
            region = self._engine.register(arr, access="w")
        else:
            dtype, shape = view.dtype, view.shape
            found = None
            why = self._engine.gpu_links_unreached()
            if not why:
                try:  # GPUDirect RDMA (or CUDA IPC on shm): the pusher WRITEs into it itself
                    found = self._engine.register(obj, access="w")
                except (UnsupportedError, RegistrationError) as exc:
                    why = str(exc)
            if found is None:
                log.info("tensor %r: pushed through a host mirror (%s)", name, why)
                host = np.empty(view.shape, view.dtype)
                self._mirrors.append((view, host))
                found = self._engine.register(host, access="w")
            region = found
        st_name = name_of(dtype)
        if st_name is None:
            region.close()
            raise InvalidArgumentError(
                f"tensor {name!r} has dtype {dtype}, which has no safetensors name; "
                f"supported: {dtype_names()}"
            )
        self._tensors[name] = {
            "dtype": st_name,
            "shape": list(shape),
            "region": len(self._regions),
            "offset": 0,
        }
        self._regions.append(region)

    @property
    def port(self) -> int:
        """The TCP port pushers connect to."""
        return self._port

    @property
    def version(self) -> int:
        """The last version that landed whole (0: none yet)."""
        return self._landed

    def wait(self, version: int | None = None, *, timeout: float | None = None) -> int:
        """Wait until a whole version has landed in the arrays.

        Args:
            version: return once this version (or a later one) has landed; None: once a
                version newer than the one the previous ``wait`` returned has landed.
            timeout: seconds (default ``RDMAXFER_TIMEOUT`` or 60).

        Returns:
            The version now in the arrays.

        Raises:
            TransferTimeoutError: no such version landed within ``timeout``.
        """
        limit = resolve_timeout(timeout)
        want = self._seen + 1 if version is None else version
        end = time.monotonic() + limit
        with self._cond:
            while self._landed < want:
                left = end - time.monotonic()
                if left <= 0 or self._stop.is_set():
                    raise TransferTimeoutError(
                        f"receiver: version {want} did not land within {limit:g} s (the last "
                        f"that landed is {self._landed}); is the trainer pushing to port "
                        f"{self._port}?"
                    )
                self._cond.wait(min(left, 0.5))
            self._seen = self._landed
            return self._landed

    def _serve(self) -> None:
        while not self._stop.is_set():
            endpoint = accept_next(self._engine, self._stop)
            if endpoint is None:
                continue
            self._current = endpoint
            with endpoint:
                try:
                    self._serve_pusher(endpoint)
                except RdmaxferError as exc:
                    if not self._stop.is_set():
                        log.warning("pusher %s: %s", endpoint.peer, exc)
            self._current = None

    def _serve_pusher(self, endpoint: Endpoint) -> None:
        endpoint.send(self._targets, timeout=self._timeout)
        version = self._wait_version(endpoint)
        if version is None:
            return
        for view, host in self._mirrors:
            cuda.copy_from_host(view, host)
        with self._cond:
            self._landed = version
            self._cond.notify_all()
        reply = {"v": PROTOCOL_VERSION, "op": "landed", "version": version}
        endpoint.send(encode(reply), timeout=self._timeout)
        message = decode(endpoint.recv(timeout=self._timeout), "push")
        if message.get("op") != "done":
            raise ProtocolError(f"unknown push op {message.get('op')!r}")

    def _wait_version(self, endpoint: Endpoint) -> int | None:
        """The version announced by the pusher's batch notification; None when the pusher
        left (or the receiver is closing) first."""
        end = time.monotonic() + self._timeout
        while not self._stop.is_set():
            left = end - time.monotonic()
            if left <= 0:
                raise TransferTimeoutError(
                    f"pusher {endpoint.peer} sent no version notification within "
                    f"{self._timeout:g} s"
                )
            try:
                peer, payload = self._engine.wait_notification(min(left, _POLL_S))
            except TransferTimeoutError:
                if endpoint.closed:
                    return None
                continue
            if (
                peer != endpoint.peer
                or not isinstance(payload, bytes)
                or not payload.startswith(VERSION_PREFIX)
                or not payload[len(VERSION_PREFIX) :].isdigit()
            ):
                log.warning("receiver: ignored notification %r from %s", payload, peer)
                continue
            return int(payload[len(VERSION_PREFIX) :])
        return None

    def stop_at_exit(self) -> None:
        """Internal: at interpreter exit (:mod:`rdmaxfer.transport.lifecycle`): end the threads'
        loops (their waits in the core fail as the engine closes next)."""
        self._stop.set()

    def close(self) -> None:
        """Stop receiving; release the registrations (the arrays stay the caller's)."""
        self._stop.set()
        current = self._current
        if current is not None:
            current.close()
        thread = getattr(self, "_thread", None)
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5.0)
        with self._cond:
            self._cond.notify_all()
        for region in self._regions:
            region.close()
        self._regions.clear()
        if self._own_engine:
            self._engine.close()

    def __enter__(self) -> WeightReceiver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def receive_weights(
    arrays: Mapping[str, Any],
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    engine: Engine | None = None,
    transport: str = "auto",
    timeout: float | None = None,
) -> WeightReceiver:
    """Register ``arrays`` (``{name: array}``, host or GPU, writable, C-contiguous) as the
    destinations of pushed weights and listen for trainers on ``host:port`` (port 0: a free
    one, see :attr:`WeightReceiver.port`).

    Args:
        timeout: seconds each step of a pusher's exchange may take, and ``wait``'s default.

    Raises:
        InvalidArgumentError: a read-only or non-contiguous array, an unsupported dtype.
        RegistrationError: the memory could not be registered.
    """
    return WeightReceiver(
        arrays, host=host, port=port, engine=engine, transport=transport, timeout=timeout
    )


def push_weights(
    address: str,
    weights: Mapping[str, Any],
    *,
    version: int,
    engine: Engine | None = None,
    transport: str = "auto",
    streams: int = 0,
    timeout: float | None = None,
    deadline: float | None = None,
) -> int:
    """WRITE every tensor of ``weights`` into a receiver's arrays in one batch whose
    notification announces ``version``.

    Returns once the receiver recorded the version (its ``wait`` returns it). The batch
    (``Endpoint.write_batch``, at most 256 WRITEs in flight) notifies only after every byte
    is in the receiver's memory: see the ordering note in :mod:`rdmaxfer.weights.push`.

    Args:
        address: the receiver, ``"host:port"``.
        weights: ``{name: array}`` (host or GPU arrays), exactly the receiver's tensor names,
            each of the receiver's dtype and shape.
        version: the version these weights are (an int in 1..2**63-1 the receiver reports).
        timeout, deadline: as :func:`pull_weights`.

    Returns:
        ``version``.

    Raises:
        InvalidArgumentError: a name the receiver does not have or one it has that is not
            pushed, or another dtype/shape (the message names the tensor); no byte moved.
        ConnectionFailedError, TransferTimeoutError, ProtocolError, RemoteAccessError: the
            connection failed, the WRITEs stalled, the receiver broke the protocol, or it
            refused a WRITE.
    """
    if (
        isinstance(version, bool)
        or not isinstance(version, int)
        or not 1 <= version <= _MAX_VERSION
    ):
        raise InvalidArgumentError(f"version must be an int in 1..2**63-1, got {version!r}")
    own = engine is None
    eng = engine if engine is not None else Engine(transport)
    limit = CallLimits(timeout, deadline)
    try:
        with eng.connect(address, streams=streams, timeout=limit.connect_s()) as ep:
            targets = decode(
                ep.recv(timeout=limit.timeout_s, deadline=limit.deadline_left()), "targets"
            )
            try:
                regions = [_core.Descriptor.unpack(bytes.fromhex(d)) for d in targets["regions"]]
                tensors: dict[str, dict[str, Any]] = dict(targets["tensors"])
            except (KeyError, TypeError, ValueError) as exc:
                raise ProtocolError(f"malformed targets: {exc!r}") from exc
            writes = _checked_writes(address, weights, tensors, regions)
            move(ep, "write", writes, limit, notify=VERSION_PREFIX + str(version).encode())
            reply = decode(
                ep.recv(timeout=limit.timeout_s, deadline=limit.deadline_left()), "landed"
            )
            if reply.get("op") != "landed" or reply.get("version") != version:
                raise ProtocolError(f"receiver answered {reply!r} to version {version}")
            ep.send(
                encode({"v": PROTOCOL_VERSION, "op": "done"}),
                timeout=limit.timeout_s,
                deadline=limit.deadline_left(),
            )
            return version
    finally:
        if own:
            eng.close()


def _checked_writes(
    address: str,
    weights: Mapping[str, Any],
    tensors: Mapping[str, Mapping[str, Any]],
    regions: list[_core.Descriptor],
) -> list[Piece]:
    unknown = sorted(set(weights) - set(tensors))
    missing = sorted(set(tensors) - set(weights))
    if unknown or missing:
        raise InvalidArgumentError(
            f"push to {address}: the receiver has no tensors {unknown} and expects {missing} "
            "too; push exactly the receiver's tensors (a version lands whole)"
        )
    writes: list[Piece] = []
    for name, obj in weights.items():
        what = f"pushed tensor {name!r}"
        view = device_view(obj, writable=False, what=what)
        src: object = obj
        if view is None:
            arr = as_array(obj, writable=False, what=what)
            src, dtype, shape = arr, arr.dtype, arr.shape
        else:
            dtype, shape = view.dtype, view.shape
        entry = tensors[name]
        want = DTYPES.get(str(entry.get("dtype")))
        if dtype != want or list(shape) != list(entry.get("shape", ())):
            raise InvalidArgumentError(
                f"the {what} is {dtype} of shape {list(shape)}, but the receiver's tensor "
                f"{name!r} is {want} of shape {entry.get('shape')}; push arrays of its dtype "
                "and shape"
            )
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        writes.append((src, regions[int(entry["region"])], 0, int(entry["offset"]), nbytes))
    return writes
