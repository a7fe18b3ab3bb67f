"""Model weights straight into arrays: publish tensors, pull them with one-sided READs.

The server (:class:`WeightServer`, ``rdmaxfer serve``) registers the tensors for remote READ:
a ``.safetensors`` file is memory-mapped and registered as one region (no copy; the pages are
read from the page cache as the peer asks for them), a dict of arrays is registered array by
array. A client (:func:`pull_weights`, ``rdmaxfer pull``) asks for the catalog, allocates
arrays of the right dtype and shape, and fills them with READs straight from the server's
memory; the server's CPU only serves the bytes.

Protocol (two-sided messages on one endpoint, each a 1-D ``uint8`` array holding UTF-8 JSON):

1. client -> server ``{"v": 1, "op": "catalog"}``
2. server -> client ``{"v": 1, "regions": [<descriptor hex>, ...], "header": <hex or null>,
   "tensors": {name: {"dtype": "F32", "shape": [...], "region": i, "offset": bytes}}}``;
   ``dtype`` uses safetensors' names (F64 F32 F16 BF16 I64 I32 I16 I8 U64 U32 U16 U8 BOOL
   F8_E4M3 F8_E5M2), ``offset`` is the tensor's first byte in region ``i``, and ``header`` is
   the file's raw safetensors header (so a client can write a bit-exact copy).
3. client READs the bytes, then sends ``{"v": 1, "op": "done"}`` and closes.

GPU memory: :class:`WeightServer` publishes GPU-resident tensors (a dict of CuPy/PyTorch
arrays, for trainer -> inference weight sync) registered for GPUDirect RDMA where the engine
can, else through a pinned host mirror that :meth:`WeightServer.refresh` updates;
``pull_weights(..., device="cuda:0")`` fills GPU arrays (GPUDirect READs into registered GPU
memory, else the staging pipeline).

dtypes: BF16 and the F8 types arrive as ``ml_dtypes`` arrays (``ml_dtypes.bfloat16`` ...),
which NumPy, safetensors and JAX accept; nothing is converted.

The safetensors layout (8-byte little-endian header size, JSON header, data) is read from the
file's header; the file is first validated with the ``safetensors`` library.
"""

from __future__ import annotations

import json
import logging
import mmap
import os
import struct
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import numpy.typing as npt

from . import _core, cuda
from ._config import CallLimits, resolve_timeout
from .buffer import Buffer, MemoryRegion, as_array
from .endpoint import Endpoint
from .engine import Engine
from .errors import (
    InvalidArgumentError,
    ProtocolError,
    RdmaxferError,
    RegistrationError,
    TransferTimeoutError,
    UnsupportedError,
)

__all__ = [
    "DTYPES",
    "TensorInfo",
    "WeightServer",
    "pull_weights",
    "read_safetensors_header",
    "save_safetensors_copy",
    "serve_weights",
]

log = logging.getLogger(__name__)

PROTOCOL_VERSION = 1
PIECE_BYTES = 8 << 20
"""Pulls are posted in pieces of this many bytes (all in flight at once) so progress moves."""

DTYPES: dict[str, np.dtype[Any]] = {
    "F64": np.dtype(np.float64),
    "F32": np.dtype(np.float32),
    "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
    "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
    "I64": np.dtype(np.int64),
    "I32": np.dtype(np.int32),
    "I16": np.dtype(np.int16),
    "I8": np.dtype(np.int8),
    "U64": np.dtype(np.uint64),
    "U32": np.dtype(np.uint32),
    "U16": np.dtype(np.uint16),
    "U8": np.dtype(np.uint8),
    "BOOL": np.dtype(np.bool_),
}
_NAMES = {dtype: name for name, dtype in DTYPES.items()}


