"""Authenticated connections: a shared secret gates the bootstrap (HMAC-SHA256 challenge), on
TCP and on shm (the same handshake over its UNIX socket)."""

from __future__ import annotations

import socket
import struct
import warnings

import numpy as np
import pytest

from rdmaxfer import ConnectionFailedError, Engine, TransferTimeoutError


def roundtrip(server: Engine, client: Engine, rng: np.random.Generator) -> None:
    port = server.listen("127.0.0.1", 0)
    ep = client.connect("127.0.0.1", port, timeout=10)
    peer = server.accept(timeout=10)
    data = rng.integers(0, 256, 100_003, dtype=np.uint8)
    sending = ep.post_send(data)  # rendezvous: completes once the receiver has placed it
    got = peer.recv(timeout=30)
    sending.wait(30)
    assert got.tobytes() == data.tobytes()


def test_same_secret_connects(transport: str, rng: np.random.Generator) -> None:
    with (
        Engine(transport, secret="s3cret") as server,
        Engine(transport, secret=b"s3cret") as client,
    ):
        roundtrip(server, client, rng)
        assert "authenticated" in server.describe()


def test_wrong_secret_is_refused_and_server_stays_usable(
    transport: str, rng: np.random.Generator
) -> None:
    with Engine(transport, secret="right") as server:
        port = server.listen("127.0.0.1", 0)
        with Engine(transport, secret="wrong") as bad:
            with pytest.raises(ConnectionFailedError, match="holds a different secret"):
                bad.connect("127.0.0.1", port, timeout=10)
        with Engine(transport) as none:
            with pytest.raises(ConnectionFailedError, match="requires authentication"):
                none.connect("127.0.0.1", port, timeout=10)
        with Engine(transport, secret="right") as good:
            ep = good.connect("127.0.0.1", port, timeout=10)
            peer = server.accept(timeout=10)
            data = rng.standard_normal(1000)
            sending = ep.post_send(data)
            np.testing.assert_array_equal(peer.recv(timeout=10), data)
            sending.wait(10)


def test_client_with_secret_refuses_unauthenticated_server(transport: str) -> None:
    with Engine(transport) as server, Engine(transport, secret="x") as client:
        port = server.listen("127.0.0.1", 0)
        with pytest.raises(ConnectionFailedError, match="peer did not authenticate"):
            client.connect("127.0.0.1", port, timeout=10)


def test_secret_from_environment(
    transport: str, monkeypatch: pytest.MonkeyPatch, rng: np.random.Generator
) -> None:
    monkeypatch.setenv("RDMAXFER_SECRET", "from-env")
    with Engine(transport) as server, Engine(transport, secret="from-env") as client:
        roundtrip(server, client, rng)


def test_forged_proof_reveals_nothing() -> None:
    """A raw client that answers the challenge with garbage gets only a refusal: no
    endpoint appears on the server and the socket is closed."""
    with Engine("tcp", secret="k") as server:
        port = server.listen("127.0.0.1", 0)
        hello = b"RXHI" + struct.pack("<HBBBB6xQQ", 1, 1, 0, 1, 1, 7, 9)
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(hello)
            ack = s.recv(16, socket.MSG_WAITALL)
            assert ack[:4] == b"RXOK" and struct.unpack("<H", ack[6:8])[0] == 4  # challenge
            assert len(s.recv(32, socket.MSG_WAITALL)) == 32  # the nonce, nothing else
            s.sendall(bytes(64))
            verdict = s.recv(16, socket.MSG_WAITALL)
            assert struct.unpack("<H", verdict[6:8])[0] == 5  # auth failed
            assert s.recv(100) == b""  # closed
        with pytest.raises(TransferTimeoutError) as info:
            server.accept(timeout=1)
    assert f"a peer connected to port {port} but its handshake failed" in str(info.value)
    assert "authentication failed: the peer holds a different secret" in str(info.value)


def test_accept_says_a_peer_failed_authentication_and_why(transport: str) -> None:
    """An accept that gets no connection says so, and when peers connected and failed their
    handshake, how many and why the last one failed (not "no peer connected"); an accepted
    connection clears the record."""
    with Engine(transport, secret="right") as server:
        port = server.listen("127.0.0.1", 0)
        with pytest.raises(TransferTimeoutError, match=r"^accept: no peer connected within 0.1 s"):
            server.accept(timeout=0.1)
        with Engine(transport, secret="wrong") as bad:
            with pytest.raises(ConnectionFailedError):
                bad.connect("127.0.0.1", port, timeout=10)
        with pytest.raises(TransferTimeoutError) as info:
            server.accept(timeout=1)
        text = str(info.value)
        assert text.startswith(
            f"accept: no connection completed within 1 s: a peer connected to port {port} but "
            "its handshake failed ("
        ), text
        assert "authentication failed: the peer holds a different secret" in text, text
        with Engine(transport) as none:  # no secret: it hangs up at the challenge
            with pytest.raises(ConnectionFailedError):
                none.connect("127.0.0.1", port, timeout=10)
        with pytest.raises(TransferTimeoutError) as info:
            server.accept(timeout=1)
        text = str(info.value)
        assert f"2 connections to port {port} failed their handshake (the last" in text, text
        assert "authentication failed: the peer hung up at the challenge" in text, text
        with Engine(transport, secret="right") as good:
            good.connect("127.0.0.1", port, timeout=10)
            server.accept(timeout=10).close()
        with pytest.raises(TransferTimeoutError, match=r"^accept: no peer connected within"):
            server.accept(timeout=0.1)


def test_listen_beyond_loopback_without_secret_warns() -> None:
    with Engine("tcp") as engine:
        with pytest.warns(UserWarning, match="without a shared secret"):
            engine.listen("0.0.0.0", 0)
    with Engine("tcp", secret="k") as engine, warnings.catch_warnings():
        warnings.simplefilter("error")
        engine.listen("0.0.0.0", 0)
