"""rdmaxfer inside Ray: a Ray Direct Transport (``"RDMAXFER"``) and weight sync between actors.

Needs the ``ray`` extra (``pip install 'rdmaxfer[ray]'``: Ray >= 2.60 and PyTorch). Ray Direct
Transport (RDT) moves the tensors an actor method returns straight from that actor's memory
to the actor that uses them, out of band of Ray's object store; rdmaxfer plugs in as a
one-sided transport: the destination READs the source's registered tensors (shm between
actors of one host, RDMA verbs where a device is active, else TCP)::

    import ray, torch
    import rdmaxfer.ray

    rdmaxfer.ray.register()            # in the driver, before the classes and actors
    ray.init()

    @ray.remote
    class Trainer:
        @ray.method(tensor_transport="rdmaxfer")
        def weights(self) -> torch.Tensor:
            return self.w

    @ray.remote(enable_tensor_transport=True)   # a destination needs Ray's transfer thread
    class Worker:
        def load(self, w: torch.Tensor) -> float:   # w arrives by one-sided READs
            return float(w.sum())

    ray.get(worker.load.remote(trainer.weights.remote()))

Weight sync (:mod:`.weights`): a trainer actor publishes versions with a
:class:`~rdmaxfer.WeightServer`; each inference actor pulls its shard into its live weights
(:class:`LiveWeights`); a :class:`WeightSync` in the driver asks the actors that are alive to
pull each version under a deadline, so a dead or stalled actor is reported and never holds
back the others, and actors join and leave between versions without any group being formed.
See docs/ray.md.
"""

from __future__ import annotations

from .transport import (
    MAX_CACHED_PEERS,
    TRANSPORT_NAME,
    RdmaxferTensorTransport,
    RdmaxferTransportMetadata,
    deregister_memory,
    register_memory,
    share_secret,
)
from .weights import LiveWeights, SyncResult, WeightSync, address_of, publish

__all__ = [
    "MAX_CACHED_PEERS",
    "TRANSPORT_NAME",
    "LiveWeights",
    "RdmaxferTensorTransport",
    "RdmaxferTransportMetadata",
    "SyncResult",
    "WeightSync",
    "address_of",
    "deregister_memory",
    "publish",
    "register",
    "register_memory",
    "share_secret",
]


def register() -> None:
    """Register the ``"RDMAXFER"`` tensor transport with Ray, for ``cpu`` and ``cuda``
    ``torch.Tensor`` objects: ``@ray.method(tensor_transport="rdmaxfer")`` and
    ``ray.put(t, _tensor_transport="rdmaxfer")`` then move tensors with rdmaxfer.

    Call it in the driver before defining classes that name the transport in
    ``@ray.method`` (Ray checks the name there) and before creating the actors that use it
    (Ray registers it on each actor as it is created). Calling it again does nothing.
    """
    import torch
    from ray.experimental import register_tensor_transport
    from ray.experimental.rdt import util

    util._ensure_default_transports_registered()
    if TRANSPORT_NAME in util.transport_manager_info:
        return
    register_tensor_transport(
        TRANSPORT_NAME, ["cpu", "cuda"], RdmaxferTensorTransport, torch.Tensor
    )
