"""The registration cache: temporary registrations of unregistered memory, kept for reuse.

A transfer from or into an array that is not registered needs a registration for the length of
the operation. Registering and deregistering on every call costs a system call pair (verbs:
``ibv_reg_mr``/``ibv_dereg_mr``, which pins and unpins every page), so repeated transfers of the
same array reuse one registration instead, as NCCL's and UCX's registration caches do.

The rule that keeps a cached registration from ever describing other memory: an entry is keyed
by (address, bytes) and holds a *weak* reference to the object that owns the memory (the root of
the array's ``base`` chain: an ndarray, an ``mmap``...). A hit needs that very owner object to
be alive and to be the owner of the array asking. Memory is freed only after its owner dies, so
an address freed and reused by another allocation belongs to another owner and misses; the dead
owner's entry is deregistered at the next cache call. Memory whose owner takes no weak reference
(``bytes``, ``bytearray``) is not cached: it gets a temporary registration per operation. An
owner that reallocates its own buffer in place (``ndarray.resize(refcheck=False)``) is outside
the rule: do not transfer from such an array while it is resized.

GPU memory (:meth:`RegistrationCache.acquire_identified`, the implicit CUDA IPC exports of
``MemoryDomain``) has no owner object to watch: an entry is keyed by its allocation's (base,
bytes) and validated on every hit with the allocation's identity, which the caller reads from
the driver each time (CU_POINTER_ATTRIBUTE_BUFFER_ID, never reused in a process, as UCX's
cuda_ipc cache does). An allocation freed and another made at its address has another identity:
the old entry is dropped and a new one made. Such an entry does not keep the memory alive.

Bounds: at most ``max_entries`` entries and ``max_bytes`` bytes (0: nothing is kept); the least
recently used entry not in use by a transfer is deregistered first. Entries are dropped
(deregistered once unused) when a user registration of overlapping memory is made or ended, when
a transfer that used one fails, and when the engine closes.
"""

from __future__ import annotations

import contextlib
import os
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy.typing as npt

from ..errors import InvalidArgumentError, RdmaxferError
from ..memory.region import MemoryRegion

__all__ = ["EXPORTS_ENV", "RegistrationCache", "exports_max", "memory_owner"]

#: Default bounds (entries, bytes); a cached registration pins its pages on verbs.
DEFAULT_MAX_ENTRIES = 64
DEFAULT_MAX_BYTES = 1 << 30

#: The implicit CUDA IPC exports of unregistered GPU allocations an engine keeps (the least
#: recently used beyond it is dropped): this variable, default DEFAULT_MAX_EXPORTS (0: none,
#: such memory is staged). An export by IPC handle holds nothing; one of VMM memory holds its
#: POSIX fd, so the allocation lives until the export is dropped.
EXPORTS_ENV = "RDMAXFER_CUDA_IPC_EXPORTS"
DEFAULT_MAX_EXPORTS = 64


def exports_max() -> int:
    """The implicit CUDA IPC exports an engine keeps: RDMAXFER_CUDA_IPC_EXPORTS, default
    DEFAULT_MAX_EXPORTS; 0 stages unregistered GPU memory on shm connections too.

    Raises:
        InvalidArgumentError: not an integer >= 0.
    """
    raw = os.environ.get(EXPORTS_ENV, "").strip()
    if not raw:
        return DEFAULT_MAX_EXPORTS
    if not raw.isdigit():
        raise InvalidArgumentError(
            f"{EXPORTS_ENV}={raw!r} must be an integer >= 0 (the CUDA IPC exports of unregistered "
            f"GPU memory an engine keeps, default {DEFAULT_MAX_EXPORTS}; 0: stage such memory)"
        )
    return int(raw)


def memory_owner(arr: npt.NDArray[Any]) -> object:
    """The object at the root of ``arr``'s ``base`` chain (through memoryviews to the object
    they view): the one whose death frees the memory."""
    owner: object = arr
    while True:
        base = owner.obj if isinstance(owner, memoryview) else getattr(owner, "base", None)
        if base is None or base is owner:
            return owner
        owner = base


@dataclass(eq=False)
class _Entry:
    region: MemoryRegion
    owner: weakref.ref[Any] | None  # None: validated by ``identity`` instead
    writes: bool
    identity: int = 0
    users: int = 0
    retired: bool = False
    key: tuple[int, int] = field(default=(0, 0))


