"""The registration cache: temporary registrations of unregistered memory, kept for reuse.

A transfer from or into an array that is not registered needs a registration for the length of
the operation. Registering and deregistering on every call costs a system call pair (verbs:
``ibv_reg_mr``/``ibv_dereg_mr``, which pins and unpins every page), so repeated transfers of the
same memory reuse one registration instead, as NCCL's and UCX's registration caches do.

One registration per allocation: an array that is a view of a larger allocation (a slice of an
ndarray, a tensor viewing part of a storage, see :mod:`rdmaxfer.memory.allocation`) gets the
registration of the allocation that holds it, and the operation uses it at the view's offset.
So a batch of 10,000 views of one array costs one registration (one ``ibv_reg_mr``), and so do
later transfers of any view of it. An allocation larger than the byte bound (and than
:data:`WINDOW_BYTES`) is registered in windows of :data:`WINDOW_BYTES` from its start instead:
a view gets the window(s) it touches, so nothing pins a huge allocation whole for a small view.

The rule that keeps a cached registration from ever describing other memory: an entry holds a
*weak* reference to the object that owns the allocation (the root of the array's ``base``
chain: an ndarray, an ``mmap``, a torch storage...). A hit needs that very owner object to be
alive, to be the owner of the array asking and to span the same memory as when the entry was
made. Memory is freed only after its owner dies, so an address freed and reused by another
allocation belongs to another owner and misses; the dead owner's entry (found from its weak
reference, not by a scan) is deregistered at the next cache call. Memory whose owner takes no
weak reference (``bytes``, ``bytearray``) is shared only while operations use it (they keep the
owner alive) and deregistered when the last one ends. An owner that reallocates its own buffer
in place to the same size is outside the rule: do not transfer from such an array while it is
resized.

GPU memory (:meth:`RegistrationCache.acquire_identified`, the implicit CUDA IPC exports of
``MemoryDomain``) has no owner object to watch: an entry is keyed by its allocation's (base,
bytes) and validated on every hit with the allocation's identity, which the caller reads from
the driver each time (CU_POINTER_ATTRIBUTE_BUFFER_ID, never reused in a process, as UCX's
cuda_ipc cache does). An allocation freed and another made at its address has another identity:
the old entry is dropped and a new one made. Such an entry does not keep the memory alive.

Bounds: at most ``max_entries`` entries and ``max_bytes`` bytes (``RDMAXFER_REGCACHE_ENTRIES``,
default 1024, and ``RDMAXFER_REGCACHE_BYTES``, default 1 GiB; 0: nothing is kept once unused);
the least recently used entry not in use by a transfer is deregistered first. Entries in use
are never evicted, so an operation over more memory than the bounds still shares one
registration per allocation while it runs. Entries of an allocation are dropped (deregistered
once unused) when the user registers or deregisters memory of it, when a transfer that used one
fails, and when the engine closes.

Every call costs O(1) dictionary operations (plus the entries it drops): entries by key, by
region key, by owner and by weak reference; the unused ones in an LRU ``OrderedDict``.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy.typing as npt

from .._core import address_of
from ..errors import RdmaxferError
from ..memory.allocation import Allocation, allocation_of, owner_of
from ..memory.region import MemoryRegion
from ..options import declared, env_setting

__all__ = [
    "BYTES_ENV",
    "ENTRIES_ENV",
    "EXPORTS_ENV",
    "WINDOW_BYTES",
    "RegistrationCache",
    "cache_bounds",
    "exports_max",
]

#: The bounds of an engine's cache of temporary host registrations (entries, bytes): these
#: variables, default DEFAULT_MAX_ENTRIES and DEFAULT_MAX_BYTES (a cached registration pins its
#: pages on verbs); 0 keeps nothing once unused.
ENTRIES_ENV = "RDMAXFER_REGCACHE_ENTRIES"
BYTES_ENV = "RDMAXFER_REGCACHE_BYTES"
DEFAULT_MAX_ENTRIES: int = declared(ENTRIES_ENV).default
DEFAULT_MAX_BYTES: int = declared(BYTES_ENV).default

#: An allocation larger than the byte bound and than this is registered in windows of this
#: many bytes from its start (the window(s) a view touches), not whole.
WINDOW_BYTES = 64 << 20

#: The implicit CUDA IPC exports of unregistered GPU allocations an engine keeps (the least
#: recently used beyond it is dropped): this variable, default DEFAULT_MAX_EXPORTS (0: none,
#: such memory is staged). An export by IPC handle holds nothing; one of VMM memory holds its
#: POSIX fd, so the allocation lives until the export is dropped.
EXPORTS_ENV = "RDMAXFER_CUDA_IPC_EXPORTS"
DEFAULT_MAX_EXPORTS: int = declared(EXPORTS_ENV).default


def exports_max() -> int:
    """The implicit CUDA IPC exports an engine keeps: RDMAXFER_CUDA_IPC_EXPORTS, default
    DEFAULT_MAX_EXPORTS; 0 stages unregistered GPU memory on shm connections too.

    Raises:
        InvalidArgumentError: not an integer >= 0.
    """
    return int(env_setting(EXPORTS_ENV))


def cache_bounds() -> tuple[int, int]:
    """(entries, bytes) an engine's cache of temporary host registrations keeps at most:
    RDMAXFER_REGCACHE_ENTRIES (default 1024) and RDMAXFER_REGCACHE_BYTES (default 1 GiB).

    Raises:
        InvalidArgumentError: either is not an integer >= 0.
    """
    return int(env_setting(ENTRIES_ENV)), int(env_setting(BYTES_ENV))


#: A function that registers ``[addr, addr + nbytes)`` as a temporary region; ``hold`` is the
#: object the region must keep alive (None for a cached one, which must not keep its owner
#: alive: the entry lives only as long as the owner does).
Register = Callable[[int, int, object], MemoryRegion]


@dataclass(eq=False)
class _Entry:
    region: MemoryRegion
    key: tuple[int, ...]  # (id(owner), start, bytes) of owned memory; (base, bytes) of GPU memory
    nbytes: int
    writes: bool
    owner: weakref.ref[Any] | None = None  # the owner, for an owner that takes weak references
    held: object = None  # the owner, for one that takes none: the entry lives while in use
    span: tuple[int, int] = (0, 0)  # the owner's (address, bytes) when the entry was made
    identity: int = 0  # GPU memory: the allocation's identity (owner and held are None)
    users: int = 0
    retired: bool = False


class RegistrationCache:
    """Temporary registrations by allocation, validated by their owner's identity.

    ``acquire`` returns a region and counts one user; every ``acquire`` is paired with one
    ``release`` when the operation is done. Thread-safe. ``hits``/``misses`` count look-ups
    (a miss makes one registration); ``replaced`` counts entries dropped because their memory's
    identity changed.
    """

    def __init__(
        self, max_entries: int = DEFAULT_MAX_ENTRIES, max_bytes: int = DEFAULT_MAX_BYTES
    ) -> None:
        self._lock = threading.Lock()
        self._entries: dict[tuple[int, ...], _Entry] = {}  # live entries by key
        self._unused: OrderedDict[tuple[int, ...], _Entry] = OrderedDict()  # live, LRU first
        self._by_region: dict[int, _Entry] = {}  # region key -> entry, retired ones included
        self._by_ref: dict[int, _Entry] = {}  # id(weak reference) -> live entry
        self._by_owner: dict[int, dict[tuple[int, ...], _Entry]] = {}  # id(owner) -> live ones
        self._dead: list[_Entry] = []  # retired and unused: deregistered at the next call
        self._died: list[weakref.ref[Any]] = []  # owners gone (appended by the collector)
        self._bytes = 0
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.hits = 0
        self.misses = 0
        self.replaced = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        """Bytes of memory the live entries register."""
        return self._bytes

    def unit(self, allocation: Allocation, addr: int, nbytes: int) -> tuple[int, int]:
        """(address, bytes) that a temporary registration of ``[addr, addr + nbytes)`` inside
        ``allocation`` covers: the whole allocation, or for one larger than the byte bound and
        than WINDOW_BYTES the windows of WINDOW_BYTES from its start that the range touches."""
        if allocation.nbytes <= max(self.max_bytes, WINDOW_BYTES):
            return allocation.addr, allocation.nbytes
        first = (addr - allocation.addr) // WINDOW_BYTES * WINDOW_BYTES
        last = -(-(addr + nbytes - allocation.addr) // WINDOW_BYTES) * WINDOW_BYTES
        end = min(max(last, first + WINDOW_BYTES), allocation.nbytes)
        return allocation.addr + first, end - first

    def acquire(
        self, arr: npt.NDArray[Any], writes: bool, register: Register
    ) -> tuple[MemoryRegion, int]:
        """A registration holding the C-contiguous host array ``arr`` with local write when
        ``writes``: (region, byte offset of arr in it). The cached one of arr's allocation
        (:meth:`unit`) when its owner is the same live object spanning the same memory, else
        ``register`` makes one. It counts one user: hand it back with :meth:`release`."""
        self._reap()
        allocation = allocation_of(arr)
        addr = address_of(arr)
        start, nbytes = self.unit(allocation, addr, int(arr.nbytes))
        owner = allocation.owner
        span = (allocation.addr, allocation.nbytes)
        key = (id(owner), start, nbytes)
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and _owned_by(entry, owner, span) and entry.region.registered:
                if entry.writes or not writes:
                    self._use_locked(entry)
                    self.hits += 1
                    return entry.region, addr - start
        try:
            ref: weakref.ref[Any] | None = weakref.ref(owner, self._owner_died)
        except TypeError:
            ref = None
        region = register(start, nbytes, None if ref is not None else owner)
        entry = _Entry(region, key, nbytes, writes, ref, None if ref is not None else owner, span)
        self._insert(entry)
        return region, addr - start

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
                    self._use_locked(entry)
                    self.hits += 1
                    return entry.region
                self.replaced += entry.identity != identity
                self._retire_locked(entry)
        region = register()
        self._insert(_Entry(region, key, key[1], True, identity=identity))
        return region

    def release(self, region: MemoryRegion, *, keep: bool = True) -> bool:
        """One user of a cached ``region`` is done (``keep=False``: it failed, so the entry is
        dropped and deregistered once unused); False when the region is not the cache's (the
        caller then deregisters it)."""
        with self._lock:
            entry = self._by_region.get(region.key)
            if entry is None or entry.region is not region:
                return False
            entry.users -= 1
            was_retired = entry.retired
            if not keep or (entry.users == 0 and entry.held is not None):
                self._retire_locked(entry)  # a held owner's entry lives only while in use
            if entry.users == 0:
                if was_retired:
                    self._dead.append(entry)
                elif not entry.retired:
                    self._unused[entry.key] = entry
            self._evict_locked()
        self._reap()
        return True

    def invalidate(self, arr: npt.NDArray[Any]) -> None:
        """Drop every entry of the allocation holding ``arr`` (deregistered once unused)."""
        if not self._by_owner:  # no entry of any owner: nothing to resolve
            return
        owner = owner_of(arr)
        if id(owner) not in self._by_owner:  # a look without the lock: most calls end here
            return
        with self._lock:
            for entry in list(self._by_owner.get(id(owner), {}).values()):
                self._retire_locked(entry)
        self._reap()

    def lookup(self, arr: npt.NDArray[Any]) -> MemoryRegion | None:
        """The live cached registration that :meth:`acquire` would return for ``arr`` (no user
        counted), or None."""
        allocation = allocation_of(arr)
        start, nbytes = self.unit(allocation, address_of(arr), int(arr.nbytes))
        span = (allocation.addr, allocation.nbytes)
        with self._lock:
            entry = self._entries.get((id(allocation.owner), start, nbytes))
        if entry is None or not _owned_by(entry, allocation.owner, span):
            return None
        return entry.region

    def clear(self) -> None:
        """Drop every entry (the engine is closing; it deregisters the regions itself)."""
        with self._lock:
            self._entries.clear()
            self._unused.clear()
            self._by_region.clear()
            self._by_ref.clear()
            self._by_owner.clear()
            self._dead.clear()
            self._bytes = 0

    def _insert(self, entry: _Entry) -> None:
        """Cache a new ``entry`` with its caller as its one user, replacing the one of its key."""
        with self._lock:
            self.misses += 1
            entry.users = 1
            old = self._entries.get(entry.key)
            if old is not None:
                self._retire_locked(old)
            self._entries[entry.key] = entry
            self._by_region[entry.region.key] = entry
            if entry.owner is not None:
                self._by_ref[id(entry.owner)] = entry
            if entry.owner is not None or entry.held is not None:
                self._by_owner.setdefault(entry.key[0], {})[entry.key] = entry
            self._bytes += entry.nbytes
            self._evict_locked()
        self._reap()

    def _use_locked(self, entry: _Entry) -> None:
        if entry.users == 0:
            del self._unused[entry.key]
        entry.users += 1

    def _owner_died(self, ref: weakref.ref[Any]) -> None:
        # Called by the garbage collector, maybe while this thread holds the lock: no lock here.
        self._died.append(ref)

    def _retire_locked(self, entry: _Entry) -> None:
        if entry.retired:
            return
        entry.retired = True
        key = entry.key
        if self._entries.get(key) is entry:
            del self._entries[key]
            self._bytes -= entry.nbytes
        if self._unused.get(key) is entry:
            del self._unused[key]
        if entry.owner is not None and self._by_ref.get(id(entry.owner)) is entry:
            del self._by_ref[id(entry.owner)]
        owned = self._by_owner.get(key[0])
        if owned is not None and owned.get(key) is entry:
            del owned[key]
            if not owned:
                del self._by_owner[key[0]]
        if entry.users == 0:
            self._dead.append(entry)

    def _evict_locked(self) -> None:
        while self._unused and (
            len(self._entries) > self.max_entries or self._bytes > self.max_bytes
        ):
            _, entry = self._unused.popitem(last=False)  # the least recently used
            self._retire_locked(entry)

    def _reap(self) -> None:
        if not self._died and not self._dead:  # nothing to do (most calls): no lock taken
            return
        with self._lock:
            died, self._died = self._died, []
            for ref in died:
                entry = self._by_ref.get(id(ref))
                if entry is not None and entry.owner is ref:
                    self._retire_locked(entry)
            dead, self._dead = self._dead, []
            for entry in dead:
                if self._by_region.get(entry.region.key) is entry:
                    del self._by_region[entry.region.key]
        for entry in dead:
            with contextlib.suppress(RdmaxferError):
                entry.region.deregister()


def _owned_by(entry: _Entry, owner: object, span: tuple[int, int]) -> bool:
    """True when ``entry`` was made for this very live ``owner`` spanning the same memory."""
    alive = entry.owner() if entry.owner is not None else entry.held
    return alive is owner and entry.span == span
