"""The broadcast of :mod:`rdmaxfer.distributed`: a pipelined ring of point-to-point
transfers. Here: the ring order, the layout of an array or a dict of arrays (each array 64-byte
aligned in one virtual buffer), its metadata message, the spans that map the layout onto this
rank's arrays (host memory or GPU memory: CuPy, torch CUDA tensors, any
``__cuda_array_interface__`` or CUDA ``__dlpack__`` object, device Buffers), and the relay that
receives each piece and forwards it as soon as it landed."""

from __future__ import annotations

import bisect
import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

import numpy as np
import numpy.typing as npt

from ..errors import InvalidArgumentError, ProtocolError, TransferTimeoutError
from ..memory import cuda
from ..memory import meta as _meta
from ..memory.buffer import Buffer, byte_view
from ..transport.args import operand
from ..transport.endpoint import Endpoint
from ..transport.transfer import Transfer
from .store import PROTOCOL_VERSION, check_int

__all__ = [
    "ArrayDict",
    "Bytes",
    "Item",
    "Source",
    "Spans",
    "decode_meta",
    "destination",
    "encode_meta",
    "layout",
    "relay",
    "ring",
    "source",
]

ALIGN = 64  # bytes: where each array of a broadcast layout starts
MAX_META_ITEMS = 1 << 20

#: What a dict broadcast returns: name -> array (an ndarray; for GPU memory the caller's
#: object, or on a receiver with ``device=`` a CuPy array when CuPy is importable, else a
#: device Buffer).
ArrayDict = dict[str, Any]
#: Bytes of a span: host memory, or a range of GPU memory (dtype uint8, 1-D).
Bytes: TypeAlias = npt.NDArray[np.uint8] | cuda.CudaArray


@dataclass(frozen=True)
class Item:
    name: str
    dtype: np.dtype[Any]
    shape: tuple[int, ...]
    offset: int  # in the virtual layout

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


def layout(specs: Sequence[tuple[str, np.dtype[Any], tuple[int, ...]]]) -> tuple[list[Item], int]:
    items: list[Item] = []
    offset = 0
    for name, dtype, shape in specs:
        offset = -(-offset // ALIGN) * ALIGN
        item = Item(name, dtype, shape, offset)
        items.append(item)
        offset += item.nbytes
    return items, offset


def encode_meta(kind: str, chunk: int, items: Sequence[Item]) -> npt.NDArray[np.uint8]:
    doc = {
        "v": PROTOCOL_VERSION,
        "kind": kind,
        "chunk": chunk,
        "items": [[it.name, _meta.dtype_token(it.dtype), list(it.shape)] for it in items],
    }
    return np.frombuffer(json.dumps(doc).encode(), dtype=np.uint8).copy()


def decode_meta(raw: npt.NDArray[Any], peer: int) -> tuple[str, int, list[Item], int]:
    where = f"broadcast metadata from rank {peer}"
    if raw.dtype != np.uint8 or raw.ndim != 1:
        raise ProtocolError(f"{where}: expected a 1-D uint8 message, got {raw.dtype} {raw.shape}")
    try:
        doc = json.loads(raw.tobytes().decode())
        if doc.get("v") != PROTOCOL_VERSION:
            raise ProtocolError(
                f"{where}: protocol version {doc.get('v')!r}, this rank speaks "
                f"{PROTOCOL_VERSION}: run the same rdmaxfer version on every rank"
            )
        kind, chunk, entries = doc["kind"], doc["chunk"], doc["items"]
        if kind not in ("array", "dict") or not isinstance(chunk, int) or chunk <= 0:
            raise ValueError(f"kind {kind!r}, chunk {chunk!r}")
        if not isinstance(entries, list) or len(entries) > MAX_META_ITEMS:
            raise ValueError("items is not a list of at most 2**20 entries")
        if kind == "array" and len(entries) != 1:
            raise ValueError(f"an array broadcast has 1 item, not {len(entries)}")
        specs = []
        for name, token, shape in entries:
            dims = tuple(int(d) for d in shape)
            if not isinstance(name, str) or any(d < 0 for d in dims):
                raise ValueError(f"item {name!r} shape {shape!r}")
            specs.append((name, _meta.dtype_from_token(str(token)), dims))
    except ProtocolError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError) as exc:
        raise ProtocolError(f"{where} is malformed: {exc}") from None
    except InvalidArgumentError as exc:
        raise ProtocolError(f"{where}: {exc}") from None
    items, total = layout(specs)
    return kind, chunk, items, total


