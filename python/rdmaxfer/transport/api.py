"""Module-level conveniences on a lazily created default engine.

Either side may listen::

    # machine B (listens)                    # machine A (connects)
    w = rdmaxfer.recv(listen=":5555")        rdmaxfer.send(w, to="B:5555")
    rdmaxfer.send(w, listen=":5555")         w = rdmaxfer.recv(from_="B:5555")

Endpoints are cached per address: repeated calls to the same address reuse the connection.
A listening address given as ``":port"`` binds 127.0.0.1; use ``"0.0.0.0:port"`` to accept
peers from other machines.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import threading
from typing import Any

import numpy.typing as npt

from .._config import CallLimits, format_address, parse_address
from ..errors import InvalidArgumentError, RdmaxferError
from ..memory.buffer import set_default_registrar
from .args import receivable, sendable
from .endpoint import Endpoint
from .engine import Engine

__all__ = ["accept", "connect", "default_engine", "listen", "recv", "send", "shutdown"]

_LISTEN_HOST = "127.0.0.1"

_lock = threading.RLock()
_default: Engine | None = None
# Engines listening on (host, port); the default engine serves the first address.
_listeners: dict[tuple[str, int], Engine] = {}
# Endpoints reused per address: connected to (host, port), or accepted on (host, port).
_connected: dict[tuple[str, int], Endpoint] = {}
_accepted: dict[tuple[str, int], Endpoint] = {}


def default_engine() -> Engine:
    """The process-wide engine (created on first use with ``Engine()``; transport "auto")."""
    global _default
    with _lock:
        if _default is None or _default.closed:
            _default = Engine()
        return _default


set_default_registrar(default_engine)  # Buffer.empty(pinned=True) without an engine


def _listener(address: str | int) -> tuple[Engine, tuple[str, int]]:
    host, port = parse_address(address, default_host=_LISTEN_HOST)
    with _lock:
        engine = _listeners.get((host, port)) if port != 0 else None
        if engine is not None and not engine.closed:
            return engine, (host, port)
        default = default_engine()
        engine = default if default.port is None else Engine()
        bound = engine.listen(host, port)
        _listeners[(host, bound)] = engine
        return engine, (host, bound)


def listen(address: str | int = ":0") -> int:
    """Listen on ``address`` (``":port"``, ``"host:port"``; port 0 picks a free port).

    Returns:
        The bound port; pass ``f":{port}"`` as ``listen=`` to send/recv/accept.

    Raises:
        InvalidArgumentError: malformed address. TransportError: the port is in use.
    """
    return _listener(address)[1][1]


def accept(listen: str | int, *, timeout: float | None = None) -> Endpoint:
    """The endpoint of a peer connected to the listening ``address`` (cached: an open one is
    reused, else the next peer is accepted).

    Raises:
        TransferTimeoutError: no peer connected within ``timeout`` seconds.
    """
    engine, key = _listener(listen)
    with _lock:
        cached = _accepted.get(key)
        if cached is not None and not cached.closed:
            return cached
    endpoint = engine.accept(timeout)
    with _lock:
        _accepted[key] = endpoint
    return endpoint


def connect(address: str, *, streams: int = 0, timeout: float | None = None) -> Endpoint:
    """The endpoint connected to ``"host:port"`` (cached: an open one is reused). A refused
    connection (the peer does not listen yet) is retried with backoff until ``timeout``.

    Raises:
        ConnectionFailedError: nothing listened there within ``timeout`` seconds (the message
            says how long it tried). TransferTimeoutError: no answer in time.
    """
    key = parse_address(address)
    with _lock:
        cached = _connected.get(key)
        if cached is not None and not cached.closed:
            return cached
    endpoint = default_engine().connect(format_address(*key), streams=streams, timeout=timeout)
    with _lock:
        _connected[key] = endpoint
    return endpoint


def _check_peer_args(peer: str | None, listen_at: str | int | None, peer_arg: str) -> None:
    if (peer is None) == (listen_at is None):
        raise InvalidArgumentError(
            f"pass exactly one of {peer_arg}='host:port' (connect to a listening peer) or "
            "listen=':port' (wait for the peer to connect)"
        )


def _endpoint(
    peer: str | None, listen_at: str | int | None, limits: CallLimits
) -> tuple[Endpoint, dict[tuple[str, int], Endpoint], tuple[str, int]]:
    if peer is not None:
        key = parse_address(peer)
        return connect(peer, timeout=limits.connect_s()), _connected, key
    key = _listener(listen_at if listen_at is not None else 0)[1]
    return accept(format_address(*key), timeout=limits.connect_s()), _accepted, key


def _forget_on_failure(cache: dict[tuple[str, int], Endpoint], key: tuple[str, int]) -> None:
    with _lock:
        endpoint = cache.get(key)
        if endpoint is not None and endpoint.closed:
            del cache[key]


def send(
    array: object,
    to: str | None = None,
    *,
    listen: str | int | None = None,
    timeout: float | None = None,
    deadline: float | None = None,
) -> None:
    """Send one array to a peer that calls ``recv``.

    The array is checked before any connection is made: a bad one raises here and the peer
    sees nothing.

    Args:
        array: a C-contiguous array (any dtype, incl. bfloat16), Buffer, or object exposing
            the buffer protocol / ``__array_interface__`` / ``__dlpack__``.
        to: ``"host:port"`` of a receiver listening with ``recv(listen=...)``. A receiver
            that does not listen yet is waited for: refused connections are retried with
            backoff until ``timeout``.
        listen: ``":port"`` or ``"host:port"``: wait for the receiver to connect
            (``recv(from_=...)``).
        timeout: seconds (default: RDMAXFER_TIMEOUT or 60) to connect (or accept), and then
            the inactivity bound of the transfer: it fails when no byte moved for that long.
        deadline: optional bound on the whole call in seconds, connecting included (None:
            none).

    Raises:
        InvalidArgumentError: both or neither of ``to``/``listen``; a non-contiguous array or
            a dtype a message cannot carry (raised before connecting).
        ConnectionFailedError: nothing listened at ``to`` within ``timeout``, or the peer went
            away.
        ProtocolError: the receiver rejected the array (dtype/shape mismatch with its out).
        TransferTimeoutError: no peer within ``timeout``, no progress for ``timeout``
            seconds, or past ``deadline``.
    """
    _check_peer_args(to, listen, "to")
    limits = CallLimits(timeout, deadline)
    sendable(array)
    endpoint, cache, key = _endpoint(to, listen, limits)
    try:
        endpoint.send(array, timeout=limits.timeout_s, deadline=limits.deadline_left())
    finally:
        _forget_on_failure(cache, key)


def recv(
    out: object = None,
    from_: str | None = None,
    *,
    listen: str | int | None = None,
    timeout: float | None = None,
    deadline: float | None = None,
) -> npt.NDArray[Any]:
    """Receive one array sent by a peer's ``send``.

    ``out`` is checked before any connection is made.

    Args:
        out: where to place the bytes: a writable C-contiguous array of the message's exact
            dtype and shape (NumPy, or any buffer-protocol / ``__array_interface__`` /
            ``__dlpack__`` object such as a torch CPU tensor; a GPU array is filled through
            staging), or None to allocate one of the sender's dtype and shape.
        from_: ``"host:port"`` of a sender listening with ``send(listen=...)`` (refused
            connections are retried with backoff until ``timeout``).
        listen: ``":port"`` or ``"host:port"``: wait for the sender to connect (``send(to=...)``).
        timeout: seconds (default: RDMAXFER_TIMEOUT or 60) to connect (or accept), then to
            wait for the message, then the inactivity bound while its bytes arrive.
        deadline: optional bound on the whole call in seconds (None: none).

    Returns:
        The received array (``out`` itself as an ndarray, or a new array).

    Raises:
        InvalidArgumentError: ``out`` is unusable, raised before connecting: read-only,
            not C-contiguous, an object dtype, or exposing no memory; or ``out``'s dtype or
            shape differ from the message's: the message is then rejected before any byte is
            written (``out`` is untouched) and the sender's ``send`` raises ProtocolError.
        UnsupportedError: ``out`` is GPU memory and CUDA is not usable here.
        TransferTimeoutError: nothing arrived in time, or past ``deadline``.
        ConnectionFailedError: the peer went away.
        ProtocolError: the message's metadata is malformed.
    """
    _check_peer_args(from_, listen, "from_")
    limits = CallLimits(timeout, deadline)
    if out is not None:
        receivable(out)
    endpoint, cache, key = _endpoint(from_, listen, limits)
    try:
        return endpoint.recv(out, timeout=limits.timeout_s, deadline=limits.deadline_left())
    finally:
        _forget_on_failure(cache, key)


def shutdown() -> None:
    """Close every cached endpoint and every engine of this module (idempotent; runs at exit).
    The next call creates a new default engine."""
    global _default
    with _lock:
        endpoints = list(_connected.values()) + list(_accepted.values())
        engines = list(_listeners.values())
        if _default is not None:
            engines.append(_default)
        _connected.clear()
        _accepted.clear()
        _listeners.clear()
        _default = None
    for endpoint in endpoints:
        with contextlib.suppress(RdmaxferError):
            endpoint.close()
    for engine in {id(e): e for e in engines}.values():
        with contextlib.suppress(RdmaxferError):
            engine.close()


def _after_fork_in_child() -> None:
    """A child of os.fork() starts with a fresh lock (another thread may have held this one at
    the fork) and forgets the parent's engines: they are inert here (``Engine.close``)."""
    global _lock, _default
    _lock = threading.RLock()
    _default = None
    _connected.clear()
    _accepted.clear()
    _listeners.clear()


atexit.register(shutdown)
os.register_at_fork(after_in_child=_after_fork_in_child)
