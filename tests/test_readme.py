"""The README's Engine example runs as written: node A and node B as two processes on
loopback (``nodeA`` -> 127.0.0.1, a free port for 5555, a shared secret in the environment as
the example asks)."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
WAIT_S = 60.0


def _example(first_line: str) -> str:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.DOTALL)
    found = [b for b in blocks if b.startswith(first_line)]
    assert len(found) == 1, f"the README has {len(found)} blocks starting {first_line!r}"
    return found[0]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _listening(port: int) -> bool:
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:
                    return True
    return False


def test_engine_example_runs_on_both_sides(tmp_path: Path) -> None:
    port = _free_port()
    node_a = _example("# node A:").replace("5555", str(port))
    node_b = _example("# node B:").replace("nodeA:5555", f"127.0.0.1:{port}")
    assert "nodeA" not in node_b and str(port) in node_a
    env = {**os.environ, "RDMAXFER_SECRET": "readme-example", "RDMAXFER_TRANSPORT": "tcp"}
    (tmp_path / "a.py").write_text(node_a)
    (tmp_path / "b.py").write_text(node_b)
    a = subprocess.Popen(
        [sys.executable, "-W", "error", str(tmp_path / "a.py")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        deadline = time.monotonic() + WAIT_S
        while not _listening(port):
            assert a.poll() is None, a.communicate()
            assert time.monotonic() < deadline, "node A did not listen"
            time.sleep(0.05)
        b = subprocess.run(
            [sys.executable, "-W", "error", str(tmp_path / "b.py")],
            capture_output=True,
            text=True,
            env=env,
            timeout=WAIT_S,
        )
        assert b.returncode == 0, b.stderr
        out, err = a.communicate(timeout=WAIT_S)
    finally:
        if a.poll() is None:
            a.kill()
    assert a.returncode == 0, err
    assert re.fullmatch(r"node B wrote 1048576 bytes, checksum \d+\n", out), out
    assert int(out.split()[-1]) > 1048576  # random bytes, not zeros


def test_weight_sync_example_runs(tmp_path: Path) -> None:
    from rdmaxfer.tools.cli_weights import default_model_file

    pull_port, push_port = _free_port(), _free_port()
    code = (
        _example("# weight sync:")
        .replace('"model.safetensors"', repr(str(default_model_file())))
        .replace("5555", str(pull_port))
        .replace("5556", str(push_port))
        .replace("nodeA:", "127.0.0.1:")
        .replace("nodeB:", "127.0.0.1:")
        .replace('"0.0.0.0"', '"127.0.0.1"')
    )
    (tmp_path / "sync.py").write_text(code)
    env = {**os.environ, "RDMAXFER_TRANSPORT": "tcp"}
    run = subprocess.run(
        [sys.executable, "-W", "error", str(tmp_path / "sync.py")],
        capture_output=True,
        text=True,
        env=env,
        timeout=WAIT_S * 2,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout == "pulled version 2, pushed version 3\n"
