"""What a user reads: --help, hints, warning locations, timeout messages, the serve log,
printed addresses (IPv6 in brackets), the top-level names."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

import rdmaxfer
from rdmaxfer import Engine, TransferTimeoutError, TransportError, _core
from rdmaxfer._config import parse_address
from rdmaxfer.tools.cli import build_parser
from rdmaxfer.tools.cli_weights import start_serve_process


def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rdmaxfer", *args], capture_output=True, text=True, timeout=timeout
    )


def test_help_lists_every_command_without_rst() -> None:
    out = run("--help")
    assert out.returncode == 0, out.stderr
    commands = build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    assert set(commands) == {"info", "serve", "pull", "load", "fetch", "bench", "doctor", "demo"}
    listed = [line.split()[0] for line in out.stdout.splitlines() if line.startswith("    ")]
    assert set(commands) <= set(listed), out.stdout
    assert "``" not in out.stdout, out.stdout


def test_port_in_use_raises_transport_error_with_hints(tmp_path: Path) -> None:
    with Engine("tcp") as first, Engine("tcp") as second:
        port = first.listen("127.0.0.1", 0)
        with pytest.raises(TransportError, match=r"127\.0\.0\.1:\d+.*port=0.*--port 0") as info:
            second.listen("127.0.0.1", port)
        assert "Address already in use" in str(info.value)
        path = tmp_path / "w.safetensors"
        save_file({"w": np.arange(6, dtype=np.float32)}, str(path))
        out = run("serve", str(path), "--port", str(port), "--transport", "tcp")
    assert out.returncode == 2
    assert "--port 0" in out.stderr and "TransportError" not in out.stderr, out.stderr


def test_listen_warning_points_at_the_callers_line() -> None:
    arrays = {"w": np.arange(4, dtype=np.float32)}
    with pytest.warns(UserWarning, match="without a shared secret") as caught:
        server = rdmaxfer.serve_weights(arrays, host="0.0.0.0", transport="tcp")
    server.close()
    assert [w.filename for w in caught] == [__file__]
    with Engine("tcp") as engine, pytest.warns(UserWarning) as caught:
        engine.listen("0.0.0.0", 0)
    assert [w.filename for w in caught] == [__file__]


def test_handshake_timeout_names_the_peer_and_the_seconds() -> None:
    silent = socket.socket()  # accepts TCP connections (backlog) but never answers a hello
    silent.bind(("127.0.0.1", 0))
    silent.listen(4)
    port = silent.getsockname()[1]
    try:
        with Engine("tcp") as engine:
            start = time.monotonic()
            with pytest.raises(TransferTimeoutError) as info:
                engine.connect(f"127.0.0.1:{port}", timeout=1.5)
            assert time.monotonic() - start < 10
    finally:
        silent.close()
    text = str(info.value)
    assert f"handshake with 127.0.0.1:{port}" in text and "within 1.5 s" in text, text
    assert "did not answer rdmaxfer's hello" in text and "not an rdmaxfer engine" in text, text


def test_serve_prints_a_line_per_client(tmp_path: Path) -> None:
    path = tmp_path / "w.safetensors"
    save_file({"w": np.random.default_rng(1).standard_normal(64).astype(np.float32)}, str(path))
    server, first = start_serve_process(path, "tcp", max_clients=2)
    try:
        address = first.rsplit(" ", 1)[-1].strip()
        for _ in range(2):
            got = rdmaxfer.pull_weights(address, transport="tcp", timeout=30)
            assert got["w"].nbytes == 256
        assert server.stdout is not None
        lines = [server.stdout.readline().strip() for _ in range(2)]
        assert server.wait(timeout=30) == 0
    finally:
        if server.poll() is None:
            server.kill()
    for line in lines:
        host, port = parse_address(line.split()[1].rstrip(":"))
        assert host == "127.0.0.1" and port > 0 and line.endswith(": done"), line


def test_serve_weights_takes_timeout() -> None:
    ended: list[tuple[str, str]] = []
    done = threading.Event()

    def on_client(peer: str, outcome: str) -> None:
        ended.append((peer, outcome))
        done.set()

    arrays = {"w": np.arange(8, dtype=np.float32)}
    with rdmaxfer.serve_weights(arrays, transport="tcp", timeout=0.5, on_client=on_client) as srv:
        with Engine("tcp") as engine, engine.connect(f"127.0.0.1:{srv.port}", timeout=10) as ep:
            start = time.monotonic()
            assert done.wait(20), "the server never timed the silent client out"
            assert time.monotonic() - start < 10
            assert ended[0][0].startswith("127.0.0.1:") and ep.peer == f"127.0.0.1:{srv.port}"
    assert "TransferTimeoutError" in ended[0][1] and "0.5" in ended[0][1], ended


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback (::1) on this host")
def test_ipv6_peers_print_bracketed() -> None:
    with Engine("tcp") as server, Engine("tcp") as client:
        port = server.listen("::1", 0)
        a = client.connect(f"[::1]:{port}", timeout=10)
        b = server.accept(timeout=10)
        assert a.peer == f"[::1]:{port}"
        assert b.peer.startswith("[::1]:")
        for printed in (a.peer, b.peer):
            host, _port = parse_address(printed)  # every printed address parses back
            assert host == "::1"
    with Engine("tcp") as wide, pytest.warns(UserWarning, match=r"on \[::\]:\d+ without"):
        wide.listen("::", 0)


def test_descriptor_is_exported_at_the_top_level() -> None:
    assert rdmaxfer.Descriptor is _core.Descriptor and "Descriptor" in rdmaxfer.__all__
    with Engine("tcp") as engine:
        region = engine.register(np.arange(16, dtype=np.uint8), access="r")
        packed = region.descriptor().pack()
        assert rdmaxfer.Descriptor.unpack(packed).length == 16
