"""Observability (issue 12 item 5) over TCP: Endpoint.stats() / Engine.stats() count exactly
what was moved, per kind and per lane, with errors, retries and credit stalls; the C++ core
logs connection set-up, teardown and failures to the "rdmaxfer" logger, and prints nothing on
stderr by default. The verbs twin is tests/rdma/test_rdma_observability.py."""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import numpy.typing as npt
import pytest
import xxhash

from _interrupts import child_env
from rdmaxfer import Engine, RemoteAccessError
from rdmaxfer.transport.stats import nonzero

KIB = 1024
MIB = 1024 * KIB


def digest(arr: npt.NDArray[np.uint8]) -> int:
    return xxhash.xxh64(arr.tobytes()).intdigest()


def lane_bytes(stats: dict[str, int]) -> dict[int, int]:
    return {
        int(k[4:].split(".")[0]): v
        for k, v in stats.items()
        if k.startswith("lane") and k.endswith(".bytes")
    }


def wait_for(predicate: object, timeout: float = 10.0) -> None:
    assert callable(predicate)
    end = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < end, "condition not met in time"
        time.sleep(0.01)


def logged(
    caplog: pytest.LogCaptureFixture, level: int, text: str, timeout: float = 10.0
) -> list[logging.LogRecord]:
    """The records at ``level`` or above containing ``text``, waiting for the first (up to
    ``timeout`` s): a message from an I/O thread reaches Python once that thread gets the GIL,
    which may be after the failed call already returned to its caller."""
    end = time.monotonic() + timeout
    while True:
        found = [r for r in caplog.records if r.levelno >= level and text in r.getMessage()]
        if found or time.monotonic() >= end:
            return found
        time.sleep(0.01)


def test_counts_equal_the_bytes_moved_per_kind_and_per_lane(rng: np.random.Generator) -> None:
    with Engine("tcp", streams=4) as server, Engine("tcp", streams=4) as client:
        port = server.listen("127.0.0.1", 0)
        a = client.connect("127.0.0.1", port, timeout=10)
        b = server.accept(timeout=10)
        sizes = {"write": 3 * MIB + 17, "read": 2 * MIB + 5, "big": 1 * MIB + 3, "eager": 999}
        target = np.zeros(sizes["write"], np.uint8)
        source = rng.integers(0, 256, sizes["read"], dtype=np.uint8)
        t_region = server.register(target, "w")
        s_region = server.register(source, "r")
        src = rng.integers(0, 256, sizes["write"], dtype=np.uint8)
        a.write(src, t_region.descriptor(), chunk_size=256 * KIB, streams=4, timeout=30)
        back = np.zeros(sizes["read"], np.uint8)
        a.read(back, s_region.descriptor(), chunk_size=256 * KIB, streams=4, timeout=30)
        assert digest(target) == digest(src)
        assert digest(back) == digest(source)
        sent = [rng.integers(0, 256, sizes[k], dtype=np.uint8) for k in ("big", "eager")]
        for arr in sent:
            t = a.post_send(arr, chunk_size=128 * KIB, streams=4)
            got = b.recv(timeout=30)
            t.wait(timeout=30)
            assert digest(got) == digest(arr)
        msg_bytes = sizes["big"] + sizes["eager"]

        sa, sb = a.stats(), b.stats()
        assert (sa["write.ops"], sa["write.bytes"]) == (1, sizes["write"])
        assert (sa["read.ops"], sa["read.bytes"]) == (1, sizes["read"])
        assert (sa["send.ops"], sa["send.bytes"]) == (2, msg_bytes)
        assert (sb["recv.ops"], sb["recv.bytes"]) == (2, msg_bytes)
        assert sa["recv.ops"] == sb["send.ops"] == sb["write.ops"] == sb["read.ops"] == 0
        # Two RTS/EAGER from a; two CTS from b.
        assert sa["ctrl.ops"] == 2 and sb["ctrl.ops"] == 2
        lanes_a = lane_bytes(sa)
        assert sum(lanes_a.values()) == sizes["write"] + sizes["read"] + msg_bytes
        assert len([n for n in lanes_a.values() if n]) == 4  # striped over the 4 streams
        assert sum(lane_bytes(sb).values()) == msg_bytes
        assert all(v == 0 for k, v in sa.items() if k.startswith("errors."))
        # The engine sums its endpoints (one each here), and counts its I/O threads' linger.
        for engine, ep_stats in ((client, sa), (server, sb)):
            counts = nonzero(engine.stats())
            counts.pop("io_linger_us", None)  # the engine's own threads, not an endpoint's
            assert "io_linger_us" not in ep_stats
            assert counts == nonzero(ep_stats)
        a.close()
        # Closed endpoints still count in their engine.
        assert client.stats()["write.bytes"] == sizes["write"]
        assert client.stats()["ctrl.ops"] == 3  # and the GOODBYE


