"""Settings: one declarative table per transport, and the typed options an engine takes.

Every setting of the package is one :class:`Option` row in one of the tables below (its
name, type, default, unit, environment variable and help), the way NCCL's ``NCCL_PARAM``
lines and UCX's config tables declare theirs; ``rdmaxfer info --config`` lists them all with
their current values, and the documentation's configuration page is generated from them.

An engine takes its settings as one typed object per transport (plus :class:`EngineOptions`
for what every transport shares)::

    Engine("rdma", options=[rdmaxfer.RdmaOptions(devices=["mlx5_0", "mlx5_1"], traffic_class=104)])

A field left at None takes the setting's environment variable when set, else the default. A
row marked environment-only has no field: it is read from its variable when the engine (or
the process) needs it. The variables' only readers are this module and the C++ core (the rows
say ``read by: core``); tests-only switches are not settings and live in
:mod:`rdmaxfer._test_hooks`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from ._option import Option
from .errors import InvalidArgumentError

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "ENGINE",
    "PROCESS",
    "RDMA",
    "SHM",
    "TABLES",
    "TCP",
    "EngineOptions",
    "Option",
    "RdmaOptions",
    "ShmOptions",
    "TcpOptions",
    "declared",
    "default_timeout",
    "env_setting",
]

DEFAULT_TIMEOUT_S = 60.0


# -- the tables --------------------------------------------------------------------------------

#: Settings of the whole process (environment-only): read where they are used.
PROCESS: tuple[Option, ...] = (
    Option("transport", "choice", "auto", "RDMAXFER_TRANSPORT",
           "the transport Engine(transport='auto') uses; 'auto': shm for same-host peers, "
           "else rdma where a device offers RC, else ofi over a hardware RDMA provider, else tcp",
           choices=("auto", "tcp", "rdma", "shm", "ofi"), field=False),
    Option("timeout", "float", DEFAULT_TIMEOUT_S, "RDMAXFER_TIMEOUT",
           "default timeout of every blocking call: a fixed bound for connect, accept and "
           "handshakes, an inactivity bound (no progress for that long) for transfers",
           unit="s", low=0, field=False),
    Option("regcache_entries", "int", 1024, "RDMAXFER_REGCACHE_ENTRIES",
           "temporary host registrations an engine's cache keeps (0: none once unused)",
           low=0, field=False),
    Option("regcache_bytes", "int", 1 << 30, "RDMAXFER_REGCACHE_BYTES",
           "bytes of temporary host registrations an engine's cache keeps (on verbs they "
           "stay pinned)", unit="bytes", low=0, field=False),
    Option("bounce_slab_bytes", "int", 8 << 20, "RDMAXFER_BOUNCE_SLAB_BYTES",
           "bytes of each registered host slab GPU memory is staged through (the largest "
           "staging chunk)", unit="bytes", low=1, field=False, read_by="core"),
    Option("bounce_pool_bytes", "int", 256 << 20, "RDMAXFER_BOUNCE_POOL_BYTES",
           "total bytes of an engine's staging slabs (at least one slab)",
           unit="bytes", low=1, field=False, read_by="core"),
    Option("cuda_library", "str", "libcuda.so.1", "RDMAXFER_CUDA_LIBRARY",
           "the CUDA driver library loaded at run time (a path or a name for dlopen)",
           field=False, read_by="core"),
    Option("cufile_library", "str", "libcufile.so.0", "RDMAXFER_CUFILE_LIBRARY",
           "the GPUDirect Storage library loaded at run time (a path or a name for dlopen)",
           field=False, read_by="core"),
    Option("ray_host", "str", "", "RDMAXFER_RAY_HOST",
           "the address rdmaxfer.ray listens on in each Ray process ('': Ray's address of "
           "the node)", field=False),
)  # fmt: skip

#: Settings every transport of an engine shares.
ENGINE: tuple[Option, ...] = (
    Option("poll_mode", "choice", "adaptive", "RDMAXFER_POLL_MODE",
           "how waits for I/O spend their time: 'adaptive' (spin a short self-tuned time, "
           "then sleep), 'busy' (spin: lowest latency, a CPU per waiting thread) or 'event' "
           "(sleep at once: least CPU)", choices=("adaptive", "busy", "event"),
           read_by="core"),
    Option("secret", "secret", "", "RDMAXFER_SECRET",
           "shared secret: every connection starts with a mutual HMAC-SHA256 "
           "challenge-response, and a peer without it is refused (both sides need it)"),
    Option("max_message_bytes", "int", 1 << 34, "RDMAXFER_MAX_MESSAGE_BYTES",
           "the largest two-sided message a peer may announce to this engine: a larger one "
           "is refused (the sender's send raises ProtocolError) before anything is allocated "
           "('rdmaxfer serve' takes 64 KiB: --max-message-bytes)",
           unit="bytes", low=1, high=2**62),
)  # fmt: skip

#: Settings of the TCP transport.
TCP: tuple[Option, ...] = (
    Option("io_threads", "int", 0, None,
           "I/O threads (0: min(2, CPUs); with TLS half the CPUs, 2 to 8)", low=0, high=64),
    Option("socket_buffer", "int", 0, None,
           "SO_SNDBUF/SO_RCVBUF of each stream (0: the kernel's autotuning)",
           unit="bytes", low=0, high=2**31 - 1),
    Option("streams", "int", 0, None,
           "parallel TCP streams per connection (0: 4; with TLS at least one per I/O thread)",
           low=0, high=64),
    Option("tls", "bool", False, "RDMAXFER_TLS",
           "TLS 1.3 (AES-128-GCM) on every stream of every connection, authenticated by the "
           "shared secret as a pre-shared key or by tls_cert/tls_key/tls_ca; a peer without "
           "it is refused (both sides need it); on rdma and ofi the bootstrap stream and the "
           "control messages over it (the fabric's bytes stay as they are)"),
    Option("tls_cert", "str", "", "RDMAXFER_TLS_CERT",
           "with tls and no secret: this side's PEM certificate chain file"),
    Option("tls_key", "str", "", "RDMAXFER_TLS_KEY",
           "with tls_cert: its PEM private key file"),
    Option("tls_ca", "str", "", "RDMAXFER_TLS_CA",
           "with tls_cert: the PEM file of the CAs a peer's certificate must chain to"),
)  # fmt: skip

#: Settings of the shm transport.
SHM: tuple[Option, ...] = (
    Option("cuda_ipc_exports", "int", 64, "RDMAXFER_CUDA_IPC_EXPORTS",
           "CUDA IPC exports of unregistered GPU memory an engine keeps (least recently used "
           "dropped beyond it; 0: stage such memory instead)", low=0, field=False),
)  # fmt: skip

#: Settings of the rdma (verbs) transport.
RDMA: tuple[Option, ...] = (
    Option("device", "str", None, "RDMAXFER_RDMA_DEVICE",
           "the device of a one-rail engine ('mlx5_0', 'rxe0'; default: the first device "
           "with an active port)", read_by="core"),
    Option("devices", "names", None, "RDMAXFER_RDMA_DEVICES",
           "several devices, one rail each (names separated by commas or spaces, or 'auto': "
           "every device with an active port); takes precedence over device",
           read_by="core"),
    Option("gid_index", "int", None, "RDMAXFER_GID_INDEX",
           "the GID table index (default: the first RoCE v2 GID holding an IPv4-mapped "
           "address)", low=0, high=65535, read_by="core"),
    Option("qps", "int", 0, None,
           "queue pairs per connection on each pair of rails (0: 1)", low=0, high=64),
    Option("service_level", "int", 0, "RDMAXFER_SERVICE_LEVEL",
           "service level of every QP (InfiniBand SL; the priority on RoCE)",
           low=0, high=15, read_by="core"),
    Option("traffic_class", "int", 0, "RDMAXFER_TRAFFIC_CLASS",
           "GRH traffic class of every QP (RoCE: the IP TOS byte, DSCP << 2, e.g. 104 for "
           "DSCP 26)", low=0, high=255, read_by="core"),
    Option("min_rnr_timer", "int", 18, "RDMAXFER_MIN_RNR_TIMER",
           "IB RNR NAK timer code of every QP (18 = 5.12 ms)", low=0, high=31,
           read_by="core"),
    Option("srq", "bool", True, "RDMAXFER_SRQ",
           "one shared receive queue per rail for control messages (off: each QP posts its "
           "own)", field=False, read_by="core"),
    Option("srq_buffers", "int", 256, "RDMAXFER_SRQ_BUFFERS",
           "receive buffers each SRQ starts with and adds per step (at most 8192)",
           low=1, high=8192, field=False, read_by="core"),
)  # fmt: skip

#: Settings of the ofi (libfabric) transport, read from the environment when an engine opens it.
OFI: tuple[Option, ...] = (
    Option("provider", "str", None, "RDMAXFER_OFI_PROVIDER",
           "the libfabric provider ('efa', 'verbs;ofi_rxm', 'tcp;ofi_rxm'; default: the "
           "first hardware RDMA provider fi_getinfo lists; tcp, udp, sockets and shm only "
           "when named)", field=False, read_by="core"),
    Option("iface", "str", None, "RDMAXFER_OFI_IFACE",
           "the libfabric domains, one rail each: a NIC ('rdmap0s6-rdm', 'rxe0'), or the "
           "network interface for the tcp provider ('lo'); several separated by commas; "
           "'auto': every domain of the provider (at most 8); default: the first",
           field=False, read_by="core"),
    Option("hmem", "bool", True, "RDMAXFER_OFI_HMEM",
           "ask the provider for FI_HMEM where CUDA loads, so that GPU memory registers with "
           "the NIC (0: never; GPU memory is then staged through host memory)",
           field=False, read_by="core"),
    Option("library", "str", "libfabric.so.1", "RDMAXFER_OFI_LIBRARY",
           "the libfabric library loaded at run time (a path or a name for dlopen)",
           field=False, read_by="core"),
)  # fmt: skip

#: Every table by its name, in the order ``rdmaxfer info --config`` lists them.
TABLES: dict[str, tuple[Option, ...]] = {
    "process": PROCESS,
    "engine": ENGINE,
    "tcp": TCP,
    "shm": SHM,
    "rdma": RDMA,
    "ofi": OFI,
}

_BY_ENV: dict[str, Option] = {o.env: o for t in TABLES.values() for o in t if o.env}


def declared(env: str) -> Option:
    """The row that declares the environment variable ``env``.

    Raises:
        KeyError: no table declares it.
    """
    return _BY_ENV[env]


def env_setting(env: str, environ: Mapping[str, str] | None = None) -> Any:
    """The value of the declared variable ``env`` (``"RDMAXFER_REGCACHE_BYTES"``) in
    ``environ`` (default ``os.environ``), else its row's default.

    Raises:
        KeyError: ``env`` is not declared in a table.
        InvalidArgumentError: the variable holds an invalid value (the message says the fix).
    """
    option = _BY_ENV[env]
    value = option.from_env(environ)
    return option.default if value is None else value


# -- the options objects -----------------------------------------------------------------------


class _Options:
    """Typed settings of one table: a keyword argument per field row (None: from the
    environment, else the default). Immutable; compares by value."""

    TABLE: ClassVar[tuple[Option, ...]] = ()
    #: The transport these options are for ("" when every transport shares them).
    TRANSPORT: ClassVar[str] = ""

    def __init__(self, **values: Any) -> None:
        rows = {o.name: o for o in self.TABLE if o.field}
        cls = type(self).__name__
        for name in values:
            if name not in rows:
                known = ", ".join(rows) or "none"
                env = [o for t in TABLES.values() for o in t if o.name == name and not o.field]
                how = f"; {name} is set by {env[0].env} only" if env and env[0].env else ""
                raise InvalidArgumentError(
                    f"{cls}() has no option {name!r} (its options: {known}){how}; "
                    "'rdmaxfer info --config' lists every setting and its table"
                )
        for name, row in rows.items():
            value = values.get(name)
            if value is not None:
                value = row.check(value, cls)
            object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable; make a new one")

    def given(self) -> dict[str, Any]:
        """The fields set (not None), by name."""
        fields = (o.name for o in self.TABLE if o.field)
        return {name: getattr(self, name) for name in fields if getattr(self, name) is not None}

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self.given() == other.given()

    def __hash__(self) -> int:
        return hash((type(self), repr(self)))

    def __repr__(self) -> str:
        shown = ", ".join(
            f"{k}={'***' if k == 'secret' else repr(v)}" for k, v in self.given().items()
        )
        return f"{type(self).__name__}({shown})"


class EngineOptions(_Options):
    """What every transport of an engine shares (table :data:`ENGINE`).

    Args:
        poll_mode: "adaptive", "busy" or "event" (default: ``RDMAXFER_POLL_MODE``, else
            "adaptive"); see the poll modes page.
        secret: a shared secret, str or bytes (default: ``RDMAXFER_SECRET``, else none).
        max_message_bytes: the largest two-sided message a peer may announce, in bytes,
            1..2**62 (default: ``RDMAXFER_MAX_MESSAGE_BYTES``, else 16 GiB); a larger one is
            refused before anything is allocated and the sender's send raises
            :class:`~rdmaxfer.errors.ProtocolError` naming the bound.

    Raises:
        InvalidArgumentError: an unknown option or a value of the wrong type or range.
    """

    TABLE = ENGINE
    poll_mode: str | None
    secret: str | bytes | None
    max_message_bytes: int | None

    def __init__(
        self,
        *,
        poll_mode: str | None = None,
        secret: str | bytes | None = None,
        max_message_bytes: int | None = None,
        **unknown: object,
    ) -> None:
        super().__init__(
            poll_mode=poll_mode, secret=secret, max_message_bytes=max_message_bytes, **unknown
        )


class TcpOptions(_Options):
    """Settings of the TCP transport (table :data:`TCP`).

    Args:
        io_threads: I/O threads, 0..64 (default 0: min(2, CPUs); with TLS half the CPUs this
            process may use, 2 to 8, since every byte is also encrypted or decrypted on them).
        socket_buffer: SO_SNDBUF/SO_RCVBUF in bytes (default 0: the kernel's autotuning).
        streams: parallel streams per connection, 0..64 (default 0: 4; with TLS as many as
            the I/O threads, at least 4).
        tls: TLS 1.3 on every stream (default: ``RDMAXFER_TLS``, else off); both sides need
            it, with the same secret (the pre-shared key) or with certificates.
        tls_cert, tls_key, tls_ca: PEM files: this side's certificate chain, its private key,
            and the CAs a peer's certificate must chain to (default: ``RDMAXFER_TLS_CERT``,
            ``_KEY``, ``_CA``); for TLS without a secret.

    Raises:
        InvalidArgumentError: a value of the wrong type or out of range.
    """

    TABLE = TCP
    TRANSPORT = "tcp"
    io_threads: int | None
    socket_buffer: int | None
    streams: int | None
    tls: bool | None
    tls_cert: str | None
    tls_key: str | None
    tls_ca: str | None

    def __init__(
        self,
        *,
        io_threads: int | None = None,
        socket_buffer: int | None = None,
        streams: int | None = None,
        tls: bool | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
        tls_ca: str | None = None,
        **unknown: object,
    ) -> None:
        super().__init__(
            io_threads=io_threads, socket_buffer=socket_buffer, streams=streams, tls=tls,
            tls_cert=tls_cert, tls_key=tls_key, tls_ca=tls_ca, **unknown
        )  # fmt: skip


class ShmOptions(_Options):
    """Settings of the shm transport (table :data:`SHM`): none per engine today; its one
    setting, ``RDMAXFER_CUDA_IPC_EXPORTS``, is read from the environment.

    Raises:
        InvalidArgumentError: any keyword (there is no field).
    """

    TABLE = SHM
    TRANSPORT = "shm"

    def __init__(self, **unknown: object) -> None:
        super().__init__(**unknown)


class RdmaOptions(_Options):
    """Settings of the rdma (verbs) transport (table :data:`RDMA`). None: from the row's
    environment variable, else its default.

    Args:
        device: the device of a one-rail engine ("mlx5_0", "rxe0"; default
            ``RDMAXFER_RDMA_DEVICE``, else the first device with an active port).
        devices: several devices, one rail each (a list, or names separated by commas or
            spaces; "auto": every device with an active port; default
            ``RDMAXFER_RDMA_DEVICES``).
        gid_index: GID table index, 0..65535 (default ``RDMAXFER_GID_INDEX``, else the first
            RoCE v2 GID holding an IPv4-mapped address).
        qps: queue pairs per connection on each pair of rails, 0..64 (0: the default).
        service_level: 0..15 (default ``RDMAXFER_SERVICE_LEVEL``, else 0).
        traffic_class: 0..255, the IP TOS byte on RoCE (default ``RDMAXFER_TRAFFIC_CLASS``,
            else 0).
        min_rnr_timer: IB RNR timer code 0..31 (default ``RDMAXFER_MIN_RNR_TIMER``, else 18,
            5.12 ms).

    Raises:
        InvalidArgumentError: a value of the wrong type or out of range.
    """

    TABLE = RDMA
    TRANSPORT = "rdma"
    device: str | None
    devices: list[str] | None
    gid_index: int | None
    qps: int | None
    service_level: int | None
    traffic_class: int | None
    min_rnr_timer: int | None

    def __init__(
        self,
        *,
        device: str | None = None,
        devices: Sequence[str] | str | None = None,
        gid_index: int | None = None,
        qps: int | None = None,
        service_level: int | None = None,
        traffic_class: int | None = None,
        min_rnr_timer: int | None = None,
        **unknown: object,
    ) -> None:
        super().__init__(
            device=device, devices=devices, gid_index=gid_index, qps=qps,
            service_level=service_level, traffic_class=traffic_class,
            min_rnr_timer=min_rnr_timer, **unknown,
        )  # fmt: skip


# -- the default timeout (read on every blocking call, so cheaply) -----------------------------

_TIMEOUT = PROCESS[1]
# The mapping os.environ keeps its entries in (CPython: encoded keys to the very value objects
# stored on assignment), so that default_timeout() sees a change of RDMAXFER_TIMEOUT by one dict
# look-up and an identity test, without decoding the value on every call.
_ENVIRON = os.environ
_env = getattr(_ENVIRON, "_data", None)
_ENV_DATA: dict[object, object] | None = _env if type(_env) is dict else None
_TIMEOUT_KEY: object = os.environ.encodekey("RDMAXFER_TIMEOUT")
#: (the stored value the default was parsed from, the default in seconds); _UNSEEN: none yet.
_UNSEEN = object()
_default_timeout: tuple[object, float] = (_UNSEEN, DEFAULT_TIMEOUT_S)


def default_timeout() -> float:
    """The default timeout in seconds: ``RDMAXFER_TIMEOUT`` as it is at this call, or 60 when
    unset (a change through ``os.environ`` takes effect on the next call; the value is parsed
    again only when it changed).

    Raises:
        InvalidArgumentError: the variable is not a finite number of seconds >= 0.
    """
    global _default_timeout
    env = os.environ
    raw: object = _UNSEEN  # os.environ replaced (or not CPython's): read and parsed every call
    if env is _ENVIRON and _ENV_DATA is not None:
        raw = _ENV_DATA.get(_TIMEOUT_KEY)
        seen, value = _default_timeout
        if raw is seen:
            return value
    text = env.get("RDMAXFER_TIMEOUT", "").strip()
    if not text:
        value = DEFAULT_TIMEOUT_S
    else:
        source = f"RDMAXFER_TIMEOUT={text!r}"
        try:
            value = float(text)
        except ValueError:
            raise InvalidArgumentError(
                f"{source} is not a number of seconds; set it to e.g. 60, or unset it"
            ) from None
        if not math.isfinite(value) or value < 0:
            raise InvalidArgumentError(
                f"{source}: a timeout must be a finite number of seconds >= 0 (every wait is "
                "bounded)"
            )
    _default_timeout = (raw, value)  # only a valid value is kept: a bad one raises every call
    return value
