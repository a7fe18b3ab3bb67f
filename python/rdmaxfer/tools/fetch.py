"""Ranged HTTP download straight into a file or into memory (``rdmaxfer fetch``).

A large file (model weights) is cut into chunks (:func:`choose_chunk_size`) that parallel
HTTP connections fetch with ``Range`` requests. The bytes move in libcurl, through pycurl's
multi interface (:mod:`rdmaxfer.tools.curl_session`): each response lands at its offset in the
destination as it arrives (into memory, one copy per 16 KiB block libcurl hands over; into a
file, gathered per connection and written by a writer thread, whole 4 KiB blocks with
``O_DIRECT``); connections are kept alive, speak HTTP/2 where an ``https`` server offers it,
follow redirects and use libcurl's TLS.

- a file (``out=``): opened once, grown to its final size with ``ftruncate`` (a sparse file),
  written with ``os.pwrite`` (``O_DIRECT`` for whole blocks, the page cache for the rest and
  while the disk is behind); a small JSON sidecar ``<out>.rdmaxfer-fetch`` records finished
  chunks so that an interrupted download resumes with only the missing ones (the sidecar is
  trusted only while the server's size, ``ETag`` and ``Last-Modified`` are unchanged);
- memory: a new ``np.empty`` buffer, a caller's writable buffer (``into=``), or pinned
  registered memory of an :class:`~rdmaxfer.transport.engine.Engine` (``engine=``);
- ``.safetensors`` (:func:`fetch_weights`, :mod:`rdmaxfer.tools.fetch_safetensors`): the header
  is read first (the 8-byte length, then the JSON), then every tensor's bytes land in arrays of
  the right dtype and shape.

The connection count adapts (:mod:`rdmaxfer.tools.connection_ramp`): 4 first, doubled while the
total rate grows (servers and CDNs cap each connection), up to 32; ``connections=`` fixes it.
Every wait is bounded (the connect, and a transfer that receives nothing, ``timeout`` seconds).
A failed range is retried from the byte where it stopped, with exponential backoff (``retries``
times at most), while the other connections go on. A server that answers a ranged request
with ``200`` (it ignores ``Range``) is read as one stream, with a warning. ``rate`` caps the
total download rate in bytes per second (a token bucket shared by all connections). At the end
the size is checked, and the SHA-256 when the caller gives one or the server sends one
(``Repr-Digest: sha-256=:…:``, ``Digest: SHA-256=…`` or ``X-Checksum-Sha256``).

Units: sizes and offsets in bytes, rates in bytes per second, times in seconds,
``FetchResult.gbps`` in GB/s (1e9 bytes per second).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from ..errors import FetchIntegrityError, InvalidArgumentError
from .connection_ramp import ConnectionRamp, RangeSizer
from .curl_session import Session
from .fetch_safetensors import afetch_weights, fetch_weights
from .range_requests import download_span, probe, sha256_fd, verify, warn_no_ranges
from .ranges import (
    _STATE_VERSION,
    DEFAULT_RETRIES,
    MAX_CHUNKS,
    STATE_SUFFIX,
    TokenBucket,
    _check_sha256,
    _FileSink,
    _GrowingSink,
    _in_thread,
    _memory_target,
    _MemorySink,
    _Options,
    _options,
    _Remote,
    _State,
    choose_chunk_size,
    open_direct,
    parse_rate,
    server_sha256,
)

if TYPE_CHECKING:
    from ..transport.engine import Engine

__all__ = [
    "MAX_CHUNKS",
    "STATE_SUFFIX",
    "FetchResult",
    "TokenBucket",
    "afetch",
    "afetch_weights",
    "choose_chunk_size",
    "fetch",
    "fetch_weights",
    "parse_rate",
    "server_sha256",
]


@dataclass
class FetchResult:
    """What :func:`fetch` did.

    Attributes:
        url: the URL fetched.
        size: the file's size in bytes.
        path: the output file, or None when fetched into memory.
        array: the bytes in memory (1-D uint8, ``size`` elements), or None for a file.
        bytes_fetched: bytes transferred by this call (less than ``size`` after a resume;
            a retried range counts only its new bytes).
        seconds: wall time of this call.
        ranged: False when the server ignored ``Range`` and one stream was used.
        connections: the connection count chosen (the last of ``connection_steps``; no more
            than the chunks there were to fetch).
        connection_steps: the counts the adaptive ramp went through: ``{"t_s": seconds
            since the download began, "connections": n, "GB_per_s": rate measured at n}``.
        chunks: chunks the file was cut into (the resume grid); ``resumed_chunks`` of them
            were already done.
        chunk_size: bytes per chunk.
        range_size: the largest range one request asked for (a whole number of chunks).
        range_steps: the range sizes used: ``{"t_s": seconds since the download began,
            "bytes": n}`` at each change (one chunk first, then grown with the rate measured
            per connection; fixed at one chunk when ``chunk_size`` is given).
        retries: requests that failed and were retried.
        sha256: the verified SHA-256 (hex), or None when no digest was known.
        http_version: the server's HTTP version (``"1.1"``, ``"2"``).
    """

    url: str
    size: int
    path: Path | None = None
    array: npt.NDArray[np.uint8] | None = None
    bytes_fetched: int = 0
    seconds: float = 0.0
    ranged: bool = True
    connections: int = 1
    connection_steps: list[dict[str, float]] = field(default_factory=list)
    chunks: int = 1
    resumed_chunks: int = 0
    chunk_size: int = 0
    range_size: int = 0
    range_steps: list[dict[str, float]] = field(default_factory=list)
    retries: int = 0
    sha256: str | None = None
    http_version: str = ""

    @property
    def gbps(self) -> float:
        """Rate of this call in GB/s (1e9 bytes/s) over the bytes it transferred."""
        return self.bytes_fetched / self.seconds / 1e9 if self.seconds > 0 else 0.0


# -- public API --------------------------------------------------------------------------------
async def afetch(
    url: str,
    out: str | os.PathLike[str] | None = None,
    *,
    into: object = None,
    engine: Engine | None = None,
    connections: int | None = None,
    chunk_size: int | None = None,
    rate: float | int | str | None = None,
    sha256: str | None = None,
    retries: int = DEFAULT_RETRIES,
    timeout: float = 30.0,
    resume: bool = True,
    progress: bool = False,
    headers: Mapping[str, str] | None = None,
) -> FetchResult:
    """Asyncio form of :func:`fetch` (same arguments, result and errors): the download runs
    in a worker thread; cancelling the task stops it."""
    return await _in_thread(
        lambda stop: _fetch(
            url, out, into, engine, connections, chunk_size, rate, sha256, retries, timeout,
            resume, progress, headers, stop,
        )
    )  # fmt: skip


def _fetch(
    url: str,
    out: str | os.PathLike[str] | None,
    into: object,
    engine: Engine | None,
    connections: int | None,
    chunk_size: int | None,
    rate: float | int | str | None,
    sha256: str | None,
    retries: int,
    timeout: float,
    resume: bool,
    progress: bool,
    headers: Mapping[str, str] | None,
    stop: threading.Event | None,
) -> FetchResult:
    t0 = time.perf_counter()
    opts = _options(connections, chunk_size, rate, retries, timeout, headers, progress, "fetch")
    expected = _check_sha256(sha256)
    if out is not None and (into is not None or engine is not None):
        raise InvalidArgumentError("give either out= (a file) or into=/engine= (memory), not both")
    with contextlib.closing(Session(opts.timeout, stop)) as session:
        if out is not None:
            result = _to_file(session, url, Path(out), opts, resume, expected)
        else:
            result = _to_memory(session, url, opts, into, engine, expected)
    result.seconds = time.perf_counter() - t0
    result.bytes_fetched = opts.stats["bytes"]
    result.retries = opts.stats["retries"]
    return result


def _ranged_result(
    result: FetchResult, remote: _Remote, ramp: ConnectionRamp, sizer: RangeSizer, todo: int
) -> FetchResult:
    """``result`` with the figures of a ranged download of ``todo`` chunks."""
    result.connections = min(ramp.target, max(todo, 1))
    result.connection_steps = [s.as_dict() for s in ramp.steps]
    result.chunk_size = sizer.chunk
    result.range_size = sizer.largest
    result.range_steps = sizer.as_list()
    result.http_version = remote.http_version
    return result


def _to_file(
    session: Session, url: str, path: Path, opts: _Options, resume: bool, expected: str | None
) -> FetchResult:
    state_path = path.with_name(path.name + STATE_SUFFIX)
    stream_fds: list[int] = []

    def whole(remote: _Remote) -> _FileSink:  # the server ignores Range: one stream
        stream_fds.append(os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644))
        return _FileSink(stream_fds[-1])

    try:
        remote, received = probe(session, url, opts, whole)
        if not remote.ranged:
            warn_no_ranges(url)
            fd = stream_fds[0]
            os.ftruncate(fd, received)
            digest = verify(expected, remote.sha256, lambda: sha256_fd(fd, received), url)
            with contextlib.suppress(FileNotFoundError):
                state_path.unlink()
            return FetchResult(url, received, path=path, ranged=False, sha256=digest,
                               http_version=remote.http_version)  # fmt: skip
    finally:
        for fd in stream_fds:
            os.close(fd)

    size = remote.size or 0
    chunk = opts.chunk_for(size)
    meta = {
        "v": _STATE_VERSION,
        "url": url,
        "size": size,
        "chunk_size": chunk,
        "nchunks": max(1, -(-size // chunk)) if size else 0,
        "etag": remote.etag,
        "last_modified": remote.last_modified,
    }
    exists = path.exists() and path.stat().st_size == size
    if resume and exists and state_path.exists():
        state = _State.load(state_path, meta)
    else:
        state = _State(state_path, meta, set())
    flags = os.O_RDWR | os.O_CREAT | (0 if state.done else os.O_TRUNC)
    fd = os.open(path, flags, 0o644)
    direct = open_direct(path)
    ramp, sizer = opts.ramp(), opts.sizer(chunk)
    try:
        os.ftruncate(fd, size)  # sparse: no blocks until written
        if size:
            state.save()
            sink = _FileSink(fd, direct_fd=direct)
            nchunks, resumed = download_span(
                session, url, remote, 0, size, sink, opts, state, chunk, ramp, sizer
            )
        else:
            nchunks, resumed = 0, 0
        if os.fstat(fd).st_size != size:
            raise FetchIntegrityError(f"{path}: {os.fstat(fd).st_size} bytes, expected {size}")
        try:
            digest = verify(expected, remote.sha256, lambda: sha256_fd(fd, size), url)
        except FetchIntegrityError:
            state.remove()  # a corrupt file is not resumed
            raise
    finally:
        os.close(fd)
        if direct >= 0:
            os.close(direct)
    state.remove()
    result = FetchResult(url, size, path=path, chunks=nchunks, resumed_chunks=resumed,
                         sha256=digest)  # fmt: skip
    return _ranged_result(result, remote, ramp, sizer, nchunks - resumed)


def _to_memory(
    session: Session,
    url: str,
    opts: _Options,
    into: object,
    engine: Engine | None,
    expected: str | None,
) -> FetchResult:
    streamed: list[npt.NDArray[np.uint8]] = []
    growing = _GrowingSink()

    def whole(remote: _Remote) -> _MemorySink | _GrowingSink:  # the server ignores Range
        if remote.size is None:
            return growing
        streamed.append(_memory_target(remote.size, into, engine)[0])
        return _MemorySink(streamed[-1])

    remote, received = probe(session, url, opts, whole)
    if not remote.ranged:
        warn_no_ranges(url)
        if streamed:
            arr = streamed[0]
        else:
            arr, _ = _memory_target(received, into, engine)
            arr[:] = np.frombuffer(growing.data, dtype=np.uint8)
        digest = verify(expected, remote.sha256, lambda: hashlib.sha256(arr.data).hexdigest(), url)
        return FetchResult(url, received, array=arr, ranged=False, sha256=digest,
                           http_version=remote.http_version)  # fmt: skip
    size = remote.size or 0
    arr = streamed[0] if streamed else _memory_target(size, into, engine)[0]
    chunk = opts.chunk_for(size)
    ramp, sizer = opts.ramp(), opts.sizer(chunk)
    nchunks = 0
    if size:
        nchunks, _ = download_span(
            session, url, remote, 0, size, _MemorySink(arr), opts, None, chunk, ramp, sizer
        )
    digest = verify(expected, remote.sha256, lambda: hashlib.sha256(arr.data).hexdigest(), url)
    result = FetchResult(url, size, array=arr, chunks=nchunks, sha256=digest)
    return _ranged_result(result, remote, ramp, sizer, nchunks)


def fetch(
    url: str,
    out: str | os.PathLike[str] | None = None,
    *,
    into: object = None,
    engine: Engine | None = None,
    connections: int | None = None,
    chunk_size: int | None = None,
    rate: float | int | str | None = None,
    sha256: str | None = None,
    retries: int = DEFAULT_RETRIES,
    timeout: float = 30.0,
    resume: bool = True,
    progress: bool = False,
    headers: Mapping[str, str] | None = None,
) -> FetchResult:
    """Download ``url`` with parallel HTTP Range requests into a file or memory.

    The bytes move in libcurl (pycurl's multi interface): each response lands at its offset
    in the destination (a file's whole 4 KiB blocks with ``O_DIRECT`` from a writer thread,
    so the file is not left in the page cache); connections are kept alive,
    speak HTTP/2 where an ``https`` server offers it, follow redirects and use libcurl's TLS.

    Args:
        url: an ``http://`` or ``https://`` URL (redirects are followed).
        out: write the file here (a sparse file of the final size, filled at offsets); an
            interrupted download resumes from ``<out>.rdmaxfer-fetch`` unless ``resume=False``.
            Without ``out`` the bytes land in memory (``FetchResult.array``).
        into: memory destination: a writable C-contiguous array/buffer of at least the file's
            size (default: a new ``np.empty``).
        engine: allocate the destination as pinned, registered memory of this engine (ready
            to be sent with one-sided WRITEs).
        connections: parallel connections, fixed (1 to 256). Default: adaptive, 4 first,
            doubled while the total rate grows by 30% or more (a server that caps each
            connection), up to 32; ``FetchResult.connection_steps`` lists the steps.
        chunk_size: bytes per chunk, the unit of resume, and then per ranged request
            (default: :func:`choose_chunk_size` for the most connections the download may
            open, and ranges of whole chunks that grow with the rate measured per
            connection, up to 64 MiB; ``FetchResult.range_steps`` lists them).
        rate: cap in bytes/s for all connections together (``"1G"``, ``"500M"`` or a number).
        sha256: expected SHA-256 (64 hex digits) of the whole file.
        retries: attempts after the first for each failed range (backoff 0.25 s doubling to
            8 s).
        timeout: seconds for each connect, and for a transfer that receives nothing.
        resume: use (and keep) the sidecar state file of an interrupted download to ``out``.
        progress: show a tqdm progress bar on stderr (with the connection count).
        headers: extra request headers (e.g. ``Authorization``).

    Returns:
        A :class:`FetchResult`.

    Raises:
        InvalidArgumentError: a bad argument (the message names it).
        FetchError: HTTP errors, a range that kept failing after ``retries`` retries, or a
            file that changed on the server during the download.
        FetchIntegrityError: wrong size or SHA-256 (a :class:`FetchError`).
    """
    return _fetch(
        url, out, into, engine, connections, chunk_size, rate, sha256, retries, timeout, resume,
        progress, headers, None,
    )  # fmt: skip
