"""Start-up order (TCP): connecting retries a refused connection with backoff until its timeout,
so a sender started before its receiver waits for it (as torch.distributed's TCPStore does),
and says how long it tried when it gives up. The verbs twin is in
tests/rdma/test_rdma_waits.py (the bootstrap is shared)."""

from __future__ import annotations

import re
import threading
import time

import pytest

import rdmaxfer
from _common import MARGIN_S
from _interrupts import refused_address
from _peers import digest, make_array
from rdmaxfer import ConnectionFailedError, Engine


def receive_later(port: int, delay_s: float, got: dict[str, object]) -> threading.Thread:
    def run() -> None:
        time.sleep(delay_s)
        with Engine("tcp") as engine:
            engine.listen("127.0.0.1", port)
            with engine.accept(timeout=30) as ep:
                got["array"] = ep.recv(timeout=30)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_send_started_before_the_receiver_waits_for_it() -> None:
    address = refused_address()
    port = int(address.rsplit(":", 1)[1])
    data = make_array(11, 1 << 20)
    got: dict[str, object] = {}
    thread = receive_later(port, 0.3, got)
    start = time.monotonic()
    try:
        rdmaxfer.send(data, to=address, timeout=30)
    finally:
        thread.join(timeout=60)
        rdmaxfer.shutdown()
    assert time.monotonic() - start >= 0.3
    assert digest(got["array"]) == digest(data)


def test_connect_gives_up_at_its_timeout_saying_how_long_it_tried() -> None:
    address = refused_address()
    with Engine("tcp") as engine:
        start = time.monotonic()
        with pytest.raises(ConnectionFailedError) as info:
            engine.connect(address, timeout=1.0)
        elapsed = time.monotonic() - start
    text = str(info.value)
    found = re.search(
        rf"cannot connect to {address}: connect: Connection refused \(errno 111\) "
        r"\((\d+) attempts over ([\d.]+) s; is the peer listening",
        text,
    )
    assert found, text
    # Attempts at 0, 0.05, 0.15, 0.35 and 0.75 s (50 ms doubling), the last at the deadline;
    # fewer when a sleep overran on a loaded machine, never more (no spinning at the end).
    assert 3 <= int(found[1]) <= 6, text
    assert 1.0 <= float(found[2]) < 1.0 + MARGIN_S
    assert 1.0 <= elapsed < 1.0 + MARGIN_S


def test_timeout_zero_tries_once() -> None:
    with Engine("tcp") as engine, pytest.raises(ConnectionFailedError, match=r"\(1 attempt over"):
        engine.connect(refused_address(), timeout=0)


def test_retry_refused_false_fails_at_once() -> None:
    with Engine("tcp") as engine:
        start = time.monotonic()
        with pytest.raises(ConnectionFailedError, match=r"\(1 attempt over"):
            engine.connect(refused_address(), timeout=30, retry_refused=False)
        assert time.monotonic() - start < MARGIN_S
