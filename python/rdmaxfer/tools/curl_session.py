"""The HTTP client of :mod:`rdmaxfer.tools.fetch`: libcurl's multi interface through pycurl.

libcurl receives every body into its own buffer (:data:`BUFFER_SIZE` bytes per ``recv`` and
connection) and hands it to a write callback as ``memoryview`` blocks of that buffer (16 KiB
each; no copy), which put the bytes at their place in the destination. The connections live in
one multi handle driven by :meth:`Session.step` in the calling thread; they are kept alive from
request to request, speak HTTP/2 where an ``https`` server offers it (ALPN; one transfer per
connection, so that a server that caps each connection is met with several), follow redirects
(``http``/``https`` only) and use libcurl's TLS.

Every wait is bounded: the connect (``timeout`` seconds), and a transfer that receives nothing
for ``timeout`` seconds ends with an error (retried by the caller). :meth:`Session.step` waits
at most :data:`SELECT_S` so that a stop request or Ctrl-C is seen at once.
"""

from __future__ import annotations

import math
import ssl
import threading
import time
from collections.abc import Callable

import pycurl

from ..errors import FetchError

BUFFER_SIZE = 1 << 20
"""libcurl's receive buffer per connection (bytes): the most one ``recv`` takes."""
USER_AGENT = "rdmaxfer-fetch"
"""The ``User-Agent`` of every request."""
SELECT_S = 0.1
"""Longest wait for socket activity (seconds) before a stop request is checked."""
_PROTOCOLS = pycurl.PROTO_HTTP | pycurl.PROTO_HTTPS

Writer = Callable[[memoryview], None]
OnBody = Callable[[memoryview], "int | None"]


def ca_locations() -> tuple[str | None, str | None]:
    """The CA certificates to verify servers with: this system's, as Python's ``ssl`` finds
    them (``SSL_CERT_FILE``/``SSL_CERT_DIR`` first). pycurl's wheels carry a libcurl built
    elsewhere, whose compiled-in bundle path need not exist here."""
    paths = ssl.get_default_verify_paths()
    return paths.cafile, paths.capath


class FetchCancelled(FetchError):
    """The download was stopped (the awaiting task was cancelled)."""


class Conn:
    """One libcurl easy handle: one connection, kept alive across the requests it makes.

    Attributes:
        status: the HTTP status of the last response's status line (0 before it).
        version: its HTTP version (``"1.1"``, ``"2"``).
        headers: its headers, names lower-case (those of redirects are dropped).
        error: what the writer raised, which ended the transfer (None when it did not).
    """

    def __init__(
        self, timeout: float, user_agent: str, ca: tuple[str | None, str | None] = (None, None)
    ) -> None:
        easy = pycurl.Curl()
        easy.setopt(pycurl.NOSIGNAL, 1)
        easy.setopt(pycurl.FOLLOWLOCATION, 1)
        easy.setopt(pycurl.MAXREDIRS, 10)
        easy.setopt(pycurl.PROTOCOLS, _PROTOCOLS)
        easy.setopt(pycurl.REDIR_PROTOCOLS, _PROTOCOLS)
        easy.setopt(pycurl.HTTP_VERSION, pycurl.CURL_HTTP_VERSION_2TLS)
        easy.setopt(pycurl.CONNECTTIMEOUT_MS, max(1, int(timeout * 1000)))
        easy.setopt(pycurl.LOW_SPEED_LIMIT, 1)
        easy.setopt(pycurl.LOW_SPEED_TIME, max(1, math.ceil(timeout)))
        easy.setopt(pycurl.BUFFERSIZE, BUFFER_SIZE)
        easy.setopt(pycurl.USERAGENT, user_agent)
        cafile, capath = ca
        if cafile:
            easy.setopt(pycurl.CAINFO, cafile)
        if capath:
            easy.setopt(pycurl.CAPATH, capath)
        easy.setopt(pycurl.HEADERFUNCTION, self._on_header)
        self.easy = easy
        self.status = 0
        self.version = ""
        self.headers: dict[str, str] = {}
        self.error: BaseException | None = None

    def begin(self, url: str, byte_range: str | None, headers: list[str], on_body: OnBody) -> None:
        """Set up a GET of ``url`` (``byte_range`` ``"first-last"`` or None for the whole
        body) whose body goes to ``on_body``, libcurl's write callback. It must not raise: it
        keeps what went wrong in :attr:`error` and returns 0, which ends the transfer
        (:meth:`guarded` makes one of a plain writer)."""
        self.status, self.version, self.headers, self.error = 0, "", {}, None
        self.easy.setopt(pycurl.WRITEFUNCTION, on_body, use_memoryview=True)
        self.easy.setopt(pycurl.URL, url)
        if byte_range is None:
            self.easy.unsetopt(pycurl.RANGE)
        else:
            self.easy.setopt(pycurl.RANGE, byte_range)
        self.easy.setopt(pycurl.HTTPHEADER, headers)

    def guarded(self, writer: Writer) -> OnBody:
        """A write callback that calls ``writer`` and keeps what it raises in :attr:`error`."""

        def on_body(data: memoryview) -> int | None:
            try:
                writer(data)
            except BaseException as exc:  # kept, and raised by the loop: never lost in libcurl
                self.error = exc
                return 0  # ends this transfer with CURLE_WRITE_ERROR
            return None

        return on_body

    def _on_header(self, line: bytes) -> None:
        text = line.decode("latin-1").strip()
        if text.startswith("HTTP/"):  # a new response: a redirect's target, or the first
            parts = text.split(None, 2)
            self.version = parts[0][5:]
            self.status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
            self.headers = {}
        elif ":" in text:
            name, value = text.split(":", 1)
            self.headers[name.strip().lower()] = value.strip()

    def close(self) -> None:
        self.easy.close()


