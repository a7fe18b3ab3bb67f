"""Weights straight into arrays: serve/pull over loopback, checked against safetensors."""

from __future__ import annotations

import hashlib
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from rdmaxfer import Engine, InvalidArgumentError, pull_weights, serve_weights
from rdmaxfer.tools.cli_weights import default_model_file, start_serve_process, verify_against_file
from rdmaxfer.weights import WeightServer, save_safetensors_copy


def model_file() -> Path:
    try:
        return default_model_file()
    except FileNotFoundError as exc:  # a required test input, not an optional one
        pytest.fail(f"{exc} (the README's test command installs it)")


def random_tensors(rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {
        "f32": rng.standard_normal((17, 33)).astype(np.float32),
        "bf16": rng.standard_normal((5, 7, 3)).astype(ml_dtypes.bfloat16),
        "f16": rng.standard_normal(1001).astype(np.float16),
        "i64": rng.integers(-(2**62), 2**62, (4, 4), dtype=np.int64),
        "u8": rng.integers(0, 256, 4095, dtype=np.uint8),
        "i8": rng.integers(-128, 128, 3, dtype=np.int8),
        "bool": rng.integers(0, 2, 9).astype(np.bool_),
        "scalar": np.array(rng.standard_normal(), dtype=np.float64),
    }


def test_real_model_pulled_between_processes_is_bit_exact(tmp_path: Path) -> None:
    path = model_file()
    server, line = start_serve_process(path, "tcp")
    try:
        assert "serving 104 tensors" in line, line
        address = line.rsplit(" ", 1)[-1].strip()
        arrays = pull_weights(address, transport="tcp", timeout=60, with_header=True)
        assert verify_against_file(arrays, path) == []
        reference = load_file(str(path))
        assert set(reference) == set(arrays) - {"__header__"}
        for name, ref in reference.items():
            assert arrays[name].dtype == ref.dtype and arrays[name].shape == ref.shape
            np.testing.assert_array_equal(arrays[name], ref)
        save_safetensors_copy(arrays, tmp_path / "copy.safetensors")
        digest = hashlib.sha256((tmp_path / "copy.safetensors").read_bytes()).hexdigest()
        assert digest == hashlib.sha256(path.read_bytes()).hexdigest()
        assert server.wait(timeout=30) == 0
    finally:
        server.kill()


def test_dict_of_arrays_all_dtypes(rng: np.random.Generator) -> None:
    tensors = random_tensors(rng)
    with serve_weights(tensors, transport="tcp") as server:
        got = pull_weights(f"127.0.0.1:{server.port}", transport="tcp", timeout=30)
    assert set(got) == set(tensors)
    for name, ref in tensors.items():
        assert got[name].dtype == ref.dtype, name
        assert got[name].shape == ref.shape, name
        assert got[name].tobytes() == ref.tobytes(), name


def test_safetensors_file_with_bf16_and_subset(tmp_path: Path, rng: np.random.Generator) -> None:
    tensors = random_tensors(rng)
    path = tmp_path / "w.safetensors"
    save_file(tensors, str(path))
    seen: list[tuple[int, int]] = []
    with Engine("tcp") as engine, WeightServer(path, transport="tcp") as server:
        server.start()
        address = f"127.0.0.1:{server.port}"
        got = pull_weights(address, engine=engine, progress=lambda d, t: seen.append((d, t)))
        assert verify_against_file(got, path) == []
        assert seen[-1][0] == seen[-1][1] == sum(t.nbytes for t in tensors.values())
        sub = pull_weights(address, engine=engine, names=["bf16", "u8"])
        assert sorted(sub) == ["bf16", "u8"]
        assert sub["bf16"].dtype == ml_dtypes.bfloat16
        assert sub["bf16"].tobytes() == tensors["bf16"].tobytes()
        with pytest.raises(InvalidArgumentError, match=r"\['nope'\] are not published"):
            pull_weights(address, engine=engine, names=["nope"])
        # The engine is still usable after the refused pull.
        again = pull_weights(address, engine=engine, names=["f32"])
        np.testing.assert_array_equal(again["f32"], tensors["f32"])


def test_serve_rejects_bad_input(tmp_path: Path) -> None:
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}      ")
    with pytest.raises(InvalidArgumentError, match="not a readable safetensors file"):
        WeightServer(bad, transport="tcp")
    with pytest.raises(InvalidArgumentError, match=r"not contiguous|strides"):
        WeightServer({"t": np.arange(20.0)[::2]}, transport="tcp")
    with pytest.raises(InvalidArgumentError, match="no safetensors name"):
        WeightServer({"c": np.zeros(3, dtype=np.complex64) + 1j}, transport="tcp")
