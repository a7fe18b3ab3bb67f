"""The main job over verbs: the MiniLM file served on rxe1, pulled from rxe0, bit-exact against
safetensors; through the CLI (``rdmaxfer serve``) and the Python API (``serve_weights`` of a
path and of a dict of arrays). Also: read-only memory registers on verbs (no LOCAL_WRITE), and
receiving into it fails before anything is posted."""

from __future__ import annotations

import mmap
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import load_file

import rdmaxfer
from rdmaxfer import Engine, InvalidArgumentError, RegistrationError, pull_weights, serve_weights
from rdmaxfer.tools.cli import default_model_file, verify_against_file

from .rdma_helpers import WAIT_S, addrs, devices, random_bytes

pytestmark = pytest.mark.rdma

PACKAGE_ROOT = os.path.dirname(os.path.dirname(rdmaxfer.__file__))
SECRET = "rxe-weights-test"


def kernel_at_least(major: int, minor: int) -> bool:
    release = os.uname().release.split("-")[0].split(".")
    return (int(release[0]), int(release[1])) >= (major, minor)


def model_file() -> Path:
    try:
        return default_model_file()
    except FileNotFoundError as exc:  # a required test input, not an optional one
        pytest.fail(f"{exc} (the README's test command installs it)")


@pytest.fixture
def client() -> Iterator[Engine]:
    with Engine("rdma", rdma_device=devices()[0], secret=SECRET) as engine:
        yield engine


def assert_same_as_file(arrays: dict[str, np.ndarray], path: Path) -> None:
    assert verify_against_file(arrays, path) == []
    reference = load_file(str(path))
    assert set(reference) == set(arrays) - {"__header__"}
    for name, ref in reference.items():
        assert arrays[name].dtype == ref.dtype and arrays[name].shape == ref.shape, name
        np.testing.assert_array_equal(arrays[name], ref)


def test_minilm_served_by_the_cli_pulled_over_verbs(client: Engine) -> None:
    path = model_file()
    env = {
        **os.environ,
        "PYTHONPATH": PACKAGE_ROOT,
        "PYTHONUNBUFFERED": "1",
        "RDMAXFER_RDMA_DEVICE": devices()[1],
        "RDMAXFER_SECRET": SECRET,
    }
    command = [sys.executable, "-m", "rdmaxfer", "serve", str(path), "--transport", "rdma"]
    command += ["--host", addrs()[1], "--port", "0", "--max-clients", "1"]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        assert "serving 104 tensors" in line, f"serve did not start: {line!r}"
        address = line.rsplit(" ", 1)[-1].strip()
        arrays = pull_weights(address, engine=client, timeout=WAIT_S * 5, with_header=True)
        assert_same_as_file(arrays, path)
        assert server.wait(timeout=WAIT_S) == 0
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(10)


def test_minilm_served_by_serve_weights_of_a_path(client: Engine) -> None:
    path = model_file()
    with (
        Engine("rdma", rdma_device=devices()[1], secret=SECRET) as engine,
        serve_weights(path, host=addrs()[1], engine=engine) as server,
    ):
        region = server._regions[0]
        assert region.readonly and not region.core.local_write  # a source only
        arrays = pull_weights(f"{addrs()[1]}:{server.port}", engine=client, timeout=WAIT_S * 5)
        assert_same_as_file(arrays, path)


def test_dict_of_arrays_served_over_verbs(client: Engine, rng: np.random.Generator) -> None:
    frozen = rng.standard_normal((64, 33)).astype(np.float32)
    frozen.flags.writeable = False
    tensors = {
        "frozen_f32": frozen,
        "bf16": rng.standard_normal((5, 7, 3)).astype(ml_dtypes.bfloat16),
        "i64": rng.integers(-(2**62), 2**62, (4, 4), dtype=np.int64),
        "u8_big": random_bytes(rng, 3 << 20),
    }
    with (
        Engine("rdma", rdma_device=devices()[1], secret=SECRET) as engine,
        serve_weights(tensors, host=addrs()[1], engine=engine) as server,
    ):
        got = pull_weights(f"{addrs()[1]}:{server.port}", engine=client, timeout=WAIT_S)
    assert set(got) == set(tensors)
    for name, ref in tensors.items():
        assert got[name].dtype == ref.dtype and got[name].shape == ref.shape
        np.testing.assert_array_equal(got[name].view(np.uint8), ref.view(np.uint8))


def test_read_only_memory_is_served_and_never_written(
    client: Engine, rng: np.random.Generator, tmp_path: Path
) -> None:
    data = random_bytes(rng, 3 * 4096 + 123)
    file = tmp_path / "ro.bin"
    file.write_bytes(data.tobytes())
    with file.open("rb") as f:
        private = mmap.mmap(f.fileno(), 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ)
        shared = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    frozen = data.copy()
    frozen.flags.writeable = False
    sources: dict[str, object] = {
        "mmap MAP_PRIVATE PROT_READ": np.frombuffer(private, np.uint8),
        "frozen": frozen,
        "bytes": data.tobytes(),
    }
    if kernel_at_least(6, 2):
        sources["mmap ACCESS_READ"] = np.frombuffer(shared, np.uint8)
    with Engine("rdma", rdma_device=devices()[1], secret=SECRET) as server:
        port = server.listen(addrs()[1], 0)
        ep = client.connect(addrs()[1], port, timeout=WAIT_S)
        peer = server.accept(timeout=WAIT_S)
        for name, source in sources.items():
            region = server.register(source, "r")
            assert not region.core.local_write, name
            back = np.zeros(data.size, np.uint8)
            ep.read(back, region.descriptor(), timeout=WAIT_S)
            np.testing.assert_array_equal(back, data, err_msg=name)
            # A receive into it is refused before anything is posted; the endpoint stays up.
            with pytest.raises(InvalidArgumentError, match="without local write access"):
                peer.core.post_read(region.core, 0, region.descriptor(), 0, 16)
            assert not peer.closed
            region.close()
        # Receiving into a read-only array is refused on the Python side too.
        with pytest.raises(InvalidArgumentError, match="read-only"):
            peer.post_recv(frozen)
        if not kernel_at_least(6, 2):
            # Kernels before 6.2 pin every MR for writing (FOLL_FORCE): a read-only *shared*
            # file mapping cannot be registered at all there; the error says what to do.
            with pytest.raises(RegistrationError, match=r"errno 14.*MAP_PRIVATE.*6\.2"):
                server.register(np.frombuffer(shared, np.uint8), "r")