@dataclass(frozen=True)
class TensorInfo:
    """One published tensor: safetensors dtype name, shape, region index and byte offset."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    region: int
    offset: int

    @property
    def nbytes(self) -> int:
        """Size in bytes (dtype itemsize times the product of the shape)."""
        return DTYPES[self.dtype].itemsize * int(np.prod(self.shape, dtype=np.int64))


def read_safetensors_header(path: str | os.PathLike[str]) -> tuple[bytes, dict[str, Any], int]:
    """Read a ``.safetensors`` file's header.

    Returns:
        (raw header bytes including the 8-byte size prefix, parsed JSON, offset in bytes of
        the data section).

    Raises:
        InvalidArgumentError: not a readable safetensors file (the message says why).
    """
    from safetensors import safe_open

    p = Path(path)
    try:
        with safe_open(str(p), framework="numpy"):
            pass  # the library checks the header, dtypes and offsets against the file size
        with p.open("rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            raw = f.read(size)
    except (OSError, struct.error, Exception) as exc:
        raise InvalidArgumentError(
            f"{str(p)!r} is not a readable safetensors file: {exc}; pass a .safetensors file"
        ) from exc
    header: dict[str, Any] = json.loads(raw)
    return struct.pack("<Q", size) + raw, header, 8 + size


def _encode(obj: Mapping[str, Any]) -> npt.NDArray[np.uint8]:
    return np.frombuffer(json.dumps(obj).encode(), dtype=np.uint8).copy()


def _decode(arr: npt.NDArray[Any], what: str) -> dict[str, Any]:
    try:
        obj = json.loads(arr.tobytes().decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProtocolError(f"malformed {what} message: {exc}") from exc
    if not isinstance(obj, dict) or obj.get("v") != PROTOCOL_VERSION:
        version = obj.get("v") if isinstance(obj, dict) else None
        raise ProtocolError(
            f"{what} message of an unsupported version {version!r} (this build speaks version "
            f"{PROTOCOL_VERSION}); use the same rdmaxfer on both sides"
        )
    return obj


class WeightServer:
    """Publishes tensors for :func:`pull_weights`.

    Lifecycle: constructed (tensors registered, listening) -> :meth:`start` (a thread accepts
    clients, one thread per client) or :meth:`serve_forever` -> :meth:`close` (endpoints and
    registrations released, the file unmapped). A context manager.

    Args:
        source: a ``.safetensors`` path, or a mapping of names to C-contiguous host arrays.
        host, port: where to listen (port 0 picks a free port; see :attr:`port`).
        engine: an existing :class:`Engine` (default: a new one with ``transport``).
        transport: ``"auto"``, ``"tcp"`` or ``"rdma"`` when creating the engine.
        timeout: seconds each client may take for one step (default ``RDMAXFER_TIMEOUT``/60).
        on_client: called as ``on_client(peer, outcome)`` when a client leaves, from its
            thread: ``peer`` its address (``"10.0.0.2:41234"``, ``"[::1]:41234"``),
            ``outcome`` ``"done"`` or the error that ended it (``rdmaxfer serve`` prints it).

    Raises:
        InvalidArgumentError: unreadable file, non-contiguous array, unsupported dtype.
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
        self._mmap: mmap.mmap | None = None
        self._header: bytes | None = None
        self._tensors: dict[str, TensorInfo] = {}
        # GPU tensors published through a host mirror: (device view, host copy).
        self._mirrors: list[tuple[cuda.CudaArray, npt.NDArray[Any]]] = []
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._clients: set[Endpoint] = set()  # connected now; close() ends their waits
        self._clients_lock = threading.Lock()
        self._clients_served = 0
        try:
            if isinstance(source, Mapping):
                self._publish_arrays(source)
            else:
                self._publish_file(Path(source))
            self._port = self._engine.listen(host, port)
        except BaseException:
            self.close()
            raise
        self._catalog = _encode(
            {
                "v": PROTOCOL_VERSION,
                "regions": [r.descriptor().pack().hex() for r in self._regions],
                "header": None if self._header is None else self._header.hex(),
                "tensors": {
                    t.name: {
                        "dtype": t.dtype,
                        "shape": list(t.shape),
                        "region": t.region,
                        "offset": t.offset,
                    }
                    for t in self._tensors.values()
                },
            }
        )

    def _publish_file(self, path: Path) -> None:
        header_raw, header, data_offset = read_safetensors_header(path)
        with path.open("rb") as f:
            size = os.fstat(f.fileno()).st_size
            # Read-only and private: kernels before 6.2 pin an MR's pages for writing even when
            # it is registered read-only, which a read-only *shared* file mapping refuses
            # (EFAULT); a private one is pinned (its pages copied, on those kernels).
            self._mmap = (
                mmap.mmap(f.fileno(), size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ)
                if size
                else None
            )
        if self._mmap is None:
            raise InvalidArgumentError(f"{str(path)!r} is empty; pass a .safetensors file")
        view = np.frombuffer(self._mmap, dtype=np.uint8)
        self._regions.append(self._engine.register(view, access="r", local_write=False))
        self._header = header_raw
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            dtype = entry["dtype"]
            if dtype not in DTYPES:
                raise InvalidArgumentError(
                    f"tensor {name!r} has dtype {dtype!r}, which rdmaxfer does not map; "
                    f"supported: {', '.join(DTYPES)}"
                )
            begin, _end = entry["data_offsets"]
            self._tensors[name] = TensorInfo(
                name, dtype, tuple(entry["shape"]), 0, data_offset + int(begin)
            )

    def _publish_arrays(self, arrays: Mapping[str, Any]) -> None:
        for index, (name, obj) in enumerate(arrays.items()):
            view = cuda.device_view(obj, writable=False, what=f"tensor {name!r}")
            if view is not None:
                self._publish_device(index, name, obj, view)
                continue
            arr = as_array(obj, writable=False, what=f"tensor {name!r}")
            dtype = _NAMES.get(arr.dtype)
            if dtype is None:
                raise InvalidArgumentError(
                    f"tensor {name!r} has dtype {arr.dtype}, which has no safetensors name; "
                    f"supported: {', '.join(str(d) for d in _NAMES)}"
                )
            self._regions.append(self._engine.register(arr, access="r", local_write=False))
            self._tensors[name] = TensorInfo(name, dtype, tuple(arr.shape), index, 0)

    def _publish_device(self, index: int, name: str, obj: object, view: cuda.CudaArray) -> None:
        dtype = _NAMES.get(view.dtype)
        if dtype is None:
            raise InvalidArgumentError(
                f"tensor {name!r} has dtype {view.dtype}, which has no safetensors name"
            )
        try:  # GPUDirect RDMA: peers READ the GPU memory itself
            region = self._engine.register(obj, access="r", local_write=False)
        except (UnsupportedError, RegistrationError) as exc:
            log.info("tensor %r: GPU memory published through a host mirror (%s)", name, exc)
            host = cuda.copy_to_host(view)
            self._mirrors.append((view, host))
            region = self._engine.register(host, access="r", local_write=False)
        self._regions.append(region)
        self._tensors[name] = TensorInfo(name, dtype, tuple(view.shape), index, 0)

    def refresh(self) -> int:
        """Copy the current contents of GPU tensors published through a host mirror into their
        mirrors (after the trainer updated them in place); GPUDirect-registered tensors need
        nothing. Clients pulling meanwhile may see a mix of old and new values.

        Returns:
            Bytes copied from the GPUs.
        """
        total = 0
        for view, host in self._mirrors:
            cuda.copy_to_host(view, host)
            total += view.nbytes
        return total

    @property
    def port(self) -> int:
        """The TCP port the server listens on."""
        return self._port

    @property
    def tensors(self) -> dict[str, TensorInfo]:
        """What is published, by name."""
        return dict(self._tensors)

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
            try:
                endpoint = self._engine.accept(timeout=0.5)
            except TransferTimeoutError:
                continue
            except RdmaxferError:
                if self._stop.is_set():
                    return
                raise
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
        with endpoint:
            try:
                while not self._stop.is_set():
                    request = _decode(endpoint.recv(timeout=self._timeout), "request")
                    op = request.get("op")
                    if op == "catalog":
                        endpoint.send(self._catalog, timeout=self._timeout)
                    elif op == "done":
                        self._clients_served += 1
                        outcome = "done"
                        return
                    else:
                        raise ProtocolError(f"unknown request op {op!r}")
            except RdmaxferError as exc:
                if not self._stop.is_set():  # close() ends the waits of clients still connected
                    outcome = f"{type(exc).__name__}: {exc}"
                    log.warning("client %s: %s", endpoint.peer, exc)
            finally:
                with self._clients_lock:
                    self._clients.discard(endpoint)
                if self._on_client is not None:
                    self._on_client(endpoint.peer, outcome)

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
        for region in self._regions:
            region.close()
        self._regions.clear()
        if self._own_engine:
            self._engine.close()
        if self._mmap is not None:
            try:
                self._mmap.close()
            except BufferError:
                pass  # an array view is still alive; the mapping goes with it
            self._mmap = None

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


