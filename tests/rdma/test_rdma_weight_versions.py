"""Versions immutable to pulls over verbs (the host twin: tests/test_weights_immutable.py): a
server on rxe1 whose publisher writes into its own arrays, or rewrites its file on disk, while
pulls from rxe0 run; every pull's bytes are those of the version it reports."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from _immutable import Digests, digests, overwrite, race, torn
from rdmaxfer import Engine
from rdmaxfer.weights import WeightServer, read_safetensors_header

from .rdma_helpers import addrs, devices

pytestmark = pytest.mark.rdma

SECRET = "rxe-weight-versions"


def tensors(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """About 600 KB (the guest is slow) in two tensors."""
    return {
        "a": rng.standard_normal((128, 1024)).astype(np.float32),
        "b": rng.integers(0, 2**62, size=1 << 13, dtype=np.int64),
    }


def serve(source: Mapping[str, np.ndarray] | Path) -> tuple[Engine, WeightServer, str]:
    engine = Engine("rdma", rdma_device=devices()[1], secret=SECRET)
    server = WeightServer(source, host=addrs()[1], engine=engine, timeout=120)
    server.start()
    return engine, server, f"{addrs()[1]}:{server.port}"


def client() -> Engine:
    return Engine("rdma", rdma_device=devices()[0], secret=SECRET)


def test_pulls_get_their_version_while_the_publisher_writes_its_arrays() -> None:
    rng = np.random.default_rng(0x5EED)
    sources = tensors(rng)
    expected: dict[int, Digests] = {1: digests(sources)}
    engine, server, address = serve(sources)
    with engine, server:

        def publish_step(step: int) -> None:
            overwrite(sources, rng)
            if step % 2 == 0:
                expected[server.refresh(timeout=120)] = digests(sources)

        results = race(address, client, publish_step, pullers=2, pulls=4)
    assert not torn(results, expected), torn(results, expected)


def test_a_file_rewritten_on_disk_after_publishing_is_not_served(tmp_path: Path) -> None:
    rng = np.random.default_rng(0xF11E)
    path = tmp_path / "model.safetensors"
    save_file(tensors(rng), str(path))
    expected = {1: digests(load_file(str(path)))}
    _, _, data_offset = read_safetensors_header(path)
    size = path.stat().st_size - data_offset
    engine, server, address = serve(path)
    with engine, server:

        def publish_step(step: int) -> None:
            with path.open("r+b") as f:
                f.seek(data_offset)
                f.write(rng.integers(0, 256, size=size, dtype=np.uint8).tobytes())

        results = race(address, client, publish_step, pullers=2, pulls=4)
    assert not torn(results, expected), torn(results, expected)
