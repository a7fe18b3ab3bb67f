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
_OFF = ("0", "off", "no", "false")
_ON = ("1", "on", "yes", "true")


class Option:
    """One setting: ``name`` (the options field, or the row's name when environment-only),
    ``kind`` ("int", "float", "bool", "str", "choice", "names" or "secret"), ``default``,
    ``env`` (its environment variable, or None), ``help``, ``unit`` ("" when none), an
    inclusive range ``low``..``high`` for numbers, ``choices`` for "choice", ``field``
    (False: environment-only) and ``read_by`` ("python" or "core": who reads the variable)."""

    __slots__ = (
        "choices", "default", "env", "field", "help", "high", "kind", "low", "name", "read_by",
        "unit",
    )  # fmt: skip

    def __init__(
        self,
        name: str,
        kind: str,
        default: Any,
        env: str | None,
        help: str,
        *,
        unit: str = "",
        low: float | None = None,
        high: float | None = None,
        choices: tuple[str, ...] = (),
        field: bool = True,
        read_by: str = "python",
    ) -> None:
        self.name, self.kind, self.default, self.env, self.help = name, kind, default, env, help
        self.unit, self.low, self.high, self.choices = unit, low, high, choices
        self.field, self.read_by = field, read_by

    def __repr__(self) -> str:
        return f"Option({self.name!r}, env={self.env!r}, default={self.default!r})"

    def expects(self) -> str:
        """What a valid value is, in words (used in error messages)."""
        if self.kind == "choice":
            return " or ".join(repr(c) for c in self.choices)
        if self.kind in ("int", "float"):
            what = "an integer" if self.kind == "int" else "a number"
            low, high = (
                (None if b is None else int(b) if self.kind == "int" else f"{b:g}")
                for b in (self.low, self.high)
            )
            if low is not None and high is not None:
                return f"{what} in {low}..{high}"
            return f"{what} >= {low}" if low is not None else what
        if self.kind == "bool":
            return "True or False (in the environment: 1/0, on/off, yes/no, true/false)"
        if self.kind == "names":
            return "device names (a list, or a string separated by commas or spaces; 'auto')"
        return "a string"

    def check(self, value: Any, where: str) -> Any:
        """``value`` (not None) validated and normalised for this row; ``where`` (the options
        class, "RdmaOptions") names it in the error.

        Raises:
            InvalidArgumentError: the value's type or range is wrong; the message names the
                option and what it must be.
        """
        kind = self.kind
        ok = True
        if kind in ("int", "float"):
            number = (int,) if kind == "int" else (int, float)
            ok = isinstance(value, number) and not isinstance(value, bool)
            ok = ok and math.isfinite(value)
            ok = ok and (self.low is None or value >= self.low)
            ok = ok and (self.high is None or value <= self.high)
        elif kind == "bool":
            ok = isinstance(value, bool)
        elif kind == "choice":
            ok = value in self.choices
        elif kind == "names":
            if isinstance(value, str):
                value = value.replace(",", " ").split()
            ok = isinstance(value, Sequence) and len(value) > 0
            ok = ok and all(isinstance(n, str) and n for n in value)
            value = list(value) if ok else value
        elif kind == "secret":
            ok = isinstance(value, (str, bytes))
        else:
            ok = isinstance(value, str)
        if not ok:
            raise InvalidArgumentError(
                f"{where}({self.name}={value!r}): {self.name} must be "
                f"{self.expects()}{self._unit_words()}, or None for the default "
                f"({self.describe_default()})"
            )
        return value

    def parse(self, text: str) -> Any:
        """The value of the environment text ``text`` (not empty; stripped but for a secret).

        Raises:
            InvalidArgumentError: not a valid value; the message names the variable and says
                to fix or unset it.
        """
        value: Any = text
        try:
            if self.kind == "int":
                value = int(text)
            elif self.kind == "float":
                value = float(text)
            elif self.kind == "bool":
                low = text.lower()
                if low not in _ON + _OFF:
                    raise ValueError(text)
                value = low in _ON
            elif self.kind == "choice":
                value = text.lower()
            return self.check(value, f"{self.env}")
        except (ValueError, InvalidArgumentError):
            raise InvalidArgumentError(
                f"{self.env}={text!r} must be {self.expects()}{self._unit_words()} "
                f"({self.name}, default {self.describe_default()}); fix it or unset it"
            ) from None

    def from_env(self, environ: Mapping[str, str] | None = None) -> Any:
        """The variable's value in ``environ`` (default ``os.environ``) parsed, or None when
        the row has no variable or it is unset or empty.

        Raises:
            InvalidArgumentError: the variable holds an invalid value.
        """
        if self.env is None:
            return None
        text = (os.environ if environ is None else environ).get(self.env, "")
        if self.kind != "secret":  # a secret is taken as it is, spaces included
            text = text.strip()
        return self.parse(text) if text else None

    def describe_default(self) -> str:
        """The default in words (None: decided at run time, as the help says)."""
        if self.default is None:
            return "automatic"
        if self.kind == "bool":
            return "on" if self.default else "off"
        return (
            f"{self.default!r}{self._unit_words()}"
            if self.kind != "int"
            else (f"{self.default}{self._unit_words()}")
        )

    def _unit_words(self) -> str:
        return f" {self.unit}" if self.unit else ""


