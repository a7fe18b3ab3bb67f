"""load_weights into GPU memory: new GPU arrays and the caller's GPU arrays, through page-locked
bounce buffers and host-to-device copies. Marked ``gpu`` (``pytest -m gpu`` runs them over the
stand-in driver on machines without a GPU)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from _st_files import random_tensors, write, write_sharded
from rdmaxfer import Buffer, load_weights
from rdmaxfer.errors import InvalidArgumentError
from rdmaxfer.memory import cuda

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not cuda.available(), reason=cuda.unavailable_reason() or "no GPU"),
]


def to_host(arr: Any) -> np.ndarray:
    return arr.get() if hasattr(arr, "get") else arr.copy_to_host()


def test_new_gpu_arrays_of_every_dtype(tmp_path: Path, rng: np.random.Generator) -> None:
    tensors = random_tensors(rng)
    index = write_sharded(tmp_path, tensors, files=2)
    got = load_weights(index, device="cuda:0", gds=False, chunk_bytes=4096, depth=4)
    assert sorted(got) == sorted(tensors)
    for name, arr in tensors.items():
        back = to_host(got[name])
        assert back.dtype == arr.dtype and back.tobytes() == arr.tobytes(), name


def test_into_gpu_arrays_and_shards(tmp_path: Path, rng: np.random.Generator) -> None:
    tensors = random_tensors(rng)
    path = write(tmp_path / "m.safetensors", tensors)
    dest = Buffer.empty((20, 4), np.float32, device="cuda:0")
    got = load_weights(path, into={"w1": dest}, shard={"w1": np.s_[:, 2:6]})
    assert got["w1"] is dest
    np.testing.assert_array_equal(to_host(dest), tensors["w1"][:, 2:6])
    wrong = Buffer.empty((20, 5), np.float32, device="cuda:0")
    with pytest.raises(InvalidArgumentError, match=r"into\['w1'\] has dtype float32 and shape"):
        load_weights(path, into={"w1": wrong})


def test_cli_load_into_the_gpu_verifies(tmp_path: Path, rng: np.random.Generator) -> None:
    import subprocess
    import sys

    native = {k: v for k, v in random_tensors(rng).items() if "bf16" not in k and "f8" not in k}
    path = write(tmp_path / "m.safetensors", native)  # what safetensors.numpy reads back
    done = subprocess.run(
        [sys.executable, "-m", "rdmaxfer", "load", str(path), "--device", "cuda:0", "--verify"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "into cuda:0" in done.stdout and "every tensor identical" in done.stdout


def test_gpudirect_storage_reads_straight_into_gpu_memory(
    tmp_path: Path, rng: np.random.Generator
) -> None:
    """With libcufile present (the stand-in's cuFile here) GPU arrays are read by cuFileRead;
    gds=False reads the same bytes through host bounce buffers."""
    from rdmaxfer import _core
    from rdmaxfer.errors import UnsupportedError

    if _core.gds_unavailable():
        pytest.skip(_core.gds_unavailable())
    tensors = random_tensors(rng)
    path = write(tmp_path / "m.safetensors", tensors)
    try:
        by_gds = load_weights(path, device="cuda:0", gds=True)
    except UnsupportedError as exc:  # a real libcufile that does not take files here
        if "cuFileHandleRegister" not in str(exc):
            raise
        pytest.skip(f"cuFile does not take files in {tmp_path}: {exc}")
    by_host = load_weights(path, device="cuda:0", gds=False)
    assert by_gds.files[0].engine == "cufile" and by_host.files[0].engine == "io_uring"
    dest = Buffer.empty((20, 4), np.float32, device="cuda:0")
    into = load_weights(path, into={"w1": dest}, shard={"w1": np.s_[:, 1:5]}, gds=True)
    assert into.files[0].engine == "cufile"
    np.testing.assert_array_equal(to_host(dest), tensors["w1"][:, 1:5])
    for name, arr in tensors.items():
        for got in (by_gds, by_host):
            assert to_host(got[name]).tobytes() == arr.tobytes(), name


def test_gds_needs_o_direct(tmp_path: Path, rng: np.random.Generator) -> None:
    from rdmaxfer import _core
    from rdmaxfer.errors import UnsupportedError

    if _core.gds_unavailable():
        pytest.skip(_core.gds_unavailable())
    path = write(tmp_path / "m.safetensors", random_tensors(rng))
    with pytest.raises(UnsupportedError, match="GPUDirect Storage needs O_DIRECT"):
        load_weights(path, device="cuda:0", gds=True, direct=False)
    got = load_weights(path, device="cuda:0", direct=False)  # gds=None: through host memory
    assert got.files[0].io == "buffered" and got.files[0].engine == "io_uring"


def test_a_file_cufile_refuses_is_read_through_host_memory(
    tmp_path: Path, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """libcufile without nvidia-fs refused a file on a GPU machine's /tmp at
    cuFileHandleRegister (CU_FILE_HANDLE_NOT_REGISTERED): gds=None reads it through host
    memory, bit-exact, and says why; gds=True raises UnsupportedError naming the error."""
    from rdmaxfer import _core
    from rdmaxfer.errors import UnsupportedError

    if _core.gds_unavailable():
        pytest.skip(_core.gds_unavailable())
    tensors = random_tensors(rng)
    path = write(tmp_path / "m.safetensors", tensors)
    monkeypatch.setenv("RDMAXFER_CUFILE_STANDIN_REFUSE_FILES", "1")
    got = load_weights(path, device="cuda:0")
    assert got.files[0].engine.startswith("io_uring (no GPUDirect Storage: cuFileHandleRegister")
    assert "CU_FILE_HANDLE_NOT_REGISTERED" in got.files[0].engine
    for name, arr in tensors.items():
        assert to_host(got[name]).tobytes() == arr.tobytes(), name
    with pytest.raises(UnsupportedError, match=r"gds=True: cuFileHandleRegister .*5027 "
                       r"\(CU_FILE_HANDLE_NOT_REGISTERED\); pass gds=None"):  # fmt: skip
        load_weights(path, device="cuda:0", gds=True)