def _pieces(length: int) -> Iterable[tuple[int, int]]:
    offset = 0
    while offset < length or (length == 0 and offset == 0):
        n = min(PIECE_BYTES, length - offset)
        yield offset, n
        offset += max(n, 1)


def pull_weights(
    address: str,
    *,
    names: Iterable[str] | None = None,
    engine: Engine | None = None,
    transport: str = "auto",
    streams: int = 0,
    timeout: float | None = None,
    deadline: float | None = None,
    progress: Callable[[int, int], None] | None = None,
    with_header: bool = False,
    device: str | int | None = None,
) -> dict[str, Any]:
    """Fetch published tensors into new host arrays with one-sided READs.

    Tensors that sit next to each other on the server are fetched by one READ into one
    allocation and returned as zero-copy views of it, in the server's layout.

    Args:
        address: the server, ``"host:port"``.
        names: tensors to fetch (default: all).
        engine: an existing Engine (default: a new one, closed on return).
        transport: ``"auto"``, ``"tcp"`` or ``"rdma"`` when creating the engine.
        streams: parallel streams/QPs for the connection (0: the engine's default).
        timeout: seconds (default ``RDMAXFER_TIMEOUT`` or 60) for connecting and for the
            catalog exchange, and the inactivity bound of the READs: the pull fails when no
            byte arrived for that long, however long the whole pull takes.
        deadline: optional bound on the whole pull in seconds, connecting included (None:
            none).
        progress: called as ``progress(bytes_done, bytes_total)`` as pieces arrive.
        with_header: also return the server file's raw safetensors header under the key
            ``"__header__"`` (a ``uint8`` array), for :func:`save_safetensors_copy`.
        device: None/``"cpu"`` for host arrays, or ``"cuda:N"``: each contiguous run of
            tensors is allocated on that GPU and filled by READs, straight into GPU memory
            when the engine can register it for GPUDirect RDMA, else through the staging
            pipeline; tensors come back as CuPy arrays (when CuPy is importable) or device
            Buffers, zero-copy views of the run.

    Returns:
        ``{name: ndarray}`` with the published dtype (BF16 as ``ml_dtypes.bfloat16``) and shape.

    Raises:
        InvalidArgumentError: a name in ``names`` is not published, or a bad ``device``.
        UnsupportedError: ``device`` is a GPU but CUDA is not usable here (with the reason).
        ConnectionFailedError, TransferTimeoutError, ProtocolError, RemoteAccessError.
    """
    ordinal = None if device is None or device == "cpu" else cuda.parse_device(device)
    own = engine is None
    eng = engine if engine is not None else Engine(transport)
    limit = CallLimits(timeout, deadline)
    try:
        with eng.connect(address, streams=streams, timeout=limit.connect_s()) as ep:
            ep.send(
                _encode({"v": PROTOCOL_VERSION, "op": "catalog"}),
                timeout=limit.timeout_s,
                deadline=limit.deadline_left(),
            )
            catalog = _decode(
                ep.recv(timeout=limit.timeout_s, deadline=limit.deadline_left()), "catalog"
            )
            try:
                regions = [_core.Descriptor.unpack(bytes.fromhex(d)) for d in catalog["regions"]]
                tensors = [
                    TensorInfo(n, e["dtype"], tuple(e["shape"]), int(e["region"]), int(e["offset"]))
                    for n, e in catalog["tensors"].items()
                ]
                header_hex = catalog.get("header")
            except (KeyError, TypeError, ValueError) as exc:
                raise ProtocolError(f"malformed catalog: {exc!r}") from exc
            for t in tensors:
                if t.dtype not in DTYPES or not 0 <= t.region < len(regions):
                    raise ProtocolError(f"malformed catalog entry for tensor {t.name!r}")
            if names is not None:
                wanted = set(names)
                missing = wanted - {t.name for t in tensors}
                if missing:
                    raise InvalidArgumentError(
                        f"tensors {sorted(missing)} are not published by {address}; "
                        f"it has {len(tensors)} tensors (see its catalog)"
                    )
                tensors = [t for t in tensors if t.name in wanted]
            if ordinal is None:
                result: dict[str, Any] = dict(_fetch(ep, regions, tensors, limit, progress))
            else:
                result = _fetch_device(ep, regions, tensors, limit, progress, ordinal)
            if with_header and header_hex is not None:
                result["__header__"] = np.frombuffer(bytes.fromhex(header_hex), dtype=np.uint8)
            ep.send(
                _encode({"v": PROTOCOL_VERSION, "op": "done"}),
                timeout=limit.timeout_s,
                deadline=limit.deadline_left(),
            )
            return result
    finally:
        if own:
            eng.close()


