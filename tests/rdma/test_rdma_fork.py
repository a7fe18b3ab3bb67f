"""Fork safety on verbs (tests/_fork_scenario.py, checked by tests/test_fork.py): the child of a
process with rdma engines, QPs and MRs (one over a buffer that is not page-aligned) finds them
inert, exits normally without touching the parent's QPs, and transfers with its own Engine;
with and without RDMAV_FORK_SAFE."""

from __future__ import annotations

import pytest

from _fork_scenario import run_fork_scenario

from .rdma_helpers import addrs, devices

pytestmark = pytest.mark.rdma


@pytest.mark.parametrize("fork_safe", [False, True], ids=["plain", "RDMAV_FORK_SAFE"])
def test_fork_with_live_rdma_engines(fork_safe: bool) -> None:
    run_fork_scenario(["rdma", devices()[1], devices()[0], addrs()[1]], fork_safe)
