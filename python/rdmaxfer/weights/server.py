"""The weights server: publishes tensors (a ``.safetensors`` file, or a dict of host or GPU
arrays) for one-sided READs and answers the catalog (see :mod:`rdmaxfer.weights`)."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from .._config import resolve_timeout
from ..errors import (
    InvalidArgumentError,
    ProtocolError,
    RdmaxferError,
    RegistrationError,
    TransferTimeoutError,
    UnsupportedError,
)
from ..memory import cuda
from ..memory.buffer import Buffer, as_array, device_view
from ..memory.region import MemoryRegion
from ..transport.endpoint import Endpoint
from ..transport.engine import Engine
from ..transport.lifecycle import track_service
from .format import DTYPES, TensorInfo, decode, dtype_names, name_of
from .snapshot import owned_buffer, snapshot_file, tensor_view
from .versions import Slot, Versions

__all__ = ["WeightServer", "accept_next", "serve_weights"]

log = logging.getLogger("rdmaxfer.weights")


def accept_next(engine: Engine, stop: threading.Event) -> Endpoint | None:
    """The next peer, or None after half a second without one or once ``stop`` is set (an
    accept that fails because the engine is closing then ends quietly)."""
    try:
        return engine.accept(timeout=0.5)
    except TransferTimeoutError:
        return None
    except RdmaxferError:
        if stop.is_set():
            return None
        raise


class WeightServer:
    """Publishes tensors for :func:`pull_weights`.

    Lifecycle: constructed (the tensors copied into server-owned memory and registered,
    listening) -> :meth:`start` (a thread accepts clients, one thread per client) or
    :meth:`serve_forever` -> :meth:`close` (endpoints and registrations released). A context
    manager; left open at interpreter exit, its threads stop quietly (docs/lifecycle.md).
    What it publishes first is version 1; :meth:`update` and :meth:`refresh` publish the next
    ones. Every version is immutable to pulls (:mod:`rdmaxfer.weights.versions`): a pull gets
    exactly the bytes of the version it reports, whatever the publisher later writes into its
    arrays or the file on disk. The cost: version 1 is a copy of the source (the file read
    into memory whole, the arrays copied), made by the constructor; see
    docs/weights-versions.md.

    Args:
        source: a ``.safetensors`` path, or a mapping of names to C-contiguous host or GPU
            arrays.
        host, port: where to listen (port 0 picks a free port; see :attr:`port`).
        engine: an existing :class:`Engine` (default: a new one with ``transport``).
        transport: ``"auto"``, ``"tcp"`` or ``"rdma"`` when creating the engine.
        timeout: seconds each client may take for one step (default ``RDMAXFER_TIMEOUT``/60).
        on_client: called as ``on_client(peer, outcome)`` when a client leaves, from its
            thread: ``peer`` its address (``"10.0.0.2:41234"``, ``"[::1]:41234"``),
            ``outcome`` ``"done"`` or the error that ended it (``rdmaxfer serve`` prints it).

    Raises:
        InvalidArgumentError: unreadable file (or one that kept changing while it was read),
            non-contiguous array, unsupported dtype.
        RegistrationError: the memory could not be registered.
    """

    def __init__(
        self,
        source: str | os.PathLike[str] | Mapping[str, Any],
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        engine: Engine | None = None,
        transport: str = "auto",
        timeout: float | None = None,
        on_client: Callable[[str, str], None] | None = None,
    ) -> None:
        self._on_client = on_client
        self._own_engine = engine is None
        self._engine = engine if engine is not None else Engine(transport)
        self._timeout = resolve_timeout(timeout)
        self._regions: list[MemoryRegion] = []
        self._file: Path | None = None
        # The tensors as given (host arrays or GPU views), by name: what refresh() re-reads.
        self._sources: dict[str, npt.NDArray[Any] | cuda.CudaArray] = {}
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._clients: set[Endpoint] = set()  # connected now; close() ends their waits
        self._clients_lock = threading.Lock()
        self._clients_served = 0
        track_service(self)  # its threads stop quietly at interpreter exit
        try:
            if isinstance(source, Mapping):
                first = self._publish_arrays(source)
            else:
                first = self._publish_file(Path(source))
            self._port = self._engine.listen(host, port)
        except BaseException:
            self.close()
            raise
        self._tensors = dict(first.tensors)
        self._versions = Versions(
            first, lambda buffer: self._engine.register(buffer, access="r", local_write=False)
        )

    def _register(self, memory: object) -> MemoryRegion:
        region = self._engine.register(memory, access="r", local_write=False)
        self._regions.append(region)
        return region

    def _publish_file(self, path: Path) -> Slot:
        """Version 1 of a file: its bytes read into server-owned memory (snapshot.py), one
        region; the tensors where the file's header puts them."""
        snap = snapshot_file(path, self._timeout)
        self._file = path
        self._register(snap.buffer)
        tensors: dict[str, TensorInfo] = {}
        for name, entry in snap.header.items():
            if name == "__metadata__":
                continue
            dtype = entry["dtype"]
            if dtype not in DTYPES:
                raise InvalidArgumentError(
                    f"tensor {name!r} has dtype {dtype!r}, which rdmaxfer does not map; "
                    f"supported: {', '.join(DTYPES)}"
                )
            begin = int(entry["data_offsets"][0])
            tensors[name] = TensorInfo(
                name, dtype, tuple(entry["shape"]), 0, snap.data_offset + begin
            )
        arrays = {t.name: tensor_view(snap.buffer, t) for t in tensors.values()}
        return Slot(1, list(self._regions), tensors, snap.header_raw, dict(arrays))

    def _publish_arrays(self, arrays: Mapping[str, Any]) -> Slot:
        """Version 1 of a dict of arrays: each copied into server-owned memory registered as
        a region of its own (as the arrays were): a GPU tensor into GPU memory when the engine
        can register it for its peers (GPUDirect RDMA, CUDA IPC on shm), else into host
        memory, like the host arrays."""
        tensors: dict[str, TensorInfo] = {}
        owned: dict[str, npt.NDArray[Any] | cuda.CudaArray] = {}
        for index, (name, obj) in enumerate(arrays.items()):
            what = f"tensor {name!r}"
            view = device_view(obj, writable=False, what=what)
            source = as_array(obj, writable=False, what=what) if view is None else view
            dtype = name_of(source.dtype)
            if dtype is None:
                raise InvalidArgumentError(
                    f"tensor {name!r} has dtype {source.dtype}, which has no safetensors name; "
                    f"supported: {dtype_names()}"
                )
            self._sources[name] = source
            tensors[name] = TensorInfo(name, dtype, tuple(source.shape), index, 0)
            on_gpu = self._device_copy(name, view) if view is not None else None
            if on_gpu is not None:
                owned[name] = on_gpu
                continue
            host = tensor_view(owned_buffer(tensors[name].nbytes), tensors[name])
            self._register(host)
            if isinstance(source, cuda.CudaArray):
                cuda.copy_to_host(source, host)
            else:
                np.copyto(host, source)
            owned[name] = host
        return Slot(1, list(self._regions), tensors, None, owned)

    def _device_copy(self, name: str, view: cuda.CudaArray) -> cuda.CudaArray | None:
        """A registered server-owned GPU copy of ``view`` for GPUDirect READs, or None when
        the engine cannot register GPU memory for its peers (the tensor then goes into host
        memory)."""
        why = self._engine.gpu_links_unreached()
        if not why:
            copy = Buffer.empty(view.shape, view.dtype, device=view.device)
            try:  # GPUDirect RDMA (or CUDA IPC on shm): peers READ the GPU memory itself
                self._register(copy)
            except (UnsupportedError, RegistrationError) as exc:
                why = str(exc)
            else:
                owned = copy.device_array()
                cuda.copy_from_host(owned, cuda.copy_to_host(view))
                return owned
        log.info("tensor %r: GPU memory published through a host copy (%s)", name, why)
        return None

    def update(self, new: Mapping[str, Any], *, timeout: float | None = None) -> int:
        """Publish a new version: ``new`` maps some or all published names to arrays (host or
        GPU) of the published dtype and shape; the other tensors keep their current values.

        The values are copied into one of two server-owned registered buffers (double
        buffering): one that no pull is reading, so a pull gets exactly one version. If pulls
        of older versions still hold both buffers, the update waits for one of them.

        Args:
            new: ``{name: array}``.
            timeout: seconds to wait for a free buffer (default: the server's ``timeout``).

        Returns:
            The new version number (the first version, as constructed, is 1).

        Raises:
            InvalidArgumentError: an unpublished name or another dtype/shape (the message
                names the tensor); nothing is published.
            TransferTimeoutError: no buffer became free in time; nothing is published.
        """
        return self._versions.update(new, self._timeout if timeout is None else timeout)

    def refresh(self, *, timeout: float | None = None) -> int:
        """Publish the current contents of the arrays given at construction (after the trainer
        updated them in place, on the host or the GPU) as a new version; see :meth:`update`.

        Returns:
            The new version number.

        Raises:
            UnsupportedError: the server publishes a file (nothing to re-read).
            TransferTimeoutError: as :meth:`update`.
        """
        if self._file is not None:
            raise UnsupportedError(
                "refresh(): this server publishes a file; publish new values with "
                "update({name: array})"
            )
        return self.update(self._sources, timeout=timeout)

    @property
    def version(self) -> int:
        """The version pulls get now (1 until the first :meth:`update`/:meth:`refresh`)."""
        return self._versions.version

    @property
    def port(self) -> int:
        """The TCP port the server listens on."""
        return self._port

    @property
    def tensors(self) -> dict[str, TensorInfo]:
        """What is published now (the current version's places), by name."""
        return dict(self._versions.current.tensors)

    @property
    def nbytes(self) -> int:
        """Total bytes of all published tensors."""
        return sum(t.nbytes for t in self._tensors.values())

    @property
    def clients_served(self) -> int:
        """Clients that completed a pull (sent "done")."""
        return self._clients_served

    def start(self) -> WeightServer:
        """Serve in a background thread; returns self."""
        thread = threading.Thread(target=self.serve_forever, name="rdmaxfer-weights", daemon=True)
        thread.start()
        self._threads.append(thread)
        return self

    def serve_forever(self, max_clients: int | None = None) -> None:
        """Accept clients until :meth:`close` (or ``max_clients`` clients were served)."""
        accepted = 0
        while not self._stop.is_set() and (max_clients is None or accepted < max_clients):
            endpoint = accept_next(self._engine, self._stop)
            if endpoint is None:
                continue
            accepted += 1
            with self._clients_lock:
                self._clients.add(endpoint)
            worker = threading.Thread(
                target=self._serve_client, args=(endpoint,), name="rdmaxfer-client", daemon=True
            )
            worker.start()
            self._threads.append(worker)
            if max_clients is not None and accepted >= max_clients:
                worker.join()

    def _serve_client(self, endpoint: Endpoint) -> None:
        outcome = "stopped: the server is closing"
        leased: list[Slot] = []  # the version this client pulls (at most one)
        try:
            with endpoint:
                try:
                    outcome = self._serve_requests(endpoint, leased)
                except (RdmaxferError, ValueError, TypeError) as exc:
                    if not self._stop.is_set():  # close() ends the waits of connected clients
                        outcome = f"{type(exc).__name__}: {exc}"
                        log.warning("client %s: %s", endpoint.peer, exc)
        finally:
            for slot in leased:  # the endpoint is closed: no READ of this client can follow
                self._versions.release(slot)
            with self._clients_lock:
                self._clients.discard(endpoint)
            if self._on_client is not None:
                self._on_client(endpoint.peer, outcome)

    def _serve_requests(self, endpoint: Endpoint, leased: list[Slot]) -> str:
        while not self._stop.is_set():
            request = decode(endpoint.recv(timeout=self._timeout), "request")
            op = request.get("op")
            if op == "catalog":
                for slot in leased:  # a client asking again (for a newer version)
                    self._versions.release(slot)
                leased.clear()
                wait_s = min(float(request.get("wait_s", 0.0)), self._timeout)
                leased.append(self._versions.lease(int(request.get("min_version", 0)), wait_s))
                endpoint.send(leased[0].catalog, timeout=self._timeout)
            elif op == "done":
                self._clients_served += 1
                return "done"
            else:
                raise ProtocolError(f"unknown request op {op!r}")
        return "stopped: the server is closing"

    def stop_at_exit(self) -> None:
        """Internal: at interpreter exit (:mod:`rdmaxfer.transport.lifecycle`): end the threads'
        loops (their waits in the core fail as the engine closes next)."""
        self._stop.set()

    def close(self) -> None:
        """Stop serving and release endpoints, registrations and the file mapping."""
        self._stop.set()
        with self._clients_lock:
            clients = list(self._clients)
        for endpoint in clients:  # each one's thread may be waiting for its next request
            endpoint.close()
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(timeout=5.0)
        versions = getattr(self, "_versions", None)
        for region in self._regions if versions is None else versions.regions():
            region.close()
        self._regions.clear()
        if self._own_engine:
            self._engine.close()

    def __enter__(self) -> WeightServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def serve_weights(
    source: str | os.PathLike[str] | Mapping[str, Any],
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    engine: Engine | None = None,
    transport: str = "auto",
    timeout: float | None = None,
    on_client: Callable[[str, str], None] | None = None,
) -> WeightServer:
    """Publish ``source`` in a background thread and return the running :class:`WeightServer`
    (close it, or use it as a context manager). Same arguments as :class:`WeightServer`
    (``timeout``: seconds each client may take for one step)."""
    server = WeightServer(
        source,
        host=host,
        port=port,
        engine=engine,
        transport=transport,
        timeout=timeout,
        on_client=on_client,
    )
    return server.start()
