"""Ranged HTTP download straight into a file or into memory (``rdmaxfer fetch``).

A large file (model weights) is cut into chunks (:func:`choose_chunk_size`) that
``connections`` asynchronous HTTP/1.1 connections (httpx) fetch with ``Range`` requests; each
chunk's bytes go to their offset in the destination as they arrive:

- a file (``out=``): opened once, grown to its final size with ``ftruncate`` (a sparse file),
  written with ``os.pwrite``; a small JSON sidecar ``<out>.rdmaxfer-fetch`` records finished
  chunks so that an interrupted download resumes with only the missing ones (the sidecar is
  trusted only while the server's size, ``ETag`` and ``Last-Modified`` are unchanged);
- memory: a new ``np.empty`` buffer, a caller's writable buffer (``into=``), or pinned
  registered memory of an :class:`~rdmaxfer.transport.engine.Engine` (``engine=``);
- ``.safetensors`` (:func:`fetch_weights`): the header is read first (the 8-byte length, then
  the JSON), then every tensor's bytes land in arrays of the right dtype and shape.

Every wait is bounded (httpx connect/read/write/pool timeouts). A failed range is retried
from the byte where it stopped, with exponential backoff (``retries`` times at most). A server
that answers a ranged request with ``200`` (it ignores ``Range``) is read as one stream, with
a warning. ``rate`` caps the total download rate in bytes per second (a token bucket shared by
all connections). At the end the size is checked, and the SHA-256 when the caller gives one or
the server sends one (``Repr-Digest: sha-256=:…:``, ``Digest: SHA-256=…`` or
``X-Checksum-Sha256``).

Units: sizes and offsets in bytes, rates in bytes per second, times in seconds,
``FetchResult.gbps`` in GB/s (1e9 bytes per second).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import struct
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from ..errors import FetchError, FetchIntegrityError, InvalidArgumentError
from ..memory.buffer import as_array
from .range_requests import (
    _backoff,
    _client,
    _download_span,
    _probe,
    _Retry,
    _sha256_fd,
    _single_stream,
    _verify,
    _warn_no_ranges,
)
from .ranges import (
    _RETRY_STATUS,
    _STATE_VERSION,
    DEFAULT_RETRIES,
    MAX_CHUNKS,
    STATE_SUFFIX,
    TokenBucket,
    _check_sha256,
    _content_range,
    _FileSink,
    _GrowingSink,
    _MemorySink,
    _Options,
    _options,
    _Remote,
    _remote_from,
    _State,
    choose_chunk_size,
    parse_rate,
    server_sha256,
)

if TYPE_CHECKING:
    import httpx

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

MAX_SAFETENSORS_HEADER = 100 << 20
"""safetensors' own limit on the JSON header (bytes)."""


@dataclass
class FetchResult:
    """What :func:`fetch` did.

    Attributes:
        url: the URL fetched.
        size: the file's size in bytes.
        path: the output file, or None when fetched into memory.
        array: the bytes in memory (1-D uint8, ``size`` elements), or None for a file.
        bytes_fetched: bytes transferred by this call (less than ``size`` after a resume).
        seconds: wall time of this call.
        ranged: False when the server ignored ``Range`` and one stream was used.
        connections: connections used.
        chunks: chunks the file was cut into; ``resumed_chunks`` of them were already done.
        retries: ranged requests that failed and were retried.
        sha256: the verified SHA-256 (hex), or None when no digest was known.
    """

    url: str
    size: int
    path: Path | None = None
    array: npt.NDArray[np.uint8] | None = None
    bytes_fetched: int = 0
    seconds: float = 0.0
    ranged: bool = True
    connections: int = 1
    chunks: int = 1
    resumed_chunks: int = 0
    retries: int = 0
    sha256: str | None = None

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
    """Asyncio form of :func:`fetch` (same arguments, result and errors)."""
    t0 = time.perf_counter()
    opts = _options(connections, chunk_size, rate, retries, timeout, headers, progress, "fetch")
    expected = _check_sha256(sha256)
    if out is not None and (into is not None or engine is not None):
        raise InvalidArgumentError("give either out= (a file) or into=/engine= (memory), not both")
    async with _client(opts) as client:
        remote = await _probe(client, url, opts)
        try:
            if out is not None:
                result = await _to_file(client, url, Path(out), remote, opts, resume, expected)
            else:
                result = await _to_memory(client, url, remote, opts, into, engine, expected)
        finally:
            await remote.close()
    result.seconds = time.perf_counter() - t0
    result.bytes_fetched = opts.stats["bytes"]
    result.retries = opts.stats["retries"]
    return result


