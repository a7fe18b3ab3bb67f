"""save_weights: a safetensors file written by O_DIRECT writes and fsync'ed, readable by the
safetensors library and load_weights (every dtype); a full disk leaves the old file intact."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file

from _st_files import random_tensors
from rdmaxfer import load_weights, save_weights
from rdmaxfer.errors import InvalidArgumentError, TransportError


def test_readable_by_the_safetensors_library(tmp_path: Path, rng: np.random.Generator) -> None:
    tensors = {f"x{i}": rng.standard_normal((33, 7 + i)).astype(np.float32) for i in range(40)}
    tensors["ids"] = rng.integers(0, 2**31, size=1000, dtype=np.int64)
    path = tmp_path / "out.safetensors"
    saved = save_weights(path, tensors, metadata={"step": "7"}, chunk_bytes=8192)
    assert saved.nbytes == path.stat().st_size and saved.io in ("direct", "buffered")
    ref = load_file(str(path))
    assert sorted(ref) == sorted(tensors)
    assert all(np.array_equal(ref[k], v) for k, v in tensors.items())
    with safe_open(str(path), framework="numpy") as f:
        assert f.metadata() == {"step": "7"}
    assert [p.name for p in tmp_path.iterdir()] == ["out.safetensors"]  # no temporary left


def test_every_dtype_round_trips(tmp_path: Path, rng: np.random.Generator) -> None:
    tensors = random_tensors(rng)
    path = tmp_path / "all.safetensors"
    save_weights(path, tensors, direct=False)
    got = load_weights(path)
    for name, arr in tensors.items():
        assert got[name].dtype == arr.dtype and got[name].tobytes() == arr.tobytes(), name


def test_a_full_disk_leaves_the_old_file_intact(
    tmp_path: Path, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "model.safetensors"
    old = {"w": rng.standard_normal(5000).astype(np.float32)}
    save_weights(path, old)
    before = path.read_bytes()
    real_pwrite = os.pwrite
    calls = []

    def filling_up(fd: int, data: Any, offset: int) -> int:
        calls.append(offset)
        if len(calls) > 2:  # the disk fills up after two chunks
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", filling_up)
    new = {"w": rng.standard_normal(1 << 16).astype(np.float32)}
    with pytest.raises(TransportError, match=r"No space left on device \(errno 28\); the old") as e:
        save_weights(path, new, chunk_bytes=4096)
    assert e.value.errno == errno.ENOSPC
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["model.safetensors"]


def test_bad_tensors_are_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="tensor 'c' has dtype complex64"):
        save_weights(tmp_path / "x.safetensors", {"c": np.zeros(3, np.complex64)})
    with pytest.raises(InvalidArgumentError, match="is not a folder"):
        save_weights(tmp_path / "no" / "x.safetensors", {"a": np.zeros(3)})
    assert list(tmp_path.iterdir()) == []


def test_a_full_tmpfs_leaves_the_old_file_intact(tmp_path: Path, rng: np.random.Generator) -> None:
    """A real full file system: a 1 MiB tmpfs (needs root to mount; skips otherwise)."""
    import subprocess

    mount = tmp_path / "small"
    mount.mkdir()
    made = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True
    )
    if made.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {made.stderr.decode().strip()}")
    try:
        path = mount / "model.safetensors"
        save_weights(path, {"w": rng.standard_normal(1000).astype(np.float32)})
        before = path.read_bytes()
        with pytest.raises(TransportError, match="No space left on device") as e:
            save_weights(path, {"w": rng.standard_normal(300_000).astype(np.float32)})
        assert e.value.errno == errno.ENOSPC
        assert path.read_bytes() == before
        assert [p.name for p in mount.iterdir()] == ["model.safetensors"]
    finally:
        subprocess.run(["umount", str(mount)], check=True)