class RegistrationCache:
    """Temporary registrations by (address, bytes), validated by their owner's identity.

    ``acquire`` returns a region and counts one user; every ``acquire`` is paired with one
    ``release`` when the operation is done. Thread-safe.
    """

    def __init__(
        self, max_entries: int = DEFAULT_MAX_ENTRIES, max_bytes: int = DEFAULT_MAX_BYTES
    ) -> None:
        self._lock = threading.Lock()
        self._entries: OrderedDict[tuple[int, int], _Entry] = OrderedDict()
        self._by_key: dict[int, _Entry] = {}  # region key -> entry, retired ones included
        self._dead: list[_Entry] = []  # retired and unused: deregistered at the next call
        self._died: list[weakref.ref[Any]] = []  # owners gone (appended by the collector)
        self._bytes = 0
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.hits = 0
        self.misses = 0
        self.replaced = 0  # entries dropped because their memory's identity changed

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        """Bytes of memory the live entries register."""
        return self._bytes

    def acquire(
        self,
        arr: npt.NDArray[Any],
        addr: int,
        writes: bool,
        register: Callable[[bool], MemoryRegion],
    ) -> tuple[MemoryRegion, bool]:
        """A registration of ``[addr, addr + arr.nbytes)`` with local write when ``writes``:
        (region, cached). ``register(cached)`` makes a new one; a cached region must not keep
        the memory's owner alive (the entry lives only as long as the owner does). A region
        that is not cached (its owner takes no weak reference) is the caller's to deregister;
        a cached one goes back with :meth:`release`."""
        self._reap()
        owner = memory_owner(arr)
        key = (addr, int(arr.nbytes))
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and self._valid(entry, owner, writes):
                entry.users += 1
                self._entries.move_to_end(key)
                self.hits += 1
                return entry.region, True
        try:
            ref = weakref.ref(owner, self._owner_died)
        except TypeError:
            return register(False), False
        region = register(True)
        self._insert(_Entry(region, ref, writes, users=1, key=key))
        return region, True

    def acquire_identified(
        self, key: tuple[int, int], identity: int, register: Callable[[], MemoryRegion]
    ) -> MemoryRegion:
        """A registration of the memory ``key`` = (address, bytes) whose identity the caller
        read just now (non-zero): the cached one when it was made for that same identity, else
        ``register()`` makes a new one (the old entry is dropped, deregistered once unused).
        It counts one user: hand it back with :meth:`release`."""
        self._reap()
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                if entry.identity == identity and entry.region.registered:
                    entry.users += 1
                    self._entries.move_to_end(key)
                    self.hits += 1
                    return entry.region
                self.replaced += entry.identity != identity
                self._retire_locked(entry)
        region = register()
        self._insert(_Entry(region, None, True, identity=identity, users=1, key=key))
        return region

    def _insert(self, entry: _Entry) -> None:
        """Cache a new ``entry`` (in use by its caller), replacing the one of its key."""
        with self._lock:
            self.misses += 1
            old = self._entries.get(entry.key)
            if old is not None:
                self._retire_locked(old)
            self._entries[entry.key] = entry
            self._by_key[entry.region.key] = entry
            self._bytes += entry.key[1]
            self._evict_locked()
        self._reap()

    def release(self, region: MemoryRegion, *, keep: bool = True) -> bool:
        """One user of a cached ``region`` is done (``keep=False``: it failed, so the entry is
        dropped and deregistered once unused); False when the region is not the cache's (the
        caller then deregisters it)."""
        with self._lock:
            entry = self._by_key.get(region.key)
            if entry is None or entry.region is not region:
                return False
            entry.users -= 1
            if not keep:
                self._retire_locked(entry)
            elif entry.retired and entry.users == 0:
                self._dead.append(entry)
            self._evict_locked()
        self._reap()
        return True

    def invalidate(self, addr: int, nbytes: int) -> None:
        """Drop every entry overlapping ``[addr, addr + nbytes)`` (deregistered once unused)."""
        with self._lock:
            for entry in list(self._entries.values()):
                start, length = entry.key
                if start < addr + nbytes and addr < start + length:
                    self._retire_locked(entry)
        self._reap()

    def clear(self) -> None:
        """Drop every entry (the engine is closing; it deregisters the regions itself)."""
        with self._lock:
            self._entries.clear()
            self._by_key.clear()
            self._dead.clear()
            self._bytes = 0

    @staticmethod
    def _valid(entry: _Entry, owner: object, writes: bool) -> bool:
        return (
            entry.owner is not None
            and entry.owner() is owner
            and (entry.writes or not writes)
            and entry.region.registered
        )

    def _owner_died(self, ref: weakref.ref[Any]) -> None:
        # Called by the garbage collector, maybe while this thread holds the lock: no lock here.
        self._died.append(ref)

    def _retire_locked(self, entry: _Entry) -> None:
        if entry.retired:
            return
        entry.retired = True
        if self._entries.get(entry.key) is entry:
            del self._entries[entry.key]
            self._bytes -= entry.key[1]
        if entry.users == 0:
            self._dead.append(entry)

    def _evict_locked(self) -> None:
        if len(self._entries) <= self.max_entries and self._bytes <= self.max_bytes:
            return
        for entry in list(self._entries.values()):  # least recently used first
            if len(self._entries) <= self.max_entries and self._bytes <= self.max_bytes:
                return
            if entry.users == 0:
                self._retire_locked(entry)

    def _reap(self) -> None:
        if not self._died and not self._dead:  # nothing to do (most calls): no lock taken
            return
        with self._lock:
            died, self._died = self._died, []
            for entry in list(self._entries.values()):
                if any(entry.owner is ref for ref in died):
                    self._retire_locked(entry)
            dead, self._dead = self._dead, []
            for entry in dead:
                if self._by_key.get(entry.region.key) is entry:
                    del self._by_key[entry.region.key]
        for entry in dead:
            with contextlib.suppress(RdmaxferError):
                entry.region.deregister()
