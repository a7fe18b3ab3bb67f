"""The two-sided protocol (csrc/protocol/message_protocol.h) over the in-process loopback
transport (csrc/transport/loopback/), which supplies only the channel primitives: control
messages, grants and WRITE-with-notification, by memcpy, with no socket and no verbs.

The transport is internal (``_core.Engine("loopback")``; not in ``rdmaxfer info``). Its limits:
eager up to 4096 bytes, 8192 bytes of metadata + data per control message, a credit window of 4.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pytest

from rdmaxfer import ConnectionFailedError, ProtocolError, RemoteAccessError, _core

TIMEOUT_S = 10.0
EAGER_LIMIT = 4096
WINDOW = 4


@dataclass
class Pair:
    a_engine: _core.Engine
    b_engine: _core.Engine
    a: _core.Endpoint
    b: _core.Endpoint


@pytest.fixture
def pair() -> Iterator[Pair]:
    server = _core.Engine("loopback")
    client = _core.Engine("loopback")
    port = server.listen("loopback", 0)
    a = client.connect("loopback", port, streams=2, timeout=TIMEOUT_S)
    b = server.accept(TIMEOUT_S)
    yield Pair(client, server, a, b)
    a.close()
    b.close()
    client.close()
    server.close()


def register(engine: _core.Engine, array: np.ndarray, access: int) -> _core.Region:
    return engine.register(array.ctypes.data, array.nbytes, access)


def wait_ok(request: _core.Request) -> None:
    assert request.wait(TIMEOUT_S), "the request did not finish in time"
    request.check()


def send_recv(p: Pair, payload: np.ndarray, meta: bytes, access: int) -> np.ndarray:
    src = register(p.a_engine, payload, _core.ACCESS_LOCAL)
    sent = p.a.post_send(src, 0, payload.nbytes, meta)
    header = p.b.post_recv_header()
    wait_ok(header)
    msg_id, length, got_meta = header.message()
    assert (length, got_meta) == (payload.nbytes, meta)
    out = np.zeros(length, dtype=np.uint8)
    dst = register(p.b_engine, out, access)
    wait_ok(p.b.post_recv(msg_id, dst, 0, length))
    wait_ok(sent)
    return out


@pytest.mark.parametrize("size", [1000, EAGER_LIMIT + 1, 3 << 20], ids=["eager", "rts", "3MiB"])
def test_message_with_meta_arrives_whole(pair: Pair, size: int) -> None:
    payload = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8)
    # The destination lacks remote write: a rendezvous grants it for the message only.
    out = send_recv(pair, payload, b'{"dtype": "uint8"}', _core.ACCESS_LOCAL_WRITE)
    assert out.tobytes() == payload.tobytes()


def test_credit_window_holds_later_sends_at_the_sender(pair: Pair) -> None:
    rng = np.random.default_rng(7)
    payloads = [rng.integers(0, 256, 512, dtype=np.uint8) for _ in range(WINDOW + 3)]
    regions = [register(pair.a_engine, x, _core.ACCESS_LOCAL) for x in payloads]
    sends = [pair.a.post_send(r, 0, 512, str(i).encode()) for i, r in enumerate(regions)]
    deadline = time.monotonic() + TIMEOUT_S
    while pair.b.attributes().get("messages_waiting_for_recv") != WINDOW:
        assert time.monotonic() < deadline, pair.b.attributes()
        time.sleep(0.01)
    assert pair.a.attributes()["credit_window"] == WINDOW
    assert pair.a.attributes()["sends_waiting_for_credit"] == 3
    assert not any(s.done() for s in sends)
    for i, payload in enumerate(payloads):
        header = pair.b.post_recv_header()
        wait_ok(header)
        msg_id, length, meta = header.message()
        assert meta == str(i).encode()  # in order, one credit passed on at a time
        out = np.zeros(length, dtype=np.uint8)
        wait_ok(
            pair.b.post_recv(
                msg_id, register(pair.b_engine, out, _core.ACCESS_LOCAL_WRITE), 0, length
            )
        )
        assert out.tobytes() == payload.tobytes()
    for s in sends:
        wait_ok(s)
    assert pair.a.attributes()["sends_waiting_for_credit"] == 0


def test_reject_fails_the_send_with_the_reason(pair: Pair) -> None:
    payload = np.arange(10000, dtype=np.uint8)
    sent = pair.a.post_send(register(pair.a_engine, payload, _core.ACCESS_LOCAL), 0, 10000, b"m")
    header = pair.b.post_recv_header()
    wait_ok(header)
    pair.b.reject(header.message()[0], "wrong dtype")
    assert sent.wait(TIMEOUT_S)
    with pytest.raises(ProtocolError, match="rejected the message: wrong dtype"):
        sent.check()


def test_one_sided_write_and_read_are_checked_against_the_peer_region(pair: Pair) -> None:
    rng = np.random.default_rng(3)
    target = np.zeros(1 << 16, dtype=np.uint8)
    remote = register(pair.b_engine, target, _core.ACCESS_REMOTE_WRITE | _core.ACCESS_REMOTE_READ)
    data = rng.integers(0, 256, 1 << 16, dtype=np.uint8)
    local = register(pair.a_engine, data, _core.ACCESS_LOCAL_WRITE)
    wait_ok(pair.a.post_write(local, 0, remote.descriptor(), 0, data.nbytes))
    assert target.tobytes() == data.tobytes()
    back = np.zeros_like(data)
    wait_ok(
        pair.a.post_read(
            register(pair.a_engine, back, _core.ACCESS_LOCAL_WRITE),
            0,
            remote.descriptor(),
            0,
            back.nbytes,
        )
    )
    assert back.tobytes() == data.tobytes()
    read_only = register(pair.b_engine, np.zeros(64, dtype=np.uint8), _core.ACCESS_REMOTE_READ)
    refused = pair.a.post_write(local, 0, read_only.descriptor(), 0, 64)
    assert refused.wait(TIMEOUT_S)
    with pytest.raises(RemoteAccessError, match="refused access to 64 bytes"):
        refused.check()


def test_peer_close_fails_a_waiting_receive(pair: Pair) -> None:
    header = pair.b.post_recv_header()
    pair.a.close()
    assert header.wait(TIMEOUT_S)
    with pytest.raises(ConnectionFailedError, match="closed the endpoint"):
        header.check()
    assert pair.b.closed


def test_windows_granted_out_of_order_are_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    """A staged sender writes window by window; the receiver's first two CTS messages reach it
    swapped (RDMAXFER_LOOPBACK_SWAP_CTS, as a receiver granting from two threads can send
    them). The sender takes each window by its offset, and every byte lands in place."""
    slab = 1 << 16
    monkeypatch.setenv("RDMAXFER_BOUNCE_SLAB_BYTES", str(slab))
    monkeypatch.setenv("RDMAXFER_BOUNCE_POOL_BYTES", str(3 * slab))
    monkeypatch.setenv("RDMAXFER_LOOPBACK_SWAP_CTS", "1")
    server = _core.Engine("loopback")
    client = _core.Engine("loopback")
    stager = _core.Stager(client, _core.HostCopier())
    try:
        port = server.listen("loopback", 0)
        a = client.connect("loopback", port, streams=1, timeout=TIMEOUT_S)
        b = server.accept(TIMEOUT_S)
        payload = np.random.default_rng(7).integers(0, 256, 9 * slab + 123, dtype=np.uint8)
        meta = b'{"dtype": "uint8"}'
        sent = stager.post_send(a, payload.ctypes.data, payload.nbytes, meta, TIMEOUT_S)
        header = b.post_recv_header()
        wait_ok(header)
        msg_id, length, _ = header.message()
        out = np.zeros(length, dtype=np.uint8)
        wait_ok(b.post_recv(msg_id, register(server, out, _core.ACCESS_LOCAL_WRITE), 0, length))
        wait_ok(sent)
        assert zlib.crc32(out) == zlib.crc32(payload)
    finally:
        stager.close()
        client.close()
        server.close()
