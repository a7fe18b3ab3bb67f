"""Prometheus metrics of engines: every ``Engine.stats()`` counter and gauge, per engine and
per peer, read at scrape time.

Needs the ``metrics`` extra (``pip install 'rdmaxfer[metrics]'``: ``prometheus_client``), which
is imported on first use only::

    from prometheus_client import start_http_server, REGISTRY
    from rdmaxfer.metrics import EngineCollector

    REGISTRY.register(EngineCollector([engine]))
    start_http_server(9400)

or in one call, :func:`serve_metrics` (what ``rdmaxfer serve --metrics-port N`` does). The
collector keeps no thread and no copy: each scrape reads ``Engine.stats()`` and each open
endpoint's ``stats()`` (a few atomic loads in the core) and turns them into metric families.

Names carry their unit (``_bytes_total``, counts as ``_total``); the stats keys of
:mod:`rdmaxfer.transport.stats` map to them as follows (:data:`FAMILIES`). Per-engine series
are labelled ``engine`` (the engine id in hex) and ``transport``; per-peer series
(``rdmaxfer_peer_*``, the open endpoints only, summed by peer: a closed endpoint's counts
stay in the engine's) add ``peer`` (``host:port``) and the endpoints' own ``transport``.
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from .errors import UnsupportedError
from .transport.engine import Engine

__all__ = ["FAMILIES", "EngineCollector", "Family", "family_of", "serve_metrics"]

PREFIX = "rdmaxfer_"
PEER_PREFIX = "rdmaxfer_peer_"
_OP_KINDS = ("write", "read", "send", "recv", "ctrl")
_LANE = re.compile(r"lane(\d+)\.(bytes|chunks)")


@dataclass(frozen=True)
class Family:
    """One metric family: its name after ``rdmaxfer_`` (with the unit), counter or gauge,
    its help text and the label its stats keys differ by (None: one key, one series)."""

    name: str
    kind: str  # "counter" or "gauge"
    help: str
    label: str | None = None


#: The families, by the stats key pattern they export.
FAMILIES: dict[str, Family] = {
    "<op>.ops": Family(
        "operations_total",
        "counter",
        "Operations of this side completed, by op: write and read (one-sided), send and recv "
        "(two-sided messages), ctrl (control messages sent).",
        "op",
    ),
    "<op>.bytes": Family(
        "bytes_total",
        "counter",
        "Payload bytes moved by the completed operations, by op (ctrl: bytes on the wire).",
        "op",
    ),
    "lane<N>.bytes": Family(
        "lane_bytes_total",
        "counter",
        "Payload bytes carried by each lane (TCP stream or verbs queue pair N).",
        "lane",
    ),
    "lane<N>.chunks": Family(
        "lane_chunks_total",
        "counter",
        "Parts (chunks, work requests) that carried the payload, by lane.",
        "lane",
    ),
    "errors.<kind>": Family(
        "errors_total",
        "counter",
        "Failures, by kind: operations of that op that failed, connection (endpoints that "
        "ended on a failure), connect and accept (set-ups that failed; engine only).",
        "kind",
    ),
    "retries": Family(
        "connect_retries_total",
        "counter",
        "Connection attempts that were refused (nothing listening yet) and tried again.",
    ),
    "credit_stalls": Family(
        "credit_stalls_total",
        "counter",
        "Times a sender began to wait for a credit (verbs) or for room in a socket (TCP).",
    ),
    "io_linger_us": Family(
        "io_linger_microseconds_total",
        "counter",
        "Time the engine's I/O threads (TCP loops, shm readers) spent polling for their next "
        "event instead of sleeping (the poll mode's linger).",
    ),
    "recv_buffers.posted": Family(
        "recv_buffers_posted",
        "gauge",
        "Receive buffers (16 KiB each) posted for two-sided messages now (rdma engines).",
    ),
    "recv_buffers.allocated": Family(
        "recv_buffers_allocated",
        "gauge",
        "Receive buffers (16 KiB each) allocated now (rdma engines).",
    ),
}

_ENDPOINTS = Family("endpoints", "gauge", "Endpoints of the engine open now.")
_REGIONS = Family("registered_regions", "gauge", "Memory registrations the engine holds now.")
_CONNECTIONS = Family(
    "connections_total", "counter",
    "Connections accepted or made, by the transport that carried them.", "link",
)  # fmt: skip


def family_of(key: str) -> tuple[Family, str | None]:
    """The family of a stats key and its label value (``"write.bytes"`` -> (bytes_total,
    ``"write"``)). A key the table does not know (a counter added to the core later) gets a
    counter family of its own, ``<key>_total`` with dots as underscores."""
    head, _, tail = key.partition(".")
    if head in _OP_KINDS and tail in ("ops", "bytes"):
        return FAMILIES[f"<op>.{tail}"], head
    lane = _LANE.fullmatch(key)
    if lane is not None:
        return FAMILIES[f"lane<N>.{lane.group(2)}"], lane.group(1)
    if head == "errors" and tail:
        return FAMILIES["errors.<kind>"], tail
    if key in FAMILIES:
        return FAMILIES[key], None
    name = re.sub(r"[^a-zA-Z0-9_]", "_", key)
    return Family(f"{name}_total", "counter", f"The Engine.stats() counter {key!r}."), None


def _prometheus() -> ModuleType:
    try:
        import prometheus_client.core
    except ImportError as exc:
        raise UnsupportedError(
            "rdmaxfer.metrics needs prometheus_client: pip install 'rdmaxfer[metrics]' "
            f"(or prometheus_client>=0.17) ({exc})"
        ) from exc
    return prometheus_client.core


class _Families:
    """The metric families of one scrape, made on first use, in the order first met."""

    def __init__(self, core: ModuleType) -> None:
        self._core = core
        self._made: dict[str, Any] = {}

    def add(self, prefix: str, family: Family, labels: Mapping[str, str], value: int) -> None:
        name = prefix + family.name
        made = self._made.get(name)
        if made is None:
            make = (
                self._core.CounterMetricFamily
                if family.kind == "counter"
                else self._core.GaugeMetricFamily
            )
            made = make(name, family.help, labels=list(labels))
            self._made[name] = made
        made.add_metric(list(labels.values()), value)

    def add_stats(self, prefix: str, base: Mapping[str, str], stats: Mapping[str, int]) -> None:
        for key, value in stats.items():
            family, label = family_of(key)
            labels = dict(base)
            if family.label is not None and label is not None:
                labels[family.label] = label
            self.add(prefix, family, labels, value)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._made.values())


class EngineCollector:
    """A Prometheus collector (``registry.register(EngineCollector([engine]))``) of the
    engines it is given: each scrape reads their stats, so it needs no thread. Engines are
    held weakly, and a closed or collected engine is left out.

    Raises:
        UnsupportedError: prometheus_client is not installed (the message names the extra).
    """

    def __init__(self, engines: Iterable[Engine] = ()) -> None:
        self._core = _prometheus()
        self._engines: weakref.WeakSet[Engine] = weakref.WeakSet()
        for engine in engines:
            self.add(engine)

    def add(self, engine: Engine) -> None:
        """Export ``engine`` too (from the next scrape on)."""
        self._engines.add(engine)

    def remove(self, engine: Engine) -> None:
        """Stop exporting ``engine`` (no error when it was not exported)."""
        self._engines.discard(engine)

    def describe(self) -> list[Any]:
        """No families up front: they depend on the stats at scrape time (lanes, errors)."""
        return []

    def collect(self) -> Iterator[Any]:
        """The families of every open engine and of its open endpoints, read now."""
        families = _Families(self._core)
        for engine in sorted(self._engines, key=lambda e: e.engine_id):
            if engine.closed:
                continue
            base = {"engine": f"{engine.engine_id:016x}", "transport": engine.transport}
            families.add_stats(PREFIX, base, engine.stats())
            endpoints = engine.endpoints()
            families.add(PREFIX, _ENDPOINTS, base, len(endpoints))
            families.add(PREFIX, _REGIONS, base, engine.registered_count())
            for link, count in sorted(engine.links().items()):
                families.add(PREFIX, _CONNECTIONS, {**base, "link": link}, count)
            for (peer, transport), stats in _per_peer(endpoints).items():
                labels = {"engine": base["engine"], "peer": peer, "transport": transport}
                families.add_stats(PEER_PREFIX, labels, stats)
        yield from families


def _per_peer(endpoints: Iterable[Any]) -> dict[tuple[str, str], dict[str, int]]:
    """The stats of open endpoints summed by (peer, transport): two connections to one peer
    are one series."""
    out: dict[tuple[str, str], dict[str, int]] = {}
    for endpoint in endpoints:
        summed = out.setdefault((endpoint.peer, endpoint.core.transport), {})
        for key, value in endpoint.stats().items():
            summed[key] = summed.get(key, 0) + value
    return out


def serve_metrics(
    engine: Engine, port: int, *, host: str = "127.0.0.1", registry: Any = None
) -> str:
    """Serve ``engine``'s metrics over HTTP (``prometheus_client.start_http_server``, a
    daemon thread) on ``host:port`` (port 0: a free one).

    Args:
        engine: the engine to export (more can be added to the collector of ``registry``).
        port: TCP port of the endpoint; 0 picks a free one.
        host: address to listen on (loopback by default: metrics name peers).
        registry: a ``prometheus_client.CollectorRegistry`` to add the collector to and serve
            (default: a new one, holding only this engine's metrics).

    Returns:
        The URL to scrape, ``http://HOST:PORT/metrics``.

    Raises:
        UnsupportedError: prometheus_client is not installed (the message names the extra).
        OSError: the port cannot be bound.
    """
    collector = EngineCollector([engine])
    from prometheus_client import CollectorRegistry, start_http_server

    target = registry if registry is not None else CollectorRegistry()
    target.register(collector)
    server, _thread = start_http_server(port, addr=host, registry=target)
    bound = int(server.server_port)
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{bound}/metrics"
