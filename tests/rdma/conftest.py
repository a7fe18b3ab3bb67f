"""Fixtures for the verbs-transport tests: two engines on the two soft-RoCE devices of the test
VM (tests/rxe/run-in-vm.sh: rxe0 on 10.77.0.1, rxe1 on 10.77.0.2), connected over the bootstrap.

Every test here is marked ``rdma`` and skips when ``_core.available_transports()["rdma"]`` is
non-empty (no libibverbs or no active device), except the ofi cases (ofi_cases.py), which skip
when their libfabric provider cannot open its domain: on EFA there is no verbs RC device.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np
import pytest

from .rdma_helpers import SKIP_REASON, RdmaPair, connect_pair, rdma_reason


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = os.path.dirname(__file__)
    reason = rdma_reason()
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(pytest.mark.rdma)
            if reason and os.path.basename(str(item.fspath)) != "ofi_cases.py":
                item.add_marker(pytest.mark.skip(reason=f"{SKIP_REASON}: {reason}"))


@pytest.fixture
def rdma_pair() -> Iterator[RdmaPair]:
    pair = connect_pair()
    try:
        yield pair
    finally:
        pair.client.close()
        pair.server.close()


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(0x5EED)
