"""The server's own copies of what it publishes: host memory it allocates (64-byte aligned), a
``.safetensors`` file read into such memory whole (by the O_DIRECT reads of :mod:`.loading`,
so a cold file is read at the disk's rate, with no page faults), and tensors laid out in it
side by side.

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
from .checkpoint import file_stamp
from .format import DTYPES, TensorInfo, read_safetensors_header
from .loading import OpenedFile, open_file, read_or_buffered, read_whole

__all__ = ["ALIGN", "FileSnapshot", "layout", "owned_buffer", "snapshot_file", "tensor_view"]

ALIGN = 64
#: Reads of a file that keeps changing on disk before publishing it fails.
SNAPSHOT_TRIES = 3


def owned_buffer(nbytes: int, align: int = ALIGN) -> npt.NDArray[np.uint8]:
    """New host memory of ``nbytes`` bytes (at least 64: a region is never empty) whose first
    byte is ``align``-byte aligned (64 by default)."""
    size = max(nbytes, ALIGN)
    raw = np.empty(size + align, dtype=np.uint8)
    shift = -raw.ctypes.data % align
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


def snapshot_file(path: Path, timeout_s: float = 60.0) -> FileSnapshot:
    """Read the whole file at ``path`` into server-owned memory, consistently: the read is
    retried when the file's inode, size, modification or change time moved meanwhile, or its
    header no longer is the one validated. The reads are O_DIRECT where the file system allows
    it (buffered otherwise), each bounded by ``timeout_s``.

    Raises:
        InvalidArgumentError: not a readable safetensors file, or it kept changing on disk
            for SNAPSHOT_TRIES reads (the message says how to publish a file being written).
        TransportError: a read failed (the message gives the offset and errno).
    """
    for _ in range(SNAPSHOT_TRIES):
        header_raw, header, data_offset = read_safetensors_header(path)
        with open_file(path) as opened:
            before = os.fstat(opened.fd)
            buffer = owned_buffer(-(-before.st_size // opened.align) * opened.align, opened.align)
            try:
                got = _read_into(path, opened, before.st_size, buffer, timeout_s)
            except InvalidArgumentError:  # it shrank meanwhile: read it again
                got = -1
            after = os.fstat(opened.fd)
        if (
            got == before.st_size
            and file_stamp(before) == file_stamp(after)
            and buffer[: len(header_raw)].tobytes() == header_raw
        ):
            return FileSnapshot(buffer[: before.st_size], header_raw, header, data_offset)
    raise InvalidArgumentError(
        f"{str(path)!r} changed on disk while it was read ({SNAPSHOT_TRIES} tries); publish a "
        "file once it is written completely (write it under another name, then rename it)"
    )


def _read_into(
    path: Path, opened: OpenedFile, size: int, out: npt.NDArray[np.uint8], timeout_s: float
) -> int:
    """Bytes read into ``out`` from the start of the file (again buffered when the O_DIRECT
    reads are refused with EINVAL)."""
    return read_or_buffered(path, opened, lambda o: read_whole(path, o, size, out, timeout_s))
