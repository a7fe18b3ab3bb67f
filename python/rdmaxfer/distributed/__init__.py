"""Ranks of a ``torch.distributed`` job talking through rdmaxfer: rendezvous on the job's store.

Training and inference jobs already run a ``torch.distributed`` store (a ``TCPStore``, a
``FileStore``, or the default process group's store). :func:`init` uses it to find the other
ranks; the bytes then move over rdmaxfer (RDMA verbs or TCP), not through the store or gloo::

    import torch.distributed as dist
    import rdmaxfer.distributed as rd

    dist.init_process_group("gloo")                  # or any store you already have
    group = rd.init()                                # the default group's store, rank, size
    weights = group.broadcast(weights if group.rank == 0 else None, src=0)
    group.send(grad_shard, dst=1); part = group.recv(src=0)
    group.close()

torch is imported only by :func:`init` when no store is passed (to find the default group);
the rest of this module never imports it.

Protocol (version 1). ``P`` is ``"<namespace>/<n>/"``, where ``n`` counts the ``init`` calls
with that namespace in this process (every rank calls ``init`` the same number of times, so
all ranks agree on ``n``):

1. Every rank creates an :class:`~rdmaxfer.Engine`, listens on ``host:0`` and sets
   ``P + "rank/<r>"`` to the UTF-8 JSON ``{"v": 1, "address": "host:port", "transport":
   "tcp"|"rdma", "world_size": N, "token": T}``; ``T`` is a random 62-bit number.
2. Connections are made lazily, the first time two ranks exchange data, and always by the
   LOWER rank: it waits (bounded) for the higher rank's key, checks the record, connects and
   sends a hello, a two-sided message holding ``int64[5] = [0x52584447 ("RXDG"), 1, its rank,
   N, T of the higher rank]``. The higher rank's accept thread checks the hello (a stale
   connection from an earlier ``init`` carries the wrong token and is closed). So there is at
   most one connection per pair, and a missing peer is a bounded wait, never a hang.
3. ``send``/``recv`` are the endpoint's two-sided messages (dtype and shape travel with them).
   Messages on one connection are matched in the order they were sent.
4. ``broadcast`` runs along a ring that starts at ``src`` and visits the other ranks of
   ``ranks`` in increasing order, wrapping around (src=2 of 0..3: 2 -> 3 -> 0 -> 1). The
   source sends a metadata message (UTF-8 JSON in a ``uint8`` array: ``{"v": 1, "kind":
   "array"|"dict", "chunk": bytes, "items": [[name, dtype token, shape], ...]}``); every rank
   forwards it, then the data follows as pieces of ``chunk`` bytes of a virtual layout in which
   item ``i`` starts at the next multiple of 64 bytes. Each rank posts the receives of all
   pieces at once and forwards piece ``k`` to its successor as soon as it has landed, while
   pieces ``k+1...`` are still arriving: every link of the ring is busy at the same time.
   A piece that lies inside one array moves straight from/into that array (host or GPU
   memory); a piece that straddles small arrays goes through a host staging copy of at most
   ``chunk`` bytes. A piece sent from GPU memory is staged on its own, so the next piece
   to the same rank is posted once it completed (messages keep their order).
5. ``barrier`` is a counter in the store: ``P + "barrier/<k>"``; the last rank to arrive sets
   ``P + "barrier/<k>/done"``, which the others wait for (bounded).

Failures: every wait is bounded by ``timeout`` seconds (the default from :func:`init`, itself
``RDMAXFER_TIMEOUT`` or 60): a store key, a connection, a hello, each message and each piece.
A rank that dies makes its neighbours' transfers fail at once (the connection resets) or
within ``timeout`` (nothing arrives). A failed collective, or a transfer that closed its
connection, breaks the group: every connection is aborted, so that the ranks downstream fail
at once too instead of waiting, and later calls raise :class:`~rdmaxfer.ConnectionFailedError`
(call :func:`init` again on every rank to start over).
"""

from __future__ import annotations

from typing import Any

from ..errors import InvalidArgumentError
from .broadcast import ArrayDict
from .group import DEFAULT_CHUNK_BYTES, DEFAULT_NAMESPACE, PROTOCOL_VERSION, RdmaGroup

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "DEFAULT_NAMESPACE",
    "PROTOCOL_VERSION",
    "ArrayDict",
    "RdmaGroup",
    "init",
]


def init(
    store: Any = None,
    rank: int | None = None,
    world_size: int | None = None,
    *,
    transport: str = "auto",
    host: str | None = None,
    timeout: float | None = None,
    namespace: str = DEFAULT_NAMESPACE,
    streams: int = 0,
    io_threads: int = 0,
    rdma_device: str | None = None,
    gid_index: int | None = None,
    secret: str | bytes | None = None,
) -> RdmaGroup:
    """Join the group of ranks sharing ``store``: create an engine, listen, publish the address.

    Every rank of the job calls ``init`` with the same store, namespace and world size (and
    the same number of times with that namespace); no connection is made yet.

    Args:
        store: a ``torch.distributed`` store shared by the ranks (``TCPStore``, ``FileStore``,
            ``PrefixStore``...). None: the default process group's store, rank and world size
            (``torch.distributed.init_process_group`` must have run).
        rank: this rank, 0 <= rank < world_size.
        world_size: number of ranks (>= 1).
        transport: ``"auto"``, ``"tcp"`` or ``"rdma"``; every rank must end up with the same one.
        host: the address this rank listens on and publishes (an IP or name the other ranks
            reach it at). Default: the local address on the route to the TCPStore's host
            (127.0.0.1 when the store is local or a FileStore).
        timeout: seconds bounding every wait of the group (default ``RDMAXFER_TIMEOUT`` or 60).
        namespace: prefix of the store keys (two groups on one store need two namespaces).
        streams, io_threads, rdma_device, gid_index: passed to :class:`~rdmaxfer.Engine`.
        secret: the shared secret that authenticates every connection (default: env
            ``RDMAXFER_SECRET``); set it whenever ``host`` is not a loopback address.

    Returns:
        The :class:`RdmaGroup` of this rank.

    Raises:
        InvalidArgumentError: a bad rank, world size, transport or store; or store None
            without an initialised default process group.
        ConnectionFailedError: the store cannot be reached.
        TransportError: the engine cannot listen on ``host``.
    """
    if store is None:
        store, rank, world_size = _default_group(rank, world_size)
    if world_size is None or rank is None:
        raise InvalidArgumentError(
            "pass rank= and world_size= with a store (or store=None to use the default "
            "torch.distributed process group)"
        )
    return RdmaGroup(
        store,
        rank,
        world_size,
        transport=transport,
        host=host,
        timeout=timeout,
        namespace=namespace,
        streams=streams,
        io_threads=io_threads,
        rdma_device=rdma_device,
        gid_index=gid_index,
        secret=secret,
    )


def _default_group(rank: int | None, world_size: int | None) -> tuple[Any, int, int]:
    try:
        import torch.distributed as dist
    except ImportError as exc:
        raise InvalidArgumentError(
            f"store=None uses torch.distributed's default group, but torch cannot be imported "
            f"({exc}): pass a store, rank and world_size"
        ) from None
    if not dist.is_available() or not dist.is_initialized():
        raise InvalidArgumentError(
            "store=None: torch.distributed's default process group is not initialised; call "
            "torch.distributed.init_process_group() first, or pass a store, rank and world_size"
        )
    from torch.distributed import distributed_c10d

    store = distributed_c10d._get_default_store()
    return (
        store,
        dist.get_rank() if rank is None else rank,
        dist.get_world_size() if world_size is None else world_size,
    )
