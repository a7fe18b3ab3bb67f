"""The wire and store records of :mod:`rdmaxfer.distributed` (private; the protocol is
described in that module's docstring): the store wrapper with bounded waits, the rank record,
the hello, the broadcast metadata and layout, and the spans that map a layout onto arrays."""

from __future__ import annotations

import bisect
import datetime
import json
import math
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from . import _meta
from ._config import Deadline
from .errors import (
    ConnectionFailedError,
    InvalidArgumentError,
    ProtocolError,
    RdmaxferError,
    TransferTimeoutError,
)

PROTOCOL_VERSION = 1
HELLO_MAGIC = 0x52584447  # "RXDG"
ALIGN = 64  # bytes: where each array of a broadcast layout starts
MIN_STORE_WAIT_S = 0.001  # c10d reads a zero timeout as "wait forever"
MAX_META_ITEMS = 1 << 20

ArrayDict = dict[str, npt.NDArray[Any]]
T = TypeVar("T")


# -- the store ---------------------------------------------------------------------------------
class Store:
    """Bounded waits on a torch.distributed store; its errors become rdmaxfer errors."""

    def __init__(self, store: Any) -> None:
        for method in ("set", "get", "add", "wait"):
            if not callable(getattr(store, method, None)):
                raise InvalidArgumentError(
                    f"store {type(store).__name__} has no {method}(): pass a "
                    "torch.distributed Store (TCPStore, FileStore, PrefixStore, or "
                    "torch.distributed.distributed_c10d._get_default_store())"
                )
        self.store = store

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except RdmaxferError:
            raise
        except Exception as exc:  # torch raises DistStoreError / DistNetworkError / RuntimeError
            text = f"{type(exc).__name__}: {exc}"
            if isinstance(exc, TimeoutError) or "timeout" in text.lower():
                raise TransferTimeoutError(f"store: {what}: {text}") from exc
            raise ConnectionFailedError(f"store: {what} failed: {text}") from exc

    def set(self, key: str, value: bytes) -> None:
        self._call(f"set {key!r}", lambda: self.store.set(key, value))

    def add(self, key: str, amount: int) -> int:
        return int(self._call(f"add {key!r}", lambda: self.store.add(key, amount)))

    def get(self, key: str, deadline: Deadline, why: str) -> bytes:
        """Wait (bounded by ``deadline``) for ``key`` and return its value."""
        wait_s = max(deadline.remaining(), MIN_STORE_WAIT_S)
        try:
            self._call(
                f"wait for {key!r}",
                lambda: self.store.wait([key], datetime.timedelta(seconds=wait_s)),
            )
        except TransferTimeoutError as exc:
            raise TransferTimeoutError(
                f"{why}: key {key!r} did not appear in the store within "
                f"{deadline.timeout_s:g} s ({exc})"
            ) from exc
        value = self._call(f"get {key!r}", lambda: self.store.get(key))
        return bytes(value)


def store_host(store: Any) -> str | None:
    """The host of the TCPStore under ``store`` (through PrefixStores), if any."""
    current = store
    for _ in range(16):
        host = getattr(current, "host", None)
        if isinstance(host, str) and host:
            return host
        current = getattr(current, "underlying_store", None)
        if current is None:
            return None
    return None


def reachable_host(store: Any) -> str:
    """The local address on the route to the store's host (127.0.0.1 without a TCP store or
    when the store is local): the address the other ranks can reach this one at."""
    host = store_host(store)
    if host is None:
        return "127.0.0.1"
    try:
        infos = socket.getaddrinfo(host, 9, socket.AF_INET, socket.SOCK_DGRAM)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.connect(infos[0][4])  # UDP: no packet is sent, only the route is chosen
            return str(sock.getsockname()[0])
    except OSError:
        return "127.0.0.1"


# -- records and messages ------------------------------------------------------------------------
@dataclass(frozen=True)
class Record:
    address: str
    transport: str
    world_size: int
    token: int

    def pack(self) -> bytes:
        return json.dumps(
            {
                "v": PROTOCOL_VERSION,
                "address": self.address,
                "transport": self.transport,
                "world_size": self.world_size,
                "token": self.token,
            }
        ).encode()

    @classmethod
    def unpack(cls, data: bytes, key: str) -> Record:
        try:
            obj = json.loads(data.decode())
            if obj.get("v") != PROTOCOL_VERSION:
                raise ProtocolError(
                    f"store key {key!r} has protocol version {obj.get('v')!r}, this rank "
                    f"speaks {PROTOCOL_VERSION}: run the same rdmaxfer version on every rank"
                )
            record = cls(
                str(obj["address"]),
                str(obj["transport"]),
                int(obj["world_size"]),
                int(obj["token"]),
            )
        except ProtocolError:
            raise
        except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError) as exc:
            raise ProtocolError(
                f"store key {key!r} does not hold an rdmaxfer rank record ({exc}): is another "
                "program using that namespace? pass namespace= to init()"
            ) from None
        return record


def hello(rank: int, world_size: int, token: int) -> npt.NDArray[np.int64]:
    return np.array([HELLO_MAGIC, PROTOCOL_VERSION, rank, world_size, token], dtype=np.int64)


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
            specs.append((name, _meta._dtype_from_token(str(token)), dims))
    except ProtocolError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError) as exc:
        raise ProtocolError(f"{where} is malformed: {exc}") from None
    except InvalidArgumentError as exc:
        raise ProtocolError(f"{where}: {exc}") from None
    items, total = layout(specs)
    return kind, chunk, items, total


class Spans:
    """Where this rank's bytes of the virtual layout live: (layout offset, uint8 view) spans."""

    def __init__(self, spans: list[tuple[int, npt.NDArray[np.uint8]]]) -> None:
        self.spans = [(off, view) for off, view in spans if view.nbytes > 0]
        self.starts = [off for off, _ in self.spans]

    def direct(self, start: int, end: int) -> npt.NDArray[np.uint8] | None:
        """A view of [start, end) if one span holds all of it, else None."""
        i = bisect.bisect_right(self.starts, start) - 1
        if i >= 0:
            off, view = self.spans[i]
            if end <= off + view.nbytes:
                return view[start - off : end - off]
        return None

    def overlaps(self, start: int, end: int) -> list[tuple[slice, npt.NDArray[np.uint8]]]:
        """(slice of the piece, view of the span) for every span overlapping [start, end)."""
        out = []
        i = max(0, bisect.bisect_right(self.starts, start) - 1)
        while i < len(self.spans) and self.spans[i][0] < end:
            off, view = self.spans[i]
            lo, hi = max(start, off), min(end, off + view.nbytes)
            if lo < hi:
                out.append((slice(lo - start, hi - start), view[lo - off : hi - off]))
            i += 1
        return out


@dataclass
class Source:
    kind: str
    items: list[Item]
    total: int
    spans: Spans
    result: npt.NDArray[Any] | ArrayDict


def aligned_empty(nbytes: int) -> npt.NDArray[np.uint8]:
    raw = np.empty(nbytes + ALIGN, dtype=np.uint8)
    shift = (-raw.ctypes.data) % ALIGN
    return raw[shift : shift + nbytes]
