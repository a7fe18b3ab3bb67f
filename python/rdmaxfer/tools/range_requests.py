"""The HTTP Range requests of :mod:`rdmaxfer.tools.fetch` over httpx: the client, the
progress bar, the probe, each chunk's download with retries and backoff, the single-stream
fallback for servers without ranges, and the final digest check.

Sizes and offsets in bytes, rates in bytes per second, times in seconds.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import logging
import os
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from .._warn import warn
from ..errors import FetchError, FetchIntegrityError

if TYPE_CHECKING:
    import httpx

from .ranges import (
    _RETRY_STATUS,
    BACKOFF_BASE_S,
    BACKOFF_MAX_S,
    _content_range,
    _Options,
    _Remote,
    _remote_from,
    _Sink,
    _State,
)

log = logging.getLogger("rdmaxfer.fetch")


def _client(opts: _Options) -> httpx.AsyncClient:
    import httpx

    n = opts.connections
    return httpx.AsyncClient(
        timeout=httpx.Timeout(opts.timeout),
        limits=httpx.Limits(max_connections=n, max_keepalive_connections=n),
        headers={"Accept-Encoding": "identity", **opts.headers},
        follow_redirects=True,
    )


def _progress(opts: _Options, total: int | None, initial: int) -> Any:
    from tqdm import tqdm  # type: ignore[import-untyped]

    return tqdm(
        total=total,
        initial=initial,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        desc=opts.desc,
        disable=not opts.progress,
        leave=False,
    )


async def _backoff(opts: _Options, attempt: int, what: str, exc: BaseException) -> None:
    """Sleep before retry ``attempt`` (1-based) or raise FetchError when retries are spent."""
    if attempt > opts.retries:
        raise FetchError(
            f"{what} failed {attempt} times (last: {type(exc).__name__}: {exc}); "
            f"the server or network keeps failing: try again later or raise retries "
            f"(now {opts.retries})"
        ) from exc
    opts.stats["retries"] += 1
    delay = min(BACKOFF_BASE_S * 2 ** (attempt - 1), BACKOFF_MAX_S)
    log.info("%s: %s; retry %d in %.2f s", what, exc, attempt, delay)
    await asyncio.sleep(delay)


class _Retry(Exception):
    """A ranged request that failed in a way worth retrying (5xx, short body)."""


async def _probe(client: httpx.AsyncClient, url: str, opts: _Options) -> _Remote:
    """Learn the size and validators with ``Range: bytes=0-0``; retried like a chunk.

    A ``200`` (the server ignores Range) comes back with its body unread in ``body``, for
    :func:`_single_stream`: the file is then downloaded once, not once per request.
    """
    import httpx

    attempt = 0
    while True:
        try:
            request = client.build_request("GET", url, headers={"Range": "bytes=0-0"})
            response = await client.send(request, stream=True)
            status = response.status_code
            if status == 200:
                remote = _remote_from(response, ranged=False)
                remote.ranged = remote.size == 0  # an empty file has no range to honour
                remote.body = response
                return remote
            try:
                await response.aread()
            finally:
                await response.aclose()
            if status == 206:
                remote = _remote_from(response, ranged=True)
                if remote.size is None:
                    raise FetchError(
                        f"{url}: 206 without a file size in Content-Range "
                        f"({response.headers.get('content-range')!r}); cannot split the file"
                    )
                return remote
            if status == 416:  # an empty file
                _, _, total = _content_range(response.headers.get("content-range"))
                return _Remote(size=total or 0, ranged=True, etag=response.headers.get("etag"))
            if status in _RETRY_STATUS:
                raise _Retry(f"HTTP {status}")
            raise FetchError(f"{url}: HTTP {status} {response.reason_phrase}; check the URL")
        except (httpx.TransportError, _Retry) as exc:
            attempt += 1
            await _backoff(opts, attempt, f"GET {url} (probe)", exc)


async def _download_span(
    client: httpx.AsyncClient,
    url: str,
    remote: _Remote,
    base: int,
    length: int,
    sink: _Sink,
    opts: _Options,
    state: _State | None,
    chunk: int,
) -> tuple[int, int]:
    """Fetch bytes ``[base, base + length)`` of the file into ``sink`` (offsets relative to
    ``base``) in chunks of ``chunk`` bytes, skipping those ``state`` records as done.

    Returns:
        (chunks, chunks that were already done).
    """
    import httpx

    nchunks = max(1, -(-length // chunk)) if length else 0
    done = set(state.done) if state is not None else set()
    todo = collections.deque(i for i in range(nchunks) if i not in done)
    already = sum(min(chunk, length - i * chunk) for i in done)
    bar = _progress(opts, length, already)
    validators = {}
    if remote.etag and not remote.etag.startswith("W/"):
        validators["If-Range"] = remote.etag
    elif remote.last_modified:
        validators["If-Range"] = remote.last_modified

    async def one(index: int) -> None:
        start = index * chunk
        end = min(start + chunk, length)
        pos = start
        attempt = 0
        what = f"GET {url} bytes {base + start}-{base + end - 1}"
        while True:
            try:
                headers = {"Range": f"bytes={base + pos}-{base + end - 1}", **validators}
                async with client.stream("GET", url, headers=headers) as response:
                    status = response.status_code
                    if status == 200:
                        raise FetchError(
                            f"{url}: the server answered a ranged request with the whole file "
                            "(it stopped honouring Range, or the file changed: If-Range "
                            "failed); fetch again from the start"
                        )
                    if status in _RETRY_STATUS:
                        raise _Retry(f"HTTP {status}")
                    if status != 206:
                        raise FetchError(f"{what}: HTTP {status} {response.reason_phrase}")
                    first, _, total = _content_range(response.headers.get("content-range"))
                    if first != base + pos or (total is not None and total != remote.size):
                        raise FetchError(
                            f"{what}: the server sent Content-Range "
                            f"{response.headers.get('content-range')!r}; the file changed "
                            "during the download: fetch again"
                        )
                    async for data in response.aiter_raw():
                        n = len(data)
                        if pos + n > end:
                            raise FetchError(f"{what}: the server sent more bytes than asked")
                        sink.write(pos, data)
                        pos += n
                        opts.stats["bytes"] += n
                        bar.update(n)
                        if opts.bucket is not None:
                            await opts.bucket.acquire(n)
                if pos < end:
                    raise _Retry(f"short body: {end - pos} bytes missing")
                break
            except (httpx.TransportError, _Retry) as exc:
                attempt += 1
                await _backoff(opts, attempt, what, exc)
        if state is not None:
            state.mark(index)

    async def worker() -> None:
        while todo:
            await one(todo.popleft())

    try:
        await _gather_or_cancel([worker() for _ in range(min(opts.connections, len(todo)))])
    finally:
        bar.close()
        if state is not None:
            state.save()
    return nchunks, len(done)


async def _gather_or_cancel(coros: list[Awaitable[None]]) -> None:
    """Run all; on the first failure cancel the others, wait for them, and re-raise."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        await asyncio.gather(*tasks)
    except BaseException:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


