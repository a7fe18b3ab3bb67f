"""Weight sync between Ray actors that join and leave (see :mod:`rdmaxfer.ray`, docs/ray.md).

Three parts, none of which forms a group:

- the trainer actor publishes versions with :func:`publish` (a :class:`~rdmaxfer.WeightServer`
  listening on the node's address, with the cluster's connection secret) and its
  :meth:`~rdmaxfer.WeightServer.update`;
- each inference actor keeps a :class:`LiveWeights`: its own tensors, filled in place by
  one-sided READs of its shard (:func:`~rdmaxfer.pull_weights` with ``into=`` and ``shard=``);
- the driver's :class:`WeightSync` calls one method of every actor it is given with the
  version to reach, and waits at most ``deadline`` seconds: an actor that died (Ray's
  ``RayActorError``) or did not answer in time is reported, not waited for, and gets no
  new call while its last one is still running. An actor that restarts builds its
  ``LiveWeights`` again and pulls the latest version; any actor handle can be added to or
  left out of the next :meth:`WeightSync.sync`.

A stalled puller holds the version it is reading until it finishes or until the server's
per-step ``timeout`` passes (then the server drops it): the versions others pull are never
held back, but with two buffers per server (:mod:`rdmaxfer.weights.versions`) the
*publication* of the version after next may wait for that timeout. :func:`publish` therefore
takes a short ``timeout``.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.exceptions import RayActorError

from .._config import format_address
from ..transport.engine import Engine
from ..weights.pull import pull_weights
from ..weights.server import WeightServer
from .transport import node_host, share_secret

__all__ = ["LiveWeights", "SyncResult", "WeightSync", "address_of", "publish"]


def publish(source: Any, *, timeout: float = 10.0, transport: str = "auto") -> WeightServer:
    """Publish ``source`` (a ``.safetensors`` path or ``{name: tensor}``, host or GPU) from
    this actor: a started :class:`~rdmaxfer.WeightServer` on the node's address (env
    ``RDMAXFER_RAY_HOST`` overrides it), port chosen by the system, connections
    authenticated with the cluster's secret (:func:`~rdmaxfer.ray.share_secret`).

    Args:
        timeout: seconds a client may take for one step; a stalled client loses its version
            after that.
        transport: as :class:`~rdmaxfer.Engine` (``"auto"``: shm on this host, else rdma
            or tcp).

    Returns:
        The running server: ``f"{host}:{server.port}"`` is the address to pull from
        (:func:`address_of`); ``server.update({...})`` publishes the next version.
    """
    engine = Engine(transport, secret=share_secret())
    server = WeightServer(source, host=node_host(), engine=engine, timeout=timeout)
    return server.start()


def address_of(server: WeightServer) -> str:
    """The ``"host:port"`` actors pull ``server`` from (made by :func:`publish`)."""
    return format_address(node_host(), server.port)


class LiveWeights:
    """An inference actor's live weights, filled in place by pulls from the trainer.

    Args:
        address: the trainer's :class:`~rdmaxfer.WeightServer` (:func:`address_of`).
        weights: ``{name: tensor}``, the tensors the actor computes with (torch or NumPy,
            host or GPU; C-contiguous, of the published dtype and of the shape of this
            actor's shard).
        shard: ``{name: np.s_[...]}``, this actor's part of each tensor (tensors without an
            entry are pulled whole).
        timeout: seconds for each step of a pull, and the bound on no progress of its READs.
        transport: as :class:`~rdmaxfer.Engine` (``"auto"``: shm on this host, else rdma or
            tcp).
        gc_freeze: collect garbage, then move every object that exists now into the garbage
            collector's permanent generation (:func:`gc.freeze`, once, here), so that later
            full collections skip what Ray, torch and the actor's start-up allocated. Without
            it, a full collection in an inference actor with torch imported took about 100 ms
            of the actor's thread (16-CPU host), and landing inside a pull it made that pull
            4-5x as long as the others. Frozen objects are never collected; False leaves the
            collector alone.

    Attributes:
        version: the version the tensors hold (0 before the first :meth:`pull`).
    """

    def __init__(
        self,
        address: str,
        weights: Mapping[str, Any],
        *,
        shard: Mapping[str, object] | None = None,
        timeout: float = 30.0,
        transport: str = "auto",
        gc_freeze: bool = True,
    ) -> None:
        self.address = address
        self.weights = dict(weights)
        self.shard = None if shard is None else dict(shard)
        self.timeout = timeout
        self.version = 0
        self._engine = Engine(transport, secret=share_secret())
        if gc_freeze:
            gc.collect()  # what is garbage now is freed, not frozen
            gc.freeze()

    def pull(self, min_version: int = 0, *, deadline: float | None = None) -> int:
        """Fill the tensors with version ``min_version`` or later (waiting for the trainer to
        publish it, at most ``timeout`` s) and return the version they hold; all their
        bytes belong to that one version.

        Raises:
            TransferTimeoutError: the version was not published in time, or ``deadline``
                (seconds for the whole pull) passed.
            ConnectionFailedError: the trainer cannot be reached.
        """
        pulled = pull_weights(
            self.address,
            into=self.weights,
            shard=self.shard,
            min_version=min_version,
            engine=self._engine,
            timeout=self.timeout,
            deadline=deadline,
        )
        self.version = pulled.version
        return self.version

    def close(self) -> None:
        """Close the engine (the tensors stay the actor's)."""
        self._engine.close()


@dataclass
class SyncResult:
    """What one :meth:`WeightSync.sync` saw.

    Attributes:
        version: the version asked for.
        pulled: actor name -> the version it reported holding (>= ``version``).
        seconds: actor name -> seconds from the call to its answer, for those in ``pulled``.
        dead: actor name -> Ray's error for an actor that died or is restarting.
        failed: actor name -> the error its pull raised (the actor lives).
        stalled: the actors still busy at the deadline (their earlier call, or this one).
    """

    version: int
    pulled: dict[str, int] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    dead: dict[str, str] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    stalled: list[str] = field(default_factory=list)

    @property
    def slowest(self) -> float:
        """Seconds of the slowest actor that pulled (0.0 when none did)."""
        return max(self.seconds.values(), default=0.0)


class WeightSync:
    """In the driver: brings the inference actors to each version, never waiting past a
    deadline for one of them.

    Args:
        method: the name of the actors' method to call with the version (it pulls, e.g. with
            :meth:`LiveWeights.pull`, and returns the version it holds).
        deadline: seconds each :meth:`sync` waits at most for all the actors' answers.
    """

    def __init__(self, method: str = "sync_weights", *, deadline: float = 30.0) -> None:
        self.method = method
        self.deadline = deadline
        self._busy: dict[str, Any] = {}  # actor name -> its call still running (an ObjectRef)

    def sync(self, actors: Mapping[str, Any], version: int) -> SyncResult:
        """Ask every actor of ``actors`` (name -> actor handle) to reach ``version``.

        An actor whose call of an earlier sync is still running is not called again; it is
        listed in ``stalled`` until that call ends, and called as usual from the next sync
        on. Returns when every called actor answered or ``deadline`` passed.

        Raises:
            AttributeError: an actor has no method named ``method``.
        """
        result = SyncResult(version)
        started = time.monotonic()
        waiting: dict[Any, str] = {}
        for name, actor in actors.items():
            earlier = self._busy.pop(name, None)
            if earlier is not None and not ray.wait([earlier], timeout=0)[0]:
                self._busy[name] = earlier
                result.stalled.append(name)
                continue
            waiting[getattr(actor, self.method).remote(version)] = name
        pending = list(waiting)
        while pending:
            left = self.deadline - (time.monotonic() - started)
            if left <= 0:
                break
            done, pending = ray.wait(pending, num_returns=1, timeout=left)
            for ref in done:
                name = waiting[ref]
                try:
                    result.pulled[name] = int(ray.get(ref))
                    result.seconds[name] = time.monotonic() - started
                except RayActorError as exc:
                    result.dead[name] = _first_line(exc)
                except Exception as exc:  # the actor lives; its pull raised
                    result.failed[name] = _first_line(exc)
        for ref in pending:
            self._busy[waiting[ref]] = ref
            result.stalled.append(waiting[ref])
        return result


def _first_line(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text.splitlines()[0]
