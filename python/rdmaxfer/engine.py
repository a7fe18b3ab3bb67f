"""The engine: one transport (TCP or RDMA), its listener, its endpoints and its registrations.

Example::

    with Engine() as engine:
        port = engine.listen("0.0.0.0", 5555)
        with engine.accept(timeout=30) as ep:
            weights = ep.recv()                # a new array of the sender's dtype and shape
"""

from __future__ import annotations

import contextlib
import os
import threading
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import numpy.typing as npt

from . import _core
from ._config import ENV_SECRET, ENV_TRANSPORT, format_address, parse_address, resolve_timeout
from ._warn import warn
from .buffer import (
    ACCESS,
    LOCAL_WRITE,
    Buffer,
    MemoryRegion,
    access_bits,
    as_array,
    byte_view,
    device_view,
)
from .endpoint import Endpoint
from .errors import (
    EndpointClosedError,
    InvalidArgumentError,
    RdmaxferError,
    RegistrationError,
    UnsupportedError,
)
from .transfer import Notifications, Transfer

if TYPE_CHECKING:
    from types import TracebackType

    from . import cuda, topology

__all__ = ["Endpoint", "Engine", "Transfer", "resolve_transport"]

_TRANSPORTS = ("tcp", "rdma")
# Bound on deregistration waits when the engine closes (its endpoints are closed by then).
_CLOSE_TIMEOUT_S = 5.0


def resolve_transport(transport: str = "auto") -> str:
    """The transport ``Engine(transport)`` uses.

    ``"auto"`` picks ``RDMAXFER_TRANSPORT`` when set, else ``"rdma"`` when
    ``_core.available_transports()`` says it is usable here, else ``"tcp"``.

    Raises:
        InvalidArgumentError: not "auto", "tcp" or "rdma" (or a bad RDMAXFER_TRANSPORT).
    """
    if transport == "auto":
        env = os.environ.get(ENV_TRANSPORT, "").strip().lower()
        if env and env != "auto":
            if env not in _TRANSPORTS:
                raise InvalidArgumentError(
                    f"{ENV_TRANSPORT}={env!r} is not 'tcp', 'rdma' or 'auto'; fix or unset it"
                )
            return env
        usable = _core.available_transports()
        return "rdma" if usable.get("rdma") == "" else "tcp"
    if transport not in _TRANSPORTS:
        raise InvalidArgumentError(f"transport={transport!r} is not 'auto', 'tcp' or 'rdma'")
    return transport


