"""``RDMAXFER``: a one-sided Ray Direct Transport over rdmaxfer (see :mod:`rdmaxfer.ray`).

Per process (actor or driver) one :class:`~rdmaxfer.Engine` (``"auto"``: shm to an actor of the
same host, RDMA verbs where a device is active, else TCP), created on first use. Its two
halves:

- source: :meth:`RdmaxferTensorTransport.extract_tensor_transport_metadata` registers the
  storage of each returned tensor for remote READ (once per storage, counted; a storage
  pinned by :func:`register_memory` stays registered) and puts the engine's address and the
  packed descriptors into the metadata; a thread accepts the destinations' connections;
  :meth:`~RdmaxferTensorTransport.garbage_collect` drops the counts when Ray frees the object.
- destination: :meth:`~RdmaxferTensorTransport.fetch_multiple_tensors` connects to the source
  (endpoints cached per address, least recently used closed beyond
  :data:`MAX_CACHED_PEERS`), allocates the tensors (or takes ``target_buffers``) and posts one
  ``read_batch`` of every tensor; :meth:`~RdmaxferTensorTransport.wait_fetch_complete` waits for
  it. :meth:`~RdmaxferTensorTransport.abort_transport` aborts the endpoint of a transfer in
  flight, so its wait ends at once.

Connections are authenticated (HMAC-SHA256 challenge-response, see docs/security.md) with
``RDMAXFER_SECRET`` when it is set in the actors' environment, else with a random secret that
:func:`rdmaxfer.ray.register` stores in the cluster's internal key-value store (the GCS), so
only processes of the same Ray cluster connect.
"""

from __future__ import annotations

import secrets
import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import ray
from ray.exceptions import RayDirectTransportError
from ray.experimental import CommunicatorMetadata, TensorTransportManager, TensorTransportMetadata
from ray.experimental.rdt.tensor_transport_manager import FetchRequest

from .._config import ENV_SECRET, format_address, resolve_timeout
from .._warn import warn
from ..errors import RdmaxferError, TransferTimeoutError
from ..memory.region import MemoryRegion
from ..options import env_setting
from ..transport.batch import BatchResult
from ..transport.endpoint import Endpoint
from ..transport.engine import Engine
from ..transport.transfer import Transfer

if TYPE_CHECKING:
    import torch

__all__ = [
    "MAX_CACHED_PEERS",
    "RECEIVE_CACHE_BYTES",
    "TRANSPORT_NAME",
    "RdmaxferFetchRequest",
    "RdmaxferTensorTransport",
    "RdmaxferTransportMetadata",
    "deregister_memory",
    "register_memory",
    "share_secret",
]

TRANSPORT_NAME = "RDMAXFER"
"""The name Ray knows the transport by (``tensor_transport="rdmaxfer"``, any case)."""

MAX_CACHED_PEERS = 64
"""Endpoints a destination keeps open to sources; the least recently used is closed beyond."""

RECEIVE_CACHE_BYTES = 1 << 30
"""Host memory a destination keeps of received objects that were freed, for the next ones."""

_CACHE_FROM = 1 << 20  # smaller receives allocate anew
_SECRET_KEY = b"rdmaxfer/ray/secret"
_SECRET_NAMESPACE = "rdmaxfer"
_ENV_HOST = "RDMAXFER_RAY_HOST"
_ALIGN = 64


def share_secret() -> str:
    """The cluster's connection secret: ``RDMAXFER_SECRET`` when set, else the one in the
    GCS key-value store (created by the first caller: 32 random bytes, hex). Needs a
    connected Ray worker or driver (``ray.init``)."""
    own = env_setting(ENV_SECRET)
    if own:
        return str(own)
    from ray.experimental import internal_kv

    internal_kv._internal_kv_put(
        _SECRET_KEY, secrets.token_hex(32).encode(), overwrite=False, namespace=_SECRET_NAMESPACE
    )
    stored = internal_kv._internal_kv_get(_SECRET_KEY, namespace=_SECRET_NAMESPACE)
    if not isinstance(stored, bytes):
        raise _error("rdmaxfer: the connection secret is missing from Ray's GCS")
    return stored.decode()


def node_host() -> str:
    """The address this process listens on: env ``RDMAXFER_RAY_HOST``, else Ray's address of
    this node."""
    own = env_setting(_ENV_HOST)
    return str(own) if own else str(ray.util.get_node_ip_address())


@dataclass
class RdmaxferCommunicatorMetadata(CommunicatorMetadata):
    """Nothing: a one-sided READ needs no communicator (the source's address is in the
    tensor metadata)."""


