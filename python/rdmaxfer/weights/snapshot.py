"""The server's own copies of what it publishes: host memory it allocates (64-byte aligned), a
``.safetensors`` file read into such memory whole, and tensors laid out in it side by side.

A version is served from memory only the server writes (see :mod:`.versions`), so neither the
publisher writing into its arrays nor a file rewritten on disk changes what pulls of that
version get. The cost is one copy of the published bytes, made when they are published."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ..errors import InvalidArgumentError
from .format import DTYPES, TensorInfo, read_safetensors_header

__all__ = ["ALIGN", "FileSnapshot", "layout", "owned_buffer", "snapshot_file", "tensor_view"]

ALIGN = 64
#: Reads of a file that keeps changing on disk before publishing it fails.
SNAPSHOT_TRIES = 3


def owned_buffer(nbytes: int) -> npt.NDArray[np.uint8]:
    """New host memory of ``nbytes`` bytes (at least 64: a region is never empty) whose first
    byte is 64-byte aligned."""
    size = max(nbytes, ALIGN)
    raw = np.empty(size + ALIGN, dtype=np.uint8)
    shift = -raw.ctypes.data % ALIGN
    return raw[shift : shift + size]


def layout(tensors: Iterable[TensorInfo], region: int) -> tuple[dict[str, TensorInfo], int]:
    """The tensors laid out in one region (index ``region``), each at a 64-byte aligned
    offset; and the bytes they take."""
    placed: dict[str, TensorInfo] = {}
    offset = 0
    for t in tensors:
        placed[t.name] = TensorInfo(t.name, t.dtype, t.shape, region, offset)
        offset += -(-t.nbytes // ALIGN) * ALIGN
    return placed, offset


def tensor_view(buffer: npt.NDArray[np.uint8], t: TensorInfo) -> npt.NDArray[Any]:
    """Tensor ``t``'s bytes in ``buffer`` (at ``t.offset``) as an array of its dtype and
    shape."""
    raw = buffer[t.offset : t.offset + t.nbytes]
    return raw.view(DTYPES[t.dtype]).reshape(t.shape)


class FileSnapshot:
    """A ``.safetensors`` file as it was read: ``buffer`` (its bytes, header included),
    ``header_raw`` (the 8-byte size and the JSON header), ``header`` (parsed) and
    ``data_offset`` (where the data section starts in ``buffer``)."""

    def __init__(
        self,
        buffer: npt.NDArray[np.uint8],
        header_raw: bytes,
        header: dict[str, Any],
        data_offset: int,
    ) -> None:
        self.buffer = buffer
        self.header_raw = header_raw
        self.header = header
        self.data_offset = data_offset


def snapshot_file(path: Path) -> FileSnapshot:
    """Read the whole file at ``path`` into server-owned memory, consistently: the read is
    retried when the file's size, modification or change time moved meanwhile, or its header
    no longer is the one validated.

    Raises:
        InvalidArgumentError: not a readable safetensors file, or it kept changing on disk
            for SNAPSHOT_TRIES reads (the message says how to publish a file being written).
    """
    for _ in range(SNAPSHOT_TRIES):
        header_raw, header, data_offset = read_safetensors_header(path)
        try:
            with path.open("rb", buffering=0) as f:
                before = os.fstat(f.fileno())
                buffer = owned_buffer(before.st_size)
                got = _read_into(f.fileno(), buffer[: before.st_size])
                after = os.fstat(f.fileno())
        except OSError as exc:
            raise InvalidArgumentError(
                f"{str(path)!r} could not be read: {exc}; pass a readable .safetensors file"
            ) from exc
        if (
            got == before.st_size
            and _stamp(before) == _stamp(after)
            and buffer[: len(header_raw)].tobytes() == header_raw
        ):
            return FileSnapshot(buffer, header_raw, header, data_offset)
    raise InvalidArgumentError(
        f"{str(path)!r} changed on disk while it was read ({SNAPSHOT_TRIES} tries); publish a "
        "file once it is written completely (write it under another name, then rename it)"
    )


def _stamp(st: os.stat_result) -> tuple[int, int, int, int]:
    return st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def _read_into(fd: int, out: npt.NDArray[np.uint8]) -> int:
    """Bytes read into ``out`` from the start of ``fd`` (fewer at end of file)."""
    done = 0
    while done < out.size:
        n = os.preadv(fd, [out[done:].data], done)
        if n == 0:
            break
        done += n
    return done