async def _to_file(
    client: httpx.AsyncClient,
    url: str,
    path: Path,
    remote: _Remote,
    opts: _Options,
    resume: bool,
    expected: str | None,
) -> FetchResult:
    state_path = path.with_name(path.name + STATE_SUFFIX)
    if not remote.ranged:
        _warn_no_ranges(url)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            remote, size = await _single_stream(client, url, _FileSink(fd), opts, remote)
            os.ftruncate(fd, size)
            digest = _verify(expected, remote.sha256, lambda: _sha256_fd(fd, size), url)
        finally:
            os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            state_path.unlink()
        return FetchResult(url, size, path=path, ranged=False, sha256=digest)

    size = remote.size or 0
    chunk = opts.chunk_size or choose_chunk_size(size, opts.connections)
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
    try:
        os.ftruncate(fd, size)  # sparse: no blocks until written
        if size:
            state.save()
            nchunks, resumed = await _download_span(
                client, url, remote, 0, size, _FileSink(fd), opts, state, chunk
            )
        else:
            nchunks, resumed = 0, 0
        if os.fstat(fd).st_size != size:
            raise FetchIntegrityError(f"{path}: {os.fstat(fd).st_size} bytes, expected {size}")
        try:
            digest = _verify(expected, remote.sha256, lambda: _sha256_fd(fd, size), url)
        except FetchIntegrityError:
            state.remove()  # a corrupt file is not resumed
            raise
    finally:
        os.close(fd)
    state.remove()
    return FetchResult(
        url,
        size,
        path=path,
        connections=min(opts.connections, max(nchunks - resumed, 1)),
        chunks=nchunks,
        resumed_chunks=resumed,
        sha256=digest,
    )


def _memory_target(
    size: int, into: object, engine: Engine | None
) -> tuple[npt.NDArray[np.uint8], object]:
    """A writable uint8 array of ``size`` bytes (and the object keeping it alive)."""
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


