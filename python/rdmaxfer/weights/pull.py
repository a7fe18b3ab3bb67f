"""Pulling published weights: the catalog, then one-sided READs into new host arrays or, with
``device=``, GPU arrays (see :mod:`rdmaxfer.weights`)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import numpy.typing as npt

from .. import _core
from .._config import CallLimits
from ..errors import InvalidArgumentError, ProtocolError, RegistrationError, UnsupportedError
from ..gpu.staging import to_user_array
from ..memory import cuda
from ..memory.buffer import Buffer
from ..memory.region import MemoryRegion
from ..transport.endpoint import Endpoint
from ..transport.engine import Engine
from .format import DTYPES, PROTOCOL_VERSION, TensorInfo, decode, encode, pieces

__all__ = ["pull_weights"]

log = logging.getLogger("rdmaxfer.weights")


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
                encode({"v": PROTOCOL_VERSION, "op": "catalog"}),
                timeout=limit.timeout_s,
                deadline=limit.deadline_left(),
            )
            catalog = decode(
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
                encode({"v": PROTOCOL_VERSION, "op": "done"}),
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
        for off, n in pieces(length):
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
            result[t.name] = to_user_array(Buffer._from_device(view))
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
