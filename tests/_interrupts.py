"""Driving tests/_wait_child.py for the Ctrl-C tests: start a child, let it block in a wait,
send SIGINT, and measure when KeyboardInterrupt was raised and when the child exited.
Shared by tests/test_interrupt.py (TCP) and tests/rdma/test_rdma_interrupt.py (verbs)."""

from __future__ import annotations

import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import rdmaxfer

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_wait_child.py")
#: The promise: KeyboardInterrupt within this long of SIGINT.
PROMPT_S = 0.5
#: Allowance for a shared, loaded machine (and emulation in the rxe guest) on top of PROMPT_S.
SLACK_S = 0.5
#: How long the child sits in its wait before the signal.
SETTLE_S = 0.5
#: Bound on a child's start (importing rdmaxfer, opening the device, connecting): seconds on a
#: host, but minutes in the emulated rxe guest when the host is busy.
START_S = 300.0


def child_env(**extra: str) -> dict[str, str]:
    """The environment of a child: rdmaxfer imported from where this process found it."""
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(rdmaxfer.__file__))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    env.update(extra)
    return env


class Child:
    """A running tests/_wait_child.py; its stdout lines are read by a thread."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, CHILD, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        self._lines: queue.Queue[str] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line.strip())

    def expect(self, prefix: str, timeout: float) -> str:
        """The next line starting with ``prefix`` (AssertionError, with stderr, if none)."""
        end = time.monotonic() + timeout
        while True:
            try:
                line = self._lines.get(timeout=max(0.0, end - time.monotonic()))
            except queue.Empty:
                self.stop()
                raise AssertionError(
                    f"no {prefix!r} from the child within {timeout} s; stderr:\n{self.stderr()}"
                ) from None
            if line.startswith(prefix):
                return line

    def stderr(self) -> str:
        if self.proc.poll() is None:
            return "(still running)"
        assert self.proc.stderr is not None
        return self.proc.stderr.read()

    def pause(self) -> None:
        """SIGSTOP: the child stops serving (its peers' transfers stall)."""
        os.kill(self.proc.pid, signal.SIGSTOP)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
        self.proc.wait(timeout=30)


@contextmanager
def server(kind: str, host: str, env: dict[str, str]) -> Iterator[tuple[Child, str]]:
    """A ``serve`` or ``serve-weights`` child: (the child, its ``host:port``)."""
    child = Child([kind, host], env)
    try:
        port = child.expect("PORT", START_S).split()[1]
        yield child, f"{host}:{port}"
    finally:
        child.stop()


@contextmanager
def silent_listener(host: str = "127.0.0.1") -> Iterator[str]:
    """A TCP listener that accepts connections (backlog) but never answers a handshake."""
    sock = socket.create_server((host, 0))
    try:
        yield f"{host}:{sock.getsockname()[1]}"
    finally:
        sock.close()


def refused_address(host: str = "127.0.0.1") -> str:
    """``host:port`` where nothing listens (a port just freed)."""
    with socket.create_server((host, 0)) as sock:
        return f"{host}:{sock.getsockname()[1]}"


@dataclass
class Interrupted:
    raised_after_s: float  # SIGINT -> KeyboardInterrupt raised in the child
    exited_after_s: float  # SIGINT -> child gone
    returncode: int
    stderr: str


def interrupt(
    kind: str, address: str, env: dict[str, str], before: Callable[[], None] | None = None
) -> Interrupted:
    """Run the child's wait ``kind`` against ``address``, SIGINT it once it waits (after
    ``before()``, e.g. stopping the peer), and report what happened."""
    child = Child([kind, address], env)
    try:
        child.expect("WAITING", START_S)
        if before is not None:
            before()
        time.sleep(SETTLE_S)
        sent = time.monotonic()
        child.proc.send_signal(signal.SIGINT)
        raised = float(child.expect("RAISED", 30).split()[1])
        child.proc.wait(timeout=30)
        exited = time.monotonic()
        return Interrupted(raised - sent, exited - sent, child.proc.returncode, child.stderr())
    finally:
        child.stop()


def check_prompt(result: Interrupted, slack_s: float = SLACK_S) -> None:
    """KeyboardInterrupt within PROMPT_S (+ slack), a normal traceback, a prompt exit."""
    assert result.raised_after_s < PROMPT_S + slack_s, result
    lines = result.stderr.strip().splitlines()
    assert lines and lines[0] == "Traceback (most recent call last):", result.stderr
    assert lines[-1] == "KeyboardInterrupt", result.stderr
    assert "lost sys.stderr" not in result.stderr
    assert result.returncode == -signal.SIGINT, result
    assert result.exited_after_s < 10.0 + 10 * slack_s, result
