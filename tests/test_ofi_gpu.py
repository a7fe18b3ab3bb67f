"""GPU memory over transport="ofi" (libfabric's tcp;ofi_rxm provider on loopback) through the
stand-in CUDA driver (``pytest -m gpu``). The transport asks the provider for FI_HMEM when CUDA
loads; tcp;ofi_rxm grants none here (libfabric finds no CUDA runtime of its own), so GPU memory
is staged through host memory, and registering it for remote access is refused with the reason.
Registration with FI_HMEM_CUDA itself needs a provider with FI_HMEM and a real GPU
(bench/efa_check.sh on an EFA machine)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from _common import OFI_ENV
from _gpu_data import crc, device_random
from rdmaxfer import Buffer, Endpoint, Engine, _core
from rdmaxfer.errors import UnsupportedError
from rdmaxfer.memory import cuda

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not cuda.available(), reason=cuda.unavailable_reason() or "no GPU"),
]


@pytest.fixture
def ofi_pair(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Engine, Endpoint]]:
    """(the server engine, the client's endpoint to it) over tcp;ofi_rxm on loopback."""
    for key, value in OFI_ENV.items():
        monkeypatch.setenv(key, value)
    why = _core.available_transports().get("ofi", "unknown transport")
    if why:
        pytest.skip(f"transport 'ofi' is unavailable here: {why}")
    with Engine("ofi") as server, Engine("ofi") as client:
        port = server.listen("127.0.0.1", 0)
        ep = client.connect("127.0.0.1", port, timeout=30)
        server.accept(timeout=30)
        yield server, ep


def test_gpu_memory_is_staged_without_fi_hmem(
    ofi_pair: tuple[Engine, Endpoint], rng: np.random.Generator
) -> None:
    server, ep = ofi_pair
    assert ep.info["hmem"] == 0 and "FI_HMEM" not in server.describe()
    size = (3 << 20) + 77
    src, host = device_random(rng, size, np.uint8)
    remote = np.zeros(size, np.uint8)
    region = server.register(remote, "rw")
    ep.write(src, region.descriptor(), timeout=60)
    assert crc(remote) == crc(host)
    back = Buffer.empty(size, np.uint8, device="cuda:0")
    ep.read(back, region.descriptor(), timeout=60)
    assert crc(back.copy_to_host()) == crc(host)


def test_registering_gpu_memory_without_fi_hmem_says_why(
    ofi_pair: tuple[Engine, Endpoint], rng: np.random.Generator
) -> None:
    server, _ = ofi_pair
    src, _ = device_random(rng, 1 << 20, np.uint8)
    with pytest.raises(UnsupportedError, match="provider tcp;ofi_rxm grants no FI_HMEM") as raised:
        server.register(src, "rw")
    assert "staged through pinned host buffers" in str(raised.value)
    assert server.gpu_preflight(0).method == "staging"