def byte_range(arr: npt.NDArray[Any] | cuda.CudaArray) -> Bytes:
    """All of ``arr``'s bytes as a span."""
    if isinstance(arr, np.ndarray):
        return byte_view(arr)
    return dataclasses.replace(arr, shape=(arr.nbytes,), dtype=np.dtype(np.uint8))


def cut(view: Bytes, lo: int, hi: int) -> Bytes:
    """Bytes ``[lo, hi)`` of a span."""
    if isinstance(view, np.ndarray):
        return view[lo:hi]
    return dataclasses.replace(view, ptr=view.ptr + lo, shape=(hi - lo,))


def movable(view: Bytes) -> object:
    """What an endpoint sends from or receives into for a span (GPU memory: a device Buffer,
    staged or GPUDirect as the engine decides)."""
    return view if isinstance(view, np.ndarray) else Buffer.from_device(view)


def copy_bytes(dst: Bytes, src: Bytes) -> None:
    """Copy between a staging piece (host memory) and a span (host or GPU memory)."""
    if isinstance(dst, np.ndarray) and isinstance(src, np.ndarray):
        dst[...] = src
    elif isinstance(dst, np.ndarray):
        assert not isinstance(src, np.ndarray)
        cuda.copy_to_host(src, dst)
    else:
        assert isinstance(src, np.ndarray)
        cuda.copy_from_host(dst, src)


class Spans:
    """Where this rank's bytes of the virtual layout live: (layout offset, bytes) spans, each
    in host or GPU memory."""

    def __init__(self, spans: list[tuple[int, Bytes]]) -> None:
        self.spans = [(off, view) for off, view in spans if view.nbytes > 0]
        self.starts = [off for off, _ in self.spans]

    def direct(self, start: int, end: int) -> Bytes | None:
        """A view of [start, end) if one span holds all of it, else None."""
        i = bisect.bisect_right(self.starts, start) - 1
        if i >= 0:
            off, view = self.spans[i]
            if end <= off + view.nbytes:
                return cut(view, start - off, end - off)
        return None

    def overlaps(self, start: int, end: int) -> list[tuple[slice, Bytes]]:
        """(slice of the piece, view of the span) for every span overlapping [start, end)."""
        out = []
        i = max(0, bisect.bisect_right(self.starts, start) - 1)
        while i < len(self.spans) and self.spans[i][0] < end:
            off, view = self.spans[i]
            lo, hi = max(start, off), min(end, off + view.nbytes)
            if lo < hi:
                out.append((slice(lo - start, hi - start), cut(view, lo - off, hi - off)))
            i += 1
        return out


@dataclass
class Source:
    kind: str
    items: list[Item]
    total: int
    spans: Spans
    result: Any  # the array (or the caller's GPU array), or an ArrayDict


def aligned_empty(nbytes: int) -> npt.NDArray[np.uint8]:
    raw = np.empty(nbytes + ALIGN, dtype=np.uint8)
    shift = (-raw.ctypes.data) % ALIGN
    return raw[shift : shift + nbytes]


