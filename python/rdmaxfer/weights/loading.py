"""Loading a safetensors checkpoint from local disk straight into host or GPU arrays.

Each file is opened with ``O_DIRECT`` (buffered where the file system refuses it: the result
says so) and read by the C++ core (csrc/transport/storage) through io_uring: several reads of
``chunk_bytes`` in flight, each aligned to the file system's block size. The load's own host
arrays are views of one aligned allocation of new pages that the reads land in directly (no
copy; the pages are faulted in ahead of the reads on a second thread); the caller's arrays
(``into=``), shards and GPU arrays are filled from page-locked bounce buffers, the
host-to-device copies overlapped with the reads that follow.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from .. import _core
from .._config import resolve_timeout
from ..errors import CorruptFileError, InvalidArgumentError, TransportError, UnsupportedError
from ..gpu.staging import device_copier, to_user_array
from ..memory import cuda
from ..memory.buffer import Buffer, device_view
from .checkpoint import CheckpointFile, file_stamp, open_checkpoint
from .format import DTYPES, TensorInfo
from .shard import Names, Shard, destination, select, shards_for

__all__ = [
    "FileLoad",
    "LoadedWeights",
    "OpenedFile",
    "load_weights",
    "open_file",
    "read_or_buffered",
    "read_whole",
]

T = TypeVar("T")

DEFAULT_CHUNK = 4 << 20
DEFAULT_DEPTH = 16
#: Tensors of one file closer than this are read by the same reads (the gap is read too).
MERGE_GAP = 1 << 20


@dataclass(frozen=True)
class FileLoad:
    """How one file was read: ``path``; ``io``: ``"direct"`` (O_DIRECT) or ``"buffered"``;
    ``why``: the reason for buffered reads ("" for direct); ``engine``: ``"io_uring"``,
    ``"pread (reason)"``, ``"cufile"`` (GPUDirect Storage) or ``"cufile + io_uring"``, with
    ``" (no GPUDirect Storage: reason)"`` after it where cuFile refused the file;
    ``align``: the block size reads were aligned to (bytes); ``bytes_read``: bytes the reads
    returned (block rounding and merged gaps included)."""

    path: str
    io: str
    why: str
    engine: str
    align: int
    bytes_read: int


class LoadedWeights(dict[str, Any]):
    """What :func:`load_weights` returns: ``{name: array}`` (a dict).

    Attributes:
        files: one :class:`FileLoad` per file read, in the checkpoint's order.
        nbytes: bytes of the tensors (or shards) returned.
        seconds: wall time of the load, headers included.
    """

    def __init__(
        self, arrays: Mapping[str, Any], files: list[FileLoad], nbytes: int, seconds: float
    ) -> None:
        super().__init__(arrays)
        self.files = tuple(files)
        self.nbytes = nbytes
        self.seconds = seconds

    @property
    def gbps(self) -> float:
        """``nbytes`` / ``seconds`` in GB/s (1e9 bytes per second)."""
        return self.nbytes / self.seconds / 1e9 if self.seconds > 0 else 0.0

    @property
    def io(self) -> str:
        """``"direct"`` when every file was read with O_DIRECT, else ``"buffered"``."""
        return "direct" if all(f.io == "direct" for f in self.files) else "buffered"


@dataclass
class _Plan:
    """The reads of one file: ``direct`` ranges (aligned, into the load's arena) and
    ``copied`` ones (through bounce buffers)."""

    direct: list[tuple[int, int, int]] = field(default_factory=list)
    copied: list[tuple[int, int, int, bool]] = field(default_factory=list)


def load_weights(
    path: str | os.PathLike[str],
    device: str | int | None = "cpu",
    into: Mapping[str, object] | None = None,
    names: Names | None = None,
    shard: Mapping[str, object] | None = None,
    *,
    direct: bool = True,
    gds: bool | None = None,
    chunk_bytes: int = DEFAULT_CHUNK,
    depth: int = DEFAULT_DEPTH,
    timeout: float | None = None,
) -> LoadedWeights:
    """Read a safetensors checkpoint from local disk into new host or GPU arrays, or into the
    caller's arrays.

    Args:
        path: a ``.safetensors`` file, a ``*.safetensors.index.json`` (the files it names load
            as one checkpoint), or a folder holding ``model.safetensors`` or
            ``model.safetensors.index.json``.
        device: ``"cpu"`` (None) for new NumPy arrays, ``"cuda:N"`` for new GPU arrays (CuPy
            when importable, else device Buffers).
        into: ``{name: array}`` to fill in place (host or GPU arrays), each writable,
            C-contiguous, of the tensor's (or shard's) dtype and shape: checked, with
            ``names`` and ``shard``, before any byte is read, as by ``pull_weights(into=)``.
        names: the tensors to load (a list, or a predicate on the name; default all, or
            ``into``'s names).
        shard: ``{name: np.s_[...]}``: load only that part of a tensor.
        direct: read with O_DIRECT where the file system allows it (False: buffered reads
            through the page cache).
        gds: read GPU destinations with GPUDirect Storage (cuFileRead straight into GPU
            memory, no host bounce): None (default) where libcufile loads, the file is open
            with O_DIRECT and cuFile takes it, True to require it, False never.
        chunk_bytes: bytes per read (default 4 MiB), rounded up to the block size.
        depth: reads in flight (default 16, at most 256).
        timeout: seconds (default ``RDMAXFER_TIMEOUT`` or 60) any read or copy may take.

    Returns:
        A :class:`LoadedWeights` ``{name: array}`` with the file's dtype (BF16 and F8 as
        ``ml_dtypes`` dtypes) and the tensor's (or shard's) shape, ``into``'s arrays as given;
        ``.files`` says how each file was read (``io``: ``"direct"`` or ``"buffered"``).

    Raises:
        InvalidArgumentError: a bad path, index, name, shard, ``into`` array (dtype, shape,
            layout: the message names the tensor; nothing was read), device or option.
        CorruptFileError: a file is truncated or its header is corrupt, or it changed while it
            was read (the message names the file, the tensor and the offset); nothing returned.
        TransportError: a read failed (the message gives the offset and errno).
        TransferTimeoutError: a read or copy took longer than ``timeout``.
        UnsupportedError: a GPU device or array without a usable CUDA here; ``gds=True``
            without GPUDirect Storage here (the reason), on a file read buffered, or on a file
            cuFile does not take (``cuFileHandleRegister`` refused it: its file system; with
            ``gds=None`` such a file is read through host memory).
    """
    started = time.perf_counter()
    if chunk_bytes < 1 or not 1 <= depth <= 256:
        raise InvalidArgumentError(
            f"chunk_bytes={chunk_bytes}, depth={depth}: pass chunk_bytes >= 1 and depth 1..256"
        )
    timeout_s = resolve_timeout(timeout)
    ordinal = None if device is None or device == "cpu" else cuda.parse_device(device)
    files = open_checkpoint(path)
    source = repr(os.fspath(path))
    if names is None and into is not None:
        names = list(into)
    chosen = select([t for f in files for t in f.tensors], names, source)
    shards = shards_for(chosen, into, shard, source)
    placed = {s.tensor.name: destination(s, into) for s in shards}  # checked first
    with contextlib.ExitStack() as stack:
        opened = [stack.enter_context(open_file(f.path, direct)) for f in files]
        for f, o in zip(files, opened, strict=True):
            _check_unchanged(f, o.fd)
        plans = [_Plan() for _ in files]
        result, gpu = _place(shards, placed, plans, ordinal, [o.align for o in opened])
        use_gds = gpu is not None and _use_gds(gds)
        copier = device_copier(gpu) if gpu is not None else None
        opts = _Options(copier, chunk_bytes, depth, timeout_s, gpu if use_gds else None, gds)
        loads = [
            _read(f, o, plan, opts)
            for f, o, plan in zip(files, opened, plans, strict=True)
            if plan.direct or plan.copied
        ]
    nbytes = sum(s.nbytes for s in shards)
    return LoadedWeights(result, loads, nbytes, time.perf_counter() - started)


@dataclass
class OpenedFile:
    """A file open for reading: ``fd``; ``io``: ``"direct"`` (O_DIRECT) or ``"buffered"``;
    ``why``: the reason for buffered reads; ``align``: the block size to align reads to."""

    fd: int
    io: str
    why: str
    align: int


@contextlib.contextmanager
def open_file(path: Path, direct: bool = True) -> Iterator[OpenedFile]:
    """``path`` opened for reading, with O_DIRECT unless ``direct`` is False or the file
    system refuses it (EINVAL); closed on exit.

    Raises:
        InvalidArgumentError: the file cannot be opened.
    """
    why = "direct=False"
    fd = -1
    try:
        if direct:
            try:
                fd = os.open(path, os.O_RDONLY | os.O_DIRECT | os.O_CLOEXEC)
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                why = f"the file system refuses O_DIRECT ({exc.strerror})"
        io = "direct" if fd >= 0 else "buffered"
        if fd < 0:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise InvalidArgumentError(
            f"{str(path)!r} could not be opened: {exc}; pass a readable .safetensors file"
        ) from exc
    try:
        block = os.fstat(fd).st_blksize
        align = block if block >= 512 and block & (block - 1) == 0 else 4096
        yield OpenedFile(fd, io, "" if io == "direct" else why, max(align, 4096))
    finally:
        os.close(fd)


def read_whole(
    path: Path, o: OpenedFile, size: int, out: npt.NDArray[np.uint8], timeout_s: float
) -> int:
    """Read the first ``size`` bytes of the open file into ``out`` (block-aligned, at least
    ``size`` rounded up to ``o.align`` bytes) by direct reads; returns the bytes read.

    Raises:
        InvalidArgumentError: the file ended before ``size`` bytes (it shrank).
        TransportError: a read failed; TransferTimeoutError: a read took over ``timeout_s``.
    """
    length = -(-size // o.align) * o.align
    stats = _core.read_file_ranges(
        o.fd, str(path), size, [(0, length, out.ctypes.data)], [], align=o.align,
        timeout_s=timeout_s,
    )  # fmt: skip
    return min(int(stats["bytes_read"]), size)


def _check_unchanged(f: CheckpointFile, fd: int) -> None:
    now = file_stamp(os.fstat(fd))
    if now != f.stamp:
        raise CorruptFileError(
            f"{str(f.path)!r} changed on disk since its header was read (inode, size or "
            f"modification time: {f.stamp} -> {now}); load it once it is written completely "
            "(write it under another name, then rename it)",
            str(f.path),
            None,
            0,
        )


def _place(
    shards: list[Shard],
    placed: Mapping[str, tuple[object, bool] | None],
    plans: list[_Plan],
    ordinal: int | None,
    aligns: list[int],
) -> tuple[dict[str, Any], int | None]:
    """Every shard's destination (new arrays allocated), its reads added to ``plans``; and
    the GPU the device copies go to (None: none)."""
    result: dict[str, Any] = {}
    gpus: set[int] = set()
    whole = []
    for s in shards:
        given = placed[s.tensor.name]
        plan = plans[s.tensor.region]
        dtype = DTYPES[s.tensor.dtype]
        if given is None and ordinal is None and s.shape == s.tensor.shape:
            whole.append(s.tensor)
            continue
        if given is not None:
            dest, on_gpu = given
            user = dest
        elif ordinal is None:
            dest = user = np.empty(s.shape, dtype)
            on_gpu = False
        else:
            dest = Buffer.empty(s.shape, dtype, device=ordinal)
            user, on_gpu = to_user_array(dest), True
        view = device_view(dest, writable=True) if on_gpu else None
        if view is not None:
            gpus.add(view.device)
        base = view.ptr if view is not None else np.asarray(dest).ctypes.data
        plan.copied.extend(
            (p.remote_offset, p.nbytes, base + p.local_offset, on_gpu) for p in s.pieces
        )
        result[s.tensor.name] = user
    if len(gpus) > 1:
        raise InvalidArgumentError(
            f"into= holds arrays on GPUs {sorted(gpus)}; load into one GPU per call"
        )
    result.update(_arena(whole, plans, aligns))
    return result, next(iter(gpus), None)


def _spans(tensors: list[TensorInfo], align: int) -> list[tuple[int, int, list[TensorInfo]]]:
    """Block-aligned ``(start, end, tensors)`` file ranges covering ``tensors`` (of one file),
    those closer than MERGE_GAP merged."""
    spans: list[tuple[int, int, list[TensorInfo]]] = []
    for t in sorted(tensors, key=lambda t: t.offset):
        start = t.offset // align * align
        end = -(-(t.offset + t.nbytes) // align) * align
        if spans and start <= spans[-1][1] + MERGE_GAP:
            first, last, members = spans[-1]
            spans[-1] = (first, max(last, end), [*members, t])
        else:
            spans.append((start, end, [t]))
    return spans


def _arena(
    tensors: list[TensorInfo], plans: list[_Plan], aligns: list[int]
) -> dict[str, npt.NDArray[Any]]:
    """New host arrays for whole tensors: views of one allocation, laid out like the files
    (block-aligned), that the direct reads fill."""
    by_file: dict[int, list[TensorInfo]] = {}
    for t in tensors:
        by_file.setdefault(t.region, []).append(t)
    spans = {i: _spans(ts, aligns[i]) for i, ts in by_file.items()}
    total = sum(end - start + aligns[i] for i, ss in spans.items() for start, end, _ in ss)
    arena = _fresh_pages(total)
    base = arena.ctypes.data
    at = 0
    out: dict[str, npt.NDArray[Any]] = {}
    for i, ss in spans.items():
        for start, end, members in ss:
            at += -(base + at) % aligns[i]  # each file's spans on its own block size
            plans[i].direct.append((start, end - start, base + at))
            for t in members:
                lo = at + t.offset - start
                raw = arena[lo : lo + t.nbytes]
                out[t.name] = raw.view(DTYPES[t.dtype]).reshape(t.shape)
            at += end - start
    return out


def _fresh_pages(nbytes: int) -> npt.NDArray[np.uint8]:
    """``nbytes`` of new anonymous memory (private, page-aligned), freed with the last array
    viewing it. Not ``np.empty``: NumPy asks for transparent huge pages (MADV_HUGEPAGE) on
    large arrays, whose first touch, when the reads land, can stall on compaction or, in a
    VM that hands free memory back to its host, on the host backing each 2 MiB page; these
    pages follow the system's THP setting instead."""
    if nbytes == 0:
        return np.empty(0, dtype=np.uint8)
    pages = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return np.frombuffer(pages, dtype=np.uint8)


