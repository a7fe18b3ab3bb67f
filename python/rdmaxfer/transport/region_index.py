"""Which registration contains a range: an index of address ranges answering in O(log n).

:class:`CoverIndex` holds ranges ``[start, end)`` (registrations, which may nest or overlap)
and answers "one range that contains ``[addr, addr + nbytes)``". It keeps the *maximal* ranges
(none inside another) sorted by start; ordered by start, such ranges are ordered by end too, so
the one with the greatest start at or before ``addr`` has the greatest end of all that start
there, and it contains the query exactly when any range does. A range inside a kept one waits
under it and is placed again when that one is removed. The starts are kept in a blocked sorted
list (:class:`SortedInts`, the layout of ``sortedcontainers``): insert, remove and find take a
binary search over the blocks and one within a block of at most ``2 * SortedInts.LOAD``.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = ["CoverIndex", "SortedInts"]

T = TypeVar("T")


class SortedInts:
    """A sorted set of ints in blocks of ``LOAD`` to ``2 * LOAD`` (a block is split when it
    grows past that, dropped when empty), with each block's greatest value in ``_maxes``."""

    LOAD = 512

    def __init__(self) -> None:
        self._blocks: list[list[int]] = []
        self._maxes: list[int] = []
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def add(self, value: int) -> None:
        """Insert ``value`` (not present)."""
        maxes = self._maxes
        if not maxes:
            self._blocks.append([value])
            maxes.append(value)
        else:
            k = bisect_left(maxes, value)
            if k == len(maxes):
                k -= 1
            block = self._blocks[k]
            insort(block, value)
            maxes[k] = block[-1]
            if len(block) > 2 * self.LOAD:
                self._blocks.insert(k + 1, block[self.LOAD :])
                del block[self.LOAD :]
                maxes.insert(k, block[-1])
        self._len += 1

    def remove(self, value: int) -> None:
        """Remove ``value`` (present)."""
        k = bisect_left(self._maxes, value)
        block = self._blocks[k]
        del block[bisect_left(block, value)]
        if block:
            self._maxes[k] = block[-1]
        else:
            del self._blocks[k]
            del self._maxes[k]
        self._len -= 1

    def at_most(self, value: int) -> int | None:
        """The greatest element <= ``value``, or None."""
        k = bisect_right(self._maxes, value)
        if k < len(self._maxes):
            block = self._blocks[k]
            at = bisect_right(block, value)
            if at:
                return block[at - 1]
        return self._maxes[k - 1] if k else None

    def around(self, value: int) -> tuple[int | None, int | None]:
        """(:meth:`at_most` ``value``, :meth:`above` ``value``) from one search."""
        maxes = self._maxes
        k = bisect_right(maxes, value)
        if k == len(maxes):
            return (maxes[k - 1] if k else None), None
        block = self._blocks[k]
        at = bisect_right(block, value)
        below = block[at - 1] if at else (maxes[k - 1] if k else None)
        return below, block[at]

    def above(self, value: int) -> int | None:
        """The least element > ``value``, or None."""
        k = bisect_right(self._maxes, value)
        if k == len(self._maxes):
            return None
        block = self._blocks[k]
        return block[bisect_right(block, value)]


@dataclass(eq=False, slots=True)
class _Node(Generic[T]):
    key: int
    start: int
    end: int
    item: T
    parent: _Node[T] | None = None
    inner: dict[int, _Node[T]] | None = None  # ranges inside this one (made with the first)

    def hold(self, child: _Node[T]) -> None:
        """Keep ``child`` (a range inside this one) under this one."""
        child.parent = self
        if self.inner is None:
            self.inner = {}
        self.inner[child.key] = child


class CoverIndex(Generic[T]):
    """Ranges by key (an int unique per range) with the item each names. Not thread-safe: the
    caller holds its own lock."""

    def __init__(self) -> None:
        self._starts = SortedInts()  # of the maximal ranges
        self._top: dict[int, _Node[T]] = {}  # start -> maximal range
        self._nodes: dict[int, _Node[T]] = {}

    def __len__(self) -> int:
        return len(self._nodes)

    def add(self, key: int, start: int, nbytes: int, item: T) -> None:
        """Index ``item`` as the range ``[start, start + nbytes)`` under ``key`` (a key already
        indexed is replaced)."""
        if key in self._nodes:
            self.remove(key)
        node = _Node(key, start, start + nbytes, item)
        self._nodes[key] = node
        self._place(node)

    def remove(self, key: int) -> None:
        """Drop the range of ``key`` (nothing when it is not indexed)."""
        node = self._nodes.pop(key, None)
        if node is None:
            return
        parent = node.parent
        inner = node.inner.values() if node.inner is not None else ()
        if parent is not None:
            assert parent.inner is not None
            del parent.inner[key]
            for child in inner:
                parent.hold(child)
            return
        del self._top[node.start]
        self._starts.remove(node.start)
        for child in inner:
            child.parent = None
            self._place(child)

    def find(self, addr: int, nbytes: int) -> T | None:
        """The item of a range containing ``[addr, addr + nbytes)``, or None."""
        start = self._starts.at_most(addr)
        if start is None:
            return None
        node = self._top[start]
        return node.item if addr + nbytes <= node.end else None

    def _place(self, node: _Node[T]) -> None:
        start, after = self._starts.around(node.start)
        if start is not None:
            before = self._top[start]
            if before.end >= node.end:  # inside a kept range: wait under it
                before.hold(node)
                return
            if start == node.start:  # same start, shorter: it is inside this one
                self._absorb(node, before)
        while after is not None:  # kept ranges inside this one (a run: their ends increase)
            other = self._top[after]
            if other.end > node.end:
                break
            self._absorb(node, other)
            after = self._starts.above(after)
        self._top[node.start] = node
        self._starts.add(node.start)

    def _absorb(self, node: _Node[T], other: _Node[T]) -> None:
        """Move the kept range ``other`` (inside ``node``) under ``node``."""
        del self._top[other.start]
        self._starts.remove(other.start)
        node.hold(other)
