"""Test data and the code that peer PROCESSES run (imported by spawned children, so it must not
import pytest or conftest).

A peer is started with :class:`Peer` (multiprocessing, 'spawn'): the child runs
``target(conn, *args)`` where ``conn`` is its end of a pipe to the test. Whatever the child
raises comes back to the test as a :class:`PeerFailure` raised by ``Peer.get``.
"""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import os
import signal
import time
import traceback
from multiprocessing.connection import Connection
from typing import Any

import ml_dtypes
import numpy as np

import rdmaxfer
from rdmaxfer import Engine

DTYPES = {
    "uint8": np.dtype(np.uint8),
    "int16": np.dtype(np.int16),
    "float32": np.dtype(np.float32),
    "float64": np.dtype(np.float64),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
}


def host_transport() -> str:
    """The transport a peer uses: the test's (RDMAXFER_TRANSPORT, which the ``transport``
    fixture sets), else "tcp"."""
    return os.environ.get("RDMAXFER_TRANSPORT") or "tcp"


def make_array(seed: int, shape: tuple[int, ...] | int, dtype: Any = np.uint8) -> np.ndarray:
    """Random bytes (never zeros) viewed as ``dtype``; the same (seed, shape, dtype) gives the
    same bytes in every process."""
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    dt = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
    raw = np.frombuffer(np.random.default_rng(seed).bytes(nbytes), dtype=np.uint8).copy()
    return raw.view(dt).reshape(shape)


def digest(obj: Any) -> str:
    """SHA-256 of an array's (or buffer's) bytes."""
    arr = np.asarray(obj)
    return hashlib.sha256(np.ascontiguousarray(arr).reshape(-1).view(np.uint8)).hexdigest()


def same_bytes(a: np.ndarray, b: np.ndarray) -> bool:
    """Same dtype, shape and bytes (NaN payloads included)."""
    return (
        a.dtype == b.dtype
        and a.shape == b.shape
        and np.array_equal(a.reshape(-1).view(np.uint8), b.reshape(-1).view(np.uint8))
    )


class PeerFailure(AssertionError):
    """The peer process raised; the message carries its traceback."""


def _peer_main(target: Any, conn: Connection, args: tuple[Any, ...]) -> None:
    try:
        target(conn, *args)
    except BaseException as exc:  # report everything, then exit non-zero
        try:
            conn.send(("__peer_error__", type(exc).__name__, str(exc), traceback.format_exc()))
        finally:
            os._exit(3)
    finally:
        rdmaxfer.shutdown()


class Peer:
    """A peer in another process (multiprocessing 'spawn': a fresh interpreter)."""

    def __init__(self, target: Any, *args: Any) -> None:
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_peer_main, args=(target, child, args), daemon=True)
        self.proc.start()
        child.close()

    @property
    def pid(self) -> int:
        assert self.proc.pid is not None
        return self.proc.pid

    def get(self, timeout: float = 60.0) -> Any:
        """The next message from the peer; raises PeerFailure if the peer failed."""
        if not self.conn.poll(timeout):
            raise AssertionError(
                f"peer (pid {self.proc.pid}, alive={self.proc.is_alive()}) sent nothing "
                f"within {timeout} s"
            )
        msg = self.conn.recv()
        if isinstance(msg, tuple) and msg and msg[0] == "__peer_error__":
            raise PeerFailure(f"peer raised {msg[1]}: {msg[2]}\n{msg[3]}")
        return msg

    def put(self, obj: Any) -> None:
        self.conn.send(obj)

    def kill(self) -> None:
        """SIGKILL: no cleanup at all in the peer."""
        os.kill(self.pid, signal.SIGKILL)
        self.proc.join(10)

    def join(self, timeout: float = 60.0) -> int | None:
        self.proc.join(timeout)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)
            raise AssertionError(f"peer pid {self.proc.pid} did not exit within {timeout} s")
        return self.proc.exitcode

    def close(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)
        self.conn.close()


# --- peer programs (run in the child) --------------------------------------------------------


def send_specs(conn: Connection, address: str, specs: list[tuple[int, Any, str]]) -> None:
    """Connect to ``address`` and send make_array(seed, shape, dtype) for each spec, then
    receive as many arrays back and report their digests."""
    with Engine(host_transport()) as engine, engine.connect(address, timeout=30) as ep:
        for seed, shape, dtype in specs:
            ep.send(make_array(seed, shape, DTYPES[dtype]), timeout=60)
        back = [ep.recv(timeout=60) for _ in specs]
        conn.send([(str(a.dtype), a.shape, digest(a)) for a in back])
        conn.recv()  # wait until the test is done with us before closing


def send_forever(conn: Connection, address: str, nbytes: int, seed: int) -> None:
    """Connect and send make_array(seed, nbytes) again and again until killed (generated once,
    so the next message follows the previous one at once)."""
    data = make_array(seed, nbytes)
    with Engine(host_transport()) as engine, engine.connect(address, timeout=30) as ep:
        conn.send("connected")
        for _ in range(10_000):
            ep.send(data, timeout=60)


def expose_region(conn: Connection, address: str, nbytes: int, seed: int, access: str) -> None:
    """Connect, register make_array(seed, nbytes) with ``access``, send its descriptor bytes;
    then answer "digest" requests with the region's digest, until told "stop" (or killed)."""
    with Engine(host_transport()) as engine, engine.connect(address, timeout=30):
        target = make_array(seed, nbytes)
        region = engine.register(target, access)
        conn.send(region.descriptor().pack())
        while True:
            if not conn.poll(120):
                raise TimeoutError("the test sent no command within 120 s")
            cmd = conn.recv()
            if cmd == "stop":
                break
            conn.send(digest(target))


def api_send_to(conn: Connection, address: str, specs: list[tuple[int, Any, str]]) -> None:
    """rdmaxfer.send(..., to=address) for each spec (one cached connection)."""
    for seed, shape, dtype in specs:
        rdmaxfer.send(make_array(seed, shape, DTYPES[dtype]), to=address, timeout=60)
    conn.send(len(rdmaxfer.transport.api._connected))
    conn.recv()


def api_send_listening(conn: Connection, specs: list[tuple[int, Any, str]]) -> None:
    """Listen on a free port, report it, then rdmaxfer.send(..., listen=port) each spec."""
    port = rdmaxfer.listen(":0")
    conn.send(port)
    for seed, shape, dtype in specs:
        rdmaxfer.send(make_array(seed, shape, DTYPES[dtype]), listen=f":{port}", timeout=60)
    conn.send("sent")
    conn.recv()


def send_expecting_reject(conn: Connection, address: str, seed: int, shape: Any) -> None:
    """Send one float32 array; report the error the send raised (the receiver rejects it)."""
    with Engine(host_transport()) as engine, engine.connect(address, timeout=30) as ep:
        try:
            ep.send(make_array(seed, shape, np.float32), timeout=30)
        except rdmaxfer.RdmaxferError as exc:
            conn.send((type(exc).__name__, str(exc)))
        else:
            conn.send(("no error", ""))
        conn.recv()


def sleep_then_exit(conn: Connection, seconds: float) -> None:
    time.sleep(seconds)
    conn.send("done")