async def _single_stream(
    client: httpx.AsyncClient, url: str, sink: _Sink, opts: _Options, probe: _Remote
) -> tuple[_Remote, int]:
    """Read the whole file as one ``GET`` (no Range): the probe's unread ``200`` answer
    first, a new ``GET`` for each retry (from the start) when it fails.

    Returns:
        (what the response said about the file, bytes received).
    """
    import httpx

    attempt = 0
    while True:
        pos = 0
        try:
            first, probe.body = probe.body, None
            if first is None:
                first = await client.send(client.build_request("GET", url), stream=True)
            response = first
            try:
                if response.status_code != 200:
                    if response.status_code in _RETRY_STATUS:
                        raise _Retry(f"HTTP {response.status_code}")
                    raise FetchError(f"{url}: HTTP {response.status_code}; check the URL")
                remote = _remote_from(response, ranged=False)
                bar = _progress(opts, remote.size, 0)
                try:
                    async for data in response.aiter_raw():
                        sink.write(pos, data)
                        pos += len(data)
                        opts.stats["bytes"] += len(data)
                        bar.update(len(data))
                        if opts.bucket is not None:
                            await opts.bucket.acquire(len(data))
                finally:
                    bar.close()
            finally:
                await response.aclose()
            if remote.size is not None and pos != remote.size:
                raise _Retry(f"short body: {pos} of {remote.size} bytes")
            return remote, pos
        except (httpx.TransportError, _Retry) as exc:
            attempt += 1
            await _backoff(opts, attempt, f"GET {url}", exc)


def _warn_no_ranges(url: str) -> None:
    msg = (
        f"{url}: the server ignores HTTP Range requests (200 instead of 206); downloading "
        "it as one stream (no parallel connections, no resume)"
    )
    warn(msg, RuntimeWarning)


def _verify(
    expected: str | None, server: str | None, digest: Callable[[], str], url: str
) -> str | None:
    want = expected or server
    if want is None:
        return None
    got = digest()
    for label, value in (("you gave", expected), ("the server announced", server)):
        if value is not None and got != value:
            raise FetchIntegrityError(
                f"{url}: SHA-256 of the downloaded bytes is {got}, but {label} {value}; the "
                "download is corrupt or the digest is for another file: fetch again"
            )
    return got


def _sha256_fd(fd: int, size: int) -> str:
    h = hashlib.sha256()
    pos = 0
    block = 8 << 20
    while pos < size:
        data = os.pread(fd, min(block, size - pos), pos)
        if not data:
            break
        h.update(data)
        pos += len(data)
    return h.hexdigest()