@dataclass(frozen=True)
class _Options:
    copier: _core.DeviceCopier | None
    chunk_bytes: int
    depth: int
    timeout_s: float
    gds_device: int | None  # GPU destinations by GPUDirect Storage onto this GPU (None: no)
    gds: bool | None  # as asked: True refuses a file read buffered


def _use_gds(gds: bool | None) -> bool:
    why = "" if gds is False else _core.gds_unavailable()
    if gds is True and why:
        raise UnsupportedError(f"gds=True: {why}; pass gds=None to read through host memory")
    return gds is not False and not why


def read_or_buffered(path: Path, opened: OpenedFile, read: Callable[[OpenedFile], T]) -> T:
    """``read(opened)``; when its O_DIRECT reads are refused (EINVAL), ``read`` once more
    through a buffered descriptor of ``path`` (whose ``why`` says so)."""
    try:
        return read(opened)
    except TransportError as exc:
        if not _direct_refused(opened, exc):
            raise
        why = f"O_DIRECT reads refused ({exc})"
    with open_file(path, direct=False) as buffered:
        return read(OpenedFile(buffered.fd, "buffered", why, opened.align))


def _direct_refused(o: OpenedFile, exc: Exception) -> bool:
    return isinstance(exc, TransportError) and o.io == "direct" and exc.errno == errno.EINVAL


