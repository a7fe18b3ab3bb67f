"""``rdmaxfer load FILE --verify`` and ``rdmaxfer bench --op load`` on small files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from _st_files import random_tensors, write, write_sharded


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rdmaxfer", *args], capture_output=True, text=True, timeout=120
    )


def test_load_verify_a_sharded_checkpoint(tmp_path: Path, rng: np.random.Generator) -> None:
    tensors = {f"w{i}": rng.standard_normal((40, 9)).astype(np.float32) for i in range(6)}
    index = write_sharded(tmp_path, tensors, files=2)
    done = run("load", str(index), "--verify")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("loaded 6 tensors, 8640 bytes from 2 file(s) into cpu")
    assert "verified with safetensors: every tensor identical" in done.stdout
    row = json.loads(run("load", str(index), "--json", "--buffered").stdout)
    assert row["tensors"] == 6 and row["bytes"] == 8640
    assert [f["why"] for f in row["files"]] == ["direct=False"] * 2


def test_load_of_a_truncated_file_fails_with_the_offset(
    tmp_path: Path, rng: np.random.Generator
) -> None:
    path = write(tmp_path / "m.safetensors", random_tensors(rng))
    path.write_bytes(path.read_bytes()[:-10])
    done = run("load", str(path))
    assert done.returncode != 0
    assert "tensor 'w5' at offset" in done.stderr and "past the end of the file" in done.stderr


@pytest.mark.parametrize("flags", [[], ["--json"]])
def test_bench_op_load(tmp_path: Path, rng: np.random.Generator, flags: list[str]) -> None:
    from safetensors.numpy import save_file

    path = tmp_path / "b.safetensors"
    save_file({"a": rng.standard_normal((256, 256)).astype(np.float32)}, str(path))
    done = run("bench", "--op", "load", "--file", str(path), "--iters", "2", *flags)
    assert done.returncode == 0, done.stderr
    if flags:
        rows = [json.loads(line) for line in done.stdout.splitlines()]
        assert sorted(r["method"] for r in rows) == ["rdmaxfer"] * 2 + ["safetensors"] * 2
        assert all(r["bytes"] == path.stat().st_size and r["seconds"] > 0 for r in rows)
    else:
        assert "rdmaxfer vs safetensors.numpy.load_file:" in done.stdout
