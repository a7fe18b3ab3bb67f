"""Selecting what a pull fetches: tensor names (a list or a predicate), ``np.s_``-style shards
of a tensor (the byte ranges of the server's copy they cover), and the caller's destination
arrays (``into=``), all checked before any byte moves."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from ..errors import InvalidArgumentError
from ..memory.buffer import as_array, device_view
from .format import DTYPES, TensorInfo

__all__ = ["Piece", "Shard", "destination", "select", "shard_of", "shards_for"]

Names = Iterable[str] | Callable[[str], bool]


@dataclass(frozen=True)
class Piece:
    """One contiguous byte range to READ: ``nbytes`` bytes from ``remote_offset`` (in the
    tensor's region) to ``local_offset`` (in the destination array)."""

    local_offset: int
    remote_offset: int
    nbytes: int


@dataclass(frozen=True)
class Shard:
    """What a pull fetches of one tensor: the destination's ``shape`` (the shard's, or the
    tensor's) and the byte ranges, in the destination's C order."""

    tensor: TensorInfo
    shape: tuple[int, ...]
    pieces: tuple[Piece, ...]

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.pieces)


def select(tensors: list[TensorInfo], names: Names | None, address: str) -> list[TensorInfo]:
    """The published tensors that ``names`` (a list of names, or a predicate called with each
    name) selects, in catalog order.

    Raises:
        InvalidArgumentError: a listed name is not published (all such names are given).
    """
    if names is None:
        return tensors
    if callable(names):
        predicate = names
        return [t for t in tensors if predicate(t.name)]
    wanted = [names] if isinstance(names, str) else list(names)
    missing = sorted(set(wanted) - {t.name for t in tensors})
    if missing:
        raise InvalidArgumentError(
            f"tensors {missing} are not published by {address}; "
            f"it has {len(tensors)} tensors (see its catalog)"
        )
    chosen = set(wanted)
    return [t for t in tensors if t.name in chosen]


def _dims(name: str, shape: tuple[int, ...], index: object) -> list[tuple[int, int, int, bool]]:
    """``index`` as one ``(start, count, step, kept)`` per dimension."""
    items = list(index) if isinstance(index, tuple) else [index]
    if sum(item is Ellipsis for item in items) > 1:
        raise InvalidArgumentError(f"shard of tensor {name!r}: more than one Ellipsis")
    if Ellipsis in items:
        at = items.index(Ellipsis)
        items[at : at + 1] = [slice(None)] * (len(shape) - len(items) + 1)
    if len(items) > len(shape):
        raise InvalidArgumentError(
            f"shard {index!r} of tensor {name!r} has {len(items)} indices but the tensor has "
            f"shape {list(shape)}"
        )
    items += [slice(None)] * (len(shape) - len(items))
    dims = []
    for axis, (item, size) in enumerate(zip(items, shape, strict=True)):
        if isinstance(item, slice):
            start, stop, step = item.indices(size)
            if step < 1:
                raise InvalidArgumentError(
                    f"shard {index!r} of tensor {name!r}: axis {axis} has step {step}; only "
                    "positive steps are supported (reverse the array after the pull)"
                )
            dims.append((start, len(range(start, stop, step)), step, True))
        elif isinstance(item, (int, np.integer)) and not isinstance(item, bool):
            at = int(item) + size if int(item) < 0 else int(item)
            if not 0 <= at < size:
                raise InvalidArgumentError(
                    f"shard {index!r} of tensor {name!r}: index {int(item)} is out of range for "
                    f"axis {axis} of size {size} (shape {list(shape)})"
                )
            dims.append((at, 1, 1, False))
        else:
            raise InvalidArgumentError(
                f"shard {index!r} of tensor {name!r}: {item!r} is not a slice, an int or "
                "Ellipsis; use np.s_[...] with slices and ints"
            )
    return dims


