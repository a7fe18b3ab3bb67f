"""The transports of this build and what each declares it can do (private).

Every choice that differs between transports (which one ``transport="auto"`` picks, which
options an engine takes, how GPU memory registers or is staged, what ``info`` and ``doctor``
report) is made from these declared capabilities, never from a transport's name, so that a new
transport (``csrc/transport/<name>/``, registered in the core: docs/internals.md) needs no
change here. The figures come from ``_core.transports()`` (csrc/transport/transport.h,
``Capabilities``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from . import _core
from .errors import InvalidArgumentError

__all__ = [
    "Capabilities",
    "automatic_network",
    "capabilities",
    "listed",
    "same_host_companion",
    "unavailable",
]


@dataclass(frozen=True)
class Capabilities:
    """What a transport declares about itself (``Capabilities`` in csrc/transport/transport.h).

    Attributes:
        name: what ``Engine(transport=...)`` takes.
        wire_id: its byte in memory descriptors and handshakes.
        listed: offered to users (``False``: internal, the in-process test transport).
        network: reaches other hosts (``False``: processes on this host only).
        auto_rank: ``transport="auto"`` takes the usable network transport of highest rank
            (0: never).
        same_host_companion: serves an automatic engine's registrations for same-host peers.
        bootstrap: connections start with the socket handshake.
        one_sided: WRITE/READ into a peer's registered memory.
        write_with_imm: a WRITE that also notifies the target in hardware.
        gpu_direct: the NIC reads and writes GPU memory (dmabuf or nvidia-peermem MRs).
        device_ipc: GPU memory is exported to same-host peers (CUDA IPC).
        rails: runs on named devices, one per rail (``rdma_devices``).
        tls: its bootstrap streams, and whatever it sends over them, can run under TLS 1.3
            (``Engine(tls=True)``).
        max_message: the largest single transfer in bytes (0: unlimited; an engine may
            report its devices' limit).
    """

    name: str
    wire_id: int
    listed: bool
    network: bool
    auto_rank: int
    same_host_companion: bool
    bootstrap: bool
    one_sided: bool
    write_with_imm: bool
    gpu_direct: bool
    device_ipc: bool
    rails: bool
    tls: bool
    max_message: int


@functools.lru_cache(maxsize=1)
def _declared() -> dict[str, Capabilities]:
    fields = Capabilities.__dataclass_fields__
    return {
        name: Capabilities(**{k: v for k, v in caps.items() if k in fields})
        for name, caps in _core.transports().items()
    }


def capabilities(name: str) -> Capabilities:
    """The declared capabilities of transport ``name``.

    Raises:
        InvalidArgumentError: no transport of that name in this build.
    """
    found = _declared().get(name)
    if found is None:
        raise InvalidArgumentError(
            f"transport={name!r} is not 'auto' or one of {', '.join(map(repr, listed()))}"
        )
    return found


def listed() -> tuple[str, ...]:
    """The names of the transports offered to users, in name order."""
    return tuple(name for name, caps in sorted(_declared().items()) if caps.listed)


def unavailable(name: str) -> str:
    """ "" when transport ``name`` can run here, else why not (unknown names: why not too)."""
    return _core.available_transports().get(name, f"no transport {name!r} in this build")


def automatic_network() -> str:
    """The network transport ``transport="auto"`` picks here: the usable one of highest
    ``auto_rank``."""
    return _core.automatic_network_transport()


def same_host_companion() -> str | None:
    """The transport an automatic engine connects same-host peers over (it declares
    ``same_host_companion``), or None when this build has none."""
    return next((n for n in listed() if capabilities(n).same_host_companion), None)
