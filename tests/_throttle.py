"""A TCP relay with a rate limit and a pause switch: a slow or stalled link on loopback.

Every connection made to the relay is relayed to ``target``; the bytes of all connections and
both directions share one token bucket of ``rate`` bytes/s. While paused, nothing moves (the
kernel buffers on either side fill, then senders stall).
"""

from __future__ import annotations

import socket
import threading
import time


class ThrottledRelay:
    """Lifecycle: started (accepting on ``address``) -> ``close()`` (every socket closed)."""

    def __init__(self, target: tuple[str, int], rate: float, piece: int = 16384) -> None:
        self.target = target
        self.rate = rate
        self.piece = piece
        self.running = threading.Event()  # cleared: paused
        self.running.set()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self._lock = threading.Lock()
        self._next_send = time.monotonic()
        self._sockets: list[socket.socket] = [self._listener]
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def pause(self) -> None:
        self.running.clear()

    def resume(self) -> None:
        self.running.set()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            with self._lock:
                self._sockets += [client, upstream]
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _take(self, n: int) -> None:
        with self._lock:
            now = time.monotonic()
            start = max(now, self._next_send)
            self._next_send = start + n / self.rate
        time.sleep(max(0.0, start - now))

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                self.running.wait()
                data = src.recv(self.piece)
                if not data:
                    dst.shutdown(socket.SHUT_WR)
                    return
                self._take(len(data))
                self.running.wait()
                dst.sendall(data)
        except OSError:
            return

    def close(self) -> None:
        self._closed = True
        self.running.set()
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()
