"""The parts of :mod:`rdmaxfer.tools.fetch`'s downloads: rate and chunk sizes, the token
bucket, digests, destinations (file at offsets, memory), the remote file's validators, the
resume sidecar and the options; the requests themselves are in
:mod:`rdmaxfer.tools.range_requests`.

Sizes and offsets in bytes, rates in bytes per second, times in seconds.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import collections
import contextlib
import errno
import json
import logging
import math
import mmap
import os
import re
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import numpy as np
import numpy.typing as npt

from ..errors import FetchError, InvalidArgumentError
from ..memory.buffer import as_array
from .connection_ramp import (
    MAX_ADAPTIVE_CONNECTIONS,
    START_CONNECTIONS,
    ConnectionRamp,
    RangeSizer,
)

if TYPE_CHECKING:
    from ..transport.engine import Engine

log = logging.getLogger("rdmaxfer.fetch")
T = TypeVar("T")


MIN_CHUNK = 1 << 20
"""Smallest automatic chunk (bytes)."""
MAX_CHUNK = 64 << 20
"""Largest automatic chunk (bytes) until the chunk count reaches :data:`MAX_CHUNKS`."""
MAX_CHUNKS = 8192
"""Most chunks a download is cut into automatically (larger files get larger chunks)."""
CHUNKS_PER_CONNECTION = 8
"""Automatic chunking aims at this many chunks per connection (a slow one never holds the end)."""
DEFAULT_CONNECTIONS = 8
MAX_CONNECTIONS = 256
DEFAULT_RETRIES = 5
BACKOFF_BASE_S = 0.25
BACKOFF_MAX_S = 8.0
STATE_SUFFIX = ".rdmaxfer-fetch"
_STATE_VERSION = 1
_STATE_SAVE_EVERY_S = 0.5
_RETRY_STATUS = {408, 425, 429, 500, 502, 503, 504}
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


# -- small pieces ------------------------------------------------------------------------------
def parse_rate(rate: float | int | str | None) -> float | None:
    """Bytes per second from ``1073741824``, ``"1G"``, ``"500M"``, ``"1.5GiB/s"`` (binary
    units), or None (no limit).

    Raises:
        InvalidArgumentError: not a positive rate.
    """
    if rate is None:
        return None
    if isinstance(rate, str):
        m = re.fullmatch(
            r"\s*(\d+(?:\.\d*)?)\s*([KMGT]?)(?:i?B)?(?:/s)?\s*", rate, flags=re.IGNORECASE
        )
        if m is None:
            raise InvalidArgumentError(
                f"rate {rate!r} is not a rate in bytes/s; write e.g. 1G, 500M, 1.5G or 1048576"
            )
        value = float(m.group(1)) * _UNITS[m.group(2).upper()]
    elif isinstance(rate, bool) or not isinstance(rate, (int, float)):
        raise InvalidArgumentError(f"rate={rate!r} must be bytes/s (a number or e.g. '1G')")
    else:
        value = float(rate)
    if not math.isfinite(value) or value <= 0:
        raise InvalidArgumentError(f"rate={rate!r} must be > 0 bytes/s (omit it for no limit)")
    return value


def choose_chunk_size(size: int, connections: int = DEFAULT_CONNECTIONS) -> int:
    """Bytes per ranged request for a file of ``size`` bytes.

    About :data:`CHUNKS_PER_CONNECTION` chunks per connection, each between 1 MiB and 64 MiB
    (a 5 MiB file: 5 chunks; 1 GiB over 8 connections: 64 of 16 MiB; 100 GB: 1491 of 64 MiB),
    never more than :data:`MAX_CHUNKS` chunks; a multiple of 64 KiB.
    """
    if size <= 0:
        return MIN_CHUNK
    chunk = -(-size // max(1, connections * CHUNKS_PER_CONNECTION))
    chunk = min(max(chunk, MIN_CHUNK), MAX_CHUNK)
    chunk = max(chunk, -(-size // MAX_CHUNKS))
    return -(-chunk // 65536) * 65536


class TokenBucket:
    """Caps a byte rate: :meth:`take` returns how long to sleep after consuming ``n`` bytes.

    The bucket holds up to ``burst`` bytes (default: a quarter second's worth, at least
    64 KiB) and refills at ``rate`` bytes/s; taking more than it holds puts it in debt, and the
    taker sleeps until the debt is repaid. Thread-safe.
    """

    def __init__(self, rate: float, burst: float | None = None) -> None:
        if not rate > 0:
            raise InvalidArgumentError(f"rate={rate!r} must be > 0 bytes/s")
        self.rate = float(rate)
        self.burst = float(burst) if burst is not None else max(self.rate / 4, 65536.0)
        self._tokens = self.burst
        self._stamp = time.monotonic()
        self._lock = threading.Lock()

    def take(self, n: int) -> float:
        """Consume ``n`` bytes; return the seconds to wait before using more."""
        with self._lock:
            now = time.monotonic()
            self._tokens = min(self.burst, self._tokens + (now - self._stamp) * self.rate)
            self._stamp = now
            self._tokens -= n
            return 0.0 if self._tokens >= 0 else -self._tokens / self.rate

    def sleep(self, n: int) -> None:
        """Consume ``n`` bytes and block as long as the rate requires."""
        delay = self.take(n)
        if delay > 0:
            time.sleep(delay)

    async def acquire(self, n: int) -> None:
        """Consume ``n`` bytes and sleep as long as the rate requires."""
        delay = self.take(n)
        if delay > 0:
            await asyncio.sleep(delay)


def _check_sha256(value: str | None) -> str | None:
    if value is None:
        return None
    text = value.strip().lower()
    if not re.fullmatch(r"[0-9a-f]{64}", text):
        raise InvalidArgumentError(
            f"sha256={value!r} is not a SHA-256 digest; give 64 hex digits (sha256sum prints it)"
        )
    return text


def server_sha256(headers: Mapping[str, str]) -> str | None:
    """The SHA-256 (hex) of the whole file announced in response headers, if any:
    ``Repr-Digest: sha-256=:<base64>:`` (RFC 9530), ``Digest: SHA-256=<base64>`` (RFC 3230)
    or ``X-Checksum-Sha256: <hex>``."""
    lower = {k.lower(): v for k, v in headers.items()}
    raw = lower.get("x-checksum-sha256")
    if raw and re.fullmatch(r"\s*[0-9a-fA-F]{64}\s*", raw):
        return raw.strip().lower()
    for name, pattern in (
        ("repr-digest", r"sha-256=:([A-Za-z0-9+/=]+):"),
        ("digest", r"sha-256=([A-Za-z0-9+/=]+)"),
    ):
        raw = lower.get(name)
        if not raw:
            continue
        m = re.search(pattern, raw, flags=re.IGNORECASE)
        if m is None:
            continue
        try:
            digest = base64.b64decode(m.group(1), validate=True)
        except (binascii.Error, ValueError):
            continue
        if len(digest) == 32:
            return digest.hex()
    return None


# -- destinations ------------------------------------------------------------------------------
class _Sink(Protocol):
    def write(self, offset: int, data: memoryview) -> None: ...


class _FileSink:
    """Writes at offsets of a file (``base`` + offset): through the page cache (``fd``), and
    for the whole aligned blocks of :meth:`write_staged`, with ``O_DIRECT`` (``direct_fd``,
    -1 for none): no copy into the page cache, which costs more CPU than the rest of a
    download's work. A file system that refuses an ``O_DIRECT`` write gets buffered writes
    from then on."""

    def __init__(self, fd: int, base: int = 0, direct_fd: int = -1) -> None:
        self.fd = fd
        self.base = base
        self.direct_fd = direct_fd
        self.submitted = 0  # writes given to a writer thread (counted by the caller)
        self.started = 0  # and begun (counted by the writer)

    def write(self, offset: int, data: memoryview) -> None:
        self._pwrite(self.fd, self.base + offset, data)

    @staticmethod
    def _pwrite(fd: int, pos: int, data: memoryview) -> None:
        n = os.pwrite(fd, data, pos)
        while n < len(data):  # a short write: the rest
            data, pos = data[n:], pos + n
            n = os.pwrite(fd, data, pos)

    def write_queued(self, offset: int, data: memoryview) -> None:
        """:meth:`write_staged` in a writer thread; but when :data:`WRITER_BACKLOG` more writes
        wait behind this one (a busy disk), through the page cache."""
        self.started += 1
        if self.submitted - self.started < WRITER_BACKLOG:
            self.write_staged(offset, data)
        else:
            self.write(offset, data)

    def write_staged(self, offset: int, data: memoryview) -> None:
        """Write ``data``, whose address is ``base + offset`` modulo :data:`ALIGN` (a
        :class:`_Staged` buffer): its whole aligned blocks with ``O_DIRECT``, the partial
        blocks at either end through the page cache (a block is only ever written one way)."""
        pos = self.base + offset
        head = min((-pos) % ALIGN, len(data))
        body = (len(data) - head) // ALIGN * ALIGN
        if self.direct_fd < 0 or not body:
            self.write(offset, data)
            return
        if head:
            self._pwrite(self.fd, pos, data[:head])
        try:
            self._pwrite(self.direct_fd, pos + head, data[head : head + body])
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
            log.info("O_DIRECT write refused (%s); writing through the page cache", exc)
            self.direct_fd = -1
            self._pwrite(self.fd, pos + head, data[head : head + body])
        if head + body < len(data):
            self._pwrite(self.fd, pos + head + body, data[head + body :])


def open_direct(path: Path) -> int:
    """A second descriptor of ``path`` for ``O_DIRECT`` writes, or -1 where the file system
    has none (tmpfs)."""
    try:
        return os.open(path, os.O_WRONLY | getattr(os, "O_DIRECT", 0))
    except OSError:
        return -1


class _MemorySink:
    def __init__(self, array: npt.NDArray[np.uint8]) -> None:
        self.view = memoryview(array.data).cast("B")

    def write(self, offset: int, data: memoryview) -> None:
        n = len(data)
        if offset + n > len(self.view):
            raise FetchError(
                f"the server sent bytes up to {offset + n}, past the {len(self.view)}-byte "
                "destination; the file changed during the download: fetch again"
            )
        self.view[offset : offset + n] = data


STAGE_BYTES = 1 << 20
"""Bytes a file download gathers per connection before one write: libcurl hands over 16 KiB
at a time, and a 1 MiB write costs about half the CPU of 64 small ones."""
ALIGN = 4096
"""Alignment of ``O_DIRECT`` writes (offset, length and address)."""
WRITER_BACKLOG = 2
"""Writes waiting for the writer thread at which it writes through the page cache."""


class _Staged:
    """Write-combining in front of a :class:`_FileSink` for one connection: contiguous bytes
    from ``begin(offset)`` on are gathered into :data:`STAGE_BYTES` and written at once, whole
    :data:`ALIGN` blocks first (the rest of a block waits for its next bytes); :meth:`flush`
    writes all that is held (at the end of each response). The buffers are page-aligned and the
    bytes sit at the file offset's place modulo :data:`ALIGN`, so aligned blocks go out with
    ``O_DIRECT``.

    With a ``pool`` (one writer thread) the writes are made there, from two buffers in turn,
    while this thread goes on receiving (:meth:`_FileSink.write_queued`: through the page cache
    while :data:`WRITER_BACKLOG` writes wait, a busy disk); when the other buffer's write is
    still not made, the bytes go through the page cache from this thread instead, at once.
    :meth:`wait` waits for the writes (and raises what one raised); :meth:`written` is the
    offset all bytes before which are in the file.
    """

    def __init__(self, sink: _FileSink, pool: ThreadPoolExecutor | None = None) -> None:
        self.sink = sink
        self.pool = pool
        self.buffers = [memoryview(mmap.mmap(-1, STAGE_BYTES + ALIGN)) for _ in range(2)]
        self.current = 0
        self.view = self.buffers[0]
        self.pending: collections.deque[tuple[int, int, Future[None]]] = collections.deque()
        self.start = 0  # span offset of the first byte held (all before it are written)
        self.lead = 0  # where it is in the buffer: its file offset modulo ALIGN
        self.fill = 0

    def begin(self, offset: int) -> None:
        self.start, self.lead, self.fill = offset, (self.sink.base + offset) % ALIGN, 0

    def write(self, data: memoryview) -> None:
        n = len(data)
        if self.lead + self.fill + n > len(self.view):
            self._drain()
            if self.lead + self.fill + n > len(self.view):  # more than the buffer holds
                self.flush()
                self.wait()
                self.sink.write(self.start, data)
                self.start += n
                self.lead = (self.sink.base + self.start) % ALIGN
                return
        at = self.lead + self.fill
        self.view[at : at + n] = data
        self.fill += n

    def _submit(self, first: int, data: memoryview) -> None:
        if self.pool is None:
            self.sink.write_staged(first, data)
            return
        other = self.current ^ 1
        if any(index == other and not f.done() for index, _, f in self.pending):
            # the writer is far behind: through the page cache, here, at once
            self.sink.write(first, data)
            return
        self.sink.submitted += 1
        future = self.pool.submit(self.sink.write_queued, first, data)
        self.pending.append((self.current, first, future))
        self.current = other
        self.view = self.buffers[other]

    def _drain(self) -> None:
        """Write the held bytes up to the last block boundary; the rest moves to the front."""
        end = self.lead + self.fill
        keep = end % ALIGN
        if end - keep <= self.lead:
            return
        old = self.view
        self._submit(self.start, old[self.lead : end - keep])
        self.view[:keep] = old[end - keep : end]
        self.start += end - keep - self.lead
        self.lead, self.fill = 0, keep

    def flush(self) -> None:
        if self.fill:
            self._submit(self.start, self.view[self.lead : self.lead + self.fill])
            self.start += self.fill
            self.lead, self.fill = (self.sink.base + self.start) % ALIGN, 0

    def written(self) -> int:
        """The span offset all bytes before which are in the file."""
        while self.pending and self.pending[0][2].done():
            self.pending.popleft()[2].result()
        return self.pending[0][1] if self.pending else self.start

    def wait(self) -> None:
        """Wait for the writes in flight; raises the first one's error."""
        while self.pending:
            self.pending.popleft()[2].result()


