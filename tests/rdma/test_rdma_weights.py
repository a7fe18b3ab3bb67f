"""The main job over verbs: the MiniLM file served on rxe1, pulled from rxe0, bit-exact against
safetensors; through the CLI (``rdmaxfer serve``) and the Python API (``serve_weights`` of a
path and of a dict of arrays). Also: read-only memory registers on verbs (no LOCAL_WRITE), and
receiving into it fails before anything is posted. Weight sync: shards of the MiniLM file
landing in the caller's arrays, versions that never mix while updates run, ``min_version``,
and the push path."""

from __future__ import annotations

import mmap
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import xxhash
from safetensors import safe_open

import rdmaxfer
from rdmaxfer import (
    Engine,
    InvalidArgumentError,
    RegistrationError,
    TransferTimeoutError,
    pull_weights,
    serve_weights,
)
from rdmaxfer.tools.cli_weights import default_model_file, verify_against_file
from rdmaxfer.weights import read_safetensors_header

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
    """Every tensor of the file and no other (but the header), each of the file's dtype and
    shape and bit-exact: the file read through ``safetensors``, once (under TCG that read
    takes longer than the pull)."""
    assert verify_against_file(arrays, path) == []


def pulled_bit_exact(arrays: dict[str, np.ndarray], path: Path, engine: Engine) -> str:
    """ "" when `arrays` are the file's tensors bit-exact (verify_against_file); else what
    differs, for the failure's report: each tensor's byte range in the file and whether it
    came back all zeros, then the engine's description (its endpoints' rails, with the bytes
    each carried and why one failed)."""
    bad = verify_against_file(arrays, path)
    if not bad:
        return ""
    _, header, data_offset = read_safetensors_header(path)
    lines = []
    for name in bad:
        begin, end = header[name]["data_offsets"] if name in header else (0, 0)
        got = arrays.get(name)
        zeros = got is not None and not np.any(got.reshape(-1).view(np.uint8))
        where = f"file bytes {data_offset + begin}-{data_offset + end}"
        at = f", array at {got.ctypes.data}" if got is not None else ""
        lines.append(f"{name}: {where}{at}{', all zeros' if zeros else ''}")
    return "\n".join([f"{len(bad)} tensors differ:", *lines, engine.describe()])


def digests(arrays: dict[str, np.ndarray]) -> dict[str, int]:
    return {name: xxhash.xxh3_64_intdigest(memoryview(a).cast("B")) for name, a in arrays.items()}


def file_tensors(path: Path, names: Iterable[str]) -> dict[str, np.ndarray]:
    """The tensors `names` of the file, read through ``safetensors``."""
    with safe_open(str(path), framework="numpy") as f:
        return {name: f.get_tensor(name) for name in names}


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
        # version 1 is the server's own copy of the file, registered as a source only
        assert region.access == "r" and not region.core.local_write
        # one layer's tensors: the whole file is pulled from `rdmaxfer serve` above, which
        # serves the path through the same WeightServer
        layer = pull_weights(
            f"{addrs()[1]}:{server.port}", engine=client, names=lambda n: ".layer.5." in n
        )
        assert len(layer) == 16
        for name, ref in file_tensors(path, layer).items():
            assert layer[name].dtype == ref.dtype and layer[name].shape == ref.shape, name
            np.testing.assert_array_equal(layer[name], ref, err_msg=name)


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


# -- weight sync over verbs: shards, versions, push -------------------------------------------

ROWS = "encoder.layer.0.intermediate.dense.weight"  # [1536, 384] F32
SQUARE = "encoder.layer.0.attention.self.key.weight"  # [384, 384] F32


@pytest.fixture
def served_engine() -> Iterator[Engine]:
    with Engine("rdma", rdma_device=devices()[1], secret=SECRET) as engine:
        yield engine


