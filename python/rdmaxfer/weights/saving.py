"""Writing a safetensors file to local disk: O_DIRECT writes of block-aligned chunks (buffered
where the file system refuses O_DIRECT), into a temporary file next to the target that is
fsync'ed and then renamed over it, so a failed save (a full disk, an interrupted process)
leaves the old file as it was."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ..errors import InvalidArgumentError, TransportError
from ..memory.buffer import as_array
from .format import dtype_names, name_of
from .snapshot import owned_buffer

__all__ = ["SavedFile", "save_weights"]

DEFAULT_CHUNK = 4 << 20


@dataclass(frozen=True)
class SavedFile:
    """What :func:`save_weights` wrote: ``path``, ``nbytes`` (the file's size), ``io``
    (``"direct"`` or ``"buffered"``), ``why`` (the reason for buffered writes, else "") and
    ``seconds`` (fsync included)."""

    path: str
    nbytes: int
    io: str
    why: str
    seconds: float


def save_weights(
    path: str | os.PathLike[str],
    tensors: Mapping[str, object],
    *,
    metadata: Mapping[str, str] | None = None,
    direct: bool = True,
    chunk_bytes: int = DEFAULT_CHUNK,
) -> SavedFile:
    """Write ``tensors`` as a safetensors file at ``path`` (readable by the ``safetensors``
    library and :func:`load_weights`), durably: the data and the rename are fsync'ed before
    this returns.

    Args:
        path: the file to write (replaced if it exists, only once the new one is complete).
        tensors: ``{name: array}``, host arrays (NumPy, or anything exposing the buffer
            protocol) of a dtype with a safetensors name (float64 ... bool, ``ml_dtypes``'
            bfloat16 and float8 types); written in the mapping's order, without gaps.
        metadata: the header's ``__metadata__`` (``{str: str}``).
        direct: write with O_DIRECT where the file system allows it (False: buffered).
        chunk_bytes: bytes per write (default 4 MiB), rounded up to the block size.

    Returns:
        A :class:`SavedFile` (``io``: how the bytes were written).

    Raises:
        InvalidArgumentError: a tensor of a dtype without a safetensors name, a name
            ``"__metadata__"``, metadata that is not ``{str: str}``, a GPU array (copy it to the
            host first), a folder that does not exist.
        TransportError: a write failed (``errno`` set: ENOSPC for a full disk); the old file
            at ``path`` is left as it was and the temporary file removed.
    """
    started = time.perf_counter()
    target = Path(path)
    pieces = _pieces(tensors, metadata)
    if not target.parent.is_dir():
        raise InvalidArgumentError(f"{str(target.parent)!r} is not a folder; create it first")
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        fd, io, why = _create(tmp, direct)
    except OSError as exc:
        raise _write_error(target, exc) from exc
    try:
        try:
            size = _write_all(fd, io == "direct", pieces, chunk_bytes)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, target)
        _fsync_folder(target.parent)
    except OSError as exc:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise _write_error(target, exc) from exc
    return SavedFile(str(target), size, io, why, time.perf_counter() - started)


def _pieces(
    tensors: Mapping[str, object], metadata: Mapping[str, str] | None
) -> list[npt.NDArray[np.uint8]]:
    """The file's bytes in order: the header (its 8-byte size, then the JSON padded with
    spaces to a multiple of 8 bytes), then each tensor's bytes."""
    doc: dict[str, Any] = {}
    if metadata is not None:
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
            raise InvalidArgumentError("metadata must map str to str (safetensors' rule)")
        doc["__metadata__"] = dict(metadata)
    arrays = []
    offset = 0
    for name, obj in tensors.items():
        if name == "__metadata__":
            raise InvalidArgumentError("'__metadata__' is not a tensor name; pass metadata=")
        arr = np.ascontiguousarray(as_array(obj, writable=False, what=f"tensor {name!r}"))
        key = name_of(arr.dtype)
        if key is None:
            raise InvalidArgumentError(
                f"tensor {name!r} has dtype {arr.dtype}, which safetensors cannot store; "
                f"use one of {dtype_names()}"
            )
        doc[name] = {"dtype": key, "shape": list(arr.shape), "data_offsets": [offset]}
        doc[name]["data_offsets"].append(offset + arr.nbytes)
        offset += arr.nbytes
        arrays.append(arr.reshape(-1).view(np.uint8))
    raw = json.dumps(doc, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return [np.frombuffer(len(raw).to_bytes(8, "little") + raw, np.uint8), *arrays]


def _create(tmp: Path, direct: bool) -> tuple[int, str, str]:
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
    if direct:
        try:
            return os.open(tmp, flags | os.O_DIRECT, 0o644), "direct", ""
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
            why = f"the file system refuses O_DIRECT ({exc.strerror})"
    else:
        why = "direct=False"
    return os.open(tmp, flags, 0o644), "buffered", why


def _write_all(fd: int, direct: bool, arrays: list[npt.NDArray[np.uint8]], chunk: int) -> int:
    """Every byte of ``arrays`` written in order through one block-aligned chunk buffer;
    returns the file's size. O_DIRECT writes whole blocks: the last one is padded, then the
    file is truncated to its size."""
    block = max(os.fstat(fd).st_blksize, 4096)
    chunk = -(-max(chunk, 1) // block) * block
    buf = owned_buffer(chunk, align=block)
    filled = written = 0
    for arr in arrays:
        at = 0
        while at < arr.size:
            n = min(arr.size - at, chunk - filled)
            buf[filled : filled + n] = arr[at : at + n]
            filled, at = filled + n, at + n
            if filled == chunk:
                written += _pwrite(fd, buf.data, written)
                filled = 0
    size = written + filled
    if filled:
        end = -(-filled // block) * block if direct else filled
        buf[filled:end] = 0
        _pwrite(fd, buf[:end].data, written)
        if end != filled:
            os.ftruncate(fd, size)
    return size


def _pwrite(fd: int, data: memoryview, offset: int) -> int:
    done = 0
    while done < len(data):
        done += os.pwrite(fd, data[done:], offset + done)
    return done


def _fsync_folder(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_error(target: Path, exc: OSError) -> TransportError:
    hint = "free space on its file system" if exc.errno == errno.ENOSPC else "check the path"
    err = TransportError(
        f"saving {str(target)!r} failed: {exc.strerror} (errno {exc.errno}); the old file, if "
        f"any, is intact; {hint} and save again"
    )
    err.errno = exc.errno
    return err
