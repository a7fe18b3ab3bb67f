"""Every published version is immutable to pulls: whatever the publisher writes into its own
arrays (or into the file on disk) after publishing, and whichever way a version was published
(a dict of arrays, a file, update(), refresh(), the first version included), a pull returns
exactly the bytes of the version it reports (checksums of random data per version)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from _immutable import Digests, digests, overwrite, race, torn
from rdmaxfer import Buffer, Engine, InvalidArgumentError
from rdmaxfer.memory import cuda
from rdmaxfer.weights import WeightServer, read_safetensors_header
from rdmaxfer.weights import snapshot as snapshot_module


def random_tensors(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """About 3 MB in three tensors of three dtypes."""
    return {
        "a": rng.standard_normal((256, 1024)).astype(np.float32),
        "b": rng.integers(-(2**40), 2**40, size=1 << 17, dtype=np.int64),
        "c": rng.integers(0, 256, size=(100, 1001), dtype=np.uint8),
    }


def test_pulls_get_their_version_while_the_publisher_writes_its_arrays(
    transport: str, rng: np.random.Generator
) -> None:
    sources = random_tensors(rng)
    expected: dict[int, Digests] = {1: digests(sources)}
    with WeightServer(sources, transport=transport, timeout=60) as server:
        server.start()

        def publish_step(step: int) -> None:
            overwrite(sources, rng)  # the publisher's own arrays, while pulls READ
            if step % 3 == 0:
                expected[server.refresh(timeout=60)] = digests(sources)
            elif step % 3 == 1 and step > 1:
                new = {"b": rng.integers(0, 2**62, size=1 << 17, dtype=np.int64)}
                version = server.update(new, timeout=60)
                expected[version] = {**expected[version - 1], **digests(new)}

        results = race(f"127.0.0.1:{server.port}", lambda: Engine(transport), publish_step)
    assert not torn(results, expected), torn(results, expected)


def test_a_file_rewritten_on_disk_after_publishing_is_not_served(
    transport: str, rng: np.random.Generator, tmp_path: Path
) -> None:
    path = tmp_path / "model.safetensors"
    save_file(random_tensors(rng), str(path))
    expected = {1: digests(load_file(str(path)))}
    _, _, data_offset = read_safetensors_header(path)
    size = path.stat().st_size - data_offset
    with WeightServer(path, transport=transport, timeout=60) as server:
        server.start()

        def publish_step(step: int) -> None:  # rewrites the data in place (same inode)
            with path.open("r+b") as f:
                f.seek(data_offset)
                f.write(rng.integers(0, 256, size=size, dtype=np.uint8).tobytes())

        results = race(f"127.0.0.1:{server.port}", lambda: Engine(transport), publish_step)
    assert {version for version, _ in results} == {1}
    assert not torn(results, expected), torn(results, expected)


def test_a_file_that_keeps_changing_while_it_is_read_is_refused(
    rng: np.random.Generator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "model.safetensors"
    save_file(random_tensors(rng), str(path))
    read_into = snapshot_module._read_into

    def read_while_written(*args: Any) -> int:
        got = read_into(*args)
        with path.open("r+b") as f:  # a writer that is not done yet
            f.seek(-8, 2)
            f.write(rng.integers(0, 256, size=8, dtype=np.uint8).tobytes())
        later = path.stat().st_mtime_ns + 10**9  # as if a clock tick passed
        os.utime(path, ns=(later, later))
        return got

    monkeypatch.setattr(snapshot_module, "_read_into", read_while_written)
    with pytest.raises(
        InvalidArgumentError, match=r"changed on disk while it was read \(3 tries\)"
    ):
        WeightServer(path, transport="tcp")


@pytest.mark.gpu
def test_pulls_get_their_version_while_the_publisher_writes_its_gpu_tensors(
    transport: str, rng: np.random.Generator
) -> None:
    """GPU tensors: version 1 is served from the server's own copy (on the GPU where the
    engine reaches peers by GPUDirect/CUDA IPC, else in host memory), later ones from host
    memory; the trainer rewriting its tensors in place changes none of them."""
    if not cuda.available():
        pytest.skip(cuda.unavailable_reason() or "no GPU")
    host = random_tensors(rng)
    sources = {name: Buffer.empty(a.shape, a.dtype, device="cuda:0") for name, a in host.items()}
    for name, a in host.items():
        cuda.copy_from_host(sources[name].device_array(), a)
    expected: dict[int, Digests] = {1: digests(host)}
    with WeightServer(sources, transport=transport, timeout=60) as server:
        server.start()

        def publish_step(step: int) -> None:
            overwrite(host, rng)
            for name, a in host.items():  # the trainer's in-place step, while pulls READ
                cuda.copy_from_host(sources[name].device_array(), a)
            if step % 2 == 0:
                expected[server.refresh(timeout=60)] = digests(host)

        results = race(f"127.0.0.1:{server.port}", lambda: Engine(transport), publish_step)
    assert not torn(results, expected), torn(results, expected)
