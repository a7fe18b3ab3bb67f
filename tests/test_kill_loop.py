"""A peer SIGKILLed at random points of connect, handshake, transfer and close, many times.

The survivor must raise within its timeout, free what it held (file descriptors and memory
registrations back to where they started), and accept the next connection. Peers are forked
from a single-threaded "zygote" process (spawned once), so each of the ITERATIONS rounds costs
milliseconds, not a Python start-up. RDMAXFER_KILL_ITERATIONS sets the count (default 200).

The same loop runs on the verbs transport inside the rxe guest (marker ``rdma``).
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import signal
import socket
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

import numpy as np
import pytest

from _common import WITH_AUTO
from rdmaxfer import ConnectionFailedError, Engine, TransferTimeoutError, _core

ITERATIONS = int(os.environ.get("RDMAXFER_KILL_ITERATIONS", "200"))
PHASES = ("connect", "handshake", "transfer", "close")
TIMEOUT_S = 10.0
MARGIN_S = 5.0
HELLO = b"RXHI" + (1).to_bytes(2, "little") + bytes([1, 0, 1, 0]) + bytes(6) + bytes(16)


def engine_kwargs(transport: str, side: int) -> dict[str, Any]:
    if transport in WITH_AUTO:
        return {}
    devices = os.environ.get("RDMAXFER_RXE_DEVICES", "rxe0 rxe1").split()
    return {"rdma_device": devices[side]}


def listen_host(transport: str) -> str:
    if transport in WITH_AUTO:
        return "127.0.0.1"
    return os.environ.get("RDMAXFER_RXE_ADDRS", "10.77.0.1 10.77.0.2").split()[0]


def raw_connect(transport: str, host: str, port: int) -> socket.socket:
    """A plain socket to the listener (shm: its abstract UNIX socket; auto: its TCP port), no
    handshake."""
    if transport != "shm":
        return socket.create_connection((host, port), timeout=5)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(f"\0rdmaxfer-shm:{port}")
    return s


def child(transport: str, host: str, port: int, phase: str, nbytes: int) -> None:
    """Runs in a forked peer until it is killed."""
    if phase in ("connect", "handshake"):
        s = raw_connect(transport, host, port)
        if phase == "handshake":
            s.sendall(HELLO[:20])  # a started, never finished Hello
        time.sleep(60)
    engine = Engine(transport, **engine_kwargs(transport, 1))
    ep = engine.connect(host, port, timeout=10)
    data = np.random.default_rng(port).integers(0, 256, nbytes, dtype=np.uint8)
    if phase == "transfer":
        ep.post_send(data)  # the survivor receives while we are killed
    else:  # close: a small message, then close
        ep.post_send(data[:64])
        time.sleep(0.001)
        ep.close()
    time.sleep(60)


def zygote(conn: Connection) -> None:
    """Forks a peer per request; stays single-threaded so that fork() is safe."""
    import rdmaxfer  # noqa: F401  (imported once, inherited by every fork)

    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # killed peers are reaped by the kernel
    while True:
        job = conn.recv()
        if job is None:
            return
        pid = os.fork()
        if pid == 0:
            try:
                child(*job)
            finally:
                os._exit(0)
        conn.send(pid)


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def wait_until(predicate: Callable[[], bool], timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def run_kill_loop(transport: str, nbytes: int) -> dict[str, int]:
    ctx = mp.get_context("spawn")
    parent, child_end = ctx.Pipe()
    zyg = ctx.Process(target=zygote, args=(child_end,), daemon=True)
    zyg.start()
    rng = np.random.default_rng(2024)
    raised = {phase: 0 for phase in PHASES}
    host = listen_host(transport)
    try:
        with Engine(transport, **engine_kwargs(transport, 0)) as survivor:
            port = survivor.listen(host, 0)
            fds_before = open_fds()
            regions_before = survivor.registered_count()
            out = np.empty(nbytes, dtype=np.uint8)
            for i in range(ITERATIONS):
                phase = PHASES[i % len(PHASES)]
                parent.send((transport, host, port, phase, nbytes))
                pid = parent.recv()
                try:
                    if phase in ("transfer", "close"):
                        ep = survivor.accept(timeout=TIMEOUT_S)
                        time.sleep(float(rng.uniform(0, 0.01)))
                        kill(pid)
                        start = time.monotonic()
                        with pytest.raises((ConnectionFailedError, TransferTimeoutError)):
                            # The message may arrive whole before the kill; the next one never.
                            for _ in range(2):
                                ep.recv(out=out if phase == "transfer" else None, timeout=TIMEOUT_S)
                        assert time.monotonic() - start < 2 * TIMEOUT_S + MARGIN_S
                        raised[phase] += 1
                        ep.close()
                    else:
                        time.sleep(float(rng.uniform(0, 0.01)))
                        kill(pid)
                        raised[phase] += 1
                finally:
                    kill(pid)
                # The survivor accepts and serves the next peer after every kill.
                if i % 10 == 9:
                    check_next_peer(survivor, transport, host, port, rng)
            # Everything the dead peers held is released (partial connections expire).
            assert wait_until(lambda: open_fds() <= fds_before, 20), (
                f"{open_fds() - fds_before} file descriptors leaked"
            )
            # What stays is the survivor's own: `out`'s temporary registration (no remote
            # access) is kept by the registration cache while `out` lives; nothing of the peers.
            assert len(survivor._temps) <= 1
            assert survivor.registered_count() == regions_before + len(survivor._temps)
    finally:
        parent.send(None)
        zyg.join(timeout=10)
    return raised


def kill(pid: int) -> None:
    """SIGKILL, tolerating a peer that is already gone (the zygote reaps it)."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def check_next_peer(
    survivor: Engine, transport: str, host: str, port: int, rng: np.random.Generator
) -> None:
    with Engine(transport, **engine_kwargs(transport, 1)) as peer:
        ep = peer.connect(host, port, timeout=TIMEOUT_S)
        theirs = survivor.accept(timeout=TIMEOUT_S)
        data = rng.integers(0, 256, 4099, dtype=np.uint8)
        sending = ep.post_send(data)
        assert theirs.recv(timeout=TIMEOUT_S).tobytes() == data.tobytes()
        sending.wait(TIMEOUT_S)
        theirs.close()


@pytest.mark.parametrize("transport", WITH_AUTO, indirect=True)
def test_kill_loop_host(transport: str) -> None:
    raised = run_kill_loop(transport, 8 << 20)
    assert sum(raised.values()) == ITERATIONS
    assert all(raised[p] == ITERATIONS // len(PHASES) for p in PHASES)


@pytest.mark.rdma
@pytest.mark.skipif(
    _core.available_transports().get("rdma", "") != "",
    reason="no RDMA device (run inside tests/rxe/run-in-vm.sh)",
)
def test_kill_loop_rdma() -> None:
    raised = run_kill_loop("rdma", 1 << 20)
    assert sum(raised.values()) == ITERATIONS