class _GrowingSink:
    """Memory of unknown final size (a ``200`` answer without Content-Length)."""

    def __init__(self) -> None:
        self.data = bytearray()

    def write(self, offset: int, data: memoryview) -> None:
        end = offset + len(data)
        if end > len(self.data):
            self.data.extend(b"\0" * (end - len(self.data)))
        self.data[offset:end] = data


def _memory_target(
    size: int, into: object, engine: Engine | None
) -> tuple[npt.NDArray[np.uint8], object]:
    """A writable uint8 array of ``size`` bytes (and the object keeping it alive): ``into``
    (at least ``size`` bytes), pinned registered memory of ``engine``, or a new one."""
    if into is not None:
        arr = as_array(into, writable=True, what="destination of the fetch")
        flat: npt.NDArray[np.uint8] = arr.reshape(-1).view(np.uint8)
        if flat.nbytes < size:
            raise InvalidArgumentError(
                f"into= holds {flat.nbytes} bytes but the file has {size}; pass a buffer of at "
                f"least {size} bytes"
            )
        return flat[:size], into
    if engine is not None:
        region = engine.alloc_pinned(size, access="rw")
        return region.numpy(), region
    return np.empty(size, dtype=np.uint8), None


# -- the remote file ---------------------------------------------------------------------------
@dataclass
class _Remote:
    size: int | None
    ranged: bool
    etag: str | None = None
    last_modified: str | None = None
    sha256: str | None = None
    http_version: str = ""