class Engine:
    """One transport instance: listens, connects, registers memory.

    Lifecycle: open (constructed) -> listening (optional, ``listen()``) -> closed (``close()``
    or leaving a ``with`` block: every endpoint is closed and every region deregistered, then
    the transport's threads stop; idempotent). Thread-safe.

    Args:
        transport: ``"auto"`` (see :func:`resolve_transport`), ``"tcp"`` or ``"rdma"``.
        io_threads: I/O threads (0: the transport's default).
        socket_buffer: SO_SNDBUF/SO_RCVBUF in bytes (0: the system's default).
        streams: default parallel streams (TCP) or queue pairs per connection (0: default).
        rdma_device: rdma only: the device ("mlx5_0", "rxe0"; default: env
            ``RDMAXFER_RDMA_DEVICE``, else the first device with an active port).
        gid_index: rdma only: the GID table index (default: env ``RDMAXFER_GID_INDEX``, else
            the first RoCE v2 GID holding an IPv4-mapped address).
        poll_mode: rdma only: ``"event"`` (default; the completion thread sleeps on the
            completion channel) or ``"busy"`` (it spins on the CQ: lower latency, one core).
        secret: a shared secret (default: env ``RDMAXFER_SECRET``). With one, every connection
            starts with a mutual HMAC-SHA256 challenge-response and a peer without the same
            secret is refused before any address, key or QP number is revealed; both sides
            need it. Without one, :meth:`listen` warns when bound beyond loopback.

    Raises:
        InvalidArgumentError: an unknown transport or a bad value.
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
        gid_index: int | None = None,
        poll_mode: str | None = None,
        secret: str | bytes | None = None,
    ) -> None:
        if secret is None:
            secret = os.environ.get(ENV_SECRET, "")
        if isinstance(secret, bytes):
            secret = secret.decode("latin-1")
        self._authenticated = bool(secret)
        self._core = _core.Engine(
            resolve_transport(transport),
            io_threads,
            socket_buffer,
            streams,
            rdma_device=rdma_device or "",
            gid_index=-1 if gid_index is None else gid_index,
            poll_mode=poll_mode or "",
            secret=secret,
        )
        self._lock = threading.RLock()
        self._closed = False
        self._pid = os.getpid()  # in a child of os.fork() this engine is the parent's: inert
        self._port: int | None = None
        # Endpoints are held until closed: dropping the last handle must not cut a connection
        # that a peer still uses (e.g. for one-sided access to our memory).
        self._endpoints: dict[int, Endpoint] = {}
        # Every live registration by key (so none can be freed while its key is live), and the
        # user registrations by exact range, so registering the same memory again is free.
        self._regions: dict[int, MemoryRegion] = {}
        self._by_range: dict[tuple[int, int, int], MemoryRegion] = {}
        # GPU memory: one staging pipeline per GPU (rdmaxfer.staging), the GPUDirect preflight.
        self._stagers: dict[int, _core.Stager] = {}
        self._preflights: dict[int, topology.GpuDirectPreflight] = {}
        self._notifications = Notifications(self._core)

    # -- properties ------------------------------------------------------------------------
    @property
    def core(self) -> _core.Engine:
        """The underlying ``_core.Engine``."""
        return self._core

    @property
    def transport(self) -> str:
        """``"tcp"`` or ``"rdma"``."""
        return self._core.transport

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

    @property
    def closed(self) -> bool:
        """True once ``close()`` was called."""
        return self._closed

    def capabilities(self) -> dict[str, int | bool | str]:
        """What the transport can do (one-sided ops, max message size in bytes...)."""
        return self._core.capabilities()

    def describe(self) -> str:
        """One line naming the transport and its devices/settings."""
        return self._core.describe()

    def stats(self) -> dict[str, int]:
        """The counters of every endpoint this engine made (open or closed) plus failed
        set-ups; keys and units in :mod:`rdmaxfer.stats`. Readable after ``close()``."""
        return self._core.stats()

    def registered_count(self) -> int:
        """Number of live registrations in the transport (including temporary ones)."""
        return self._core.registered_count()

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
        if not self._authenticated and not _is_loopback(host):
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
                does; each handshake step of the accepting side has its own 5 s.
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
        endpoint = Endpoint(self, core)
        with self._lock:
            if self._closed:
                core.close()
                raise EndpointClosedError("the engine was closed while connecting")
            for key, known in list(self._endpoints.items()):
                if known.closed:
                    del self._endpoints[key]
            self._endpoints[id(endpoint)] = endpoint
        return endpoint

    def _forget_endpoint(self, endpoint: Endpoint) -> None:
        with self._lock:
            self._endpoints.pop(id(endpoint), None)

    # -- memory ----------------------------------------------------------------------------
    def register(
        self, obj: object, access: str = "rw", *, local_write: bool | None = None
    ) -> MemoryRegion:
        """Register memory so that peers can READ/WRITE it (or so local transfers skip a
        temporary registration).

        Registrations are cached by (address, bytes, access): registering the same memory
        again returns the same live MemoryRegion. Deregistering it (``close()``) ends it for
        every holder.

        The registration asks the transport only for the rights its uses need (on verbs, the
        ``ibv_access_flags`` of the MR): ``IBV_ACCESS_LOCAL_WRITE`` only when the region may be
        a local destination (a READ or a receive lands in it) or peers may write it. So
        read-only memory (``mmap(ACCESS_READ)`` files, arrays with ``writeable=False``,
        ``bytes``) registers fine as a source; receiving into it raises InvalidArgumentError
        before anything is posted.

        Args:
            obj: a C-contiguous array, Buffer, or object exposing the buffer protocol,
                ``__array_interface__`` or ``__dlpack__`` (host memory). It is kept alive
                until the region is deregistered. GPU memory (CuPy, PyTorch, a device
                Buffer...) is registered for GPUDirect RDMA, by dmabuf or nvidia-peermem as
                :meth:`gpu_preflight` decides.
            access: what a peer may do: ``"rw"``, ``"r"`` (read only), ``"w"`` or ``"none"``.
            local_write: whether local operations may write the region (it is then a READ or
                receive destination without a temporary registration). None (default): when
                the memory is writable by this process; False: a source only (served, sent,
                written from); True: required (read-only memory is refused). Implied by
                ``"w"``/``"rw"``.

        Raises:
            InvalidArgumentError: unknown access, non-contiguous memory, or read-only memory
                with ``"w"``/``"rw"`` or ``local_write=True``.
            RegistrationError: the transport could not register it (for GPU memory the message
                names the cause and the fix: nvidia-peermem, open kernel modules, memlock).
            UnsupportedError: GPU memory on a transport or machine without GPUDirect RDMA
                (the message says why; transfers of GPU memory are staged there instead).
            EndpointClosedError: the engine is closed.
        """
        self._check_open()
        bits = access_bits(access)
        if isinstance(obj, MemoryRegion) and obj.engine is self and obj.registered:
            if obj.core.access == bits and local_write in (None, obj.core.local_write):
                return obj
        view = device_view(obj, writable=False, what="memory to register")
        if view is not None:
            writes = not view.readonly if local_write is None else local_write
            return self._register_device(obj, view, bits | (LOCAL_WRITE if writes else 0), access)
        arr = as_array(obj, writable=False, what="memory to register")
        if (bits & ACCESS["w"] or local_write) and not arr.flags.writeable:
            why = (
                f"access={access!r}: peers could write it"
                if bits & ACCESS["w"]
                else ("local_write=True: local operations could write it")
            )
            raise InvalidArgumentError(
                f"read-only memory (shape {arr.shape}, dtype {arr.dtype}) cannot be registered "
                f"with {why}; use access='r' (local_write=False), or register a writable copy"
            )
        writes = arr.flags.writeable if local_write is None else local_write
        core_bits = bits | (LOCAL_WRITE if writes else 0)
        addr, nbytes = _addr(arr), int(arr.nbytes)
        with self._lock:
            cached = self._by_range.get((addr, nbytes, bits))
            if cached is not None and cached.registered and cached.core.local_write >= writes:
                return cached
            owner = obj.numpy() if isinstance(obj, (Buffer, MemoryRegion)) else obj
            region = MemoryRegion(
                self, self._core.register(addr, nbytes, core_bits), owner, byte_view(arr)
            )
            self._regions[region.key] = region
            self._by_range[(addr, nbytes, bits)] = region
        return region

    def gpu_preflight(self, device: str | int = 0) -> topology.GpuDirectPreflight:
        """How this engine registers memory of GPU ``device`` for RDMA, and why not otherwise:
        ``method`` is ``"dmabuf"``, ``"peermem"`` or ``"staging"`` (see
        :func:`rdmaxfer.topology.preflight`)."""
        from . import cuda, topology

        ordinal = device if isinstance(device, int) else cuda.parse_device(device)
        with self._lock:
            cached = self._preflights.get(ordinal)
        if cached is not None:
            return cached
        rdma_device = None
        if self.transport == "rdma":
            words = self.describe().split()  # "rdma: device mlx5_0 port 1, ..."
            rdma_device = words[words.index("device") + 1] if "device" in words[:-1] else None
        result = topology.preflight(
            self.transport,
            rdma_device=rdma_device,
            cuda_status=cuda.status(),
            gpu=ordinal,
            verbs_dmabuf=_core.verbs_dmabuf_unavailable(),
        )
        with self._lock:
            self._preflights[ordinal] = result
        return result

    def _register_device(
        self, obj: object, view: cuda.CudaArray, bits: int, access: str
    ) -> MemoryRegion:
        if bits & ACCESS["w"] and view.readonly:
            raise InvalidArgumentError(
                f"read-only GPU memory cannot be registered with access={access!r}"
            )
        check = self.gpu_preflight(view.device)
        if check.method == "staging":
            raise UnsupportedError(
                f"GPU memory cannot be registered for RDMA on this engine: dmabuf: "
                f"{check.reasons['dmabuf']}; nvidia-peermem: {check.reasons['peermem']}. "
                "Transfers of GPU memory work without registering (they are staged through "
                "pinned host buffers)"
            )
        with self._lock:
            cached = self._by_range.get((view.ptr, view.nbytes, bits))
            if cached is not None and cached.registered:
                return cached
        errors = []
        for method in ("dmabuf", "peermem"):
            if check.reasons.get(method):
                continue
            try:
                core = self._core.register_device(view.ptr, view.nbytes, bits, method, view.device)
            except (RegistrationError, UnsupportedError) as exc:
                errors.append(f"{method}: {exc}")
                continue
            region = MemoryRegion(self, core, view, np.empty(0, np.uint8), device=view.device)
            with self._lock:
                self._regions[region.key] = region
                self._by_range[(view.ptr, view.nbytes, bits)] = region
            return region
        raise RegistrationError("GPU memory registration failed: " + "; ".join(errors))

    def _device_regions(self) -> list[MemoryRegion]:
        with self._lock:
            return [r for r in self._regions.values() if r.registered and r.device is not None]

    def alloc_pinned(self, nbytes: int, access: str = "rw") -> MemoryRegion:
        """Allocate ``nbytes`` of page-aligned host memory locked in RAM, registered.

        The memory lives as long as the returned region (or an array viewing it) does.

        Raises:
            InvalidArgumentError: negative size or unknown access.
            RegistrationError: mmap/mlock failed (the message gives the memlock limit and how
                to raise it).
        """
        self._check_open()
        bits = access_bits(access)
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
            raise InvalidArgumentError(f"nbytes={nbytes!r} must be an integer >= 0")
        with self._lock:
            core = self._core.alloc_pinned(nbytes, bits)
            data: npt.NDArray[np.uint8] = np.frombuffer(cast(Any, core), dtype=np.uint8)
            region = MemoryRegion(self, core, core, data)
            self._regions[region.key] = region
            self._by_range[(region.addr, nbytes, bits)] = region
        return region

    def _local(
        self, arr: npt.NDArray[Any], *, writes: bool
    ) -> tuple[MemoryRegion, int, list[MemoryRegion]]:
        """The registration covering ``arr`` for a local use (``writes``: a READ or receive
        lands in it): a live user region with the rights that use needs, else a new temporary
        one with no remote access and local write only for a destination: (region, byte offset
        of arr in it, temporaries to release)."""
        self._check_open()
        addr, nbytes = _addr(arr), int(arr.nbytes)

        def usable(region: MemoryRegion | None) -> bool:
            return region is not None and region.registered and region.core.local_write >= writes

        with self._lock:
            for bits in ACCESS.values():
                hit = self._by_range.get((addr, nbytes, bits))
                if hit is not None and usable(hit):
                    return hit, 0, []
            for region in self._by_range.values():
                if usable(region) and region.contains(addr, nbytes):
                    return region, addr - region.addr, []
            core = self._core.register(addr, nbytes, LOCAL_WRITE if writes else ACCESS["none"])
            temp = MemoryRegion(self, core, arr, byte_view(arr), temporary=True)
            self._regions[temp.key] = temp
        return temp, 0, [temp]

    def _deregister_region(self, region: MemoryRegion, timeout_s: float) -> None:
        with self._lock:
            self._regions.pop(region.key, None)
            for key, value in list(self._by_range.items()):
                if value is region:
                    del self._by_range[key]
            if self._closed and self._core_closed:
                return
        self._core.deregister(region.core, timeout_s)

    # -- lifecycle -------------------------------------------------------------------------
    _core_closed = False

    def _check_open(self) -> None:
        if self._inherited():
            raise EndpointClosedError(
                f"this Engine was created by process {self._pid} before os.fork(): engines, "
                "endpoints and regions inherited through fork are inert in the child (their "
                "connections, registrations and threads belong to the parent); create a new "
                "Engine in this process"
            )
        if self._closed:
            raise EndpointClosedError("the engine is closed; create a new Engine")

    def _inherited(self) -> bool:
        """True in a child of os.fork(): the engine, its endpoints and regions are the parent's
        and are left alone (no GOODBYE, no deregistration, no QP or socket change)."""
        return self._pid != os.getpid()

    def close(self) -> None:
        """Close every endpoint, deregister every region, stop the transport (idempotent).

        In a child of ``os.fork()`` an inherited engine is only marked closed: its connections
        and registrations belong to the parent, which keeps using them."""
        if self._inherited():
            self._closed = True
            return
        with self._lock:
            if self._closed:
                return
            self._closed = True
            endpoints = list(self._endpoints.values())
        for endpoint in endpoints:
            endpoint.close()
        if self._stagers:  # only GPU transfers (rdmaxfer.staging) make Stagers
            from . import staging

            staging.close_engine(self, _CLOSE_TIMEOUT_S)
        self._notifications.close()
        with self._lock:
            regions = list(self._regions.values())
        for region in regions:
            with contextlib.suppress(RdmaxferError):
                region.deregister(_CLOSE_TIMEOUT_S)
        with self._lock:
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


def _addr(arr: npt.NDArray[Any]) -> int:
    return int(arr.__array_interface__["data"][0])


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    import ipaddress  # only when listening (and not imported by `import rdmaxfer`)

    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