async def _to_memory(
    client: httpx.AsyncClient,
    url: str,
    remote: _Remote,
    opts: _Options,
    into: object,
    engine: Engine | None,
    expected: str | None,
) -> FetchResult:
    if not remote.ranged:
        _warn_no_ranges(url)
        if remote.size is not None:
            arr, _ = _memory_target(remote.size, into, engine)
            remote, size = await _single_stream(client, url, _MemorySink(arr), opts, remote)
        else:
            grow = _GrowingSink()
            remote, size = await _single_stream(client, url, grow, opts, remote)
            arr, _ = _memory_target(size, into, engine)
            arr[:] = np.frombuffer(grow.data, dtype=np.uint8)
        digest = _verify(expected, remote.sha256, lambda: hashlib.sha256(arr.data).hexdigest(), url)
        return FetchResult(url, size, array=arr, ranged=False, sha256=digest)
    size = remote.size or 0
    arr, _ = _memory_target(size, into, engine)
    chunk = opts.chunk_size or choose_chunk_size(size, opts.connections)
    nchunks = 0
    if size:
        nchunks, _ = await _download_span(
            client, url, remote, 0, size, _MemorySink(arr), opts, None, chunk
        )
    digest = _verify(expected, remote.sha256, lambda: hashlib.sha256(arr.data).hexdigest(), url)
    return FetchResult(
        url,
        size,
        array=arr,
        connections=min(opts.connections, max(nchunks, 1)),
        chunks=nchunks,
        sha256=digest,
    )


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

    Args:
        url: an ``http://`` or ``https://`` URL (redirects are followed).
        out: write the file here (a sparse file of the final size, filled at offsets); an
            interrupted download resumes from ``<out>.rdmaxfer-fetch`` unless ``resume=False``.
            Without ``out`` the bytes land in memory (``FetchResult.array``).
        into: memory destination: a writable C-contiguous array/buffer of at least the file's
            size (default: a new ``np.empty``).
        engine: allocate the destination as pinned, registered memory of this engine (ready
            to be sent with one-sided WRITEs).
        connections: parallel connections (default 8, at most 256).
        chunk_size: bytes per ranged request (default: :func:`choose_chunk_size`).
        rate: cap in bytes/s for all connections together (``"1G"``, ``"500M"`` or a number).
        sha256: expected SHA-256 (64 hex digits) of the whole file.
        retries: attempts after the first for each failed range (backoff 0.25 s doubling to
            8 s).
        timeout: seconds for each connect, read, write and connection-pool wait.
        resume: use (and keep) the sidecar state file of an interrupted download to ``out``.
        progress: show a tqdm progress bar on stderr.
        headers: extra request headers (e.g. ``Authorization``).

    Returns:
        A :class:`FetchResult`.

    Raises:
        InvalidArgumentError: a bad argument (the message names it).
        FetchError: HTTP errors, a range that kept failing after ``retries`` retries, or a
            file that changed on the server during the download.
        FetchIntegrityError: wrong size or SHA-256 (a :class:`FetchError`).
    """
    return asyncio.run(
        afetch(
            url,
            out,
            into=into,
            engine=engine,
            connections=connections,
            chunk_size=chunk_size,
            rate=rate,
            sha256=sha256,
            retries=retries,
            timeout=timeout,
            resume=resume,
            progress=progress,
            headers=headers,
        )
    )


# -- safetensors -------------------------------------------------------------------------------
async def _get_range(
    client: httpx.AsyncClient, url: str, first: int, last: int, opts: _Options
) -> tuple[bytes, int | None, httpx.Response]:
    """Bytes ``first..last`` (inclusive): (body, file size or None, response). A ``200``
    answer returns the whole body with its size (the server ignores Range)."""
    import httpx

    attempt = 0
    while True:
        try:
            response = await client.get(url, headers={"Range": f"bytes={first}-{last}"})
            if response.status_code == 206:
                _, _, total = _content_range(response.headers.get("content-range"))
                return response.content, total, response
            if response.status_code == 200:
                return response.content, len(response.content), response
            if response.status_code in _RETRY_STATUS:
                raise _Retry(f"HTTP {response.status_code}")
            raise FetchError(
                f"{url}: HTTP {response.status_code} for bytes {first}-{last}; check the URL"
            )
        except (httpx.TransportError, _Retry) as exc:
            attempt += 1
            await _backoff(opts, attempt, f"GET {url} bytes {first}-{last}", exc)


def _parse_header(
    raw: bytes, url: str, data_len: int
) -> dict[str, tuple[np.dtype[Any], tuple[int, ...], int, int]]:
    from ..weights import DTYPES

    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, ValueError) as exc:
        raise FetchError(
            f"{url}: the safetensors header is not JSON ({exc}); not a safetensors file"
        ) from exc
    if not isinstance(header, dict):
        raise FetchError(f"{url}: the safetensors header is not a JSON object")
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype = DTYPES[info["dtype"]]
            shape = tuple(int(d) for d in info["shape"])
            begin, end = (int(x) for x in info["data_offsets"])
        except (KeyError, TypeError, ValueError) as exc:
            raise FetchError(
                f"{url}: tensor {name!r} has a bad or unsupported header entry {info!r} ({exc})"
            ) from exc
        count = int(np.prod(shape, dtype=np.int64))
        if not 0 <= begin <= end <= data_len or end - begin != count * dtype.itemsize:
            raise FetchError(
                f"{url}: tensor {name!r} offsets {begin}..{end} do not match its dtype/shape "
                f"or the {data_len}-byte data section; the file is corrupt"
            )
        tensors[name] = (dtype, shape, begin, end)
    return tensors


async def afetch_weights(
    url: str,
    *,
    engine: Engine | None = None,
    connections: int | None = None,
    chunk_size: int | None = None,
    rate: float | int | str | None = None,
    retries: int = DEFAULT_RETRIES,
    timeout: float = 30.0,
    progress: bool = False,
    headers: Mapping[str, str] | None = None,
) -> dict[str, npt.NDArray[Any]]:
    """Asyncio form of :func:`fetch_weights` (same arguments, result and errors)."""
    opts = _options(
        connections, chunk_size, rate, retries, timeout, headers, progress, "fetch weights"
    )
    async with _client(opts) as client:
        first, size, response = await _get_range(client, url, 0, 7, opts)
        if response.status_code == 200:  # no Range: we already hold the whole file
            _warn_no_ranges(url)
            whole = np.frombuffer(first, dtype=np.uint8)
            return _arrays_from_file_bytes(whole, url, engine)
        if len(first) != 8 or size is None:
            raise FetchError(f"{url}: too short for a safetensors file ({size} bytes)")
        (hlen,) = struct.unpack("<Q", first)
        if hlen > MAX_SAFETENSORS_HEADER or 8 + hlen > size:
            raise FetchError(
                f"{url}: safetensors header length {hlen} is impossible for a {size}-byte "
                "file; not a safetensors file"
            )
        raw, _, _ = await _get_range(client, url, 8, 8 + hlen - 1, opts)
        data_len = size - 8 - hlen
        tensors = _parse_header(raw, url, data_len)
        remote = _remote_from(response, ranged=True)
        buf, _owner = _memory_target(data_len, None, engine)
        if data_len:
            chunk = opts.chunk_size or choose_chunk_size(data_len, opts.connections)
            await _download_span(
                client, url, remote, 8 + hlen, data_len, _MemorySink(buf), opts, None, chunk
            )
    return _views(buf, tensors)


def _views(
    buf: npt.NDArray[np.uint8],
    tensors: Mapping[str, tuple[np.dtype[Any], tuple[int, ...], int, int]],
) -> dict[str, npt.NDArray[Any]]:
    out: dict[str, npt.NDArray[Any]] = {}
    for name, (dtype, shape, begin, end) in tensors.items():
        view = buf[begin:end].view(dtype).reshape(shape)
        # A tensor at an offset not aligned to its item size is copied once into aligned memory.
        out[name] = view if view.flags.aligned else np.require(view, requirements=["A", "C"])
    return out


def _arrays_from_file_bytes(
    whole: npt.NDArray[np.uint8], url: str, engine: Engine | None
) -> dict[str, npt.NDArray[Any]]:
    if whole.nbytes < 8:
        raise FetchError(f"{url}: too short for a safetensors file ({whole.nbytes} bytes)")
    (hlen,) = struct.unpack("<Q", whole[:8].tobytes())
    if hlen > MAX_SAFETENSORS_HEADER or 8 + hlen > whole.nbytes:
        raise FetchError(f"{url}: safetensors header length {hlen} is impossible; not safetensors")
    data = whole[8 + hlen :]
    tensors = _parse_header(whole[8 : 8 + hlen].tobytes(), url, int(data.nbytes))
    buf, _owner = _memory_target(int(data.nbytes), None, engine)
    buf[:] = data
    return _views(buf, tensors)


def fetch_weights(
    url: str,
    *,
    engine: Engine | None = None,
    connections: int | None = None,
    chunk_size: int | None = None,
    rate: float | int | str | None = None,
    retries: int = DEFAULT_RETRIES,
    timeout: float = 30.0,
    progress: bool = False,
    headers: Mapping[str, str] | None = None,
) -> dict[str, npt.NDArray[Any]]:
    """Download a ``.safetensors`` file over HTTP straight into arrays.

    Reads the header first (``Range: bytes=0-7`` for its length, then the JSON), allocates the
    data section once (``np.empty``, or pinned registered memory of ``engine``) and fetches it
    with parallel ranges (as :func:`fetch`); each tensor is an array of its dtype (bfloat16
    and float8 as ``ml_dtypes``) and shape viewing that memory, no copy. Other arguments as
    :func:`fetch`.

    Returns:
        ``{name: ndarray}`` for every tensor (``__metadata__`` is not included).

    Raises:
        FetchError: HTTP errors, ranges that kept failing, not a safetensors file, an
            unsupported dtype.
        InvalidArgumentError: a bad argument.
    """
    return asyncio.run(
        afetch_weights(
            url,
            engine=engine,
            connections=connections,
            chunk_size=chunk_size,
            rate=rate,
            retries=retries,
            timeout=timeout,
            progress=progress,
            headers=headers,
        )
    )