_CONTENT_RANGE = re.compile(r"bytes\s+(?:(\d+)-(\d+)|\*)/(\d+|\*)", re.IGNORECASE)


def _content_range(value: str | None) -> tuple[int | None, int | None, int | None]:
    m = _CONTENT_RANGE.fullmatch((value or "").strip())
    if m is None:
        return None, None, None
    first = int(m.group(1)) if m.group(1) else None
    last = int(m.group(2)) if m.group(2) else None
    total = int(m.group(3)) if m.group(3) != "*" else None
    return first, last, total


def _remote_from(headers: Mapping[str, str], ranged: bool, version: str = "") -> _Remote:
    """What a response's headers (names lower-case) say about the file: its size (from
    ``Content-Range`` when ``ranged``, else ``Content-Length``), validators and digest."""
    if ranged:
        _, _, size = _content_range(headers.get("content-range"))
    else:
        length = headers.get("content-length")
        size = int(length) if length and length.isdigit() else None
    return _Remote(
        size=size,
        ranged=ranged,
        etag=headers.get("etag"),
        last_modified=headers.get("last-modified"),
        sha256=server_sha256(headers),
        http_version=version,
    )


# -- resume state ------------------------------------------------------------------------------
class _State:
    """The sidecar file of a download to disk: which chunks are complete."""

    def __init__(self, path: Path, meta: dict[str, Any], done: set[int]) -> None:
        self.path = path
        self.meta = meta
        self.done = done
        self._saved = 0.0
        self._lock = threading.Lock()

    @classmethod
    def load(cls, path: Path, meta: dict[str, Any]) -> _State:
        """The saved state when it matches ``meta`` (size, chunk size, ETag, Last-Modified),
        else an empty one."""
        done: set[int] = set()
        try:
            saved = json.loads(path.read_text())
        except (OSError, ValueError):
            saved = None
        if isinstance(saved, dict):
            same = all(saved.get(k) == meta[k] for k in ("v", "size", "chunk_size"))
            for key in ("etag", "last_modified"):
                if meta[key] is not None or saved.get(key) is not None:
                    same = same and saved.get(key) == meta[key]
            if meta["etag"] is None and meta["last_modified"] is None:
                log.warning("resuming %s: the server sends no ETag/Last-Modified", meta["url"])
            if same:
                nchunks = meta["nchunks"]
                done = {int(i) for i in saved.get("done", []) if 0 <= int(i) < nchunks}
            else:
                log.warning(
                    "%s: the saved state is for another version of the file (size, ETag or "
                    "Last-Modified changed); starting over",
                    path,
                )
        return cls(path, meta, done)

    def mark(self, index: int) -> None:
        with self._lock:
            self.done.add(index)
        if time.monotonic() - self._saved >= _STATE_SAVE_EVERY_S:
            self.save()

    def save(self) -> None:
        with self._lock:
            record = {**self.meta, "done": sorted(self.done)}
            self._saved = time.monotonic()
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(record))
        os.replace(tmp, self.path)

    def remove(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


# -- the transfer ------------------------------------------------------------------------------
@dataclass
class _Options:
    connections: int
    chunk_size: int | None
    bucket: TokenBucket | None
    retries: int
    timeout: float
    headers: dict[str, str]
    progress: bool
    desc: str
    adaptive: bool = False
    stop: threading.Event | None = None
    stats: dict[str, int] = field(default_factory=lambda: {"bytes": 0, "retries": 0})

    def ramp(self) -> ConnectionRamp:
        """The connection count of a download: ``connections`` fixed, or adaptive from
        :data:`START_CONNECTIONS` up to ``connections``."""
        if self.adaptive:
            return ConnectionRamp(START_CONNECTIONS, self.connections)
        return ConnectionRamp(self.connections, self.connections, adaptive=False)

    def sizer(self, chunk: int) -> RangeSizer:
        """The range size of a download cut into ``chunk``-byte chunks: adaptive (whole
        chunks, grown with the rate) unless ``chunk_size`` fixes it at one chunk."""
        return RangeSizer(chunk, adaptive=self.chunk_size is None)

    def chunk_for(self, size: int) -> int:
        """Bytes per ranged request for ``size`` bytes: ``chunk_size`` or
        :func:`choose_chunk_size` for the most connections the download may open."""
        return self.chunk_size or choose_chunk_size(size, self.connections)


def _options(
    connections: int | None,
    chunk_size: int | None,
    rate: float | int | str | None,
    retries: int,
    timeout: float,
    headers: Mapping[str, str] | None,
    progress: bool,
    desc: str,
) -> _Options:
    conns = MAX_ADAPTIVE_CONNECTIONS if connections is None else connections
    if isinstance(conns, bool) or not isinstance(conns, int) or not 1 <= conns <= MAX_CONNECTIONS:
        raise InvalidArgumentError(
            f"connections={connections!r} must be an integer from 1 to {MAX_CONNECTIONS}"
        )
    if chunk_size is not None and (
        isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1
    ):
        raise InvalidArgumentError(f"chunk_size={chunk_size!r} must be a positive number of bytes")
    if isinstance(retries, bool) or not isinstance(retries, int) or not 0 <= retries <= 100:
        raise InvalidArgumentError(f"retries={retries!r} must be an integer from 0 to 100")
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, (int, float))
        or not math.isfinite(timeout)
        or timeout <= 0
    ):
        raise InvalidArgumentError(f"timeout={timeout!r} must be a finite number of seconds > 0")
    limit = parse_rate(rate)
    return _Options(
        adaptive=connections is None,
        connections=conns,
        chunk_size=chunk_size,
        bucket=TokenBucket(limit) if limit is not None else None,
        retries=retries,
        timeout=float(timeout),
        headers=dict(headers or {}),
        progress=progress,
        desc=desc,
    )


async def _in_thread(run: Callable[[threading.Event], T]) -> T:
    """``run(stop)`` in a worker thread; when the awaiting task is cancelled, ``stop`` is set
    (the download ends within :data:`~rdmaxfer.tools.curl_session.SELECT_S` seconds) and the
    thread is waited for before the cancellation goes on."""
    stop = threading.Event()
    task = asyncio.ensure_future(asyncio.to_thread(run, stop))
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        stop.set()
        with contextlib.suppress(FetchError):
            await task
        raise