def shard_of(tensor: TensorInfo, index: object | None) -> Shard:
    """The byte ranges of ``tensor[index]`` in the server's copy (C order).

    The dimensions after the last one not taken whole are one contiguous block; if that
    dimension has step 1 its whole range joins the block. So a row range is one piece and a
    column block ``[:, a:b]`` is one piece per row.

    Raises:
        InvalidArgumentError: ``index`` is not made of slices (positive step), ints and one
            Ellipsis, or does not fit the tensor's shape (the message names the tensor).
    """
    if index is None:
        return Shard(tensor, tensor.shape, (Piece(0, tensor.offset, tensor.nbytes),))
    shape = tensor.shape
    dims = _dims(tensor.name, shape, index)
    out_shape = tuple(count for _, count, _, kept in dims if kept)
    itemsize = DTYPES[tensor.dtype].itemsize
    if any(count == 0 for _, count, _, _ in dims):
        return Shard(tensor, out_shape, ())
    strides = [int(np.prod(shape[axis + 1 :], dtype=np.int64)) for axis in range(len(shape))]
    split = len(dims)  # dims[split:] are taken whole
    while split > 0 and dims[split - 1][:3] == (0, shape[split - 1], 1):
        split -= 1
    if split == 0:
        return Shard(tensor, out_shape, (Piece(0, tensor.offset, tensor.nbytes),))
    run = strides[split - 1]
    outer = split
    if dims[split - 1][2] == 1:  # a step-1 range of the last partial axis joins the block
        run *= dims[split - 1][1]
        outer = split - 1
    offsets = np.zeros((), dtype=np.int64)
    for axis in range(len(dims)):
        start, count, step, _ = dims[axis]
        if axis < outer:
            idx = start + step * np.arange(count, dtype=np.int64)
        else:
            idx = np.array([start], dtype=np.int64)
        offsets = np.add.outer(offsets, idx * strides[axis])
    starts = offsets.reshape(-1) * itemsize + tensor.offset
    nbytes = run * itemsize
    pieces = tuple(Piece(i * nbytes, int(start), nbytes) for i, start in enumerate(starts))
    return Shard(tensor, out_shape, pieces)


def shards_for(
    chosen: list[TensorInfo],
    into: Mapping[str, object] | None,
    shard: Mapping[str, object] | None,
    source: str,
) -> list[Shard]:
    """What to fetch of each chosen tensor (``source``: the server or file, for messages).

    Raises:
        InvalidArgumentError: ``into`` or ``shard`` names a tensor not chosen, or a shard does
            not fit its tensor.
    """
    names = {t.name for t in chosen}
    for what, given in (("into", into), ("shard", shard)):
        extra = sorted(set(given or ()) - names)
        if extra:
            raise InvalidArgumentError(
                f"{what} names tensors {extra} that this pull does not fetch (not published by "
                f"{source}, or not in names=); fetch them with names= or drop them"
            )
    return [shard_of(t, None if shard is None else shard.get(t.name)) for t in chosen]


def destination(
    shard: Shard, into: Mapping[str, object] | None
) -> tuple[npt.NDArray[Any] | object, bool] | None:
    """The caller's array for ``shard`` from ``into``, checked: ``(array, on_gpu)``, or None
    when ``into`` has none for it (the pull allocates one).

    Raises:
        InvalidArgumentError: the array's dtype or shape differs from the tensor's (or the
            shard's), or it is read-only or not C-contiguous; the message names the tensor.
    """
    if into is None or shard.tensor.name not in into:
        return None
    name = shard.tensor.name
    obj = into[name]
    what = f"destination of tensor {name!r}"
    view = device_view(obj, writable=True, what=what)
    dtype, shape = (view.dtype, view.shape) if view is not None else (None, None)
    if view is None:
        arr = as_array(obj, writable=True, what=what)
        dtype, shape, obj = arr.dtype, arr.shape, arr
    want = DTYPES[shard.tensor.dtype]
    if dtype != want or tuple(shape or ()) != shard.shape:
        raise InvalidArgumentError(
            f"into[{name!r}] has dtype {dtype} and shape {list(shape or ())}, but tensor "
            f"{name!r}{'' if shard.shape == shard.tensor.shape else ' (this shard of it)'} is "
            f"{want} of shape {list(shard.shape)}; pass an array of that dtype and shape"
        )
    return obj, view is not None