def test_a_refused_write_counts_as_a_write_error_and_logs_a_warning(
    caplog: pytest.LogCaptureFixture, rng: np.random.Generator
) -> None:
    caplog.set_level(logging.DEBUG, logger="rdmaxfer")
    with Engine("tcp") as server, Engine("tcp") as client:
        port = server.listen("127.0.0.1", 0)
        a = client.connect("127.0.0.1", port, timeout=10)
        server.accept(timeout=10)
        region = server.register(np.zeros(4096, np.uint8), "w")
        desc = region.descriptor()
        region.deregister()
        with pytest.raises(RemoteAccessError):
            a.write(rng.integers(0, 256, 4096, dtype=np.uint8), desc, timeout=30)
        assert a.stats()["errors.write"] == 1
        assert a.stats()["write.ops"] == 0
        assert client.stats()["errors.write"] == 1
        assert not a.closed  # the connection stays usable
        refused = logged(caplog, logging.WARNING, "refused access")
        assert refused and refused[0].levelno == logging.WARNING, caplog.text


def test_connect_retries_are_counted_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="rdmaxfer")
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()  # nothing listens on `port` until the server below does
    with Engine("tcp") as server, Engine("tcp") as client:
        timer = threading.Timer(0.4, server.listen, ("127.0.0.1", port))
        timer.start()
        ep = client.connect("127.0.0.1", port, timeout=20)
        timer.join()
        server.accept(timeout=10)
        assert ep.stats()["retries"] >= 1
        assert client.stats()["retries"] == ep.stats()["retries"]
        assert client.stats()["errors.connect"] == 0
        retried = [r.getMessage() for r in caplog.records if "retrying in" in r.getMessage()]
        assert len(retried) == ep.stats()["retries"]
        assert f"127.0.0.1:{port}" in retried[0]


def test_a_failed_connect_counts_its_retries_and_the_error(
    caplog: pytest.LogCaptureFixture, closed_port: int
) -> None:
    caplog.set_level(logging.DEBUG, logger="rdmaxfer")
    with Engine("tcp") as client:
        with pytest.raises(Exception, match="cannot connect"):
            client.connect("127.0.0.1", closed_port, timeout=0.5)
        stats = client.stats()
        assert stats["errors.connect"] == 1
        assert stats["retries"] >= 1
        failed = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert any(f"connect to 127.0.0.1:{closed_port} failed" in r.getMessage() for r in failed)


def test_a_full_socket_counts_a_credit_stall(rng: np.random.Generator) -> None:
    with Engine("tcp", socket_buffer=4096) as server, Engine("tcp", socket_buffer=4096) as client:
        port = server.listen("127.0.0.1", 0)
        a = client.connect("127.0.0.1", port, streams=1, timeout=10)
        server.accept(timeout=10)
        # 64 KiB is 16 times the socket buffers: one sendmsg cannot take it all. (Keep it small:
        # past about 100 KiB, 4 KiB sockets move about 50 KB/s, their window below the MSS.)
        target = np.zeros(64 * KIB, np.uint8)
        region = server.register(target, "w")
        src = rng.integers(0, 256, target.size, dtype=np.uint8)
        a.write(src, region.descriptor(), timeout=60)
        assert np.array_equal(target, src)
        assert a.stats()["credit_stalls"] >= 1


