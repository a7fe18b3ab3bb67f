"""The ofi transport over libfabric's verbs;ofi_rxm provider in the test VM: the cases of
tests/rdma/ofi_cases.py (one rail per engine) and tests/rdma/ofi_rail_cases.py (two), each
run in a pytest process of its own. libfabric's verbs provider
opens every RDMA device of the host and holds it until its process exits, so an engine over
verbs;ofi_rxm in the suite's process would leave `rdma link delete` blocked for the tests of
device removal that come after it (tests/rdma/test_rdma_rails_failover.py)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.rdma

HERE = Path(__file__).resolve().parent
#: The cases' own bounds are 300 s at most each (the MiniLM pull); the whole file under TCG.
RUN_S = 1800


def run_cases(name: str, passed: int) -> None:
    """Runs tests/rdma/`name` in a pytest process of its own: all `passed` cases pass, or all
    skip for one reason (then this test skips with it)."""
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "0", "-p", "no:cacheprovider", "-ra", "-q",
         str(HERE / name)],
        capture_output=True,
        text=True,
        timeout=RUN_S,
        cwd=HERE.parents[1],
    )  # fmt: skip
    out = run.stdout + run.stderr
    skipped = re.findall(r"^SKIPPED \[\d+\] [^:]+:\d+: (.*)$", out, re.MULTILINE)
    if run.returncode == 0 and skipped and " passed" not in out:
        pytest.skip(skipped[0])
    assert run.returncode == 0, out[-6000:]
    assert re.search(rf"\b{passed} passed\b", out) and not skipped, out[-3000:]


@pytest.mark.timeout(RUN_S + 60)  # the suite's 300 s per test is less than the whole file
def test_ofi_over_verbs_in_a_process_of_its_own() -> None:
    run_cases("ofi_cases.py", 7)


@pytest.mark.timeout(RUN_S + 60)
def test_ofi_on_two_rails_in_a_process_of_its_own() -> None:
    """Skips in a VM of one rail per side (``run-in-vm.sh`` without ``--rails 2``)."""
    run_cases("ofi_rail_cases.py", 5)