def ring(rank: int, world: int, src: int, ranks: Sequence[int] | None) -> list[int]:
    """The ranks of a broadcast from ``src`` in ring order (``src`` first); the checks of
    ``ranks`` (default: all ``world`` ranks) raise InvalidArgumentError."""
    if ranks is None:
        members = list(range(world))
    else:
        members = sorted({check_int("ranks[i]", r, 0, world) for r in ranks})
        if len(members) != len(ranks):
            raise InvalidArgumentError(f"ranks={list(ranks)!r} holds a rank twice")
    if src not in members:
        raise InvalidArgumentError(f"src={src} is not in ranks={members}: add it")
    if rank not in members:
        raise InvalidArgumentError(
            f"rank {rank} is not in ranks={members}: only those ranks call broadcast"
        )
    start = members.index(src)
    return members[start:] + members[:start]


def _user(value: object, arr: npt.NDArray[Any] | cuda.CudaArray) -> Any:
    """What the caller gets back for ``value``: the ndarray view of host memory, the object
    itself for GPU memory."""
    return arr if isinstance(arr, np.ndarray) else value


def source(rank: int, obj: object) -> Source:
    """What rank ``src`` (``rank``) sends: ``obj``'s layout and spans, checked."""
    arrays: list[tuple[str, npt.NDArray[Any] | cuda.CudaArray, object]] = []
    if isinstance(obj, Mapping):
        kind = "dict"
        for name, value in obj.items():
            if not isinstance(name, str):
                raise InvalidArgumentError(
                    f"broadcast: weights key {name!r} is a {type(name).__name__}; keys "
                    "must be strings"
                )
            arr = operand(value, writable=False, what=f"weights[{name!r}]")
            arrays.append((name, arr, value))
    elif obj is None:
        raise InvalidArgumentError(
            f"broadcast: rank {rank} is src but passed None: pass the array or the "
            "dict of arrays to broadcast"
        )
    else:
        kind = "array"
        arrays = [("", operand(obj, writable=False, what="array to broadcast"), obj)]
    items, total = layout([(name, arr.dtype, tuple(arr.shape)) for name, arr, _ in arrays])
    for item in items:
        _meta.dtype_token(item.dtype)  # raises for dtypes that cannot travel
    spans = Spans(
        [(it.offset, byte_range(arr)) for it, (_, arr, _) in zip(items, arrays, strict=True)]
    )
    users = {name: _user(value, arr) for name, arr, value in arrays}
    return Source(kind, items, total, spans, users[""] if kind == "array" else users)


def destination(
    rank: int, obj: object, kind: str, items: list[Item], total: int, device: int | None = None
) -> tuple[Any, Spans]:
    """Where ``rank`` places what the source sends: ``obj`` checked against the layout, or new
    arrays in one aligned buffer (``obj`` None), in host memory or on GPU ``device``; and the
    spans over them."""
    users: list[Any]
    if obj is None and device is not None:
        from ..gpu.staging import to_user_array

        buffer = Buffer.empty(max(total, 1), np.uint8, device=f"cuda:{device}")
        flat = buffer.device_array()
        users = [
            to_user_array(
                Buffer.from_device(
                    cuda.CudaArray(flat.ptr + it.offset, it.shape, it.dtype, device, False, buffer)
                )
            )
            for it in items
        ]
        spans = Spans([(0, flat)])
    elif obj is None:
        host = aligned_empty(total)
        users = [
            host[it.offset : it.offset + it.nbytes].view(it.dtype).reshape(it.shape) for it in items
        ]
        spans = Spans([(0, host)])
    else:
        arrays: list[npt.NDArray[Any] | cuda.CudaArray] = []
        values: list[object]
        if kind == "array":
            if isinstance(obj, Mapping):
                raise InvalidArgumentError(
                    f"broadcast: rank {rank} passed a dict but the source sends one "
                    "array: pass None or an array"
                )
            values = [obj]
            targets = [operand(obj, writable=True, what="broadcast destination")]
        else:
            if not isinstance(obj, Mapping):
                raise InvalidArgumentError(
                    f"broadcast: rank {rank} passed a {type(obj).__name__} but the "
                    "source sends a dict of arrays: pass None or a dict"
                )
            names = [it.name for it in items]
            if set(obj) != set(names) or len(obj) != len(names):
                missing = sorted(set(names) - set(obj))[:5]
                extra = sorted(str(k) for k in set(obj) - set(names))[:5]
                raise InvalidArgumentError(
                    f"broadcast: the dict on rank {rank} does not hold the source's "
                    f"names (missing {missing}, extra {extra}): pass None or matching arrays"
                )
            values = [obj[it.name] for it in items]
            targets = [
                operand(obj[it.name], writable=True, what=f"out[{it.name!r}]") for it in items
            ]
        for it, target in zip(items, targets, strict=True):
            if target.dtype != it.dtype or tuple(target.shape) != it.shape:
                label = "array" if kind == "array" else f"out[{it.name!r}]"
                raise InvalidArgumentError(
                    f"broadcast: the source sends {label} as {_meta.dtype_token(it.dtype)} "
                    f"{it.shape}; rank {rank} passed {target.dtype} "
                    f"{tuple(target.shape)}: pass None or an array of that dtype and shape"
                )
            arrays.append(target)
        spans = Spans([(it.offset, byte_range(a)) for it, a in zip(items, arrays, strict=True)])
        users = [_user(value, a) for value, a in zip(values, arrays, strict=True)]
    if kind == "array":
        return users[0], spans
    return {it.name: a for it, a in zip(items, users, strict=True)}, spans


