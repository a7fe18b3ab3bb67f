"""The engine: one transport (TCP or RDMA), its listener, its endpoints and its registrations.

Example::

    with Engine() as engine:
        port = engine.listen("0.0.0.0", 5555)
        with engine.accept(timeout=30) as ep:
            weights = ep.recv()                # a new array of the sender's dtype and shape
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from .. import _core, _transports
from .._config import ENV_SECRET, ENV_TRANSPORT, format_address, parse_address, resolve_timeout
from .._warn import warn
from ..errors import EndpointClosedError, InvalidArgumentError, TransferTimeoutError
from ..options import EngineOptions, RdmaOptions, ShmOptions, TcpOptions, env_setting
from .domain import MemoryDomain
from .endpoint import Endpoint
from .lifecycle import track_engine
from .tls import TLS_ARGS, TLS_ROW, tls_settings
from .transfer import Transfer

if TYPE_CHECKING:
    import asyncio
    from types import TracebackType

__all__ = ["Endpoint", "Engine", "Transfer", "is_automatic", "is_loopback", "resolve_transport"]


def resolve_transport(transport: str = "auto") -> str:
    """The transport ``Engine(transport)`` registers memory with and uses for other hosts.

    ``"auto"`` picks ``RDMAXFER_TRANSPORT`` when set, else ``"rdma"`` when
    ``_core.available_transports()`` says it is usable here, else ``"tcp"``; an automatic
    engine (see :func:`is_automatic`) also connects same-host peers over ``"shm"``.

    Raises:
        InvalidArgumentError: not "auto", "tcp", "rdma" or "shm" (or a bad
            RDMAXFER_TRANSPORT).
    """
    if transport == "auto":
        env = env_setting(ENV_TRANSPORT)
        return _transports.automatic_network() if env == "auto" else str(env)
    if transport not in _transports.listed():
        _transports.capabilities(transport)  # raises, naming the transports of this build
        raise InvalidArgumentError(f"transport={transport!r} is internal; pick a listed one")
    return transport


def is_automatic(transport: str = "auto") -> bool:
    """True when ``Engine(transport)`` picks the transport of each connection: ``"auto"``
    without a ``RDMAXFER_TRANSPORT`` that names one. Such an engine connects a peer on this
    host (same kernel, network and PID namespace, user, and CMA allowed) over shm, any other
    over its network transport, and says why when a same-host peer does not get shm."""
    return transport == "auto" and env_setting(ENV_TRANSPORT) == "auto"


class Engine(MemoryDomain):
    """One transport instance: listens, connects, registers memory (see
    :class:`~rdmaxfer.transport.domain.MemoryDomain` for the memory side).

    Lifecycle: open (constructed) -> listening (optional, ``listen()``) -> closed (``close()``
    or leaving a ``with`` block: every endpoint is closed and every region deregistered, then
    the transport's threads stop; idempotent). Thread-safe.

    Args:
        transport: ``"auto"`` (per connection: ``"shm"`` for a peer on this host that shm
            can reach, else ``"rdma"`` when a device is active here, else ``"tcp"``; see
            :func:`is_automatic` and :attr:`Endpoint.info` ``transport``/``shm_not_used``),
            ``"tcp"``, ``"rdma"`` or ``"shm"`` (processes on this host only: a control ring in
            shared memory and one-sided copies with ``process_vm_readv``/``writev``;
            ``connect`` to another host raises :class:`~rdmaxfer.errors.UnsupportedError`).
        io_threads: I/O threads (0: the transport's default).
        socket_buffer: SO_SNDBUF/SO_RCVBUF in bytes (0: the system's default).
        streams: default parallel streams (TCP) or queue pairs per connection (0: default).
        rdma_device: rdma only: the device ("mlx5_0", "rxe0"; default: env
            ``RDMAXFER_RDMA_DEVICES``, else ``RDMAXFER_RDMA_DEVICE``, else the first device with
            an active port).
        rdma_devices: rdma only: several devices, one rail each (``["mlx5_0", "mlx5_1"]``, or
            ``"auto"``: every device with an active port; default: env
            ``RDMAXFER_RDMA_DEVICES``, names separated by commas or spaces). Registrations
            cover every rail (an rkey each, in the descriptor); a connection holds QPs on each
            pair of rails the two engines share (same fabric and IPv4 network); transfers of
            512 KiB and more are striped over the rails in proportion to link speed, smaller
            ones take one rail (the NIC nearest the buffer's GPU when it has one). When a rail
            fails mid-transfer its chunks move to the others; :meth:`Endpoint.describe` shows
            each rail's state and bytes.
        gid_index: rdma only: the GID table index (default: env ``RDMAXFER_GID_INDEX``, else
            the first RoCE v2 GID holding an IPv4-mapped address).
        poll_mode: how waits for I/O spend their time (default: env ``RDMAXFER_POLL_MODE``,
            else ``"adaptive"``). ``"adaptive"``: a waiting caller polls its socket or ring
            without blocking for a self-tuned time (twice its recent waits, at most 1 ms)
            before it sleeps, and an I/O thread polls likewise after each event, so
            back-to-back small operations pay no wake-up while an idle engine sleeps (every
            spin yields the CPU every few turns, for a peer on the same CPU). ``"busy"``: a waiting
            caller spins for its whole wait (which still ends at its timeout and on Ctrl-C)
            and I/O threads poll for 20 ms after each event: lowest latency, a CPU per
            waiting thread. ``"event"``: every wait sleeps at once: least CPU, a wake-up per
            completion. On rdma ``"busy"`` spins the completion thread on the CQ, and
            ``"adaptive"`` is ``"event"`` (it sleeps on the completion channel).
        service_level, traffic_class, min_rnr_timer: rdma only, the fabric settings of every
            QP on every rail (default: env ``RDMAXFER_SERVICE_LEVEL`` / ``RDMAXFER_TRAFFIC_CLASS`` /
            ``RDMAXFER_MIN_RNR_TIMER``, else 0 / 0 / 18): the service level 0..15 (InfiniBand
            SL; the priority on RoCE), the GRH traffic class 0..255 (RoCE: the IP TOS byte,
            DSCP << 2, e.g. 104 for DSCP 26) and the IB RNR timer code 0..31 (18 = 5.12 ms).
            ``rdmaxfer doctor`` says when the traffic class misses the NIC's PFC/ECN setting.
        tls: TLS 1.3 (default: env ``RDMAXFER_TLS``, else off) on every stream of every tcp
            connection, and on rdma and ofi on the bootstrap stream with everything sent over
            it (endpoint records, ofi's control messages; the fabric's bytes stay as they
            are), authenticated by the shared secret as a pre-shared key or by certificates
            (``TcpOptions(tls_cert=, tls_key=, tls_ca=)``, or ``RDMAXFER_TLS_CERT``...); a peer
            without TLS is refused, and a peer with it is refused by an engine without.
            UnsupportedError on shm, which never leaves the host.
        secret: a shared secret (default: env ``RDMAXFER_SECRET``). With one, every connection
            starts with a mutual HMAC-SHA256 challenge-response and a peer without the same
            secret is refused before any address, key or QP number is revealed; both sides
            need it. Without one, :meth:`listen` warns when bound beyond loopback.
            A peer's two-sided message beyond ``EngineOptions(max_message_bytes=...)`` (env
            ``RDMAXFER_MAX_MESSAGE_BYTES``, else 16 GiB) is refused before anything is
            allocated; the sender's send raises :class:`~rdmaxfer.errors.ProtocolError`.
        options: the settings as typed objects, one per table (:mod:`rdmaxfer.options`):
            :class:`~rdmaxfer.options.EngineOptions`, and :class:`~rdmaxfer.options.TcpOptions`,
            :class:`~rdmaxfer.options.RdmaOptions` or :class:`~rdmaxfer.options.ShmOptions`
            for the transport(s) this engine uses (an ``"auto"`` engine takes any); one object
            or a list. The keywords above are the same settings (``streams`` is
            ``TcpOptions.streams`` and ``RdmaOptions.qps``, ``rdma_device`` is
            ``RdmaOptions.device``...); a setting given both ways is an error.

    Raises:
        InvalidArgumentError: an unknown transport or a bad value (a poll_mode other than
            "adaptive", "busy" or "event"), options for a transport this engine does not use,
            or a setting given twice.
        UnsupportedError: the transport cannot be used here (the message says why).
    """

    def __init__(
        self,
        transport: str = "auto",
        io_threads: int = 0,
        socket_buffer: int = 0,
        streams: int = 0,
        *,
        rdma_device: str | None = None,
        rdma_devices: Sequence[str] | str | None = None,
        gid_index: int | None = None,
        poll_mode: str | None = None,
        secret: str | bytes | None = None,
        service_level: int | None = None,
        traffic_class: int | None = None,
        min_rnr_timer: int | None = None,
        tls: bool | None = None,
        options: AnyOptions | Sequence[AnyOptions] | None = None,
    ) -> None:
        kind = "auto" if is_automatic(transport) else resolve_transport(transport)
        core_args: dict[str, Any] = {
            "io_threads": io_threads,
            "socket_buffer": socket_buffer,
            "default_streams": streams,
            "rdma_device": rdma_device or "",
            "gid_index": -1 if gid_index is None else gid_index,
            "poll_mode": poll_mode or "",
            "secret": secret,
            "rdma_devices": _device_list(rdma_devices),
            "service_level": -1 if service_level is None else service_level,
            "traffic_class": -1 if traffic_class is None else traffic_class,
            "min_rnr_timer": -1 if min_rnr_timer is None else min_rnr_timer,
            "max_message_bytes": None,
            **dict.fromkeys(TLS_ARGS),
        }
        if tls is not None:
            core_args["tls"] = TLS_ROW.check(tls, "Engine")
        if options is not None:
            _apply_options(core_args, kind, options)
        secret = core_args["secret"]
        if secret is None:
            secret = env_setting(ENV_SECRET)
        if isinstance(secret, bytes):
            secret = secret.decode("latin-1")
        core_args["secret"] = secret
        if core_args["max_message_bytes"] is None:
            core_args["max_message_bytes"] = env_setting("RDMAXFER_MAX_MESSAGE_BYTES")
        network = resolve_transport("auto") if kind == "auto" else kind
        tls_on = tls_settings(core_args, kind, network)
        self._authenticated = bool(secret) or tls_on
        super().__init__(_core.Engine(kind, **core_args))
        self._port: int | None = None
        # Endpoints are held until closed: dropping the last handle must not cut a connection
        # that a peer still uses (e.g. for one-sided access to our memory).
        self._endpoints: dict[int, Endpoint] = {}
        self._links: dict[str, int] = {}
        track_engine(self)  # closed at interpreter exit if still open (lifecycle.py)

    # -- properties ------------------------------------------------------------------------
    @property
    def engine_id(self) -> int:
        """Random 64-bit id of this engine (it appears in descriptors)."""
        return self._core.engine_id

    @property
    def notify_fd(self) -> int:
        """File descriptor readable when a watched request finished (asyncio uses it)."""
        return self._core.notify_fd

    @property
    def port(self) -> int | None:
        """The listening port, or None before ``listen()``."""
        return self._port

    def capabilities(self) -> dict[str, int | bool | str]:
        """What the transport can do (one-sided ops, max message size in bytes...)."""
        return self._core.capabilities()

    def describe(self) -> str:
        """One line naming the transport and its devices/settings; with ``"auto"`` it also
        says whether same-host peers connect over shm, or why not."""
        text = self._core.describe()
        if not self._core.automatic:
            return text
        off = self._core.shm_off
        return f"{text}; auto: " + (
            "shm for peers on this host" if not off else f"no shm for peers on this host ({off})"
        )

    @property
    def shm_off(self) -> str | None:
        """With ``transport="auto"``: ``""`` when peers on this host connect over shm, else why
        not (shm cannot run here, or its listener could not open); None with a forced
        transport."""
        return self._core.shm_off if self._core.automatic else None

    def links(self) -> dict[str, int]:
        """How many connections (accepted or made, open or closed) each transport carried, e.g.
        ``{"shm": 1, "tcp": 2}``."""
        with self._lock:
            return dict(self._links)

    def endpoints(self) -> list[Endpoint]:
        """The endpoints of this engine that are open now (accepted or connected), oldest
        first; each has its own ``stats()`` and ``peer``."""
        with self._lock:
            return [e for e in self._endpoints.values() if not e.closed]

    def stats(self) -> dict[str, int]:
        """The counters of every endpoint this engine made (open or closed) plus failed
        set-ups; keys and units in :mod:`rdmaxfer.transport.stats`. Readable after ``close()``."""
        return self._core.stats()

    def registered_count(self) -> int:
        """Number of live registrations in the transport (including temporary ones)."""
        return self._core.registered_count()

    # -- notifications ---------------------------------------------------------------------
    def wait_notification(self, timeout: float | None = None) -> tuple[str, bytes | int]:
        """The oldest notification a peer sent with a WRITE (``write(..., notify=)`` or
        ``write_batch(..., notify=)``), waiting up to ``timeout`` seconds for one.

        A notification is delivered only after every byte of its request is in this engine's
        memory, on every lane (stream or QP) that carried it.

        Returns:
            ``(peer, payload)``: the sender's ``host:port`` and the payload as sent (bytes of
            at most 64, or an int in 0..2**32-1).

        Raises:
            TransferTimeoutError: none arrived within ``timeout`` (default ``RDMAXFER_TIMEOUT``
                or 60 seconds).
            EndpointClosedError: the engine is closed and none is left.
        """
        limit = resolve_timeout(timeout)
        got = _core.pop_notification(self._core, limit)
        if got is None:
            self._no_notification(limit)
        return got

    async def anotification(self, timeout: float | None = None) -> tuple[str, bytes | int]:
        """Asyncio twin of :meth:`wait_notification` (the event loop watches the engine's
        notification eventfd; no thread is blocked)."""
        import asyncio

        limit = resolve_timeout(timeout)
        loop = asyncio.get_running_loop()
        fd = _core.notification_fd(self._core)
        end = loop.time() + limit
        while True:
            got = _core.pop_notification(self._core, 0.0)
            if got is not None:
                return got
            left = end - loop.time()
            if left <= 0 or self._closed:
                self._no_notification(limit)
            ready: asyncio.Future[None] = loop.create_future()
            loop.add_reader(fd, _resolve, ready)
            try:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(ready, left)
            finally:
                loop.remove_reader(fd)

    def _no_notification(self, limit: float) -> NoReturn:
        if self._closed:
            raise EndpointClosedError("the engine is closed; no notification is left")
        raise TransferTimeoutError(
            f"no notification arrived within timeout={limit:g} s; a peer sends one with "
            "write(..., notify=payload) or write_batch(..., notify=payload)"
        )

    @property
    def authenticated(self) -> bool:
        """True when the engine holds a shared secret (its peers must prove the same one)."""
        return self._authenticated

    # -- connections -----------------------------------------------------------------------
    def listen(self, host: str = "127.0.0.1", port: int = 0) -> int:
        """Start accepting connections on ``host:port`` (port 0: any free port).

        The default host is 127.0.0.1. Binding another address without a shared secret (see
        the class docstring) warns (``UserWarning``): any host that can reach the port may then
        connect and access the memory this engine exposes.

        Returns:
            The port actually bound.

        Raises:
            InvalidArgumentError: port outside 0..65535.
            TransportError: bind/listen failed (e.g. the port is in use).
        """
        self._check_open()
        host, port = parse_address(host, port, default_host="127.0.0.1")
        if not self._authenticated and not is_loopback(host):
            warn(
                f"rdmaxfer engine listening on {format_address(host, port)} without a shared "
                f"secret: any host that reaches it can connect; set {ENV_SECRET} (or "
                "Engine(secret=...)) on both sides, or listen on 127.0.0.1"
            )
        bound = self._core.listen(host, port)
        self._port = bound
        return bound

    def accept(self, timeout: float | None = None) -> Endpoint:
        """Wait for the next peer to connect (after ``listen()``).

        Args:
            timeout: seconds (default: ``RDMAXFER_TIMEOUT`` or 60).

        Raises:
            TransferTimeoutError: no peer connected in time.
            InvalidArgumentError: not listening.
            EndpointClosedError: the engine is closed.
        """
        self._check_open()
        return self._adopt(self._core.accept(resolve_timeout(timeout)))

    def connect(
        self,
        address: str,
        port: int | None = None,
        *,
        streams: int = 0,
        timeout: float | None = None,
        retry_refused: bool = True,
    ) -> Endpoint:
        """Connect to a listening engine.

        Args:
            address: ``"host:port"`` (``"[::1]:5555"`` for IPv6), or a host with ``port``.
            port: the port, when ``address`` is only a host.
            streams: parallel streams / queue pairs (0: the engine's default).
            timeout: seconds for connecting and the handshake (default: ``RDMAXFER_TIMEOUT``
                or 60). A refused connection (the peer does not listen yet) is retried with
                backoff (50 ms doubling to 1 s) until then, as torch.distributed's TCPStore
                does, the last attempt at the timeout (timeout=1: 6 attempts, at 0, 0.05,
                0.15, 0.35, 0.75 and 1 s); each handshake step of the accepting side has its
                own 5 s.
            retry_refused: False fails at once when refused: for a peer known to listen
                already (e.g. one whose address was published after it listened), where a
                refusal means it is gone.

        Raises:
            ConnectionFailedError: still refused when ``timeout`` ran out (the message gives
                the attempts and the seconds tried), unreachable, or the handshake failed.
            TransferTimeoutError: no answer in time.
            InvalidArgumentError: a malformed address.
        """
        self._check_open()
        host, port_value = parse_address(address, port)
        if port_value == 0:
            raise InvalidArgumentError(f"address {address!r}: cannot connect to port 0")
        timeout_s = resolve_timeout(timeout)
        return self._adopt(self._core.connect(host, port_value, streams, timeout_s, retry_refused))

    def _adopt(self, core: _core.Endpoint) -> Endpoint:
        endpoint = Endpoint(self, core, on_close=self._forget_endpoint)
        with self._lock:
            if self._closed:
                core.close()
                raise EndpointClosedError("the engine was closed while connecting")
            for key, known in list(self._endpoints.items()):
                if known.closed:
                    del self._endpoints[key]
            self._endpoints[id(endpoint)] = endpoint
            self._links[core.transport] = self._links.get(core.transport, 0) + 1
        return endpoint

    def _forget_endpoint(self, endpoint: Endpoint) -> None:
        with self._lock:
            self._endpoints.pop(id(endpoint), None)

    # -- lifecycle -------------------------------------------------------------------------
    def close(self) -> None:
        """Close every endpoint, deregister every region, stop the transport (idempotent).

        In a child of ``os.fork()`` an inherited engine is only marked closed: its connections
        and registrations belong to the parent, which keeps using them."""
        if self.inherited():
            self._closed = True
            return
        with self._lock:
            if self._closed:
                return
            self._closed = True
            endpoints = list(self._endpoints.values())
        # Every endpoint's teardown starts before any is waited for: on verbs the flushes of
        # 512 connections' QPs then drain together, not one connection after another.
        for endpoint in endpoints:
            endpoint.begin_close()
        for endpoint in endpoints:
            endpoint.close()
        self._close_memory()
        self._core.close()

    def stop_at_exit(self) -> None:
        """Internal: at interpreter exit (lifecycle.py): close the core only (connections aborted,
        waits failed, threads joined), taking no Python lock; later closes are no-ops."""
        if self._closed or self.inherited():
            return
        self._closed = True
        self._core_closed = True
        self._core.close()

    def __del__(self) -> None:
        # An engine dropped without close() must still stop its progress thread. No module
        # globals here: they may already be gone at interpreter exit.
        if getattr(self, "_closed", True):
            return
        try:
            self.close()
        except Exception:
            pass

    def __enter__(self) -> Engine:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        listening = f" port={self._port}" if self._port is not None else ""
        return f"<Engine {state} transport={self.transport!r}{listening}>"


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


AnyOptions = EngineOptions | TcpOptions | ShmOptions | RdmaOptions

#: (options class, field) -> the argument of ``_core.Engine`` it sets, and that argument's
#: value when not given.
_CORE_ARG: dict[tuple[type, str], tuple[str, object]] = {
    (EngineOptions, "poll_mode"): ("poll_mode", ""),
    (EngineOptions, "secret"): ("secret", None),
    (EngineOptions, "max_message_bytes"): ("max_message_bytes", None),
    (TcpOptions, "io_threads"): ("io_threads", 0),
    (TcpOptions, "socket_buffer"): ("socket_buffer", 0),
    (TcpOptions, "streams"): ("default_streams", 0),
    **{(TcpOptions, name): (name, None) for name in TLS_ARGS},
    (RdmaOptions, "device"): ("rdma_device", ""),
    (RdmaOptions, "devices"): ("rdma_devices", []),
    (RdmaOptions, "gid_index"): ("gid_index", -1),
    (RdmaOptions, "qps"): ("default_streams", 0),
    (RdmaOptions, "service_level"): ("service_level", -1),
    (RdmaOptions, "traffic_class"): ("traffic_class", -1),
    (RdmaOptions, "min_rnr_timer"): ("min_rnr_timer", -1),
}


def _apply_options(
    core_args: dict[str, Any], kind: str, options: AnyOptions | Sequence[AnyOptions]
) -> None:
    """Set ``core_args`` (``_core.Engine``'s keywords, filled from the old keywords) from
    ``options``, for an engine of transport ``kind`` ("auto", "tcp", "rdma", "shm").

    Raises:
        InvalidArgumentError: not options objects, two of one class, options of a transport
            the engine does not use, or a setting given both as a keyword and in options.
    """
    given: Sequence[object] = options if isinstance(options, (list, tuple)) else [options]
    uses = _transports.listed() if kind == "auto" else (kind,)
    network = resolve_transport("auto") if kind == "auto" else kind
    seen: set[type] = set()
    for option in given:
        cls = type(option)
        if not isinstance(option, AnyOptions):
            raise InvalidArgumentError(
                f"options={option!r}: give EngineOptions, TcpOptions, RdmaOptions or "
                "ShmOptions from rdmaxfer (one, or a list of them)"
            )
        if cls in seen:
            raise InvalidArgumentError(f"options: {cls.__name__} given twice; merge them into one")
        seen.add(cls)
        if option.TRANSPORT and option.TRANSPORT not in uses:
            raise InvalidArgumentError(
                f"options: {cls.__name__} is for transport {option.TRANSPORT!r}, but this "
                f"engine uses {kind!r}; drop it, or make the engine with "
                f"transport={option.TRANSPORT!r} (or 'auto')"
            )
        if (
            kind == "auto"
            and option.TRANSPORT
            and _transports.capabilities(option.TRANSPORT).network
            and option.TRANSPORT != network
        ):
            continue  # the network transport this automatic engine did not pick here
        for field, value in option.given().items():
            arg, unset = _CORE_ARG[(cls, field)]
            if core_args[arg] != unset and core_args[arg] != value:
                raise InvalidArgumentError(
                    f"{arg} given twice, as a keyword of Engine() and as {cls.__name__}"
                    f"({field}={value!r}); keep one"
                )
            core_args[arg] = value


def _device_list(devices: Sequence[str] | str | None) -> list[str]:
    """``rdma_devices=`` as the core takes it: [] (the environment decides), ``["auto"]`` or
    names. Raises InvalidArgumentError for anything but a string or a sequence of strings."""
    if devices is None:
        return []
    names = devices.replace(",", " ").split() if isinstance(devices, str) else list(devices)
    if not names or not all(isinstance(n, str) and n for n in names):
        raise InvalidArgumentError(
            f"rdma_devices={devices!r}: give device names (['mlx5_0', 'mlx5_1']) or 'auto'"
        )
    return names


def is_loopback(host: str) -> bool:
    """True for "localhost" and loopback addresses (127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    import ipaddress  # only when listening (and not imported by `import rdmaxfer`)

    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