def _fetch(
    ep: Endpoint,
    regions: list[_core.Descriptor],
    tensors: list[TensorInfo],
    limit: CallLimits,
    progress: Callable[[int, int], None] | None,
) -> dict[str, npt.NDArray[Any]]:
    # Group tensors into runs that are contiguous in one remote region: one allocation and one
    # READ (in pieces) per run.
    runs: list[list[TensorInfo]] = []
    for t in sorted(tensors, key=lambda t: (t.region, t.offset)):
        last = runs[-1][-1] if runs else None
        if last is not None and last.region == t.region and last.offset + last.nbytes == t.offset:
            runs[-1].append(t)
        else:
            runs.append([t])
    total = sum(t.nbytes for t in tensors)
    result: dict[str, npt.NDArray[Any]] = {}
    transfers = []
    for run in runs:
        start = run[0].offset
        length = run[-1].offset + run[-1].nbytes - start
        # 64-byte aligned allocation, placed so that tensors keep the server's alignment.
        raw = np.empty(length + 64, dtype=np.uint8)
        shift = (start - raw.ctypes.data) % 64
        buf = raw[shift : shift + length]
        for t in run:
            view = buf[t.offset - start : t.offset - start + t.nbytes]
            result[t.name] = view.view(DTYPES[t.dtype]).reshape(t.shape)
        for off, n in _pieces(length):
            transfers.append(
                ep.post_read(
                    buf, regions[run[0].region], offset=off, remote_offset=start + off, nbytes=n
                )
            )
    done = 0
    for transfer in transfers:
        transfer.wait(timeout=limit.timeout_s, deadline=limit.deadline_left())
        done += transfer.nbytes
        if progress is not None:
            progress(done, total)
    return result


