"""Weight sync with GPU arrays over TCP: shards of the MiniLM file landing in the caller's GPU
arrays, updates from GPU tensors, and pushes from and into GPU memory. Marked ``gpu``
(``pytest -m gpu`` runs them over the stand-in driver on machines without a GPU)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from safetensors.numpy import load_file

from rdmaxfer import Buffer, InvalidArgumentError, pull_weights, push_weights, receive_weights
from rdmaxfer.memory import cuda
from rdmaxfer.tools.cli_weights import default_model_file
from rdmaxfer.weights import WeightServer

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not cuda.available(), reason=cuda.unavailable_reason() or "no GPU"),
]

ROWS = "encoder.layer.0.intermediate.dense.weight"  # [1536, 384] F32
SQUARE = "encoder.layer.0.attention.self.key.weight"  # [384, 384] F32


def on_gpu(host: np.ndarray) -> Buffer:
    buf = Buffer.empty(host.shape, host.dtype, device="cuda:0")
    cuda.copy_from_host(buf.device_array(), np.ascontiguousarray(host))
    return buf


def to_host(arr: Any) -> np.ndarray:
    return arr.get() if hasattr(arr, "get") else arr.copy_to_host()


def test_shards_land_in_the_callers_gpu_arrays() -> None:
    try:
        path = default_model_file()
    except FileNotFoundError as e:  # a lent GPU machine has no network to install it
        pytest.skip(f"needs the MiniLM file: {e}")
    ref = load_file(str(path))
    into = {
        ROWS: on_gpu(np.full((256, 384), 7.0, np.float32)),
        SQUARE: on_gpu(np.full((384, 96), 7.0, np.float32)),
    }
    shards = {ROWS: np.s_[256:512], SQUARE: np.s_[:, 96:192]}
    with WeightServer(path, transport="tcp") as server:
        server.start()
        address = f"127.0.0.1:{server.port}"
        got = pull_weights(address, transport="tcp", into=into, shard=shards, timeout=60)
        assert got[ROWS] is into[ROWS] and got.version == 1
        for name, index in shards.items():
            np.testing.assert_array_equal(into[name].copy_to_host(), ref[name][index])
        with pytest.raises(InvalidArgumentError, match=rf"into\['{ROWS}'\] has dtype float32"):
            pull_weights(address, transport="tcp", into={ROWS: into[ROWS]})  # needs [1536, 384]
        new = pull_weights(address, transport="tcp", shard={ROWS: np.s_[:, :8]}, device="cuda:0")
        np.testing.assert_array_equal(to_host(new[ROWS]), ref[ROWS][:, :8])


def test_updates_from_gpu_tensors_and_pushes_between_gpu_arrays(rng: np.random.Generator) -> None:
    w = rng.standard_normal((64, 33)).astype(np.float32)
    with WeightServer({"w": on_gpu(w)}, transport="tcp") as server:
        server.start()
        w2 = rng.standard_normal((64, 33)).astype(np.float32)
        assert server.update({"w": on_gpu(w2)}) == 2
        got = pull_weights(f"127.0.0.1:{server.port}", transport="tcp")
        assert got.version == 2
        np.testing.assert_array_equal(got["w"], w2)
    dest = {"w": on_gpu(np.zeros((64, 33), np.float32)), "b": np.zeros(5, np.float16)}
    b = rng.standard_normal(5).astype(np.float16)
    with receive_weights(dest, "127.0.0.1", 0, transport="tcp", timeout=30) as receiver:
        address = f"127.0.0.1:{receiver.port}"
        push_weights(address, {"w": on_gpu(w), "b": b}, version=7, transport="tcp", timeout=30)
        assert receiver.wait(timeout=10) == 7
    np.testing.assert_array_equal(dest["w"].copy_to_host(), w)
    np.testing.assert_array_equal(dest["b"], b)


def test_auto_engines_serve_gpu_tensors_to_tcp_peers(
    rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An automatic engine over TCP shares registered GPU memory by CUDA IPC with same-host shm
    peers only: a server or receiver of GPU tensors on one goes through host mirrors, so a
    peer that connects over TCP still gets and gives the exact bytes."""
    monkeypatch.delenv("RDMAXFER_TRANSPORT", raising=False)
    w = rng.standard_normal((64, 33)).astype(np.float32)
    with WeightServer({"w": on_gpu(w)}, transport="auto") as server:
        server.start()
        got = pull_weights(f"127.0.0.1:{server.port}", transport="tcp", timeout=30)
        np.testing.assert_array_equal(got["w"], w)
    dest = {"w": on_gpu(np.zeros((64, 33), np.float32))}
    with receive_weights(dest, "127.0.0.1", 0, transport="auto", timeout=30) as receiver:
        address = f"127.0.0.1:{receiver.port}"
        push_weights(address, {"w": w}, version=3, transport="tcp", timeout=30)
        assert receiver.wait(timeout=10) == 3
    np.testing.assert_array_equal(dest["w"].copy_to_host(), w)
