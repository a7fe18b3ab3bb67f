"""Module-level send/recv on the default engine, addresses, environment settings."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import numpy as np
import pytest

import rdmaxfer
from _common import MARGIN_S, Pair
from _peers import DTYPES, Peer, api_send_listening, api_send_to, make_array, same_bytes
from rdmaxfer import (
    ConnectionFailedError,
    Engine,
    InvalidArgumentError,
    TransferTimeoutError,
    UnsupportedError,
    _core,
)
from rdmaxfer._config import default_timeout, parse_address, resolve_timeout
from rdmaxfer.transport import api


def test_package_exports() -> None:
    assert isinstance(rdmaxfer.__version__, str) and rdmaxfer.__version__
    for name in rdmaxfer.__all__:
        assert hasattr(rdmaxfer, name), name
    assert issubclass(rdmaxfer.TransferTimeoutError, TimeoutError)
    assert issubclass(rdmaxfer.EndpointClosedError, rdmaxfer.ConnectionFailedError)


def test_recv_listening_from_a_sender_process(spawn: Callable[..., Peer], seed: int) -> None:
    port = rdmaxfer.listen(":0")
    specs = [(seed + i, (5, 100 + i), name) for i, name in enumerate(DTYPES)]
    peer = spawn(api_send_to, f"127.0.0.1:{port}", specs)
    first = rdmaxfer.recv(listen=f":{port}", timeout=60)
    endpoint = rdmaxfer.accept(f":{port}")
    for k, (s, shape, name) in enumerate(specs):
        got = first if k == 0 else rdmaxfer.recv(listen=f"127.0.0.1:{port}", timeout=60)
        assert same_bytes(got, make_array(s, shape, DTYPES[name]))
    assert rdmaxfer.accept(f":{port}") is endpoint, "the accepted endpoint is reused"
    assert peer.get() == 1, "the sender reused one cached connection"
    peer.put("bye")
    assert peer.join() == 0


def test_recv_from_a_listening_sender_process(spawn: Callable[..., Peer], seed: int) -> None:
    specs = [(seed, 4095, "uint8"), (seed + 1, (64, 64), "float32"), (seed + 2, 0, "int16")]
    peer = spawn(api_send_listening, specs)
    port = peer.get()
    out = np.empty((64, 64), np.float32)
    got0 = rdmaxfer.recv(from_=f"127.0.0.1:{port}", timeout=60)
    got1 = rdmaxfer.recv(out, from_=f"127.0.0.1:{port}", timeout=60)
    got2 = rdmaxfer.recv(from_=f"127.0.0.1:{port}", timeout=60)
    assert peer.get() == "sent"
    assert same_bytes(got0, make_array(seed, 4095))
    assert got1 is out and same_bytes(out, make_array(seed + 1, (64, 64), np.float32))
    assert same_bytes(got2, make_array(seed + 2, 0, np.int16))
    assert rdmaxfer.connect(f"127.0.0.1:{port}") is api._connected[("127.0.0.1", port)]
    peer.put("bye")
    assert peer.join() == 0


def test_send_and_recv_need_exactly_one_peer_address() -> None:
    arr = make_array(1, 10)
    with pytest.raises(InvalidArgumentError, match=r"exactly one of to="):
        rdmaxfer.send(arr)
    with pytest.raises(InvalidArgumentError, match=r"exactly one of to="):
        rdmaxfer.send(arr, to="127.0.0.1:1", listen=":2")
    with pytest.raises(InvalidArgumentError, match=r"exactly one of from_="):
        rdmaxfer.recv()


def test_send_to_a_closed_port_fails_and_caches_nothing(closed_port: int) -> None:
    start = time.monotonic()
    with pytest.raises(ConnectionFailedError):
        rdmaxfer.send(make_array(2, 10), to=f"127.0.0.1:{closed_port}", timeout=0.5)
    assert time.monotonic() - start < 0.5 + MARGIN_S
    assert not api._connected


def test_recv_listening_without_peer_times_out_by_env_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RDMAXFER_TIMEOUT", "0.4")
    port = rdmaxfer.listen(":0")
    start = time.monotonic()
    with pytest.raises(TransferTimeoutError):
        rdmaxfer.recv(listen=f":{port}")
    assert time.monotonic() - start < 0.4 + MARGIN_S


def test_timeout_setting_is_validated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RDMAXFER_TIMEOUT", raising=False)
    assert resolve_timeout(None) == 60.0
    assert resolve_timeout(2) == 2.0
    monkeypatch.setenv("RDMAXFER_TIMEOUT", "12.5")
    assert resolve_timeout(None) == 12.5
    monkeypatch.setenv("RDMAXFER_TIMEOUT", "soon")
    with pytest.raises(InvalidArgumentError, match=r"RDMAXFER_TIMEOUT='soon' is not a number"):
        resolve_timeout(None)
    for bad in (float("nan"), float("inf"), -0.1):
        with pytest.raises(InvalidArgumentError, match=r"finite number of seconds >= 0"):
            resolve_timeout(bad)


def test_default_timeout_follows_the_environment_between_calls(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """RDMAXFER_TIMEOUT is read at every call (the parsed value is kept only while the
    variable's stored value is the same object), also when os.environ is replaced."""
    monkeypatch.delenv("RDMAXFER_TIMEOUT", raising=False)
    assert default_timeout() == 60.0
    for text, seconds in (("12.5", 12.5), ("12.5", 12.5), (" 3 ", 3.0), ("0", 0.0)):
        monkeypatch.setenv("RDMAXFER_TIMEOUT", text)
        assert default_timeout() == seconds and resolve_timeout(None) == seconds
    monkeypatch.setenv("RDMAXFER_TIMEOUT", "soon")
    for _ in range(2):  # a bad value is never kept: it fails at every call
        with pytest.raises(InvalidArgumentError, match=r"RDMAXFER_TIMEOUT='soon' is not a number"):
            default_timeout()
    monkeypatch.setenv("RDMAXFER_TIMEOUT", "-1")
    with pytest.raises(InvalidArgumentError, match=r"RDMAXFER_TIMEOUT='-1': a timeout must be"):
        default_timeout()
    monkeypatch.delenv("RDMAXFER_TIMEOUT")
    assert default_timeout() == 60.0
    monkeypatch.setattr(os, "environ", {"RDMAXFER_TIMEOUT": "7"})
    assert default_timeout() == 7.0
    os.environ["RDMAXFER_TIMEOUT"] = "8"
    assert default_timeout() == 8.0


def test_a_blocking_call_takes_a_changed_env_default(
    pair: Pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RDMAXFER_TIMEOUT", "30")
    target = pair.server.register(np.zeros(64, np.uint8))
    pair.a.write(np.ones(64, np.uint8), target.descriptor())  # the default is read and kept
    assert int(target.numpy().sum()) == 64
    monkeypatch.setenv("RDMAXFER_TIMEOUT", "0.3")
    start = time.monotonic()
    with pytest.raises(TransferTimeoutError, match=r"0\.3 s"):
        pair.b.recv(np.zeros(8, np.uint8))  # nothing is sent
    assert time.monotonic() - start < 0.3 + MARGIN_S


@pytest.mark.parametrize(
    ("text", "default", "expected"),
    [
        ("10.0.0.2:5555", None, ("10.0.0.2", 5555)),
        (":5555", "127.0.0.1", ("127.0.0.1", 5555)),
        ("5555", "127.0.0.1", ("127.0.0.1", 5555)),
        ("[::1]:80", None, ("::1", 80)),
        ("0.0.0.0:0", None, ("0.0.0.0", 0)),
    ],
)
def test_parse_address(text: str, default: str | None, expected: tuple[str, int]) -> None:
    assert parse_address(text, default_host=default) == expected


@pytest.mark.parametrize(
    ("text", "match"),
    [
        (":5555", "has no host"),
        ("host", "has no port"),
        ("host:http", "is not a number"),
        ("host:65536", r"not in 0\.\.65535"),
        ("::1:80", r"\[::1\]:5555"),
    ],
)
def test_parse_address_refusals(text: str, match: str) -> None:
    with pytest.raises(InvalidArgumentError, match=match):
        parse_address(text)


def test_transport_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    rdma_reason = _core.available_transports().get("rdma", "not built")
    monkeypatch.delenv("RDMAXFER_TRANSPORT", raising=False)
    assert rdmaxfer.resolve_transport("auto") == ("rdma" if rdma_reason == "" else "tcp")
    monkeypatch.setenv("RDMAXFER_TRANSPORT", "tcp")
    assert rdmaxfer.resolve_transport("auto") == "tcp"
    with Engine() as engine:
        assert engine.transport == "tcp"
    assert rdmaxfer.resolve_transport("rdma") == "rdma", "an explicit choice beats the env"
    monkeypatch.setenv("RDMAXFER_TRANSPORT", "carrier-pigeon")
    with pytest.raises(InvalidArgumentError, match=r"RDMAXFER_TRANSPORT='carrier-pigeon'"):
        Engine()
    with pytest.raises(InvalidArgumentError, match=r"transport='udp' is not"):
        Engine("udp")
    if rdma_reason:
        with pytest.raises(UnsupportedError):
            Engine("rdma")


def test_shutdown_closes_everything_and_a_new_default_follows() -> None:
    engine = rdmaxfer.default_engine()
    assert rdmaxfer.default_engine() is engine
    port = rdmaxfer.listen(":0")
    assert engine.port == port, "the default engine serves the first listening address"
    second = rdmaxfer.listen(":0")
    assert second != port and api._listeners[("127.0.0.1", second)] is not engine
    endpoint = rdmaxfer.connect(f"127.0.0.1:{port}", timeout=10)
    accepted = rdmaxfer.accept(f":{port}", timeout=10)
    assert rdmaxfer.connect(f"127.0.0.1:{port}") is endpoint
    rdmaxfer.shutdown()
    assert engine.closed and endpoint.closed and accepted.closed
    assert rdmaxfer.default_engine() is not engine
    rdmaxfer.shutdown()  # idempotent
