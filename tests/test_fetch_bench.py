"""``rdmaxfer bench --op fetch``: rdmaxfer.fetch against curl, wget and aria2c on one file
from nginx, each download's bytes checked, CPU seconds per GB for every client."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from _nginx import Nginx, nginx_binary
from rdmaxfer.tools.bench_fetch import REFERENCES, format_fetch_table, summary

WAIT_S = 300
SIZE = 8 * (1 << 20) + 11


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, bytes]]:
    if nginx_binary() is None:
        pytest.skip("nginx is not installed (apt-get install -y nginx); CI installs it")
    root = tmp_path_factory.mktemp("www-bench")
    data = np.random.default_rng(31).integers(0, 256, SIZE, dtype=np.uint8).tobytes()
    (root / "f.bin").write_bytes(data)
    with Nginx(root, tmp_path_factory.mktemp("nginx-bench")) as nginx:
        yield f"{nginx.url}/f.bin", data


def bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rdmaxfer", "bench", "--op", "fetch", *args],
        capture_output=True, text=True, timeout=WAIT_S,
    )  # fmt: skip


def test_bench_op_fetch_json(served: tuple[str, bytes], tmp_path: Path) -> None:
    url, data = served
    proc = bench("--url", url, "--iters", "2", "--dir", str(tmp_path), "--json")
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    installed = [t for t in REFERENCES if shutil.which(t.split()[0])]
    tools = ["rdmaxfer", *installed]
    # round 0 in order, round 1 reversed; one row per download, printed as it ends
    assert [r["tool"] for r in rows] == tools + tools[::-1]
    assert [r["round"] for r in rows] == [0] * len(tools) + [1] * len(tools)
    digest = hashlib.sha256(data).hexdigest()
    for r in rows:
        assert r["op"] == "fetch" and r["bytes"] == SIZE and r["sha256"] == digest
        assert r["seconds"] > 0 and r["GB_per_s"] == pytest.approx(SIZE / r["seconds"] / 1e9)
        assert r["cpu_s"] > 0 and r["cpu_s_per_GB"] == pytest.approx(r["cpu_s"] / (SIZE / 1e9))
        assert r["load_avg_1min"] >= 0
    ours = [r for r in rows if r["tool"] == "rdmaxfer"]
    assert all(r["connections"] >= 1 and r["range_size"] >= 1 << 20 for r in ours)
    assert not list(tmp_path.iterdir())  # the download removed after the last round
    table = format_fetch_table(rows)
    assert table.count("\n") == 1 + len(tools) and "| rdmaxfer |" in table
    if "curl" in installed:
        s = summary(rows)
        assert s["curl"]["x_curl"] == 1.0 and s["rdmaxfer"]["x_curl"] > 0


def test_bench_op_fetch_table_and_errors(served: tuple[str, bytes]) -> None:
    url, _ = served
    proc = bench("--url", url, "--iters", "1")
    assert proc.returncode == 0, proc.stderr
    assert f"({SIZE} bytes), 1 rounds" in proc.stdout and "| rdmaxfer |" in proc.stdout
    proc = bench("--iters", "1")
    assert proc.returncode == 2 and "needs --url" in proc.stderr
    proc = bench("--url", url.replace("f.bin", "missing.bin"), "--iters", "1")
    assert proc.returncode != 0 and "HTTP 404" in proc.stderr
