"""Versions of the published tensors: each version is a :class:`Slot` (registered regions, the
tensors' places in them, the encoded catalog). Pulls lease the current slot from the catalog
request to their "done"; :class:`Versions` writes a new version only into a slot no pull
holds (double buffering: at most two server-owned slots besides the first version), so a pull
reads exactly one version, never a mix."""

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

__all__ = ["OWNED_SLOTS", "Slot", "Versions"]

OWNED_SLOTS = 2
"""Server-owned buffers updates are written into, in turn (double buffering)."""
ALIGN = 64


@dataclass
class Slot:
    """One published version: its regions, tensors, the catalog naming them, and how many
    pulls hold it (``leases``). ``buffer`` is the server-owned memory an update may rewrite
    (None for the first version, which is the source itself)."""

    version: int
    regions: list[MemoryRegion]
    tensors: dict[str, TensorInfo]
    header: bytes | None
    buffer: npt.NDArray[np.uint8] | None = None
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

    def view(self, name: str) -> npt.NDArray[Any]:
        """A server-owned slot's tensor as an array (its dtype and shape)."""
        assert self.buffer is not None
        t = self.tensors[name]
        raw = self.buffer[t.offset : t.offset + t.nbytes]
        return raw.view(DTYPES[t.dtype]).reshape(t.shape)


def _layout(tensors: Mapping[str, TensorInfo]) -> tuple[dict[str, TensorInfo], int]:
    """The tensors laid out in one region, each at a 64-byte aligned offset."""
    placed: dict[str, TensorInfo] = {}
    offset = 0
    for t in tensors.values():
        placed[t.name] = TensorInfo(t.name, t.dtype, t.shape, 0, offset)
        offset += -(-t.nbytes // ALIGN) * ALIGN
    return placed, offset


class Versions:
    """The slots of a :class:`~rdmaxfer.weights.WeightServer` and its current version.

    Args:
        first: the first version (version 1), the published source.
        source_bytes: ``source_bytes(name, out)`` copies the first version's tensor ``name``
            into the host array ``out`` (for partial updates).
        register: registers a server-owned buffer for remote READ.
    """

    def __init__(
        self,
        first: Slot,
        source_bytes: Callable[[str, npt.NDArray[Any]], None],
        register: Callable[[npt.NDArray[np.uint8]], MemoryRegion],
    ) -> None:
        first.publish(1)
        self._first = first
        self._current = first
        self._owned: list[Slot] = []
        self._source_bytes = source_bytes
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
                out = slot.view(name)
                arr, view = checked.get(name, (None, None))
                if view is not None:
                    cuda.copy_to_host(view, out)
                elif arr is not None:
                    np.copyto(out, arr)
                elif previous.buffer is not None:
                    np.copyto(out, previous.view(name))
                else:
                    self._source_bytes(name, out)
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
        tensors, size = _layout(self._first.tensors)
        size = max(size, ALIGN)  # a region is never empty
        raw = np.empty(size + ALIGN, dtype=np.uint8)
        shift = -raw.ctypes.data % ALIGN
        buffer = raw[shift : shift + size]
        slot = Slot(0, [self._register(buffer)], tensors, None, buffer)
        with self._cond:
            self._owned.append(slot)
        return slot

    def regions(self) -> list[MemoryRegion]:
        """Every registered region of every slot (to close)."""
        return [r for s in [self._first, *self._owned] for r in s.regions]
