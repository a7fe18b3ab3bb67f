"""A small threaded HTTP/1.1 server of one file for tests/test_fetch*.py: Range requests
(or a server that ignores them), a body without Content-Length, connections dropped
mid-range, and a rate cap per connection (as CDNs and object stores cap each connection).
It counts requests, body bytes sent and the most connections open at once."""

from __future__ import annotations

import http.server
import re
import threading
import time
from collections.abc import Iterator

PIECE = 1 << 14
"""Bytes per socket write (a capped connection sleeps between them)."""


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: RangeServer

    def log_message(self, *args: object) -> None:
        pass

    def setup(self) -> None:
        super().setup()
        srv = self.server
        with srv.lock:
            srv.open_now += 1
            srv.most_open = max(srv.most_open, srv.open_now)
        self.conn_start = time.monotonic()
        self.conn_sent = 0  # body bytes on this connection, for the cap

    def finish(self) -> None:
        with self.server.lock:
            self.server.open_now -= 1
        super().finish()

    def do_GET(self) -> None:
        srv = self.server
        data = srv.data
        with srv.lock:
            srv.requests += 1
        first, last = 0, len(data) - 1
        status = 200
        m = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
        if m and not srv.ignore_range:
            first = int(m.group(1))
            last = min(int(m.group(2)) if m.group(2) else len(data) - 1, len(data) - 1)
            status = 206
        body = data[first : last + 1]
        self.send_response(status)
        if srv.no_length:  # a body that ends when the connection closes
            self.close_connection = True
            self.send_header("Connection", "close")
        else:
            self.send_header("Content-Length", str(len(body)))
        self.send_header("ETag", '"v1"')
        if status == 206:
            self.send_header("Content-Range", f"bytes {first}-{last}/{len(data)}")
        self.end_headers()
        # Drop the connection after `drop_after` bytes for the first `drops` large bodies.
        if len(body) > srv.drop_after and srv.drops_done < srv.drops:
            with srv.lock:
                srv.drops_done += 1
            self.wfile.write(body[: srv.drop_after])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(2)
            return
        for start in range(0, len(body), PIECE):  # counted as the socket takes it
            piece = body[start : start + PIECE]
            if srv.cap:  # this connection's bytes so far, at no more than cap bytes/s
                ahead = self.conn_start + self.conn_sent / srv.cap - time.monotonic()
                if ahead > 0:
                    time.sleep(ahead)
            self.wfile.write(piece)
            self.conn_sent += len(piece)
            with srv.lock:
                srv.bytes_sent += len(piece)


class RangeServer(http.server.ThreadingHTTPServer):
    """Serves ``data`` at :attr:`url` on 127.0.0.1 (a free port) until :meth:`stop`.

    Args:
        ignore_range: answer every request with the whole file (200).
        drops: drop the connection after ``drop_after`` (100,000) bytes for this many bodies.
        no_length: send no Content-Length, close the connection after the body.
        cap: bytes/s per connection (0: no cap).
    """

    daemon_threads = True

    def __init__(
        self,
        data: bytes,
        *,
        ignore_range: bool = False,
        drops: int = 0,
        no_length: bool = False,
        cap: float = 0,
    ) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.data = data
        self.ignore_range = ignore_range
        self.no_length = no_length
        self.drops = drops
        self.drops_done = 0
        self.drop_after = 100_000
        self.cap = cap
        self.requests = 0
        self.bytes_sent = 0  # body bytes written to clients
        self.open_now = 0
        self.most_open = 0  # connections open at once, at most
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05})
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/file.bin"

    def stop(self) -> None:
        self.shutdown()
        self.server_close()
        self.thread.join(timeout=10)


def servers() -> Iterator[type[RangeServer]]:
    """For a fixture (``yield from servers()``): a RangeServer class whose instances the test
    starts and the fixture stops."""
    started: list[RangeServer] = []

    class Started(RangeServer):
        def __init__(self, data: bytes, **kw: bool | int | float) -> None:
            super().__init__(data, **kw)  # type: ignore[arg-type]
            started.append(self)

    yield Started
    for s in started:
        s.stop()
