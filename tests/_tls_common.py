"""What the TLS tests of every transport share: a connected pair, transfers checked bit for
bit, and a TCP relay that records and can tamper with what passes through it."""

from __future__ import annotations

import contextlib
import socket
import threading

import numpy as np

from rdmaxfer import Engine, UnsupportedError

SECRET = "tls-test-secret"


def tls_unusable(transport: str = "tcp") -> str:
    """Why an engine of ``transport`` with TLS cannot be made here ("" when it can)."""
    try:
        Engine(transport, tls=True, secret="probe").close()
    except UnsupportedError as e:
        return str(e)
    return ""


def pair(server: Engine, client: Engine, streams: int = 0) -> tuple[object, object]:
    port = server.listen("127.0.0.1", 0)
    ep = client.connect("127.0.0.1", port, timeout=20, **({"streams": streams} if streams else {}))
    return ep, server.accept(timeout=20)


def transfers(ep: object, peer: object, server: Engine, client: Engine, n: int) -> None:
    """WRITE, READ and send/recv of n random bytes, each checked bit for bit."""
    rng = np.random.default_rng(n)
    data = rng.integers(0, 256, n, dtype=np.uint8)
    # WRITE into the server's buffer.
    dst = np.zeros(n, dtype=np.uint8)
    region = server.register(dst, access="rw")
    ep.write(data, region.descriptor(), timeout=60)  # type: ignore[attr-defined]
    assert dst.tobytes() == data.tobytes()
    # READ it back into a fresh buffer.
    back = np.zeros(n, dtype=np.uint8)
    ep.read(back, region.descriptor(), timeout=60)  # type: ignore[attr-defined]
    assert back.tobytes() == data.tobytes()
    # send/recv both ways (a rendezvous message: larger than the eager limit).
    sending = ep.post_send(data)  # type: ignore[attr-defined]
    got = peer.recv(timeout=60)  # type: ignore[attr-defined]
    sending.wait(60)
    assert got.tobytes() == data.tobytes()
    small = rng.standard_normal(37)
    sending = peer.post_send(small)  # type: ignore[attr-defined]
    np.testing.assert_array_equal(ep.recv(timeout=60), small)  # type: ignore[attr-defined]
    sending.wait(60)


class Relay:
    """A TCP relay on loopback: each accepted connection is forwarded to ``target``, both ways,
    and every byte from the client is recorded. With ``tamper_at``, the byte at that offset of
    each client-to-server stream (server-to-client with ``upstream=False``) is flipped
    (``mode="flip"``) or 64 bytes are inserted there (``mode="inject"``)."""

    def __init__(
        self, target: int, tamper_at: int | None = None, mode: str = "flip", upstream: bool = True
    ) -> None:
        self.target, self.tamper_at, self.mode = target, tamper_at, mode
        self.tamper_upstream = upstream
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.seen = bytearray()
        self.tampered = 0
        self.lock = threading.Lock()
        self.threads: list[threading.Thread] = []
        self.socks: list[socket.socket] = []
        self._start(self._accept_loop)

    def _start(self, target: object, *args: object) -> None:
        t = threading.Thread(target=target, args=args, daemon=True)  # type: ignore[arg-type]
        t.start()
        self.threads.append(t)

    def _accept_loop(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.target), timeout=20)
            server.settimeout(None)
            self.socks += [client, server]
            self._start(self._pump, client, server, True)
            self._start(self._pump, server, client, False)

    def _pump(self, src: socket.socket, dst: socket.socket, upstream: bool) -> None:
        offset = 0
        try:
            while data := src.recv(1 << 16):
                if upstream:
                    with self.lock:
                        self.seen += data
                if upstream == self.tamper_upstream:
                    at = self.tamper_at
                    if at is not None and offset <= at < offset + len(data):
                        i = at - offset
                        if self.mode == "flip":
                            data = data[:i] + bytes([data[i] ^ 0x01]) + data[i + 1 :]
                        else:
                            data = data[:i] + bytes(range(64)) + data[i:]
                        with self.lock:
                            self.tampered += 1
                    offset += len(data)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        # shutdown() wakes the threads blocked in accept() or recv() on these sockets (close()
        # alone does not, and each join would wait out its timeout)
        for s in (self.listener, *self.socks):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        for s in self.socks:
            s.close()
        for t in self.threads:
            t.join(timeout=10)
            assert not t.is_alive(), "a relay thread did not end within 10 s"
