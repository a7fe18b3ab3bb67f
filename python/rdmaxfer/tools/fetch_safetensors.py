"""``.safetensors`` over HTTP straight into arrays (:func:`fetch_weights`): the header first
(``Range: bytes=0-7`` for its length, then the JSON), then the data section with the parallel
ranges of :mod:`rdmaxfer.tools.fetch` into one buffer that every tensor views.

Sizes and offsets in bytes, times in seconds.
"""

from __future__ import annotations

import contextlib
import json
import struct
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from ..errors import FetchError
from .curl_session import Session
from .range_requests import download_span, get_range, warn_no_ranges
from .ranges import DEFAULT_RETRIES, _in_thread, _memory_target, _MemorySink, _options

if TYPE_CHECKING:
    from ..transport.engine import Engine

__all__ = ["MAX_SAFETENSORS_HEADER", "afetch_weights", "fetch_weights"]

MAX_SAFETENSORS_HEADER = 100 << 20
"""safetensors' own limit on the JSON header (bytes)."""


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
    """Asyncio form of :func:`fetch_weights` (same arguments, result and errors): the download
    runs in a worker thread; cancelling the task stops it."""
    return await _in_thread(
        lambda stop: _fetch_weights(
            url, engine, connections, chunk_size, rate, retries, timeout, progress, headers, stop
        )
    )


def _fetch_weights(
    url: str,
    engine: Engine | None,
    connections: int | None,
    chunk_size: int | None,
    rate: float | int | str | None,
    retries: int,
    timeout: float,
    progress: bool,
    headers: Mapping[str, str] | None,
    stop: threading.Event | None,
) -> dict[str, npt.NDArray[Any]]:
    opts = _options(
        connections, chunk_size, rate, retries, timeout, headers, progress, "fetch weights"
    )
    with contextlib.closing(Session(opts.timeout, stop)) as session:
        first, size, remote = get_range(session, url, 0, 7, opts)
        if not remote.ranged:  # no Range: we already hold the whole file
            warn_no_ranges(url)
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
        raw, _, _ = get_range(session, url, 8, 8 + hlen - 1, opts)
        data_len = size - 8 - hlen
        tensors = _parse_header(raw, url, data_len)
        buf, _owner = _memory_target(data_len, None, engine)
        if data_len:
            chunk = opts.chunk_for(data_len)
            download_span(
                session, url, remote, 8 + hlen, data_len, _MemorySink(buf), opts, None,
                chunk, opts.ramp(), opts.sizer(chunk),
            )  # fmt: skip
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
    return _fetch_weights(
        url, engine, connections, chunk_size, rate, retries, timeout, progress, headers, None
    )