@dataclass
class RdmaxferTransportMetadata(TensorTransportMetadata):
    """What a destination needs to READ an object's tensors.

    Args:
        address: ``"host:port"`` the source's engine listens on.
        regions: the packed :class:`~rdmaxfer.Descriptor` of each registered storage.
        places: per tensor, ``(region index, byte offset into it, bytes)``; an empty tensor
            has no region (``(-1, 0, 0)``).
    """

    address: str = ""
    regions: list[bytes] = field(default_factory=list)
    places: list[tuple[int, int, int]] = field(default_factory=list)

    __eq__ = object.__eq__
    __hash__ = object.__hash__


@dataclass
class RdmaxferFetchRequest(FetchRequest):
    """A posted ``read_batch`` (``transfer``) filling ``tensors`` from ``endpoint``, the
    cached endpoint to the source at ``address``."""

    transfer: Transfer[BatchResult] | None = None
    endpoint: Endpoint | None = None
    address: str = ""


@dataclass
class _Storage:
    region: MemoryRegion
    count: int


class _Process:
    """This process's engine, listening, with its registrations and cached endpoints.

    Lifecycle: created on first use (engine open, listening, the accept thread running) ->
    used by the transport of this process until the process exits (the engine is then closed
    by rdmaxfer's exit handling, docs/lifecycle.md)."""

    def __init__(self) -> None:
        self.engine = Engine("auto", secret=share_secret())
        host = node_host()
        self.address = format_address(host, self.engine.listen(host, 0))
        self.lock = threading.RLock()
        self.storages: dict[int, _Storage] = {}  # by storage address
        self.objects: dict[str, list[int]] = {}  # obj_id -> storage addresses it holds
        self.peers: OrderedDict[str, Endpoint] = OrderedDict()
        self.accepted: list[Endpoint] = []
        threading.Thread(target=self._accept, name="rdmaxfer-ray-accept", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                endpoint = self.engine.accept(timeout=1.0)
            except TransferTimeoutError:
                endpoint = None
            except RdmaxferError:  # the engine closed (interpreter exit)
                return
            with self.lock:  # the engine holds them; forget those the peers closed
                for gone in [e for e in self.accepted if e.closed]:
                    gone.close()
                self.accepted = [e for e in self.accepted if not e.closed]
                if endpoint is not None:
                    self.accepted.append(endpoint)

    def hold(self, tensor: torch.Tensor) -> tuple[MemoryRegion, int]:
        """Count one more use of ``tensor``'s storage, registering it for remote READ on the
        first; returns its region and the tensor's byte offset into it."""
        import torch

        storage = tensor.untyped_storage()
        base = storage.data_ptr()
        with self.lock:
            held = self.storages.get(base)
            if held is None:
                whole = torch.empty(0, dtype=torch.uint8, device=tensor.device)
                whole.set_(storage, 0, (storage.nbytes(),), (1,))
                region = self.engine.register(whole, access="r", local_write=False)
                held = self.storages[base] = _Storage(region, 0)
            held.count += 1
            return held.region, tensor.data_ptr() - base

    def release(self, bases: list[int]) -> None:
        """Count one use less of each storage; deregister those no object uses any more."""
        with self.lock:
            for base in bases:
                held = self.storages.get(base)
                if held is None:
                    continue
                held.count -= 1
                if held.count <= 0:
                    del self.storages[base]
                    held.region.close()

    def endpoint(self, address: str) -> Endpoint:
        """The cached endpoint to ``address``, connected now if there is none (or it closed)."""
        with self.lock:
            cached = self.peers.get(address)
            if cached is not None and not cached.closed:
                self.peers.move_to_end(address)
                return cached
            self.peers.pop(address, None)
        endpoint = self.engine.connect(address, retry_refused=False)
        with self.lock:
            self.peers[address] = endpoint
            while len(self.peers) > MAX_CACHED_PEERS:
                _, evicted = self.peers.popitem(last=False)
                evicted.close()
        return endpoint

    def forget(self, address: str, endpoint: Endpoint) -> None:
        with self.lock:
            if self.peers.get(address) is endpoint:
                del self.peers[address]


_process: _Process | None = None
_process_lock = threading.Lock()


def _here() -> _Process:
    global _process
    with _process_lock:
        if _process is None:
            _process = _Process()
        return _process


def register_memory(tensor: torch.Tensor) -> None:
    """Register ``tensor``'s whole storage for remote READ now and keep it registered (until
    :func:`deregister_memory`): objects made of it, or of views of it (a model's live
    weights), then cost no registration. Call it in the actor that returns the tensors.

    Raises:
        RegistrationError: the memory cannot be registered.
    """
    _here().hold(tensor)


def deregister_memory(tensor: torch.Tensor) -> None:
    """Undo one :func:`register_memory` of ``tensor``'s storage (objects still alive keep
    their own count)."""
    _here().release([tensor.untyped_storage().data_ptr()])


def _nbytes(meta: tuple[Any, Any]) -> int:
    shape, dtype = meta
    count = 1
    for n in shape:
        count *= int(n)
    return count * int(dtype.itemsize)


def _bytes_of(tensor: torch.Tensor) -> Any:
    """A tensor's bytes as a writable 1-D array (host: a NumPy view; GPU: the tensor)."""
    import torch

    flat = tensor.reshape(-1).view(torch.uint8)
    return flat.numpy() if flat.device.type == "cpu" else flat


class RdmaxferTensorTransport(TensorTransportManager):
    """Ray's ``TensorTransportManager`` for ``tensor_transport="rdmaxfer"`` (one-sided,
    abortable). Ray creates one per process; see :mod:`rdmaxfer.ray.transport`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._aborted: set[str] = set()
        self._inflight: dict[str, Endpoint] = {}
        self._checked: dict[str, bool] = {}  # actor id -> has the transport (driver side)
        self._warned: set[str] = set()  # destinations warned about (driver side)

    def tensor_transport_backend(self) -> str:
        return TRANSPORT_NAME

    @staticmethod
    def is_one_sided() -> bool:
        return True

    @staticmethod
    def can_abort_transport() -> bool:
        return True

    def actor_has_tensor_transport(self, actor: ray.actor.ActorHandle[Any]) -> bool:
        key = actor._actor_id.hex()
        if key not in self._checked:

            def __ray_actor_has_rdmaxfer__(self: object) -> bool:
                try:
                    _here()
                except Exception:
                    return False
                return True

            ref: Any = actor.__ray_call__.options(concurrency_group="_ray_system").remote(
                __ray_actor_has_rdmaxfer__
            )
            self._checked[key] = bool(ray.get(ref))
        return self._checked[key]

    def extract_tensor_transport_metadata(
        self, obj_id: str, rdt_object: list[torch.Tensor]
    ) -> RdmaxferTransportMetadata:
        if not rdt_object:
            return RdmaxferTransportMetadata(tensor_meta=[], tensor_device=None)
        kind = rdt_object[0].device.type
        for index, tensor in enumerate(rdt_object):
            if tensor.device.type != kind:
                raise ValueError(
                    f"tensor {index} is on {tensor.device}, tensor 0 on {rdt_object[0].device}: "
                    "the tensors of one RDMAXFER object must be on one kind of device"
                )
            if not tensor.is_contiguous():
                raise ValueError(
                    f"tensor {index} (shape {tuple(tensor.shape)}) is not contiguous: return "
                    "tensor.contiguous() from the method"
                )
        here = _here()
        descriptors: dict[int, int] = {}  # region key -> index into regions
        regions: list[bytes] = []
        places: list[tuple[int, int, int]] = []
        bases: list[int] = []
        try:
            for tensor in rdt_object:
                nbytes = tensor.numel() * tensor.element_size()
                if not nbytes:  # nothing to read (an empty GPU tensor has no address at all)
                    places.append((-1, 0, 0))
                    continue
                region, offset = here.hold(tensor)
                bases.append(tensor.untyped_storage().data_ptr())
                if region.key not in descriptors:
                    descriptors[region.key] = len(regions)
                    regions.append(region.descriptor().pack())
                places.append((descriptors[region.key], offset, nbytes))
        except BaseException:
            here.release(bases)
            raise
        with here.lock:
            here.objects[obj_id] = bases
        return RdmaxferTransportMetadata(
            tensor_meta=[(t.shape, t.dtype) for t in rdt_object],
            tensor_device=kind,
            address=here.address,
            regions=regions,
            places=places,
        )

    def get_communicator_metadata(
        self,
        src_actor: ray.actor.ActorHandle[Any],
        dst_actor: ray.actor.ActorHandle[Any],
        backend: str | None = None,
    ) -> RdmaxferCommunicatorMetadata:
        """Nothing to set up; warns (once per actor, ``UserWarning``) when ``dst_actor`` was
        created without ``enable_tensor_transport=True``: Ray then has no transfer thread on
        it and runs the receive step among its tasks, so on an actor that runs one task at a
        time the step waits behind the task that needs the tensors whenever the object was
        not made yet when that task was submitted, and the task fails at Ray's RDT fetch
        timeout."""
        if dst_actor is not None and not getattr(dst_actor, "_ray_enable_tensor_transport", True):
            key = dst_actor._actor_id.hex()
            with self._lock:
                first = key not in self._warned
                self._warned.add(key)
            if first:
                warn(
                    f"actor {key} takes an RDMAXFER object but was created without "
                    "enable_tensor_transport=True, so Ray runs the receive step among its "
                    "tasks: behind a task that needs the tensors it waits until Ray's RDT "
                    "fetch timeout (RAY_rdt_fetch_fail_timeout_milliseconds) fails that task. "
                    "Create the actor with @ray.remote(enable_tensor_transport=True)"
                )
        return RdmaxferCommunicatorMetadata()

    def fetch_multiple_tensors(
        self,
        obj_id: str,
        tensor_transport_metadata: TensorTransportMetadata,
        communicator_metadata: CommunicatorMetadata,
        target_buffers: list[Any] | None = None,
    ) -> RdmaxferFetchRequest:
        """Post one ``read_batch`` of every tensor of the object (into ``target_buffers``
        when given, else into new tensors of one allocation on the source's kind of device);
        returns at once.

        Raises:
            RayDirectTransportError: the transfer was aborted, the source cannot be reached,
                or the READs could not be posted (the message carries rdmaxfer's error).
        """
        meta = tensor_transport_metadata
        assert isinstance(meta, RdmaxferTransportMetadata)
        with self._lock:
            if obj_id in self._aborted:
                self._aborted.discard(obj_id)
                raise _error(f"RDMAXFER transfer of object {obj_id} was aborted")
        tensors = target_buffers if target_buffers else _allocate(meta)
        if not any(nbytes for _, _, nbytes in meta.places):
            return RdmaxferFetchRequest(obj_id=obj_id, tensors=tensors)
        from .. import _core

        here = _here()
        try:
            endpoint = here.endpoint(meta.address)
            remotes = [_core.Descriptor.unpack(packed) for packed in meta.regions]
            entries = [
                (_bytes_of(tensor), remotes[region], offset)
                for tensor, (region, offset, nbytes) in zip(tensors, meta.places, strict=True)
                if nbytes
            ]
            with self._lock:
                self._inflight[obj_id] = endpoint
            transfer = endpoint.post_read_batch(entries)
        except RdmaxferError as exc:
            self._settle(obj_id)
            raise _transport_error(obj_id, meta.address, exc) from None
        return RdmaxferFetchRequest(
            obj_id=obj_id,
            tensors=tensors,
            transfer=transfer,
            endpoint=endpoint,
            address=meta.address,
        )

    def wait_fetch_complete(self, fetch_request: FetchRequest, timeout: float = -1) -> list[Any]:
        """Wait for :meth:`fetch_multiple_tensors`' READs.

        Args:
            timeout: seconds (-1: no bound on the whole wait, which still fails once no byte
                moved for ``RDMAXFER_TIMEOUT`` s; 0: only look).

        Raises:
            TimeoutError: ``timeout`` passed (the endpoint to the source is aborted).
            RayDirectTransportError: the source died or closed, a READ failed, or Ray
                aborted the transfer.
        """
        assert isinstance(fetch_request, RdmaxferFetchRequest)
        transfer, obj_id = fetch_request.transfer, fetch_request.obj_id
        if transfer is None:
            return list(fetch_request.tensors)
        if timeout == 0 and not transfer.done():
            raise TimeoutError(f"RDMAXFER transfer of object {obj_id} is still in flight")
        try:
            result = transfer.wait(resolve_timeout(None), deadline=None if timeout < 0 else timeout)
            result.check()
        except TransferTimeoutError as exc:  # the wait aborted the endpoint
            self._settle(obj_id)
            if fetch_request.endpoint is not None:
                _here().forget(fetch_request.address, fetch_request.endpoint)
            if timeout > 0:
                raise TimeoutError(f"RDMAXFER transfer of object {obj_id}: {exc}") from None
            raise _transport_error(obj_id, fetch_request.address, exc) from None
        except RdmaxferError as exc:
            aborted = self._settle(obj_id)
            if fetch_request.endpoint is not None:
                _here().forget(fetch_request.address, fetch_request.endpoint)
            if aborted:
                raise _error(
                    f"RDMAXFER transfer of object {obj_id} was aborted by Ray ({exc})"
                ) from None
            raise _transport_error(obj_id, fetch_request.address, exc) from None
        self._settle(obj_id)
        return list(fetch_request.tensors)

    def recv_multiple_tensors(
        self,
        obj_id: str,
        tensor_transport_metadata: TensorTransportMetadata,
        communicator_metadata: CommunicatorMetadata,
        target_buffers: list[Any] | None = None,
    ) -> list[Any]:
        request = self.fetch_multiple_tensors(
            obj_id, tensor_transport_metadata, communicator_metadata, target_buffers
        )
        return self.wait_fetch_complete(request)

    def send_multiple_tensors(
        self,
        tensors: list[Any],
        tensor_transport_metadata: TensorTransportMetadata,
        communicator_metadata: CommunicatorMetadata,
    ) -> None:
        raise NotImplementedError("RDMAXFER is one-sided: the destination READs, nothing sends")

    def garbage_collect(
        self, obj_id: str, tensor_transport_meta: TensorTransportMetadata, tensors: list[Any]
    ) -> None:
        here = _process
        if here is None:
            return
        with here.lock:
            bases = here.objects.pop(obj_id, [])
        here.release(bases)

    def abort_transport(self, obj_id: str, communicator_metadata: CommunicatorMetadata) -> None:
        with self._lock:
            self._aborted.add(obj_id)
            endpoint = self._inflight.get(obj_id)
        if endpoint is not None:
            endpoint.abort(f"Ray aborted the RDMAXFER transfer of object {obj_id}")

    def _settle(self, obj_id: str) -> bool:
        """Forget a finished transfer; True when Ray had aborted it."""
        with self._lock:
            self._inflight.pop(obj_id, None)
            aborted = obj_id in self._aborted
            self._aborted.discard(obj_id)
        return aborted


def _transport_error(obj_id: str, peer: str, exc: BaseException) -> RayDirectTransportError:
    return _error(
        f"RDMAXFER transfer of object {obj_id} from {peer} failed (the source actor may have "
        f"died): {type(exc).__name__}: {exc}"
    )


class _ReceiveCache:
    """Host memory of received objects that were freed, kept (at most
    :data:`RECEIVE_CACHE_BYTES`, oldest dropped first) for the next receives: a READ into
    memory that was written before skips the page faults of a new allocation."""

    def __init__(self) -> None:
        self.lock = threading.RLock()  # a finalizer may run in a thread that holds it
        self.free: list[np.ndarray[Any, Any]] = []  # oldest first

    def take(self, nbytes: int) -> torch.Tensor:
        """``nbytes`` of host memory as a uint8 tensor: a kept buffer of at least that size
        (and at most twice it), else a new one; it comes back when the tensor's storage is
        freed."""
        import torch

        with self.lock:
            fits = [b for b in self.free if nbytes <= b.nbytes <= 2 * nbytes]
            base = min(fits, key=lambda b: b.nbytes) if fits else None
            if base is not None:
                self.free = [b for b in self.free if b is not base]
        if base is None:
            base = np.empty(nbytes, dtype=np.uint8)
        view = base[:nbytes]
        weakref.finalize(view, self._give_back, base)  # the storage holds the view
        return torch.from_numpy(view)

    def _give_back(self, base: np.ndarray[Any, Any]) -> None:
        with self.lock:
            self.free.append(base)
            while sum(b.nbytes for b in self.free) > RECEIVE_CACHE_BYTES:
                self.free.pop(0)

    def kept(self) -> int:
        """Bytes kept now."""
        with self.lock:
            return sum(b.nbytes for b in self.free)


_receive_cache = _ReceiveCache()


def _allocate(meta: RdmaxferTransportMetadata) -> list[torch.Tensor]:
    """New tensors for ``meta``: views of one uint8 allocation, each at a multiple of 64
    bytes, on the source's kind of device (host memory of 1 MiB and more from the receive
    cache)."""
    import torch

    items: list[tuple[Any, Any]] = list(meta.tensor_meta)
    offsets, total = [], 0
    for item in items:
        offsets.append(total)
        total += -(-_nbytes(item) // _ALIGN) * _ALIGN
    device = meta.tensor_device or "cpu"
    if device == "cpu" and total >= _CACHE_FROM:
        whole = _receive_cache.take(total)
    else:
        whole = torch.empty(total, dtype=torch.uint8, device=device)
    return [
        whole[offset : offset + _nbytes((shape, dtype))].view(dtype).reshape(shape)
        for (shape, dtype), offset in zip(items, offsets, strict=True)
    ]


def _error(message: str) -> RayDirectTransportError:
    """Ray's transport error (Ray's exception classes are untyped)."""
    return RayDirectTransportError(message)