def _read(f: CheckpointFile, o: OpenedFile, plan: _Plan, opts: _Options) -> FileLoad:
    """Run one file's reads (again buffered when the O_DIRECT reads are refused with EINVAL);
    the file must still be the one whose header was read."""

    def run(o: OpenedFile) -> FileLoad:
        try:
            stats = _read_ranges(f, o, plan, opts)
        except (TransportError, InvalidArgumentError) as exc:
            if not _direct_refused(o, exc):
                _check_unchanged(f, o.fd)
            raise
        _check_unchanged(f, o.fd)
        return FileLoad(str(f.path), o.io, o.why, stats["engine"], o.align, stats["bytes_read"])

    return read_or_buffered(f.path, o, run)


def _read_ranges(f: CheckpointFile, o: OpenedFile, plan: _Plan, opts: _Options) -> dict[str, Any]:
    """The file's reads: GPU destinations by GPUDirect Storage when ``opts`` says so (the file
    open with O_DIRECT), the others through io_uring."""
    gds = opts.gds_device is not None and o.io == "direct"
    if opts.gds is True and o.io != "direct":
        raise UnsupportedError(
            f"GPUDirect Storage needs O_DIRECT, which {str(f.path)!r} is not read with "
            f"({o.why}); pass gds=None to read it through host memory"
        )
    on_gpu = [(a, n, d) for a, n, d, dev in plan.copied if dev and gds]
    rest = [r for r in plan.copied if not (r[3] and gds)]
    stats: dict[str, Any] = {"bytes_read": 0, "engine": ""}
    refused = ""
    if on_gpu:
        assert opts.gds_device is not None
        try:
            stats = _core.read_file_gds(o.fd, str(f.path), f.size, opts.gds_device, on_gpu)
        except UnsupportedError as exc:  # cuFile does not take this file; nothing was read
            if opts.gds is True:
                raise UnsupportedError(
                    f"gds=True: {exc}; pass gds=None to read it through host memory"
                ) from None
            refused, rest = str(exc), plan.copied
    if plan.direct or rest:
        host = _core.read_file_ranges(
            o.fd,
            str(f.path),
            f.size,
            plan.direct,
            rest,
            align=o.align,
            chunk=opts.chunk_bytes,
            depth=opts.depth,
            timeout_s=opts.timeout_s,
            copier=opts.copier,
        )
        engine = host["engine"] if not stats["engine"] else f"cufile + {host['engine']}"
        if refused:
            engine += f" (no GPUDirect Storage: {refused})"
        stats = {"bytes_read": stats["bytes_read"] + host["bytes_read"], "engine": engine}
    return stats
