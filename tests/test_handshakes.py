"""Handshakes run in parallel (transport/handshake_pool.h): a client that connects and never
speaks delays neither another client's connect/accept nor close(), on TCP and shm; and
closing an engine ends its own connect() stalled in a handshake."""

from __future__ import annotations

import socket
import threading
import time

import numpy as np
import pytest

from _tls_common import tls_unusable
from rdmaxfer import Endpoint, EndpointClosedError, Engine

#: The acceptor's bound on one handshake (kPreAuthTimeoutS in transport/bootstrap.h).
HANDSHAKE_TIMEOUT_S = 2.0


def stalled_client(transport: str, port: int) -> socket.socket:
    """A client that connects to the listener and never sends its Hello."""
    if transport == "shm":
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(b"\0rdmaxfer-shm:%d" % port)
        return s
    return socket.create_connection(("127.0.0.1", port), timeout=5)


def exchange(server: Engine, client: Engine, port: int, rng: np.random.Generator) -> None:
    """connect + accept + a checked send, each bounded well below HANDSHAKE_TIMEOUT_S."""
    ep = client.connect("127.0.0.1", port, timeout=2.0)
    peer = server.accept(timeout=2.0)
    data = rng.integers(0, 256, 65_537, dtype=np.uint8)
    sending = ep.post_send(data)
    assert peer.recv(timeout=10).tobytes() == data.tobytes()
    sending.wait(10)


def test_stalled_clients_delay_no_other_connect(transport: str, rng: np.random.Generator) -> None:
    with Engine(transport) as server, Engine(transport) as client:
        port = server.listen("127.0.0.1", 0)
        # Three silent clients: served one at a time they would hold the acceptor 15 s.
        stalled = [stalled_client(transport, port) for _ in range(3)]
        try:
            time.sleep(0.2)  # the acceptor has taken them off the backlog
            exchange(server, client, port, rng)
            exchange(server, client, port, rng)
        finally:
            for s in stalled:
                s.close()


def test_many_clients_at_once_with_stalled_ones(transport: str, rng: np.random.Generator) -> None:
    n = 24
    with Engine(transport) as server:
        port = server.listen("127.0.0.1", 0)
        stalled = [stalled_client(transport, port) for _ in range(2)]
        clients = [Engine(transport) for _ in range(n)]
        errors: list[BaseException] = []
        endpoints: dict[int, Endpoint] = {}

        def connect(i: int) -> None:
            try:
                endpoints[i] = clients[i].connect("127.0.0.1", port, timeout=4.0)
            except BaseException as e:  # reported by the assert below
                errors.append(e)

        try:
            threads = [threading.Thread(target=connect, args=(i,)) for i in range(n)]
            for t in threads:
                t.start()
            accepted = [server.accept(timeout=4.0) for _ in range(n)]
            for t in threads:
                t.join(10)
            assert not errors
            # Each client sends its own bytes (length 1000 + i); each arrives whole on one of
            # the accepted endpoints.
            sent = {i: rng.integers(0, 256, 1000 + i, dtype=np.uint8) for i in range(n)}
            sending = [endpoints[i].post_send(data) for i, data in sent.items()]
            got = {}
            for peer in accepted:
                arr = peer.recv(timeout=10)
                got[arr.nbytes - 1000] = arr.tobytes()
            for r in sending:
                r.wait(10)
            assert got == {i: data.tobytes() for i, data in sent.items()}
        finally:
            for s in stalled:
                s.close()
            for c in clients:
                c.close()


@pytest.mark.parametrize("spoken", [False, True], ids=["silent", "hello-only"])
def test_close_cuts_a_stalled_handshake(transport: str, spoken: bool) -> None:
    server = Engine(transport)
    port = server.listen("127.0.0.1", 0)
    s = stalled_client(transport, port)
    try:
        if spoken:
            # A well-formed Hello, then silence: the acceptor is past the Hello (shm: in the
            # ring set-up that follows; tcp: the stream waits in a group that never completes).
            kind = {"tcp": 1, "shm": 4}[transport]
            s.sendall(
                b"RXHI"
                + bytes([1, 0, kind, 0, 2 if transport == "tcp" else 1, 0])
                + bytes(6)
                + (7).to_bytes(8, "little")
                + (9).to_bytes(8, "little")
            )
        time.sleep(0.3)
        start = time.monotonic()
        server.close()
        elapsed = time.monotonic() - start
        assert elapsed < HANDSHAKE_TIMEOUT_S * 0.75, f"close() took {elapsed:.2f} s"
        s.settimeout(HANDSHAKE_TIMEOUT_S)
        try:
            while s.recv(4096):  # the HelloAck, if any, then the end of the stream
                pass
        except ConnectionResetError:
            pass
    finally:
        s.close()
        server.close()


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
def test_close_ends_a_connect_in_its_handshake(tls: bool) -> None:
    """A peer that takes the Hello and then stalls (in the TLS handshake, with TLS) holds a
    connect() until its timeout; closing the engine ends it at once, naming the close."""
    if tls and tls_unusable():
        pytest.skip(f"TLS unusable here: {tls_unusable()}")
    listener = socket.create_server(("127.0.0.1", 0))
    stalled = threading.Event()
    held: list[socket.socket] = []

    def stalling_peer() -> None:
        conn, _ = listener.accept()
        held.append(conn)
        conn.recv(32)  # the Hello
        if tls:
            conn.sendall(b"RXOK" + (1).to_bytes(2, "little") + bytes(2) + (5).to_bytes(8, "little"))
            conn.recv(5)  # the start of the ClientHello: the client is in its TLS handshake
        stalled.set()

    peer = threading.Thread(target=stalling_peer, daemon=True)
    peer.start()
    client = Engine("tcp", tls=tls, secret="a secret of the test")
    failed: list[BaseException] = []

    def connect() -> None:
        try:
            client.connect("127.0.0.1", listener.getsockname()[1], timeout=120)
        except BaseException as e:  # recorded and checked below
            failed.append(e)

    connecting = threading.Thread(target=connect)
    connecting.start()
    try:
        assert stalled.wait(30), "the client never sent its Hello"
        client.close()
        connecting.join(30)
        assert not connecting.is_alive(), "connect() went on after close()"
        assert len(failed) == 1
        assert isinstance(failed[0], EndpointClosedError), failed[0]
        assert "the engine was closed during the handshake" in str(failed[0])
    finally:
        client.close()
        listener.close()
        for s in held:
            s.close()
        peer.join(10)
