"""The allocation that holds an array's memory: its owner object and its address range.

A transfer of an array that is a view (a slice of a larger ndarray, a tensor viewing part of a
storage, a slice of an ``mmap``) registers the memory of the *allocation* that holds it, so that
every view of one allocation shares one registration (``Engine``'s registration cache, as Ray
registers per PyTorch storage and NCCL per ``cuMemGetAddressRange`` allocation). What counts as
the allocation of a host array (:func:`allocation_of`):

* the root of the array's ``base`` chain (through memoryviews to the object they view): a
  NumPy array owning its data, an ``mmap``, a ``ctypes`` array, ``bytes``... Its whole buffer
  (``memoryview(root)``) is the allocation;
* a PyTorch tensor (viewed through DLPack): its storage, ``untyped_storage()``, from
  ``data_ptr()`` for ``nbytes()`` bytes; the storage object is the owner;
* any other DLPack producer: the producer object, from the ``DLTensor``'s data pointer (before
  its ``byte_offset``) to the end of the view.

When the root's buffer does not contain the array (an owner that does not expose its whole
memory), the allocation is the array's own range. GPU memory is resolved by the driver instead
(``cuMemGetAddressRange``, see ``rdmaxfer.transport.domain``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from .. import _core

__all__ = ["Allocation", "allocation_of", "memory_owner", "owner_of", "torch_storage"]


@dataclass(frozen=True)
class Allocation:
    """An allocation: ``owner`` is the object whose death frees the memory (its identity tells
    this allocation from a later one at the same address), ``addr`` its first byte, ``nbytes``
    its size in bytes."""

    owner: object
    addr: int
    nbytes: int

    def contains(self, addr: int, nbytes: int) -> bool:
        """True when ``[addr, addr + nbytes)`` lies inside the allocation."""
        return self.addr <= addr and addr + nbytes <= self.addr + self.nbytes


def memory_owner(arr: npt.NDArray[Any]) -> object:
    """The object at the root of ``arr``'s ``base`` chain (through memoryviews to the object
    they view): the one whose death frees the memory."""
    owner: object = arr
    while True:
        base = owner.obj if isinstance(owner, memoryview) else getattr(owner, "base", None)
        if base is None or base is owner:
            return owner
        owner = base


def allocation_of(arr: npt.NDArray[Any]) -> Allocation:
    """The allocation holding the C-contiguous host array ``arr`` (see the module docstring)."""
    root = memory_owner(arr)
    addr, nbytes = _core.address_of(arr), int(arr.nbytes)
    found = _root_allocation(root)
    if found is None or not found.contains(addr, nbytes):
        return Allocation(root, addr, nbytes)
    return found


def owner_of(arr: npt.NDArray[Any]) -> object:
    """``allocation_of(arr).owner``, without building the Allocation when the root of arr's
    base chain owns the memory itself (anything but a DLPack producer's stand-in)."""
    root = memory_owner(arr)
    if getattr(root, "rdmaxfer_allocation", None) is None:
        return root
    return allocation_of(arr).owner


def _root_allocation(root: object) -> Allocation | None:
    if isinstance(root, np.ndarray):
        if not (root.flags.c_contiguous or root.flags.f_contiguous):
            return None
        return Allocation(root, _core.address_of(root), int(root.nbytes))
    resolve = getattr(root, "rdmaxfer_allocation", None)  # dlpack._Owner
    if resolve is not None:
        found: Allocation = resolve()
        return found
    try:
        view = memoryview(root)  # type: ignore[arg-type]
    except TypeError:
        return None
    with view:
        if not view.contiguous:
            return None
        return Allocation(root, _core.address_of(view), view.nbytes)


def torch_storage(producer: object) -> Allocation | None:
    """The storage of a PyTorch CPU tensor as an allocation (None for anything else)."""
    if not type(producer).__module__.startswith("torch"):
        return None
    storage = getattr(producer, "untyped_storage", None)
    if storage is None:
        return None
    found = storage()
    return Allocation(found, int(found.data_ptr()), int(found.nbytes()))