def test_connect_accept_close_are_logged_with_the_peer(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="rdmaxfer")
    with Engine("tcp") as server, Engine("tcp") as client:
        port = server.listen("127.0.0.1", 0)
        a = client.connect("127.0.0.1", port, timeout=10)
        b = server.accept(timeout=10)
        texts = [r.getMessage() for r in caplog.records if r.name == "rdmaxfer"]
        assert any(t.startswith("endpoint connected over tcp: to 127.0.0.1:" + str(port))
                   for t in texts), texts  # fmt: skip
        assert any(t.startswith("endpoint accepted over tcp: to " + b.peer) for t in texts)
        a.close()
        closed = [r for r in caplog.records if "closed locally" in r.getMessage()]
        assert closed and closed[0].levelno == logging.DEBUG
        assert f"to 127.0.0.1:{port}" in closed[0].getMessage()

        def peer_close_logged() -> bool:
            return any("closed the endpoint" in r.getMessage() for r in caplog.records)

        wait_for(peer_close_logged)
        record = next(r for r in caplog.records if "closed the endpoint" in r.getMessage())
        assert record.levelno == logging.INFO and b.peer in record.getMessage()
        assert server.stats()["errors.connection"] == 0  # a peer's close is no failure


PEER = """
import os, sys, time
from rdmaxfer import Engine
engine = Engine("tcp")
ep = engine.connect(sys.argv[1], timeout=30)
print("UP", flush=True)
time.sleep(60)
"""


def test_a_peer_death_logs_a_warning_with_the_cause(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="rdmaxfer")
    with Engine("tcp") as server:
        port = server.listen("127.0.0.1", 0)
        peer = subprocess.Popen(
            [sys.executable, "-c", PEER, f"127.0.0.1:{port}"],
            stdout=subprocess.PIPE,
            env=child_env(),
            text=True,
        )
        try:
            b = server.accept(timeout=30)
            assert peer.stdout is not None and peer.stdout.readline() == "UP\n"
            pending = b.post_recv()
            os.kill(peer.pid, signal.SIGKILL)
            with pytest.raises(Exception, match="lost"):
                pending.wait(timeout=10)
        finally:
            peer.kill()
            peer.wait(timeout=30)
        lost = logged(caplog, logging.WARNING, "lost")
        assert lost, caplog.text
        assert b.peer in lost[0].getMessage()
        assert "EOF" in lost[0].getMessage() or "reset" in lost[0].getMessage()
        assert server.stats()["errors.connection"] == 1
        assert server.stats()["errors.recv"] == 1


SILENT = """
import numpy as np
import numpy.typing as npt
from rdmaxfer import Engine
with Engine("tcp") as server, Engine("tcp") as client:
    port = server.listen("127.0.0.1", 0)
    a = client.connect("127.0.0.1", port, timeout=10)
    b = server.accept(timeout=10)
    sent = a.post_send(np.arange(100000, dtype=np.int64))
    assert b.recv(timeout=30).sum() == 4999950000
    sent.wait(timeout=30)
    region = server.register(np.zeros(16, np.uint8), "w")
    desc = region.descriptor()
    region.deregister()
    try:
        a.write(np.ones(16, np.uint8), desc, timeout=10)
    except Exception:
        pass
    a.close()
    try:
        client.connect("127.0.0.1", {closed}, timeout=0.3)
    except Exception:
        pass
print("DONE")
"""


def test_nothing_reaches_stderr_by_default(closed_port: int) -> None:
    # Debug, info, warning (a refused WRITE, a failed connect) and error paths all run.
    done = subprocess.run(
        [sys.executable, "-c", SILENT.format(closed=closed_port)],
        capture_output=True,
        env=child_env(),
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "DONE\n"
    assert done.stderr == ""
