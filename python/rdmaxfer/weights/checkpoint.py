"""A safetensors checkpoint on local disk: its files (one ``.safetensors`` file, or the shards
``model-0000K-of-0000N.safetensors`` that an index ``model.safetensors.index.json`` maps each
tensor to), each file's header checked against the file's size before any tensor is read.

Layout of a file: an 8-byte little-endian header size ``n``, ``n`` bytes of JSON ``{name:
{"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, "__metadata__": {...}}``, then
the data; offsets count from the data's first byte.
"""

from __future__ import annotations

import itertools
import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import CorruptFileError, InvalidArgumentError
from .format import DTYPES, TensorInfo

__all__ = ["CheckpointFile", "open_checkpoint"]

#: Headers larger than this are refused as corrupt (the safetensors library's own bound).
MAX_HEADER = 100_000_000
INDEX_SUFFIX = ".safetensors.index.json"


@dataclass(frozen=True)
class CheckpointFile:
    """One file of a checkpoint: ``path``, its ``size`` in bytes when its header was read,
    ``header_raw`` (size prefix and JSON), ``tensors`` (``TensorInfo.region`` is the file's
    index in the checkpoint, ``offset`` the tensor's first byte in the file) and ``stamp``
    (inode, size, mtime and ctime in ns), what a reader checks the file against."""

    path: Path
    size: int
    header_raw: bytes
    tensors: tuple[TensorInfo, ...]
    stamp: tuple[int, int, int, int]


def file_stamp(st: os.stat_result) -> tuple[int, int, int, int]:
    """What identifies one version of a file: inode, size, mtime and ctime (ns)."""
    return st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def open_checkpoint(path: str | os.PathLike[str]) -> list[CheckpointFile]:
    """The files of the checkpoint at ``path``: a ``.safetensors`` file, an index JSON, or a
    folder holding ``model.safetensors`` or ``model.safetensors.index.json``.

    Raises:
        InvalidArgumentError: ``path`` is none of those, the index is malformed, names a
            missing file, or a tensor the index maps to a file lacks it (or two files hold it).
        CorruptFileError: a file is truncated or its header is corrupt (file, tensor, offset).
    """
    p = Path(path)
    if p.is_dir():
        for candidate in (p / "model.safetensors", p / f"model{INDEX_SUFFIX}"):
            if candidate.exists():
                return open_checkpoint(candidate)
        raise InvalidArgumentError(
            f"{str(p)!r} holds neither model.safetensors nor model{INDEX_SUFFIX}; pass the "
            "file or the index"
        )
    if p.name.endswith(INDEX_SUFFIX):
        return _from_index(p)
    return [read_file(p, 0)]


def _from_index(index: Path) -> list[CheckpointFile]:
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
        if not isinstance(weight_map, dict):
            raise TypeError("weight_map is not an object")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InvalidArgumentError(
            f"{str(index)!r} is not a safetensors index ({exc!r}); pass a "
            f"*{INDEX_SUFFIX} with a weight_map"
        ) from exc
    names = sorted(set(weight_map.values()))
    files = [read_file(index.parent / name, i) for i, name in enumerate(names)]
    where: dict[str, int] = {}
    for f in files:
        for t in f.tensors:
            if t.name in where:
                raise InvalidArgumentError(
                    f"tensor {t.name!r} is in both {str(files[where[t.name]].path)!r} and "
                    f"{str(f.path)!r}; a checkpoint holds each tensor once"
                )
            where[t.name] = t.region
    for name, file_name in weight_map.items():
        held = where.get(name)
        if held is None or files[held].path.name != file_name:
            raise InvalidArgumentError(
                f"{str(index)!r} maps tensor {name!r} to {file_name!r}, which does not hold "
                "it; regenerate the index"
            )
    return files


def _corrupt(path: Path, tensor: str | None, offset: int, what: str) -> CorruptFileError:
    about = f"tensor {tensor!r}" if tensor is not None else "the header"
    return CorruptFileError(
        f"{str(path)!r} is corrupt or truncated: {about} at offset {offset}: {what}; "
        "download or write the file again",
        str(path),
        tensor,
        offset,
    )


def read_file(path: Path, index: int) -> CheckpointFile:
    """One file's header, every entry checked against the file's size (``index``: the file's
    place in its checkpoint, stored as ``TensorInfo.region``).

    Raises:
        InvalidArgumentError: the file cannot be opened.
        CorruptFileError: a truncated file or a corrupt header (the message names the tensor
            and the offset).
    """
    try:
        with path.open("rb", buffering=0) as f:
            st = os.fstat(f.fileno())
            prefix = f.read(8)
            if len(prefix) < 8:
                raise _corrupt(path, None, 0, f"{st.st_size} bytes, shorter than the size prefix")
            (n,) = struct.unpack("<Q", prefix)
            if n > MAX_HEADER or 8 + n > st.st_size:
                raise _corrupt(
                    path, None, 8, f"a header of {n} bytes in a file of {st.st_size} bytes"
                )
            raw = f.read(n)
    except OSError as exc:
        raise InvalidArgumentError(
            f"{str(path)!r} could not be read: {exc}; pass a readable .safetensors file"
        ) from exc
    try:
        header = json.loads(raw)
        if not isinstance(header, dict):
            raise ValueError("not a JSON object")
    except (UnicodeDecodeError, ValueError) as exc:
        raise _corrupt(path, None, 8, f"the header is not JSON ({exc})") from exc
    data = 8 + n
    tensors = [
        _entry(path, name, e, data, st.st_size, index)
        for name, e in header.items()
        if name != "__metadata__"
    ]
    tensors.sort(key=lambda t: t.offset)
    for a, b in itertools.pairwise(tensors):
        if a.offset + a.nbytes > b.offset:
            raise _corrupt(path, b.name, b.offset, f"its bytes overlap tensor {a.name!r}'s")
    return CheckpointFile(path, st.st_size, prefix + raw, tuple(tensors), file_stamp(st))


def _entry(path: Path, name: str, e: Any, data: int, size: int, index: int) -> TensorInfo:
    try:
        dtype = e["dtype"]
        shape = tuple(int(d) for d in e["shape"])
        begin, end = (int(x) for x in e["data_offsets"])
    except (KeyError, TypeError, ValueError) as exc:
        raise _corrupt(path, name, 8, f"malformed header entry {e!r}") from exc
    if dtype not in DTYPES or any(d < 0 for d in shape) or not 0 <= begin <= end:
        raise _corrupt(
            path,
            name,
            8,
            f"dtype {dtype!r}, shape {list(shape)}, offsets "
            f"[{begin}, {end}] (dtypes: {', '.join(DTYPES)})",
        )
    t = TensorInfo(name, dtype, shape, index, data + begin)
    if end - begin != t.nbytes:
        raise _corrupt(
            path,
            name,
            t.offset,
            f"{end - begin} bytes for {dtype} of shape {list(shape)} ({t.nbytes} bytes)",
        )
    if data + end > size:
        raise _corrupt(
            path,
            name,
            t.offset,
            f"its bytes end at offset {data + end}, past the end of the file ({size} bytes)",
        )
    return t
