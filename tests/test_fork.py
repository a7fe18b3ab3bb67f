"""Fork safety on TCP: a process with an engine, connections and registrations forks; the child
finds the inherited objects inert (clear error), closes them without touching the parent's
connections, exits normally and may transfer with an engine of its own. (The same scenario runs
on verbs in tests/rdma/test_rdma_fork.py.)"""

from __future__ import annotations

import pytest

from _fork_scenario import run_fork_scenario


@pytest.mark.parametrize("fork_safe", [False, True], ids=["plain", "RDMAV_FORK_SAFE"])
def test_fork_with_live_tcp_engines(fork_safe: bool) -> None:
    run_fork_scenario(["tcp"], fork_safe)
