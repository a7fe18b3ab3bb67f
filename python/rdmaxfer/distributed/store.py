"""The rendezvous of :mod:`rdmaxfer.distributed` (the protocol is described in that package's
docstring): the store wrapper with bounded waits, the rank record, the hello that opens every
connection, and the checks of rank numbers."""

from __future__ import annotations

import datetime
import json
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from .._config import Deadline
from ..errors import (
    ConnectionFailedError,
    InvalidArgumentError,
    ProtocolError,
    RdmaxferError,
    TransferTimeoutError,
)

PROTOCOL_VERSION = 1
HELLO_MAGIC = 0x52584447  # "RXDG"
MIN_STORE_WAIT_S = 0.001  # c10d reads a zero timeout as "wait forever"

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


def check_int(name: str, value: object, low: int, high: int | None = None) -> int:
    """``value`` as an int in ``low..high-1`` (``high`` None: no upper bound).

    Raises:
        InvalidArgumentError: not an integer, or out of range.
    """
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise InvalidArgumentError(f"{name}={value!r} must be an integer")
    number = int(value)
    if number < low or (high is not None and number >= high):
        bound = f"in {low}..{high - 1}" if high is not None else f">= {low}"
        raise InvalidArgumentError(f"{name}={number} must be {bound}")
    return number
