"""An engine's memory side: its registrations, GPU memory (GPUDirect, CUDA IPC or staged) and the
completion notifications its transfers wait on.

:class:`MemoryDomain` is what endpoints and transfers need from the engine that made them;
:class:`~rdmaxfer.transport.engine.Engine` is a MemoryDomain that also listens and connects.
Endpoints sit between the two modules, so they see only this one.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import numpy.typing as npt

from .. import _core, _transports
from .._config import resolve_timeout
from ..errors import (
    EndpointClosedError,
    InvalidArgumentError,
    RdmaxferError,
    RegistrationError,
    UnsupportedError,
)
from ..memory.buffer import Buffer, as_array, device_view
from ..memory.region import ACCESS, LOCAL_WRITE, MemoryRegion, access_bits
from .notifications import Notifications
from .regcache import EXPORTS_ENV, RegistrationCache, cache_bounds, exports_max
from .region_index import CoverIndex

if TYPE_CHECKING:
    from ..gpu import gpudirect
    from ..gpu.staging import StagerPool
    from ..memory import cuda

__all__ = ["MemoryDomain", "staged_backstop_s"]

_NO_BYTES: npt.NDArray[np.uint8] = np.empty(0, np.uint8)

# Bound on deregistration waits when the engine closes (its endpoints are closed by then).
CLOSE_TIMEOUT_S = 5.0

# This process's id, made current in a child of os.fork(): _local compares it on every transfer
# (os.getpid() is a system call).
_pid = os.getpid()


def _after_fork_in_child() -> None:
    global _pid
    _pid = os.getpid()


os.register_at_fork(after_in_child=_after_fork_in_child)


class MemoryDomain:
    """The registrations of one ``_core.Engine``, its staging pipelines and notifications.

    Lifecycle: open -> closed (:meth:`_close_memory`, called by ``Engine.close`` once its
    endpoints are closed). Thread-safe.
    """

    def __init__(self, core: _core.Engine) -> None:
        self._core = core
        self._lock = threading.RLock()
        self._closed = False
        self._pid = os.getpid()  # in a child of os.fork() this engine is the parent's: inert
        # Every live registration by key (so none can be freed while its key is live), and the
        # user registrations by exact range (address, bytes, access), so registering the same
        # memory again is free, with the range key of each.
        self._regions: dict[int, MemoryRegion] = {}
        self._by_range: dict[tuple[int, int, int], MemoryRegion] = {}
        self._range_of: dict[int, tuple[tuple[int, int, int], str]] = {}  # key -> (range, kind)
        # Which user registration contains a range, by kind: host memory with local write
        # ("host_lw") or without ("host"), GPU memory exported for CUDA IPC ("ipc") or
        # registered for GPUDirect RDMA ("direct").
        self._covers: dict[str, CoverIndex[MemoryRegion]] = {
            kind: CoverIndex() for kind in ("host", "host_lw", "ipc", "direct")
        }
        # GPU memory: the staging pipelines (rdmaxfer.gpu.staging), the GPUDirect preflight.
        self._stagers: StagerPool | None = None
        self._preflights: dict[int, gpudirect.GpuDirectPreflight] = {}
        # Keys of the GPU registrations exported for CUDA IPC (moved directly on shm
        # connections only; the others are GPUDirect RDMA MRs, moved directly on rdma ones).
        self._ipc_keys: set[int] = set()
        self._notifications = Notifications(core)
        # Temporary registrations of unregistered host memory, one per allocation, reused.
        self._temps = RegistrationCache(*cache_bounds())
        # Implicit CUDA IPC exports of unregistered GPU allocations (_export), and why the
        # last unregistered GPU memory on a shm connection was staged instead ("" if none was).
        exports = exports_max()
        self._exports = RegistrationCache(max_entries=exports, max_bytes=sys.maxsize)
        self._export_off = "" if exports else f"unregistered GPU memory is staged: {EXPORTS_ENV}=0"
        self._exports_unsupported = exports == 0

    @property
    def core(self) -> _core.Engine:
        """The underlying ``_core.Engine``."""
        return self._core

    @property
    def transport(self) -> str:
        """``"tcp"``, ``"rdma"`` or ``"shm"``."""
        return self._core.transport

    @property
    def notifications(self) -> Notifications:
        """Internal: the completion notifications this engine's transfers wait on."""
        return self._notifications

    @property
    def closed(self) -> bool:
        """True once ``close()`` was called."""
        return self._closed

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
                :meth:`gpu_preflight` decides; on ``transport="shm"``, and on ``"auto"`` over
                TCP, it is exported for CUDA IPC instead (cuMemAlloc'd memory by its IPC
                handle, cuMemCreate'd VMM memory as a POSIX fd), so transfers on shm
                connections between registrations of two processes copy GPU to GPU
                (``Endpoint.info["cuda_ipc_bytes"]`` counts them). An ``"auto"`` engine's TCP
                connections stage such memory, and refuse remote access to it
                (RemoteAccessError: only peers on this host reach it).
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
        self._temps.invalidate(arr)
        with self._lock:
            cached = self._by_range.get((addr, nbytes, bits))
            if cached is not None and cached.registered and cached.core.local_write >= writes:
                return cached
            owner = obj.numpy() if isinstance(obj, (Buffer, MemoryRegion)) else obj
            core = self._core.register(addr, nbytes, core_bits)
            region = MemoryRegion(self, core, owner, arr)
            kind = "host_lw" if core.local_write else "host"
            self._add_user_locked(region, (addr, nbytes, bits), core.key, kind)
        return region

    def _add_user_locked(
        self, region: MemoryRegion, at: tuple[int, int, int], key: int, kind: str
    ) -> None:
        """Index a new user registration ``key`` of the range ``at`` = (address, bytes,
        access) as ``kind`` (see ``_covers``)."""
        self._regions[key] = region
        self._by_range[at] = region
        self._range_of[key] = (at, kind)
        self._covers[kind].add(key, at[0], at[1], region)

    def _add_user_region_locked(self, region: MemoryRegion, at: tuple[int, int, int]) -> None:
        """:meth:`_add_user_locked` for a region of any memory, its key and kind read from it."""
        key = region.key
        if region.device is not None:
            kind = "ipc" if key in self._ipc_keys else "direct"
        else:
            kind = "host_lw" if region.core.local_write else "host"
        self._add_user_locked(region, at, key, kind)

    def gpu_preflight(self, device: str | int = 0) -> gpudirect.GpuDirectPreflight:
        """How this engine registers memory of GPU ``device`` for RDMA, and why not otherwise:
        ``method`` is ``"dmabuf"``, ``"peermem"`` or ``"staging"`` (see
        :func:`rdmaxfer.gpu.gpudirect.preflight`)."""
        from ..gpu import gpudirect
        from ..memory import cuda

        ordinal = device if isinstance(device, int) else cuda.parse_device(device)
        with self._lock:
            cached = self._preflights.get(ordinal)
        if cached is not None:
            return cached
        rdma_device = None
        if _transports.capabilities(self.transport).rails:
            words = self._core.describe().split()  # "rdma: device mlx5_0 port 1, ..."
            rdma_device = words[words.index("device") + 1] if "device" in words[:-1] else None
        result = gpudirect.preflight(
            self.transport,
            gpu_direct=bool(self._core.capabilities()["gpu_direct"]),
            gpu_direct_off=self._core.gpu_direct_off,
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
        if self._exports_device_memory():
            # processes of one host: CUDA IPC (csrc/transport/shm/cuda_ipc.h)
            methods: tuple[str, ...] = ("cuda_ipc",)
        else:
            check = self.gpu_preflight(view.device)
            if check.method == "staging":
                raise UnsupportedError(
                    f"GPU memory cannot be registered for RDMA on this engine: dmabuf: "
                    f"{check.reasons['dmabuf']}; nvidia-peermem: {check.reasons['peermem']}. "
                    "Transfers of GPU memory work without registering (they are staged through "
                    "pinned host buffers)"
                )
            methods = tuple(m for m in ("dmabuf", "peermem") if not check.reasons.get(m))
        with self._lock:
            cached = self._by_range.get((view.ptr, view.nbytes, bits))
            if cached is not None and cached.registered:
                return cached
        errors = []
        for method in methods:
            try:
                core = self._core.register_device(view.ptr, view.nbytes, bits, method, view.device)
            except (RegistrationError, UnsupportedError) as exc:
                errors.append(f"{method}: {exc}")
                continue
            core.home_rail = self._nearest_rail(view.device)
            region = MemoryRegion(self, core, view, np.empty(0, np.uint8), device=view.device)
            with self._lock:
                if method == "cuda_ipc":
                    self._ipc_keys.add(region.key)
                self._add_user_region_locked(region, (view.ptr, view.nbytes, bits))
            return region
        raise RegistrationError("GPU memory registration failed: " + "; ".join(errors))

    def _ipc_companion(self) -> bool:
        """True for an automatic engine whose network transport does not register GPU memory
        for the NIC (TCP) and that has a same-host companion: its GPU registrations are exported
        for CUDA IPC (by the companion, into this engine's keys), so same-host connections move
        them GPU to GPU; its network connections stage them."""
        core = self._core
        direct = _transports.capabilities(core.transport).gpu_direct
        return core.automatic and not direct and core.has_shm_companion

    def _exports_device_memory(self) -> bool:
        """True when this engine's GPU memory is exported for CUDA IPC: its transport declares
        ``device_ipc`` (shm), or its companion does (:meth:`_ipc_companion`)."""
        return _transports.capabilities(self.transport).device_ipc or self._ipc_companion()

    def gpu_links_unreached(self) -> str:
        """Internal: "" when every connection of this engine can reach its GPU registrations, else
        why not: an automatic engine over TCP exports them for CUDA IPC, which its TCP connections
        (peers on other hosts) cannot reach, so what such peers must read or write goes through host
        memory."""
        if self._ipc_companion():
            return (
                "GPU memory of an automatic engine over TCP is shared by CUDA IPC, which only "
                "its same-host shm peers reach"
            )
        return ""

    def cuda_ipc_off(self) -> str:
        """Internal: why this engine's shm connections stage GPU memory instead of moving it by CUDA
        IPC ("" when registered GPU memory moves by CUDA IPC, when there is no usable CUDA here, or
        while the engine has not touched GPU memory, so that host-only programs never load the
        driver for ``Endpoint.info``): the driver lacks the IPC calls
        (:func:`rdmaxfer.gpu.report.cuda_ipc_report`), or the engine is automatic over rdma, where
        GPU memory is registered for GPUDirect RDMA. (Unregistered GPU memory moves by an implicit
        export where registered memory does: :meth:`_export`.)"""
        from ..gpu.report import cuda_ipc_report
        from ..memory import cuda

        with self._lock:
            used = (
                self._stagers is not None
                or len(self._covers["ipc"]) + len(self._covers["direct"]) > 0
                or len(self._exports) > 0
            )
        if not used:
            return ""
        status = cuda.status()
        if status["unavailable"]:
            return ""
        calls = cuda_ipc_report(status)["calls"]
        if calls != "available":
            return str(calls)
        if _transports.capabilities(self.transport).gpu_direct:
            return (
                "GPU memory on this engine is registered for GPUDirect RDMA (its network "
                f"transport is {self.transport}), so it is staged through host memory to peers on "
                "this host; use transport='shm' for same-host GPU peers"
            )
        return ""

    def cuda_ipc_export_off(self) -> str:
        """Internal: why unregistered GPU memory on this engine's shm connections was last staged
        instead of moved by an implicit CUDA IPC export ("" when none was): the driver does not
        report CU_POINTER_ATTRIBUTE_BUFFER_ID or lacks the IPC calls, or the memory cannot be
        exported. (Where registered memory is staged too, :meth:`_cuda_ipc_off` says why.)"""
        return self._export_off

    def _nearest_rail(self, device: int) -> int:
        """This engine's rail nearest GPU ``device`` (small transfers of its memory take it), or
        -1 with one rail or no PCI path (:func:`rdmaxfer.gpu.topology.nearest_rail`)."""
        from ..gpu import topology
        from ..memory import cuda

        rails = self._core.rails()
        bdf = next((g["pci_bus_id"] for g in cuda.status()["gpus"] if g["index"] == device), "")
        return topology.nearest_rail(bdf, rails) if len(rails) > 1 and bdf else -1

    def device_local(self, view: cuda.CudaArray, transport: str) -> tuple[MemoryRegion, int] | None:
        """Internal: the live GPU registration of the user's covering ``view`` that a connection
        over ``transport`` moves directly (CUDA IPC exports on ``"shm"``, GPUDirect RDMA MRs on the
        others): (region, byte offset of the view in it), else None."""
        with self._lock:
            ipc = _transports.capabilities(transport).device_ipc
            region = self._covers["ipc" if ipc else "direct"].find(view.ptr, view.nbytes)
        if region is None or not region.registered:
            return None
        return region, view.ptr - region.addr

    def device_direct(
        self, view: cuda.CudaArray, transport: str
    ) -> tuple[MemoryRegion, int, list[MemoryRegion]] | None:
        """Internal: how a connection over ``transport`` moves ``view`` without staging: a
        registration of the user's (:meth:`_device_local`), else on a shm connection an implicit
        CUDA IPC export of the allocation holding it (:meth:`_export`): (region, byte offset of the
        view in it, temporaries to hand back with :meth:`_release_temps` when the operation is
        done). None: the view's transfers on that connection are staged (:meth:`_stager`)."""
        found = self.device_local(view, transport)
        if found is not None:
            return found[0], found[1], []
        return self._export(view) if _transports.capabilities(transport).device_ipc else None

    def _export(self, view: cuda.CudaArray) -> tuple[MemoryRegion, int, list[MemoryRegion]] | None:
        """The implicit CUDA IPC export of the allocation holding ``view`` (unregistered GPU
        memory on a shm connection), from the export cache: keyed by the allocation's (base,
        bytes) as cuMemGetAddressRange reports them, validated on every use by its
        CU_POINTER_ATTRIBUTE_BUFFER_ID (:mod:`.regcache`), so an allocation freed and another
        made at its address never gets the old export. None (the view is staged; why in
        :meth:`_cuda_ipc_export_off`) where this engine exports nothing for CUDA IPC (an
        automatic engine over rdma), the driver lacks the IPC calls or does not report the
        buffer id, or the memory cannot be exported (managed memory, VMM memory without a
        POSIX fd handle type)."""
        if self._exports_unsupported or not self._exports_device_memory():
            return None
        try:
            base, size, identity = _core.cuda_allocation(view.ptr)
        except RdmaxferError as exc:  # not device memory, or the driver refused
            self._export_off = f"unregistered GPU memory is staged: {exc}"
            return None
        if identity == 0:
            self._export_off = (
                "unregistered GPU memory is staged: this NVIDIA driver does not report "
                "CU_POINTER_ATTRIBUTE_BUFFER_ID, which tells an exported allocation from another "
                "made later at its address; register the memory (engine.register(array)) to move "
                "it by CUDA IPC"
            )
            self._exports_unsupported = True
            return None

        def register() -> MemoryRegion:
            core = self._core.register_device(base, size, LOCAL_WRITE, "cuda_ipc", view.device)
            # No owner: the export must not keep the allocation alive.
            region = MemoryRegion(self, core, None, _NO_BYTES, temporary=True, device=view.device)
            with self._lock:
                self._regions[region.key] = region
                self._ipc_keys.add(region.key)
            return region

        try:
            region = self._exports.acquire_identified((base, size), identity, register)
        except UnsupportedError as exc:  # the driver lacks the IPC calls
            self._export_off = f"unregistered GPU memory is staged: {exc}"
            self._exports_unsupported = True
            return None
        except RegistrationError as exc:  # this memory cannot be exported
            self._export_off = f"unregistered GPU memory at {view.ptr:#x} was staged: {exc}"
            return None
        return region, view.ptr - base, [region]

    def stager(self, device: int) -> _core.Stager:
        """Internal: the staging pipeline for GPU ``device`` (:mod:`rdmaxfer.gpu.staging`; made on
        first use, so host-only programs never load it).

        Raises:
            UnsupportedError: CUDA is not usable here. EndpointClosedError: closed.
        """
        self._check_open()
        with self._lock:
            if self._stagers is None:
                from ..gpu.staging import StagerPool

                self._stagers = StagerPool(self._core)
            stagers = self._stagers
        return stagers.get(device)

    def post_device_send(
        self, endpoint: _core.Endpoint, view: cuda.CudaArray, chunk_size: int, streams: int
    ) -> tuple[_core.Request, list[object], list[MemoryRegion]]:
        """Internal: post the send of the GPU array ``view`` on ``endpoint``: directly when the
        connection reaches it (:meth:`_device_direct`: GPUDirect from its registration, CUDA
        IPC on shm), else staged through the bounce slabs of its device
        (:func:`rdmaxfer.gpu.staging.post_device_send`). Returns the request, the objects that
        must stay alive until it completes and the temporaries to hand back then."""
        from ..gpu.staging import post_device_send

        stager = self.stager(view.device)
        found = self.device_direct(view, endpoint.transport)
        direct, temps = (None, []) if found is None else ((found[0], found[1]), found[2])
        try:
            request = post_device_send(
                stager, endpoint, view, direct, staged_backstop_s(), chunk_size, streams
            )
        except BaseException:
            self.release_temps(temps, CLOSE_TIMEOUT_S, failed=True)
            raise
        return request, [view] if direct is None else [view, direct[0]], temps

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
            self._add_user_region_locked(region, (region.addr, nbytes, bits))
        return region

    def host_region(
        self, arr: npt.NDArray[Any], *, writes: bool
    ) -> tuple[MemoryRegion, int, list[MemoryRegion]]:
        """Internal: the registration holding ``arr`` for a local use (``writes``: a READ or receive
        lands in it): a live user region with the rights that use needs (one of exactly arr's
        range first, else one containing it), else a temporary one of the allocation holding
        arr with no remote access and local write only for a destination, from the registration
        cache (:mod:`.regcache`): (region, byte offset of arr in it, temporaries to hand back
        with :meth:`_release_temps` when the operation is done). O(log n) in the registrations.
        """
        if self._closed or self._pid != _pid:
            self._check_open()
        addr, nbytes = _core.address_of(arr), int(arr.nbytes)
        with self._lock:
            for bits in ACCESS.values():
                hit = self._by_range.get((addr, nbytes, bits))
                if hit is not None and hit.registered and hit.core.local_write >= writes:
                    return hit, 0, []
            found = self._covers["host_lw"].find(addr, nbytes)
            if found is None and not writes:
                found = self._covers["host"].find(addr, nbytes)
        if found is not None and found.registered:
            return found, addr - found.addr, []

        def register(start: int, length: int, hold: object) -> MemoryRegion:
            core = self._core.register(start, length, LOCAL_WRITE if writes else ACCESS["none"])
            temp = MemoryRegion(self, core, hold, _NO_BYTES, temporary=True)
            with self._lock:
                self._regions[temp.key] = temp
            return temp

        temp, offset = self._temps.acquire(arr, writes, register)
        return temp, offset, [temp]

    def release_temps(
        self, temps: list[MemoryRegion], timeout_s: float, *, failed: bool = False
    ) -> None:
        """Internal: hand back the temporaries of a finished operation: cached ones stay registered
        for the next operation on the same memory unless it ``failed``; the rest are
        deregistered."""
        for region in temps:
            cache = self._exports if region.device is not None else self._temps
            if not cache.release(region, keep=not failed):
                with contextlib.suppress(RdmaxferError):
                    region.deregister(timeout_s)

    def deregister_region(self, region: MemoryRegion, timeout_s: float) -> None:
        if not region.temporary and region.device is None:
            self._temps.invalidate(region.host_array())
        key = region.key
        with self._lock:
            self._regions.pop(key, None)
            self._ipc_keys.discard(key)
            indexed = self._range_of.pop(key, None)
            if indexed is not None:
                at, kind = indexed
                self._covers[kind].remove(key)
                if self._by_range.get(at) is region:
                    del self._by_range[at]
            if self._closed and self._core_closed:
                return
        self._core.deregister(region.core, timeout_s)

    _core_closed = False

    def _check_open(self) -> None:
        if self.inherited():
            raise EndpointClosedError(
                f"this Engine was created by process {self._pid} before os.fork(): engines, "
                "endpoints and regions inherited through fork are inert in the child (their "
                "connections, registrations and threads belong to the parent); create a new "
                "Engine in this process"
            )
        if self._closed:
            raise EndpointClosedError("the engine is closed; create a new Engine")

    def inherited(self) -> bool:
        """Internal: true in a child of os.fork(): the engine, its endpoints and regions are the
        parent's and are left alone (no GOODBYE, no deregistration, no QP or socket change)."""
        return self._pid != _pid

    def _close_memory(self) -> None:
        """Close the staging pipelines and the notifications, then deregister every region
        (each wait bounded by CLOSE_TIMEOUT_S); the caller closes the ``_core.Engine``."""
        if self._stagers is not None:
            self._stagers.close()
        self._notifications.close()
        self._temps.clear()
        self._exports.clear()
        with self._lock:
            regions = list(self._regions.values())
        for region in regions:
            with contextlib.suppress(RdmaxferError):
                region.deregister(CLOSE_TIMEOUT_S)
        with self._lock:
            self._core_closed = True


def staged_backstop_s() -> float:
    """The staging pipeline's own inactivity bound, in seconds: a backstop behind
    ``Transfer.wait(timeout)``, which aborts the endpoint when the caller's timeout runs out
    (the pipeline then stops at once)."""
    return max(600.0, 10.0 * resolve_timeout(None))


def _addr(arr: npt.NDArray[Any]) -> int:
    return _core.address_of(arr)  # C-contiguous: no __array_interface__ dict built per call
