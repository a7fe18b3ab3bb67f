"""torch tensors of dtypes NumPy lacks (bfloat16, float8) over the verbs transport: sent,
received into, registered as WRITE targets and READ sources (the TCP twin: tests/
test_dlpack.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from _dlpack_cases import one_sided, send_recv_both_ways
from rdmaxfer import Endpoint, Engine

from .rdma_helpers import WAIT_S, addrs, devices


@pytest.fixture
def engines() -> Iterator[tuple[Engine, Endpoint, Endpoint]]:
    with Engine("rdma", rdma_device=devices()[1]) as server:
        with Engine("rdma", rdma_device=devices()[0]) as client:
            port = server.listen(addrs()[1], 0)
            a = client.connect(addrs()[1], port, timeout=WAIT_S)
            b = server.accept(timeout=WAIT_S)
            yield server, a, b


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn], ids=str)
def test_send_and_recv_torch_tensors_over_verbs(
    engines: tuple[Engine, Endpoint, Endpoint], dtype: torch.dtype
) -> None:
    _server, a, b = engines
    send_recv_both_ways(a, b, dtype, seed=21)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e5m2], ids=str)
def test_register_write_read_torch_tensors_over_verbs(
    engines: tuple[Engine, Endpoint, Endpoint], dtype: torch.dtype
) -> None:
    server, a, _b = engines
    one_sided(server, a, dtype, seed=22)
