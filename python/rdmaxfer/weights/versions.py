"""Versions of the published tensors: each version is a :class:`Slot` (registered regions, the
tensors' places in them, the encoded catalog). Every version lives in memory the server owns:
the first one is a copy of the source made when it is published (a file read into memory, a
dict of arrays copied), the later ones are copies into one of two server-owned buffers
(double buffering). Pulls lease the current slot from the catalog request to their "done";
:class:`Versions` writes a new version only into a slot no pull holds and never rewrites the
first one, so a pull reads exactly the version it reports: never a mix of versions, and never
bytes the publisher wrote into its own arrays (or a file) after publishing them."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from ..errors import InvalidArgumentError, TransferTimeoutError
from ..memory import cuda
from ..memory.buffer import as_array, device_view
from ..memory.region import MemoryRegion
from .format import DTYPES, PROTOCOL_VERSION, TensorInfo, encode
from .snapshot import layout, owned_buffer, tensor_view

__all__ = ["OWNED_SLOTS", "Slot", "Versions"]

OWNED_SLOTS = 2
"""Server-owned buffers updates are written into, in turn (double buffering)."""


@dataclass
class Slot:
    """One published version: its regions, tensors, the catalog naming them, and how many
    pulls hold it (``leases``). ``arrays`` holds each tensor's server-owned storage: a host
    array (a view into the slot's registered memory) or, for a GPU tensor of the first
    version that peers READ by GPUDirect RDMA, a GPU array."""

    version: int
    regions: list[MemoryRegion]
    tensors: dict[str, TensorInfo]
    header: bytes | None
    arrays: dict[str, npt.NDArray[Any] | cuda.CudaArray] = field(default_factory=dict)
    leases: int = 0
    catalog: npt.NDArray[np.uint8] = field(default_factory=lambda: np.empty(0, np.uint8))

    def publish(self, version: int) -> None:
        self.version = version
        self.catalog = encode(
            {
                "v": PROTOCOL_VERSION,
                "version": version,
                "regions": [r.descriptor().pack().hex() for r in self.regions],
                "header": None if self.header is None else self.header.hex(),
                "tensors": {
                    t.name: {
                        "dtype": t.dtype,
                        "shape": list(t.shape),
                        "region": t.region,
                        "offset": t.offset,
                    }
                    for t in self.tensors.values()
                },
            }
        )

    def host(self, name: str) -> npt.NDArray[Any]:
        """The slot's host storage of tensor ``name`` (its dtype and shape), to write into."""
        arr = self.arrays[name]
        assert isinstance(arr, np.ndarray)
        return arr

    def read(self, name: str, out: npt.NDArray[Any]) -> None:
        """Copy the slot's tensor ``name`` into the host array ``out`` (its dtype and shape)."""
        arr = self.arrays[name]
        if isinstance(arr, cuda.CudaArray):
            cuda.copy_to_host(arr, out)
        else:
            np.copyto(out, arr)


class Versions:
    """The slots of a :class:`~rdmaxfer.weights.WeightServer` and its current version.

    Args:
        first: the first version (version 1): the server's copy of the published source.
        register: registers a server-owned buffer for remote READ.
    """

    def __init__(
        self,
        first: Slot,
        register: Callable[[npt.NDArray[np.uint8]], MemoryRegion],
    ) -> None:
        first.publish(1)
        self._first = first
        self._current = first
        self._owned: list[Slot] = []
        self._register = register
        self._cond = threading.Condition()
        self._update_lock = threading.Lock()

    @property
    def current(self) -> Slot:
        return self._current

    @property
    def version(self) -> int:
        return self._current.version

    def lease(self, min_version: int, wait_s: float) -> Slot:
        """Hold the current slot for a pull (call :meth:`release` when it is done), waiting
        up to ``wait_s`` seconds for version ``min_version`` (the current one is leased either
        way: the client sees its number)."""
        end = time.monotonic() + wait_s
        with self._cond:
            while self._current.version < min_version:
                left = end - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            slot = self._current
            slot.leases += 1
            return slot

    def release(self, slot: Slot) -> None:
        with self._cond:
            slot.leases -= 1
            self._cond.notify_all()

    def check(self, new: Mapping[str, Any]) -> dict[str, tuple[npt.NDArray[Any] | None, Any]]:
        """``new``'s arrays checked against the published tensors: name -> (host array or
        None, GPU view or None).

        Raises:
            InvalidArgumentError: an unknown name, or a dtype/shape that differs (naming the
                tensor and both).
        """
        tensors = self._first.tensors
        unknown = sorted(set(new) - set(tensors))
        if unknown:
            raise InvalidArgumentError(
                f"update names tensors {unknown} that are not published; the server publishes "
                f"{len(tensors)} tensors and an update keeps that set"
            )
        checked: dict[str, tuple[npt.NDArray[Any] | None, Any]] = {}
        for name, obj in new.items():
            what = f"new value of tensor {name!r}"
            view = (
                obj
                if isinstance(obj, cuda.CudaArray)
                else device_view(obj, writable=False, what=what)
            )
            arr = None
            if view is None:
                arr = as_array(obj, writable=False, what=what)
                dtype, shape = arr.dtype, arr.shape
            else:
                dtype, shape = view.dtype, view.shape
            t = tensors[name]
            if dtype != DTYPES[t.dtype] or tuple(shape) != t.shape:
                raise InvalidArgumentError(
                    f"the {what} is {dtype} of shape {list(shape)}, but tensor {name!r} is "
                    f"published as {DTYPES[t.dtype]} of shape {list(t.shape)}; an update keeps "
                    "every tensor's dtype and shape"
                )
            checked[name] = (arr, view)
        return checked

    def update(self, new: Mapping[str, Any], timeout: float) -> int:
        """Publish a new version: ``new``'s tensors, the others as in the current version.

        Raises:
            InvalidArgumentError: see :meth:`check` (nothing is published).
            TransferTimeoutError: every server-owned buffer stayed held by pulls of older
                versions for ``timeout`` seconds (nothing is published).
        """
        checked = self.check(new)
        with self._update_lock:
            slot = self._free_slot(timeout)
            previous = self._current
            for name in slot.tensors:
                out = slot.host(name)
                arr, view = checked.get(name, (None, None))
                if view is not None:
                    cuda.copy_to_host(view, out)
                elif arr is not None:
                    np.copyto(out, arr)
                else:
                    previous.read(name, out)
            with self._cond:
                slot.publish(previous.version + 1)
                self._current = slot
                self._cond.notify_all()
            return slot.version

    def _free_slot(self, timeout: float) -> Slot:
        end = time.monotonic() + timeout
        with self._cond:
            while True:
                for slot in self._owned:
                    if slot is not self._current and slot.leases == 0:
                        return slot
                if len(self._owned) < OWNED_SLOTS:
                    break
                left = end - time.monotonic()
                if left <= 0:
                    held = [(s.version, s.leases) for s in self._owned if s is not self._current]
                    raise TransferTimeoutError(
                        f"update: no buffer free within {timeout:g} s: pulls still hold the "
                        f"older versions (version, pulls) {held}; pull clients must finish "
                        "(or time out) before a buffer is rewritten"
                    )
                self._cond.wait(left)
        tensors, size = layout(self._first.tensors.values(), 0)
        buffer = owned_buffer(size)
        arrays = {t.name: tensor_view(buffer, t) for t in tensors.values()}
        slot = Slot(0, [self._register(buffer)], tensors, None, dict(arrays))
        with self._cond:
            self._owned.append(slot)
        return slot

    def regions(self) -> list[MemoryRegion]:
        """Every registered region of every slot (to close)."""
        return [r for s in [self._first, *self._owned] for r in s.regions]
