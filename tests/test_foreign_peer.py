"""A connect to something that is not an rdmaxfer engine says so, with what it answered."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from _nginx import Nginx, nginx_binary
from rdmaxfer import ConnectionFailedError, Engine


@pytest.mark.skipif(nginx_binary() is None, reason="nginx is not installed (apt-get install nginx)")
def test_an_http_server_on_the_port_is_named(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    server = Nginx(root, tmp_path)
    try:
        with Engine("tcp") as engine, pytest.raises(ConnectionFailedError) as info:
            engine.connect(f"127.0.0.1:{server.port}", timeout=30)
    finally:
        server.stop()
    assert str(info.value) == (
        f"handshake with 127.0.0.1:{server.port}: the peer at 127.0.0.1:{server.port} is not an "
        'rdmaxfer engine (it answered "HTTP/1.1 400 Bad Request", looks like HTTP); check the '
        "address and port"
    )


@contextmanager
def banner_server(banner: bytes) -> Iterator[int]:
    """A TCP server that sends ``banner`` to each client and closes; yields its port."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(60)

    def serve() -> None:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        with conn:
            conn.sendall(banner)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        listener.close()
        thread.join(60)


@pytest.mark.parametrize(
    ("banner", "quoted"),
    [
        (b"SSH-2.0-OpenSSH_9.6\r\n", '"SSH-2.0-OpenSSH_9.6", looks like SSH'),
        (b"RX\x00\xff", r'"RX\x00\xff"'),  # starts like our reply, then is not
        (b"\x15\x03\x01\x00\x02\x02\x46", r'"\x15\x03\x01\x00\x02\x02F", looks like TLS'),
    ],
    ids=["ssh", "short-binary", "tls-alert"],
)
def test_a_banner_is_quoted(banner: bytes, quoted: str) -> None:
    with banner_server(banner) as port, Engine("tcp") as engine:
        with pytest.raises(ConnectionFailedError) as info:
            engine.connect(f"127.0.0.1:{port}", timeout=30)
    assert f"the peer at 127.0.0.1:{port} is not an rdmaxfer engine (it answered {quoted})" in str(
        info.value
    )


def test_a_peer_that_hangs_up_unanswered_is_named() -> None:
    with banner_server(b"") as port, Engine("tcp") as engine:
        with pytest.raises(ConnectionFailedError) as info:
            engine.connect(f"127.0.0.1:{port}", timeout=30)
    assert "closed the connection without answering rdmaxfer's hello" in str(info.value)