def _runs(tensors: list[TensorInfo]) -> list[list[TensorInfo]]:
    runs: list[list[TensorInfo]] = []
    for t in sorted(tensors, key=lambda t: (t.region, t.offset)):
        last = runs[-1][-1] if runs else None
        if last is not None and last.region == t.region and last.offset + last.nbytes == t.offset:
            runs[-1].append(t)
        else:
            runs.append([t])
    return runs


def _fetch_device(
    ep: Endpoint,
    regions: list[_core.Descriptor],
    tensors: list[TensorInfo],
    limit: CallLimits,
    progress: Callable[[int, int], None] | None,
    device: int,
) -> dict[str, Any]:
    # One GPU allocation and one READ per run; the staging pipeline (or the NIC, with
    # GPUDirect) cuts it into chunks, so no Python runs per chunk.
    direct = ep.engine.gpu_preflight(device).method != "staging"
    registrations: list[MemoryRegion] = []
    total = sum(t.nbytes for t in tensors)
    result: dict[str, Any] = {}
    transfers = []
    for run in _runs(tensors):
        start = run[0].offset
        length = run[-1].offset + run[-1].nbytes - start
        buf = Buffer.empty(length, np.uint8, device=device)
        base = buf._device_view()
        if direct:
            try:
                registrations.append(ep.engine.register(buf, access="none", local_write=True))
            except (RegistrationError, UnsupportedError) as exc:
                log.info("pull into cuda:%d: staging instead of GPUDirect (%s)", device, exc)
                direct = False
        for t in run:
            view = cuda.CudaArray(
                base.ptr + t.offset - start, t.shape, DTYPES[t.dtype], device, False, buf
            )
            result[t.name] = cuda.to_user_array(Buffer._from_device(view))
        transfers.append(
            ep.post_read(buf, regions[run[0].region], remote_offset=start, nbytes=length)
        )
    done = 0
    try:
        for transfer in transfers:
            transfer.wait(timeout=limit.timeout_s, deadline=limit.deadline_left())
            done += transfer.nbytes
            if progress is not None:
                progress(done, total)
    finally:
        for region in registrations:
            region.close()
    return result


def save_safetensors_copy(
    arrays: Mapping[str, npt.NDArray[Any]], path: str | os.PathLike[str]
) -> None:
    """Write pulled tensors as a ``.safetensors`` file.

    With the ``"__header__"`` entry from ``pull_weights(..., with_header=True)`` the server's
    header and layout are reproduced byte for byte; otherwise the ``safetensors`` library
    writes a fresh file.
    """
    header = arrays.get("__header__")
    tensors = {k: v for k, v in arrays.items() if k != "__header__"}
    if header is None:
        from safetensors.numpy import save_file

        save_file(dict(tensors), str(path))
        return
    parsed: dict[str, Any] = json.loads(header[8:].tobytes())
    data_len = max(
        (int(e["data_offsets"][1]) for k, e in parsed.items() if k != "__metadata__"), default=0
    )
    data = np.zeros(data_len, dtype=np.uint8)
    for name, entry in parsed.items():
        if name == "__metadata__":
            continue
        begin, end = (int(x) for x in entry["data_offsets"])
        data[begin:end] = np.ascontiguousarray(tensors[name]).view(np.uint8).reshape(-1)
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(data.tobytes())
