"""A process that ends with engines, endpoints, a WeightServer, a WeightReceiver, a transfer in
flight and daemon threads blocked in the core still open exits with its own status and says
nothing on stderr beyond the user's own exception (rdmaxfer.transport.lifecycle).

Each ending runs REPS times, the children of an ending at once; tests/_exit_scenario.py is
the child, holding all of that on TCP and on shm at once (one child for both keeps the test
time small). The verbs variant runs in the rxe guest (tests/rxe/run-in-vm.sh) with fewer
repetitions.
"""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import rdmaxfer

SCENARIO = Path(__file__).with_name("_exit_scenario.py")
REPS = 20
RDMA_REPS = 1  # a child takes minutes in the emulated guest
#: A child that has not exited by then hangs (it takes a second on a host, minutes in the
#: emulated rxe guest).
CHILD_TIMEOUT_S = 1500.0

#: ending -> (exit status, the one line stderr ends with, or "" for an empty stderr)
ENDINGS = {
    "normal": (0, ""),
    "exit3": (3, ""),
    "raise": (1, "RuntimeError: the user's own error"),
    "sigterm": (-signal.SIGTERM, ""),
    "sigterm-handler": (143, ""),
}


def start_children(ending: str, transports: list[str], reps: int) -> list[subprocess.Popen[str]]:
    """``reps`` children ending by ``ending`` with everything open on ``transports``."""
    env = {**os.environ, "PYTHONFAULTHANDLER": "1"}  # a crash would print its stacks
    return [
        subprocess.Popen(
            [sys.executable, str(SCENARIO), ending, ",".join(transports)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(reps)
    ]


def problems_of(children: list[subprocess.Popen[str]], ending: str, objects: int) -> list[str]:
    """What went wrong in ``children`` (each holding ``objects`` objects open) that ended by
    ``ending`` (empty: nothing)."""
    want_status, want_last = ENDINGS[ending]
    problems = []
    for child in children:
        try:
            out, err = child.communicate(timeout=CHILD_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            child.kill()
            out, err = child.communicate()
            problems.append(f"hung for {CHILD_TIMEOUT_S:g} s; stderr: {err[-2000:]!r}")
            continue
        if not out.startswith(f"ready {objects}"):
            problems.append(f"exit {child.returncode} before it was ready: {err[-2000:]!r}")
        elif child.returncode != want_status:
            problems.append(f"exit {child.returncode}, not {want_status}: {err[-2000:]!r}")
        elif want_last == "" and err != "":
            problems.append(f"stderr not empty: {err[-2000:]!r}")
        elif want_last and (
            err.count("Traceback") != 1 or err.rstrip("\n").splitlines()[-1] != want_last
        ):
            problems.append(f"stderr is not the user's traceback alone: {err[-2000:]!r}")
    return [f"{ending}: {p}" for p in problems]


def summary(problems: list[str], children: int) -> str:
    counts = collections.Counter(":".join(p.split(":")[:2]) for p in problems)
    return f"{len(problems)} of {children} children failed ({dict(counts)}); first: {problems[0]}"


def host_transports() -> list[str]:
    """tcp, and shm where it can run here."""
    known = rdmaxfer._core.available_transports()
    return [name for name in ("tcp", "shm") if known.get(name) == ""]


@pytest.mark.parametrize("ending", list(ENDINGS))
def test_exit_with_everything_open(ending: str) -> None:
    transports = host_transports()
    children = start_children(ending, transports, REPS)
    problems = problems_of(children, ending, 9 * len(transports))
    assert not problems, summary(problems, REPS)


@pytest.mark.rdma
@pytest.mark.timeout(1800)
def test_exit_with_everything_open_over_verbs() -> None:
    """Every ending at once (the emulated guest is slow), RDMA_REPS children each."""
    reason = rdmaxfer._core.available_transports().get("rdma", "unknown transport")
    if reason:
        pytest.skip(f"no RDMA device (run inside tests/rxe/run-in-vm.sh): {reason}")
    started = {ending: start_children(ending, ["rdma"], RDMA_REPS) for ending in ENDINGS}
    problems = [p for ending, kids in started.items() for p in problems_of(kids, ending, 9)]
    assert not problems, summary(problems, RDMA_REPS * len(ENDINGS))