# -- the tables --------------------------------------------------------------------------------

#: Settings of the whole process (environment-only): read where they are used.
PROCESS: tuple[Option, ...] = (
    Option("transport", "choice", "auto", "RDMAXFER_TRANSPORT",
           "the transport Engine(transport='auto') uses; 'auto': shm for same-host peers, "
           "else rdma when a device is active, else tcp",
           choices=("auto", "tcp", "rdma", "shm"), field=False),
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
)  # fmt: skip

#: Settings of the TCP transport.
TCP: tuple[Option, ...] = (
    Option("io_threads", "int", 0, None,
           "I/O threads (0: min(2, cores))", low=0, high=64),
    Option("socket_buffer", "int", 0, None,
           "SO_SNDBUF/SO_RCVBUF of each stream (0: the kernel's autotuning)",
           unit="bytes", low=0, high=2**31 - 1),
    Option("streams", "int", 0, None,
           "parallel TCP streams per connection (0: 4)", low=0, high=64),
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

#: Every table by its name, in the order ``rdmaxfer info --config`` lists them.
TABLES: dict[str, tuple[Option, ...]] = {
    "process": PROCESS,
    "engine": ENGINE,
    "tcp": TCP,
    "shm": SHM,
    "rdma": RDMA,
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

    Raises:
        InvalidArgumentError: an unknown option or a value of the wrong type or range.
    """

    TABLE = ENGINE
    poll_mode: str | None
    secret: str | bytes | None

    def __init__(
        self,
        *,
        poll_mode: str | None = None,
        secret: str | bytes | None = None,
        **unknown: object,
    ) -> None:
        super().__init__(poll_mode=poll_mode, secret=secret, **unknown)


class TcpOptions(_Options):
    """Settings of the TCP transport (table :data:`TCP`).

    Args:
        io_threads: I/O threads, 0..64 (default 0: min(2, cores)).
        socket_buffer: SO_SNDBUF/SO_RCVBUF in bytes (default 0: the kernel's autotuning).
        streams: parallel streams per connection, 0..64 (default 0: 4).

    Raises:
        InvalidArgumentError: a value of the wrong type or out of range.
    """

    TABLE = TCP
    TRANSPORT = "tcp"
    io_threads: int | None
    socket_buffer: int | None
    streams: int | None

    def __init__(
        self,
        *,
        io_threads: int | None = None,
        socket_buffer: int | None = None,
        streams: int | None = None,
        **unknown: object,
    ) -> None:
        super().__init__(
            io_threads=io_threads, socket_buffer=socket_buffer, streams=streams, **unknown
        )


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