class Session:
    """The connections of one download, driven by :meth:`step`; :meth:`close` ends them (use
    ``contextlib.closing``).

    Args:
        timeout: seconds for each connect, and for a transfer that receives nothing.
        stop: when set (from another thread), :meth:`step` raises :class:`FetchCancelled`.
    """

    def __init__(self, timeout: float, stop: threading.Event | None = None) -> None:
        self.timeout = timeout
        self.stop = stop
        self.user_agent = USER_AGENT
        self.ca = ca_locations()
        self.multi = pycurl.CurlMulti()
        self.multi.setopt(pycurl.M_PIPELINING, pycurl.PIPE_NOTHING)
        self.multi.setopt(pycurl.M_MAXCONNECTS, 512)
        self._idle: list[Conn] = []
        self._active: dict[pycurl.Curl, Conn] = {}
        self._all: list[Conn] = []

    def conn(self) -> Conn:
        """An idle connection (its socket kept alive from its last request) or a new one."""
        if self._idle:
            return self._idle.pop()
        conn = Conn(self.timeout, self.user_agent, self.ca)
        self._all.append(conn)
        return conn

    def start(self, conn: Conn) -> None:
        """Start the request :meth:`Conn.begin` set up."""
        self.multi.add_handle(conn.easy)
        self._active[conn.easy] = conn

    @property
    def active(self) -> int:
        """Transfers running."""
        return len(self._active)

    def step(self, wait: float = SELECT_S) -> list[tuple[Conn, str | None]]:
        """Wait up to ``wait`` seconds for socket activity, move what arrived, and return the
        transfers that ended with libcurl's error text (None: the response was received whole).

        Raises:
            FetchCancelled: :attr:`stop` is set.
            BaseException: what a writer raised that is not an :class:`Exception`
                (``KeyboardInterrupt``), at once.
        """
        if self.stop is not None and self.stop.is_set():
            raise FetchCancelled("the download was cancelled")
        if not self._active:
            time.sleep(wait)
            return []
        hint = self.multi.timeout()
        wait = min(wait, hint / 1000) if hint >= 0 else wait
        if wait > 0 and self.multi.select(wait) < 0:
            time.sleep(min(wait, 0.001))  # nothing to select on yet (a name being resolved)
        while self.multi.perform()[0] == pycurl.E_CALL_MULTI_PERFORM:
            pass
        ended: list[tuple[Conn, str | None]] = []
        while True:
            left, ok, failed = self.multi.info_read()
            ended += [(self._active[easy], None) for easy in ok]
            ended += [(self._active[e], msg or f"libcurl error {n}") for e, n, msg in failed]
            if not left:
                break
        for conn, _ in ended:
            self.multi.remove_handle(conn.easy)
            del self._active[conn.easy]
            self._idle.append(conn)
        for conn, _ in ended:
            if conn.error is not None and not isinstance(conn.error, Exception):
                raise conn.error
        return ended

    def run_one(self, conn: Conn) -> str | None:
        """Start ``conn``'s request and drive it to its end; returns libcurl's error text or
        None."""
        self.start(conn)
        while True:
            for ended, error in self.step():
                if ended is conn:
                    return error

    def close(self) -> None:
        """Stop every transfer and close every connection (idempotent)."""
        for easy in list(self._active):
            self.multi.remove_handle(easy)
        self._active.clear()
        for conn in self._all:
            conn.close()
        self._all.clear()
        self._idle.clear()
        self.multi.close()
