"""Timeouts that fit long transfers (TCP): ``timeout`` bounds inactivity, ``deadline`` the whole
call, and the errors give the real figures. The link is a loopback relay limited to 8 MB/s
(tests/_throttle.py), so a 16 MiB transfer takes at least 2 s, however fast the machine: twice
its 1 s timeout. WRITEs go in 256 KiB chunks, so that their progress (acknowledged chunks) ticks
every 0.13 s or so, well inside that timeout on a loaded machine too."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pytest

import rdmaxfer
from _common import MARGIN_S
from _peers import digest, make_array
from _throttle import ThrottledRelay
from rdmaxfer import Endpoint, Engine, TransferTimeoutError

RATE = 8e6  # bytes/s through the relay
SIZE = 16 << 20  # about 2 s at RATE
TIMEOUT_S = 1.0
CHUNK = 256 << 10
#: A WRITE progresses as the peer acknowledges its chunks: by then several are through.
PAUSE_AT_S = 1.2


@dataclass
class SlowLink:
    server: Engine
    client: Engine
    relay: ThrottledRelay
    a: Endpoint  # client side, through the relay
    b: Endpoint  # server side


@pytest.fixture
def slow() -> Iterator[SlowLink]:
    server, client = Engine("tcp"), Engine("tcp")
    port = server.listen("127.0.0.1", 0)
    relay = ThrottledRelay(("127.0.0.1", port), RATE)
    try:
        a = client.connect(relay.address, timeout=10)
        b = server.accept(timeout=10)
        yield SlowLink(server, client, relay, a, b)
    finally:
        relay.close()
        client.close()
        server.close()


def test_a_write_longer_than_its_timeout_completes_while_bytes_move(slow: SlowLink) -> None:
    data = make_array(1, SIZE)
    dst = np.zeros(SIZE, np.uint8)
    region = slow.server.register(dst, access="rw")
    start = time.monotonic()
    slow.a.write(data, region.descriptor(), chunk_size=CHUNK, timeout=TIMEOUT_S)
    elapsed = time.monotonic() - start
    assert elapsed > 1.5 * TIMEOUT_S, f"took {elapsed:.2f} s: the link was not slow"
    assert digest(dst) == digest(data)


def test_a_message_longer_than_its_timeout_arrives_whole(slow: SlowLink) -> None:
    data = make_array(2, SIZE)
    sent: dict[str, BaseException | None] = {}

    def send() -> None:
        try:
            slow.a.send(data, timeout=TIMEOUT_S)
            sent["error"] = None
        except BaseException as exc:
            sent["error"] = exc

    thread = threading.Thread(target=send)
    thread.start()
    start = time.monotonic()
    got = slow.b.recv(timeout=TIMEOUT_S)  # the bytes trickle in for about 2 s
    elapsed = time.monotonic() - start
    thread.join(timeout=30)
    assert sent == {"error": None}
    assert elapsed > 1.5 * TIMEOUT_S, f"took {elapsed:.2f} s: the link was not slow"
    assert digest(got) == digest(data)


def test_a_stalled_write_fails_after_timeout_with_the_figures(slow: SlowLink) -> None:
    data = make_array(3, SIZE)
    region = slow.server.register(np.zeros(SIZE, np.uint8), access="rw")
    threading.Timer(PAUSE_AT_S, slow.relay.pause).start()  # several chunks are through
    start = time.monotonic()
    with pytest.raises(TransferTimeoutError) as info:
        slow.a.write(data, region.descriptor(), chunk_size=CHUNK, timeout=TIMEOUT_S)
    elapsed = time.monotonic() - start
    text = str(info.value)
    found = re.search(
        rf"write of {SIZE} bytes to \S+ made no progress for 1 s \(timeout\): (\d+) of {SIZE} "
        r"bytes moved in ([\d.]+) s",
        text,
    )
    assert found, text
    moved, seconds = int(found[1]), float(found[2])
    assert 0 < moved < SIZE, text
    assert PAUSE_AT_S < seconds < PAUSE_AT_S + TIMEOUT_S + MARGIN_S, text
    assert elapsed < PAUSE_AT_S + TIMEOUT_S + MARGIN_S
    assert slow.a.closed  # a transfer that timed out aborts its endpoint


def test_deadline_bounds_the_whole_write(slow: SlowLink) -> None:
    # 32 MiB cannot pass the relay in less than 4.2 s: the write is still moving bytes (its
    # 256 KiB chunks acknowledged one after another) when its 2 s deadline ends it, long before
    # its 30 s inactivity timeout could.
    size, deadline, timeout = 2 * SIZE, 2.0, 30.0
    data = make_array(4, size)
    region = slow.server.register(np.zeros(size, np.uint8), access="rw")
    start = time.monotonic()
    with pytest.raises(TransferTimeoutError) as info:
        slow.a.write(
            data, region.descriptor(), chunk_size=CHUNK, timeout=timeout, deadline=deadline
        )
    elapsed = time.monotonic() - start
    found = re.search(
        rf"did not complete within its deadline of 2 s: (\d+) of {size} bytes moved",
        str(info.value),
    )
    assert found, str(info.value)
    assert 0 < int(found[1]) < size  # acknowledged by the peer
    assert deadline <= elapsed < timeout


def test_pull_weights_longer_than_its_timeout() -> None:
    # A 12 MiB tensor (one READ of the pull's batch, 1.5 s through the relay: longer than the
    # timeout) and four of 1 MiB: the batch counts the bytes of each READ as they land, so the
    # pull is not cut short while they move.
    rng = np.random.default_rng(5)
    sizes = {"big": 3 << 20, **{f"t{i}": 1 << 18 for i in range(4)}}
    tensors = {k: rng.standard_normal(n).astype(np.float32) for k, n in sizes.items()}
    with rdmaxfer.serve_weights(tensors, host="127.0.0.1", port=0, transport="tcp") as server:
        relay = ThrottledRelay(("127.0.0.1", server.port), RATE)
        try:
            start = time.monotonic()
            got = rdmaxfer.pull_weights(relay.address, transport="tcp", timeout=TIMEOUT_S)
            elapsed = time.monotonic() - start
        finally:
            relay.close()
    assert elapsed > 1.5 * TIMEOUT_S, f"took {elapsed:.2f} s: the link was not slow"
    assert {k: digest(v) for k, v in got.items()} == {k: digest(v) for k, v in tensors.items()}


def test_deadline_must_be_seconds() -> None:
    with pytest.raises(rdmaxfer.InvalidArgumentError, match="deadline=-1 must be a finite"):
        rdmaxfer.send(np.ones(4, np.uint8), to="127.0.0.1:9", deadline=-1)