def relay(
    rank: int,
    ep_prev: Endpoint | None,
    ep_next: Endpoint | None,
    spans: Spans,
    total: int,
    chunk: int,
    timeout_s: float,
    nxt: int | None,
    prev: int | None = None,
) -> None:
    """Move the pieces: receive each from ``ep_prev`` (unless source) and forward it to
    ``ep_next`` (unless last) as soon as it has landed."""
    pieces = [(start, min(start + chunk, total)) for start in range(0, total, chunk)]
    staged: list[Bytes] = []
    for start, end in pieces:
        view = spans.direct(start, end)
        if view is None:  # a piece over several arrays goes through host memory
            packed = np.zeros(end - start, dtype=np.uint8)
            if ep_prev is None:  # the source packs the piece
                for part, src_view in spans.overlaps(start, end):
                    copy_bytes(packed[part], src_view)
            view = packed
        staged.append(view)
    recvs: list[Transfer[npt.NDArray[Any]]] = []
    if ep_prev is not None:
        recvs = [ep_prev.post_recv(movable(view)) for view in staged]
    sends: list[Transfer[None]] = []
    staged_last = False
    for k, view in enumerate(staged):
        if ep_prev is not None:
            try:
                recvs[k].wait(timeout_s)
            except TransferTimeoutError as exc:
                raise TransferTimeoutError(
                    f"broadcast: rank {rank} got no piece {k} of {len(staged)} from "
                    f"rank {prev} within {timeout_s:g} s"
                ) from exc
            if isinstance(view, np.ndarray) and spans.direct(*pieces[k]) is None:
                for part, dst_view in spans.overlaps(*pieces[k]):
                    copy_bytes(dst_view, view[part])
        if ep_next is not None:
            if staged_last:
                # A staged message of GPU memory reaches the wire once its copy is done,
                # after messages posted later could: the next piece waits for it.
                _wait_sends(sends, rank, nxt, timeout_s)
            sends.append(ep_next.post_send(movable(view)))
            staged_last = not isinstance(view, np.ndarray)
            while sends and sends[0].done():  # surface a failure downstream early
                sends.pop(0).wait(timeout_s)
    _wait_sends(sends, rank, nxt, timeout_s)


def _wait_sends(sends: list[Transfer[None]], rank: int, nxt: int | None, timeout_s: float) -> None:
    """Wait for (and forget) the pieces sent to rank ``nxt``."""
    while sends:
        try:
            sends.pop(0).wait(timeout_s)
        except TransferTimeoutError as exc:
            raise TransferTimeoutError(
                f"broadcast: rank {nxt} did not take the pieces from rank {rank} "
                f"within {timeout_s:g} s"
            ) from exc
