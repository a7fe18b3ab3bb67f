"""Pulling published weights: the catalog of one version, then one-sided READs into new host
arrays, new GPU arrays (``device=``) or the caller's own arrays (``into=``), whole tensors or
``np.s_``-style shards of them (see :mod:`rdmaxfer.weights`)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from .. import _core
from .._config import CallLimits
from ..errors import (
    ConnectionFailedError,
    ProtocolError,
    RegistrationError,
    TransferTimeoutError,
    UnsupportedError,
)
from ..gpu.staging import to_user_array
from ..memory import cuda
from ..memory.buffer import Buffer, device_view
from ..memory.region import MemoryRegion
from ..transport.endpoint import Endpoint
from ..transport.engine import Engine
from .format import DTYPES, PROTOCOL_VERSION, TensorInfo, decode, encode
from .moving import Piece, move
from .shard import Names, Shard, destination, select, shards_for

__all__ = ["PulledWeights", "pull_weights"]

log = logging.getLogger("rdmaxfer.weights")

ALIGN = 64


class PulledWeights(dict[str, Any]):
    """What :func:`pull_weights` returns: ``{name: array}`` (a dict), all of one version.

    Attributes:
        version: the server's version the tensors belong to (1 for what it published first,
            one more per :meth:`WeightServer.update`).
    """

    def __init__(self, arrays: Mapping[str, Any], version: int) -> None:
        super().__init__(arrays)
        self.version = version


def pull_weights(
    address: str,
    *,
    names: Names | None = None,
    into: Mapping[str, object] | None = None,
    shard: Mapping[str, object] | None = None,
    min_version: int = 0,
    engine: Engine | None = None,
    transport: str = "auto",
    streams: int = 0,
    timeout: float | None = None,
    deadline: float | None = None,
    progress: Callable[[int, int], None] | None = None,
    with_header: bool = False,
    device: str | int | None = None,
) -> PulledWeights:
    """Fetch published tensors (all of one version) with one-sided READs.

    New host arrays are zero-copy views of one allocation, registered once for the pull;
    whole tensors that sit next to each other on the server are fetched by one READ. A shard
    that is a range of rows (of the first partial axis, the later axes whole) is one READ;
    other shards (a column block ``np.s_[:, a:b]``, a step) are one READ per contiguous
    piece. Every READ of the pull goes in one batch (``Endpoint.read_batch``: pieces
    contiguous on both sides merged, at most 256 operations in flight); GPU memory without a
    GPUDirect registration is read through the staging pipeline instead, one READ per piece.

    Args:
        address: the server, ``"host:port"``.
        names: the tensors to fetch: a list of names, or a predicate called with each
            published name (default: all; with ``into`` and no ``names``, those of ``into``).
        into: ``{name: array}``: fill these arrays in place (host arrays, or GPU arrays:
            CuPy, PyTorch, ``__cuda_array_interface__``, device Buffers), each writable,
            C-contiguous and of the tensor's dtype and shape (the shard's, with ``shard``).
            Checked before any byte moves. If the pull then fails they may hold part of the
            bytes: the exception says the pull did not complete.
        shard: ``{name: index}`` with ``np.s_``-style indices (slices with a positive step,
            ints, one Ellipsis): fetch ``tensor[index]`` only, e.g. ``np.s_[256:512]`` (rows
            256 to 511) or ``np.s_[:, 0:96]`` (a column block). Tensors without an entry are
            fetched whole.
        min_version: wait (at most ``timeout`` s) until the server publishes at least this
            version (see :meth:`WeightServer.update`); 0: take the current one.
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
            ``"__header__"`` (a ``uint8`` array), for :func:`save_safetensors_copy` (version 1
            of a file only: later versions have no file header).
        device: None/``"cpu"`` for new host arrays, or ``"cuda:N"``: new arrays are allocated
            on that GPU and filled by READs, straight into GPU memory when the engine can
            register it for GPUDirect RDMA, else through the staging pipeline; they come back
            as CuPy arrays (when CuPy is importable) or device Buffers.

    Returns:
        A :class:`PulledWeights`: ``{name: array}`` with the published dtype (BF16 as
        ``ml_dtypes.bfloat16``) and the tensor's (or shard's) shape, ``into``'s arrays as
        given; ``.version`` is the version they all belong to.

    Raises:
        InvalidArgumentError: a name in ``names``, ``into`` or ``shard`` is not published (or
            not selected), a shard does not fit its tensor, an ``into`` array has another
            dtype or shape; the message names the tensor, and no byte has moved. Also a bad
            ``device``.
        TransferTimeoutError: ``min_version`` was not published within ``timeout``, or the
            READs stalled.
        UnsupportedError: ``device`` is a GPU but CUDA is not usable here (with the reason).
        ConnectionFailedError, ProtocolError, RemoteAccessError: the connection failed, the
            server broke the protocol, or it refused a READ.
    """
    ordinal = None if device is None or device == "cpu" else cuda.parse_device(device)
    if names is None and into is not None:
        names = list(into)
    own = engine is None
    eng = engine if engine is not None else Engine(transport)
    limit = CallLimits(timeout, deadline)
    try:
        with eng.connect(address, streams=streams, timeout=limit.connect_s()) as ep:
            version, regions, tensors, header_hex = _catalog(ep, limit, min_version, address)
            chosen = select(tensors, names, address)
            shards = shards_for(chosen, into, shard, address)
            placed = {s.tensor.name: destination(s, into) for s in shards}  # checked first
            reads: list[Piece] = []
            registrations: list[MemoryRegion] = []
            try:
                plain = [s.tensor for s in shards if s.pieces and _whole(s, placed)]
                arena = None
                if ordinal is None:
                    new = [
                        s for s in shards if s.tensor not in plain and placed[s.tensor.name] is None
                    ]
                    arena = _Arena(plain, new, ep, registrations)
                    result = _allocate_runs(plain, regions, reads, arena)
                else:
                    result = _allocate_runs_device(
                        plain, regions, reads, ep, ordinal, registrations
                    )
                for s in shards:
                    if s.tensor.name not in result:
                        result[s.tensor.name] = _place(
                            s, placed, regions, reads, ep, ordinal, registrations, arena
                        )
                move(ep, "read", reads, limit, progress)
            finally:
                for region in registrations:
                    region.close()
            if with_header and header_hex is not None:
                result["__header__"] = np.frombuffer(bytes.fromhex(header_hex), dtype=np.uint8)
            _send_done(ep, address, limit)
            return PulledWeights(result, version)
    finally:
        if own:
            eng.close()


def _send_done(ep: Endpoint, address: str, limit: CallLimits) -> None:
    """Tell the server this client is done (it releases the version's lease and closes its end).

    Every READ has completed by now, so the bytes are in place whatever happens to this
    message. The server closes the endpoint as soon as the message lands, and over verbs its
    GOODBYE can reach this side before the SEND's own completion does (seen on rxe under load):
    this side then fails the SEND although the server got it. That failure is logged and
    ignored; a server that really went away released the lease when its endpoint closed.
    """
    try:
        ep.send(
            encode({"v": PROTOCOL_VERSION, "op": "done"}),
            timeout=limit.timeout_s,
            deadline=limit.deadline_left(),
        )
    except ConnectionFailedError as exc:  # EndpointClosedError included
        log.info("%s: the 'done' message after the pull: %s (the pull is complete)", address, exc)


def _catalog(
    ep: Endpoint, limit: CallLimits, min_version: int, address: str
) -> tuple[int, list[_core.Descriptor], list[TensorInfo], str | None]:
    """Ask for the catalog (of at least ``min_version``, waiting up to ``timeout``)."""
    wait_s = limit.timeout_s if min_version > 0 else 0.0
    request = {"v": PROTOCOL_VERSION, "op": "catalog", "min_version": min_version}
    ep.send(
        encode({**request, "wait_s": wait_s}),
        timeout=limit.timeout_s,
        deadline=limit.deadline_left(),
    )
    catalog = decode(
        ep.recv(timeout=limit.timeout_s + wait_s, deadline=limit.deadline_left()), "catalog"
    )
    try:
        version = int(catalog["version"])
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
    if version < min_version:
        raise TransferTimeoutError(
            f"{address} publishes version {version}; version {min_version} (min_version) was "
            f"not published within {wait_s:g} s; raise timeout= or update the server"
        )
    return version, regions, tensors, header_hex


def _whole(s: Shard, placed: Mapping[str, object]) -> bool:
    return placed[s.tensor.name] is None and s.shape == s.tensor.shape and len(s.pieces) == 1


def _runs(tensors: list[TensorInfo]) -> list[list[TensorInfo]]:
    """Tensors grouped into runs contiguous in one remote region."""
    runs: list[list[TensorInfo]] = []
    for t in sorted(tensors, key=lambda t: (t.region, t.offset)):
        last = runs[-1][-1] if runs else None
        if last is not None and last.region == t.region and last.offset + last.nbytes == t.offset:
            runs[-1].append(t)
        else:
            runs.append([t])
    return runs


class _Arena:
    """One host allocation for every new host array of a pull, registered once for local
    writes, so that no READ into it needs a registration of its own."""

    def __init__(
        self,
        runs_of: list[TensorInfo],
        shards: list[Shard],
        ep: Endpoint,
        registrations: list[MemoryRegion],
    ) -> None:
        sizes = [t.nbytes for t in runs_of] + [s.nbytes for s in shards]
        total = sum(n + ALIGN for n in sizes)
        self.buffer = np.empty(total, dtype=np.uint8)
        self._at = 0
        if total:
            registrations.append(ep.engine.register(self.buffer, access="none", local_write=True))

    def take(self, nbytes: int, remote_offset: int = 0) -> npt.NDArray[np.uint8]:
        """``nbytes`` bytes aligned like ``remote_offset`` modulo 64 (the server's alignment)."""
        at = self._at + (remote_offset - self.buffer.ctypes.data - self._at) % ALIGN
        self._at = at + nbytes
        return self.buffer[at : at + nbytes]


def _allocate_runs(
    tensors: list[TensorInfo],
    regions: list[_core.Descriptor],
    reads: list[Piece],
    arena: _Arena,
) -> dict[str, Any]:
    """One READ (in pieces) per run of whole tensors, into the arena."""
    result: dict[str, Any] = {}
    for run in _runs(tensors):
        start = run[0].offset
        length = run[-1].offset + run[-1].nbytes - start
        buf = arena.take(length, start)  # tensors keep the server's alignment
        for t in run:
            view = buf[t.offset - start : t.offset - start + t.nbytes]
            result[t.name] = view.view(DTYPES[t.dtype]).reshape(t.shape)
        reads.append((buf, regions[run[0].region], 0, start, length))
    return result


def _register_for_gpudirect(
    ep: Endpoint, buf: object, device: int, registrations: list[MemoryRegion]
) -> None:
    """Register GPU memory a pull READs into for GPUDirect RDMA when the engine can (else the
    READs go through the staging pipeline)."""
    if ep.engine.gpu_preflight(device).method == "staging":
        return
    try:
        registrations.append(ep.engine.register(buf, access="none", local_write=True))
    except (RegistrationError, UnsupportedError) as exc:
        log.info("pull into cuda:%d: staging instead of GPUDirect (%s)", device, exc)


def _allocate_runs_device(
    tensors: list[TensorInfo],
    regions: list[_core.Descriptor],
    reads: list[Piece],
    ep: Endpoint,
    device: int,
    registrations: list[MemoryRegion],
) -> dict[str, Any]:
    """One GPU allocation and one READ per run of whole tensors; the staging pipeline (or the
    NIC, with GPUDirect) cuts it into chunks, so no Python runs per chunk."""
    result: dict[str, Any] = {}
    for run in _runs(tensors):
        start = run[0].offset
        length = run[-1].offset + run[-1].nbytes - start
        buf = Buffer.empty(length, np.uint8, device=device)
        base = buf.device_array()
        _register_for_gpudirect(ep, buf, device, registrations)
        for t in run:
            view = cuda.CudaArray(
                base.ptr + t.offset - start, t.shape, DTYPES[t.dtype], device, False, buf
            )
            result[t.name] = to_user_array(Buffer.from_device(view))
        reads.append((buf, regions[run[0].region], 0, start, length))
    return result


def _place(
    s: Shard,
    placed: Mapping[str, tuple[object, bool] | None],
    regions: list[_core.Descriptor],
    reads: list[Piece],
    ep: Endpoint,
    device: int | None,
    registrations: list[MemoryRegion],
    arena: _Arena | None,
) -> Any:
    """The array a shard (or a tensor going into the caller's array) lands in, its READs
    added to ``reads``."""
    given = placed[s.tensor.name]
    dtype = DTYPES[s.tensor.dtype]
    if given is not None:
        dest, on_gpu = given
        if on_gpu:
            view = device_view(dest, writable=True)
            assert view is not None
            _register_for_gpudirect(ep, dest, view.device, registrations)
        user = dest
    elif arena is not None:
        dest = user = arena.take(s.nbytes).view(dtype).reshape(s.shape)
    else:
        assert device is not None
        dest = Buffer.empty(s.shape, dtype, device=device)
        _register_for_gpudirect(ep, dest, device, registrations)
        user = to_user_array(dest)
    region = regions[s.tensor.region]
    reads.extend((dest, region, p.local_offset, p.remote_offset, p.nbytes) for p in s.pieces)
    return user
