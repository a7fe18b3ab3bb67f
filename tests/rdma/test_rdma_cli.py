"""`rdmaxfer serve` / `rdmaxfer pull` over verbs between the guest's two rxe devices: the pull
names the transport it used, and serve prints a line for the client."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from .rdma_helpers import WAIT_S, addrs, devices


def test_pull_names_the_rdma_transport(tmp_path: Path) -> None:
    path = tmp_path / "w.safetensors"
    rng = np.random.default_rng(5)
    save_file({"w": rng.standard_normal((128, 16)).astype(np.float32)}, str(path))
    serve = [sys.executable, "-m", "rdmaxfer", "serve", str(path), "--host", addrs()[1]]
    serve += ["--port", "0", "--transport", "rdma", "--max-clients", "1"]
    server = subprocess.Popen(
        serve,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "RDMAXFER_RDMA_DEVICE": devices()[1], "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert server.stdout is not None
        first = server.stdout.readline()
        assert first.startswith("serving 1 tensors"), first
        address = first.rsplit(" ", 1)[-1].strip()
        pull = [sys.executable, "-m", "rdmaxfer", "pull", address, "--transport", "rdma"]
        pull += ["--quiet", "--verify", str(path)]
        out = subprocess.run(
            pull,
            capture_output=True,
            text=True,
            timeout=WAIT_S * 2,
            env={**os.environ, "RDMAXFER_RDMA_DEVICE": devices()[0]},
        )
        assert out.returncode == 0, out.stdout + out.stderr
        assert "pulled 1 tensors, 8192 bytes over rdma in" in out.stdout, out.stdout
        assert "every tensor identical" in out.stdout
        client = server.stdout.readline().strip()
        assert client.startswith(f"client {addrs()[0]}:") and client.endswith(": done"), client
        assert server.wait(timeout=WAIT_S) == 0
    finally:
        if server.poll() is None:
            server.kill()
