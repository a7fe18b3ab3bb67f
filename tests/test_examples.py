"""Every program of examples/ runs as written, both sides on this machine, and prints its
line: the examples the README and the docs show (they include these files) are the ones that
run here."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from _ports import free_port
from rdmaxfer.memory import cuda

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
DOCS = ROOT / "docs"
TIMEOUT_S = 180

#: What each example prints when every byte arrived as sent (checked line for line).
EXPECTED = {
    "send_recv.py": "received 4194304 bytes of float32, then (1024, 1024) into out=",
    "one_sided.py": "node B wrote 1048576 bytes, checksum 133608947",
    "pull_weights.py": "pulled 104 tensors (90856960 bytes), version 1: exact",
    "weight_sync.py": "pulled version 2, pushed version 3",
    "kv_cache.py": "decode node: b'request 42', all 512 pages in place",
    "gpu_memory.py": "GPU round trip of 16777216 bytes: exact",
    "distributed.py": "rank 1: broadcast of 4 tensors exact, received sum 499500",
    "fetch.py": "fetched 90868376 bytes (sha256 53aa51172d142c89...), 104 tensors exact",
    "cli.sh": "pulled model.safetensors: bit-exact",
    "ray_weight_sync.py": "versions 1..5, inference-1 killed and restarted: 3 actors at 5, exact",
}
#: Examples that take no --port (they choose a free one or need none).
NO_PORT = {"fetch.py", "ray_weight_sync.py"}
#: Examples run elsewhere: the GPU one below, the Ray one by tests/test_ray.py (the ray extra).
RUN_ELSEWHERE = {"gpu_memory.py", "ray_weight_sync.py"}


def _programs() -> list[str]:
    return sorted(
        p.name
        for p in EXAMPLES.iterdir()
        if p.suffix in (".py", ".sh") and not p.name.startswith("_")
    )


def test_every_example_has_its_line_and_is_shown_in_the_docs() -> None:
    assert sorted(EXPECTED) == _programs()
    shown = "\n".join(p.read_text() for p in DOCS.rglob("*.md"))
    included = set(re.findall(r'--8<-- "examples/([^"]+)"', shown))
    assert included == set(EXPECTED), "an example no docs page includes, or a missing one"


def _run(name: str) -> subprocess.CompletedProcess[str]:
    path = EXAMPLES / name
    cmd = (
        ["bash", str(path)] if path.suffix == ".sh" else [sys.executable, "-W", "error", str(path)]
    )
    if name not in NO_PORT:
        port = str(free_port(2))
        cmd += [port] if path.suffix == ".sh" else ["--port", port]
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=TIMEOUT_S, cwd=ROOT)


@pytest.mark.parametrize("name", sorted(set(EXPECTED) - RUN_ELSEWHERE))
def test_example_runs(name: str) -> None:
    run = _run(name)
    assert run.returncode == 0, f"exit {run.returncode}\n{run.stdout}\n{run.stderr}"
    assert EXPECTED[name] in run.stdout.splitlines(), run.stdout


@pytest.mark.gpu
@pytest.mark.skipif(not cuda.available(), reason=cuda.unavailable_reason() or "no GPU")
def test_gpu_example_runs() -> None:
    run = _run("gpu_memory.py")
    assert run.returncode == 0, f"exit {run.returncode}\n{run.stdout}\n{run.stderr}"
    assert EXPECTED["gpu_memory.py"] in run.stdout.splitlines(), run.stdout
