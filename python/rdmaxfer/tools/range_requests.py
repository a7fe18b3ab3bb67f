"""The HTTP Range requests of :mod:`rdmaxfer.tools.fetch` over libcurl
(:mod:`rdmaxfer.tools.curl_session`): the probe (which is the whole download when the server
ignores Range), small ranged reads, the parallel download of a span with retries, backoff and
the adaptive connection count and range size, and the final digest check.

Sizes and offsets in bytes, rates in bytes per second, times in seconds.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import heapq
import logging
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from .._warn import warn
from ..errors import FetchError, FetchIntegrityError
from .connection_ramp import ConnectionRamp, RangeSizer
from .curl_session import Conn, Session
from .ranges import (
    _RETRY_STATUS,
    BACKOFF_BASE_S,
    BACKOFF_MAX_S,
    _content_range,
    _FileSink,
    _Options,
    _Remote,
    _remote_from,
    _Sink,
    _Staged,
    _State,
)

log = logging.getLogger("rdmaxfer.fetch")


class _Retry(Exception):
    """A request that failed in a way worth retrying (5xx, short body, a network error)."""


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


def _backoff_delay(opts: _Options, attempt: int, what: str, exc: BaseException) -> float:
    """Seconds to wait before retry ``attempt`` (1-based); FetchError when retries are spent."""
    if attempt > opts.retries:
        raise FetchError(
            f"{what} failed {attempt} times (last: {type(exc).__name__}: {exc}); "
            f"the server or network keeps failing: try again later or raise retries "
            f"(now {opts.retries})"
        ) from exc
    opts.stats["retries"] += 1
    delay: float = min(BACKOFF_BASE_S * 2.0 ** (attempt - 1), BACKOFF_MAX_S)
    log.info("%s: %s; retry %d in %.2f s", what, exc, attempt, delay)
    return delay


def _headers(opts: _Options, extra: dict[str, str] | None = None) -> list[str]:
    return [f"{k}: {v}" for k, v in {**opts.headers, **(extra or {})}.items()]


def _status_error(url: str, what: str, conn: Conn) -> Exception:
    if conn.status in _RETRY_STATUS:
        return _Retry(f"HTTP {conn.status}")
    if conn.status == 0:
        return _Retry("no HTTP response")
    return FetchError(f"{what}: HTTP {conn.status}; check the URL")


def _request(
    session: Session,
    conn: Conn,
    url: str,
    byte_range: str | None,
    opts: _Options,
    write: Callable[[memoryview], None],
) -> Exception | None:
    """Run one request to its end: None, or what went wrong (the writer's error first)."""
    conn.begin(url, byte_range, _headers(opts), conn.guarded(write))
    error = session.run_one(conn)
    if conn.error is not None:
        return conn.error if isinstance(conn.error, Exception) else None
    return _Retry(error) if error is not None else None


class _Probe:
    """The probe's answers, over its attempts: what the server said, and for a server that
    ignores Range, the sink of the whole body and how much of it was counted."""

    def __init__(self, url: str, opts: _Options, whole: Callable[[_Remote], _Sink]) -> None:
        self.url, self.opts, self.whole = url, opts, whole
        self.remote: _Remote | None = None
        self.sink: _Sink | None = None
        self.bar: Any = None
        self.counted = 0  # bytes of a whole-file stream counted in stats (never twice)
        self.conn: Conn | None = None
        self.pos = 0
        self.decided = False

    def attempt(self, conn: Conn) -> None:
        self.conn, self.pos, self.decided = conn, 0, False

    def decide(self) -> None:
        conn = self.conn
        assert conn is not None
        self.decided = True
        if conn.status == 200:
            remote = _remote_from(conn.headers, ranged=False, version=conn.version)
            remote.ranged = remote.size == 0  # an empty file has no range to honour
            if self.sink is None:
                self.sink = self.whole(remote)
                self.bar = _progress(self.opts, remote.size, 0)
        elif conn.status == 206:
            remote = _remote_from(conn.headers, ranged=True, version=conn.version)
        elif conn.status == 416:  # an empty file
            _, _, total = _content_range(conn.headers.get("content-range"))
            remote = _Remote(size=total or 0, ranged=True, etag=conn.headers.get("etag"))
        else:
            raise _status_error(self.url, f"GET {self.url} (probe)", conn)
        self.remote = remote

    def write(self, data: memoryview) -> None:
        if not self.decided:
            self.decide()
        if self.sink is None:  # the one byte of a 206
            return
        n = len(data)
        self.sink.write(self.pos, data)
        self.pos += n
        if self.pos > self.counted:
            self.opts.stats["bytes"] += self.pos - self.counted
            self.bar.update(self.pos - self.counted)
            self.counted = self.pos
        if self.opts.bucket is not None:
            self.opts.bucket.sleep(n)

    def outcome(self, failure: Exception | None) -> Exception | None:
        """What went wrong with this attempt, or None."""
        try:
            if failure is None and not self.decided:
                self.decide()
            remote = self.remote
            if failure is None and remote is not None and not remote.ranged:
                if remote.size is not None and self.pos != remote.size:
                    return _Retry(f"short body: {self.pos} of {remote.size} bytes")
        except Exception as exc:
            return exc
        return failure


def probe(
    session: Session, url: str, opts: _Options, whole: Callable[[_Remote], _Sink]
) -> tuple[_Remote, int]:
    """Learn the size and validators with ``Range: bytes=0-0``; retried like a range.

    A server that ignores Range answers ``200``: its body is then the download, written to the
    sink ``whole(remote)`` returns (the body crosses the network once); a failed stream is
    fetched again from the start, its bytes counted once.

    Returns:
        (what the server said about the file, body bytes received: 0 for a ranged server).
    """
    state = _Probe(url, opts, whole)
    attempt = 0
    try:
        while True:
            conn = session.conn()
            state.attempt(conn)
            byte_range = "0-0" if state.sink is None else None  # a retried stream: all of it
            failure = state.outcome(_request(session, conn, url, byte_range, opts, state.write))
            remote = state.remote
            if failure is None and remote is not None:
                if remote.ranged and remote.size is None:
                    raise FetchError(
                        f"{url}: 206 without a file size in Content-Range "
                        f"({conn.headers.get('content-range')!r}); cannot split the file"
                    )
                return remote, 0 if remote.ranged else state.pos
            if not isinstance(failure, _Retry):
                raise failure or FetchError(f"GET {url} (probe): no answer")
            attempt += 1
            time.sleep(_backoff_delay(opts, attempt, f"GET {url}", failure))
    finally:
        if state.bar is not None:
            state.bar.close()


def get_range(
    session: Session, url: str, first: int, last: int, opts: _Options
) -> tuple[bytes, int | None, _Remote]:
    """Bytes ``first..last`` (inclusive): (body, file size or None, what the server said). A
    ``200`` answer returns the whole body with its size (the server ignores Range)."""
    attempt = 0
    while True:
        conn = session.conn()
        body = bytearray()
        failure = _request(session, conn, url, f"{first}-{last}", opts, body.extend)
        if failure is None and conn.status == 206:
            remote = _remote_from(conn.headers, ranged=True, version=conn.version)
            return bytes(body), remote.size, remote
        if failure is None and conn.status == 200:
            remote = _remote_from(conn.headers, ranged=False, version=conn.version)
            return bytes(body), len(body), remote
        failure = failure or _status_error(url, f"GET {url} bytes {first}-{last}", conn)
        if not isinstance(failure, _Retry):
            raise failure
        attempt += 1
        time.sleep(_backoff_delay(opts, attempt, f"GET {url} bytes {first}-{last}", failure))


@dataclass
class _Piece:
    """One range of a span in flight: chunks ``index`` to ``index + count - 1``, bytes
    ``[pos, end)`` still to come (span-relative); ``marked`` of its chunks are recorded done."""

    index: int
    count: int
    pos: int
    end: int
    attempt: int = 0
    checked: bool = False
    marked: int = 0


def download_span(
    session: Session,
    url: str,
    remote: _Remote,
    base: int,
    length: int,
    sink: _Sink,
    opts: _Options,
    state: _State | None,
    chunk: int,
    ramp: ConnectionRamp,
    sizer: RangeSizer | None = None,
) -> tuple[int, int]:
    """Fetch bytes ``[base, base + length)`` of the file into ``sink`` (offsets relative to
    ``base``) over ``ramp.target`` connections, skipping the chunks of ``chunk`` bytes that
    ``state`` records as done. Each request asks for a run of consecutive chunks as long as
    ``sizer`` says (one chunk without it). A failed range is asked again from the byte where
    it stopped, after a backoff, while the others go on; its chunks received whole are
    recorded done.

    Returns:
        (chunks, chunks that were already done).
    """
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
    headers = _headers(opts, validators)
    stats, bucket = opts.stats, opts.bucket
    sizer = sizer or RangeSizer(chunk, adaptive=False)
    left = length - already  # bytes not yet asked for
    running: dict[Conn, _Piece] = {}
    stages: dict[Conn, _Staged] = {}  # a file's write-combining, per connection
    # a file's writes are made in one thread, while this one goes on receiving
    pool = ThreadPoolExecutor(1, "rdmaxfer-fetch-write") if isinstance(sink, _FileSink) else None
    waiting: list[tuple[float, int, _Piece]] = []  # (ready at, index, piece): retries
    shown = (0, 0)

    def mark_through(piece: _Piece, upto: int) -> None:
        """Record the piece's chunks that end at or before span offset ``upto`` as done."""
        if state is None:
            return
        while piece.marked < piece.count:
            i = piece.index + piece.marked
            if min((i + 1) * chunk, length) > upto:
                break
            state.mark(i)
            piece.marked += 1

    def next_piece() -> _Piece:
        nonlocal left
        first = todo.popleft()
        count = 1
        most = sizer.take(left, ramp.target)
        while count < most and todo and todo[0] == first + count:
            todo.popleft()
            count += 1
        piece = _Piece(first, count, first * chunk, min((first + count) * chunk, length))
        left -= piece.end - piece.pos
        return piece

    def what(piece: _Piece) -> str:
        return f"GET {url} bytes {base + piece.index * chunk}-{base + piece.end - 1}"

    def check(conn: Conn, piece: _Piece) -> None:
        piece.checked = True
        if conn.status == 200:
            raise FetchError(
                f"{url}: the server answered a ranged request with the whole file (it stopped "
                "honouring Range, or the file changed: If-Range failed); fetch again from "
                "the start"
            )
        if conn.status != 206:
            raise _status_error(url, what(piece), conn)
        first, _, total = _content_range(conn.headers.get("content-range"))
        if first != base + piece.pos or (total is not None and total != remote.size):
            raise FetchError(
                f"{what(piece)}: the server sent Content-Range "
                f"{conn.headers.get('content-range')!r}; the file changed during the "
                "download: fetch again"
            )

    def launch(piece: _Piece) -> None:
        conn = session.conn()
        staged = stages.get(conn)
        if staged is None and isinstance(sink, _FileSink):
            staged = stages[conn] = _Staged(sink, pool)
        if staged is not None:
            staged.begin(piece.pos)

        def on_body(data: memoryview) -> int | None:  # the hot path: one call per 16 KiB
            try:
                n = len(data)
                if not piece.checked:
                    check(conn, piece)
                if piece.pos + n > piece.end:
                    raise FetchError(f"{what(piece)}: the server sent more bytes than asked")
                if staged is not None:
                    staged.write(data)
                else:
                    sink.write(piece.pos, data)
                piece.pos += n
                stats["bytes"] += n
                if bucket is not None:
                    bucket.sleep(n)
            except BaseException as exc:  # kept, and raised by the loop: never lost in libcurl
                conn.error = exc
                return 0
            return None

        piece.checked = False
        conn.begin(url, f"{base + piece.pos}-{base + piece.end - 1}", headers, on_body)
        session.start(conn)
        running[conn] = piece

    def ended(conn: Conn, error: str | None) -> None:
        piece = running.pop(conn)
        if conn in stages:  # the bytes received are in the file before anything is decided
            stages[conn].flush()
            stages[conn].wait()
        failure = conn.error
        if failure is None and error is not None:
            failure = _Retry(error)
        if failure is None:
            try:
                if not piece.checked:
                    check(conn, piece)
                if piece.pos < piece.end:
                    raise _Retry(f"short body: {piece.end - piece.pos} bytes missing")
            except Exception as exc:
                failure = exc
        if failure is None:
            mark_through(piece, piece.end)
            return
        if not isinstance(failure, _Retry):
            raise failure
        mark_through(piece, piece.pos)  # the chunks received whole are in the file
        piece.attempt += 1
        delay = _backoff_delay(opts, piece.attempt, what(piece), failure)
        heapq.heappush(waiting, (time.monotonic() + delay, piece.index, piece))

    t0 = time.monotonic()
    start_bytes = stats["bytes"]
    try:
        while todo or running or waiting:
            now = time.monotonic()
            moved = stats["bytes"] - start_bytes
            target = ramp.sample(now - t0, moved)
            size = sizer.sample(now - t0, moved, len(running))
            while len(running) < target:
                if waiting and waiting[0][0] <= now:
                    launch(heapq.heappop(waiting)[2])
                elif todo:
                    launch(next_piece())
                else:
                    break
            wait = 0.1 if running or not waiting else max(0.0, min(0.1, waiting[0][0] - now))
            for conn, error in session.step(wait):
                ended(conn, error)
            if state is not None:  # chunks of long ranges, recorded as they reach the file
                for conn, piece in running.items():
                    staged = stages.get(conn)
                    mark_through(piece, staged.written() if staged is not None else piece.pos)
            if opts.progress:
                if (target, size) != shown:
                    bar.set_postfix_str(f"{target} connections, {_mib(size)} ranges", refresh=False)
                    shown = (target, size)
                bar.update(already + stats["bytes"] - start_bytes - bar.n)
    finally:
        bar.close()
        if pool is not None:  # every write made (or failed) before the file is closed
            for staged in stages.values():
                with contextlib.suppress(Exception):
                    staged.wait()
            pool.shutdown(wait=True)
        if state is not None:
            state.save()
    return nchunks, len(done)


def _mib(size: int) -> str:
    return f"{size / (1 << 20):g} MiB"


def warn_no_ranges(url: str) -> None:
    msg = (
        f"{url}: the server ignores HTTP Range requests (200 instead of 206); downloading "
        "it as one stream (no parallel connections, no resume)"
    )
    warn(msg, RuntimeWarning)


def verify(
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


def sha256_fd(fd: int, size: int) -> str:
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