def test_minilm_shards_land_in_the_callers_arrays_over_verbs(
    client: Engine, served_engine: Engine
) -> None:
    path = model_file()
    shards = {ROWS: np.s_[256:512], SQUARE: np.s_[:, 96:192]}
    into = {
        ROWS: np.full((256, 384), 12345, np.float32),
        SQUARE: np.full((384, 96), 12345, np.float32),
    }
    with serve_weights(path, host=addrs()[1], engine=served_engine) as server:
        address = f"{addrs()[1]}:{server.port}"
        got = pull_weights(address, engine=client, into=into, shard=shards, timeout=WAIT_S)
        assert got.version == 1 and got[ROWS] is into[ROWS]
        ref = file_tensors(path, shards)
        for name, index in shards.items():
            np.testing.assert_array_equal(into[name], ref[name][index], err_msg=name)
        # A row range is one READ; the 384 rows of a column slice go as gathered READs: 8
        # groups of 48 chained WRs (the fewest groups of at most 64, rounded up to the 4 in
        # flight).
        assert client.stats()["read.ops"] == 1 + 8
        layer1 = pull_weights(address, engine=client, names=lambda n: ".layer.1." in n)
        assert len(layer1) == 16
        ref = file_tensors(path, layer1)
        for name, arr in layer1.items():
            np.testing.assert_array_equal(arr, ref[name], err_msg=name)
        bad = {ROWS: np.full((256, 385), 7, np.float32)}
        with pytest.raises(InvalidArgumentError, match=rf"into\['{ROWS}'\] has dtype float32"):
            pull_weights(address, engine=client, into=bad, shard={ROWS: shards[ROWS]})
        assert (bad[ROWS] == 7).all()


def test_versions_never_mix_over_verbs(client: Engine, served_engine: Engine) -> None:
    shapes = {"a": (128, 128), "i": (1000,)}

    def versioned(version: int) -> dict[str, np.ndarray]:
        return {
            "a": np.full(shapes["a"], version, np.float32),
            "i": np.full(shapes["i"], version, np.int64),
        }

    stop = threading.Event()
    errors: list[BaseException] = []
    with serve_weights(versioned(1), host=addrs()[1], engine=served_engine) as server:
        address = f"{addrs()[1]}:{server.port}"

        def updater() -> None:
            try:
                while not stop.is_set():
                    server.update(versioned(server.version + 1), timeout=WAIT_S)
            except BaseException as exc:  # reported below
                errors.append(exc)

        thread = threading.Thread(target=updater)
        thread.start()
        seen = set()
        try:
            deadline = time.monotonic() + WAIT_S
            while len(seen) < 3 and time.monotonic() < deadline:
                shard = {"a": np.s_[:, 10:20]} if len(seen) % 2 else None
                got = pull_weights(address, engine=client, shard=shard, timeout=WAIT_S)
                for name, arr in got.items():
                    assert np.unique(arr).tolist() == [got.version], (name, got.version)
                seen.add(got.version)
        finally:
            stop.set()
            thread.join(WAIT_S)
        assert not errors and len(seen) >= 3, (errors, seen)
        version = server.version
        timer = threading.Timer(0.5, server.update, args=(versioned(version + 1),))
        timer.start()
        got = pull_weights(address, engine=client, min_version=version + 1, timeout=WAIT_S)
        timer.join()
        assert got.version == version + 1 and (got["i"] == version + 1).all()
        with pytest.raises(TransferTimeoutError, match=r"\(min_version\) was not published"):
            pull_weights(address, engine=client, min_version=version + 9, timeout=1.0)


def test_push_over_verbs(client: Engine, served_engine: Engine, rng: np.random.Generator) -> None:
    dest = {"w": np.zeros((300, 384), np.float32), "b": np.zeros(384, ml_dtypes.bfloat16)}
    with rdmaxfer.receive_weights(dest, addrs()[1], 0, engine=served_engine) as receiver:
        address = f"{addrs()[1]}:{receiver.port}"
        for version in (1, 2):
            weights = {
                "w": rng.standard_normal((300, 384)).astype(np.float32),
                "b": rng.standard_normal(384).astype(ml_dtypes.bfloat16),
            }
            rdmaxfer.push_weights(
                address, weights, version=version, engine=client, streams=3, timeout=WAIT_S
            )
            assert receiver.wait(timeout=WAIT_S) == version
            for name, arr in weights.items():
                np.testing.assert_array_equal(dest[name].view(np.uint8), arr.view(np.uint8))
        with pytest.raises(InvalidArgumentError, match="pushed tensor 'b' is float32"):
            rdmaxfer.push_weights(
                address, {**weights, "b": np.zeros(384, np.float32)}, version=3, engine=client
            )
        assert receiver.version == 2
