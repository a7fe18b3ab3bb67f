"""`rdmaxfer pull` over verbs between the guest's two rxe devices names the transport it used,
and the server reports the client (WeightServer on_client, the line `rdmaxfer serve` prints).

The server publishes arrays from this process (rxe1); the pull is the command line (rxe0).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import numpy as np
import pytest
from safetensors.numpy import save_file

import rdmaxfer

from .rdma_helpers import addrs, devices

#: A command-line start in the TCG guest takes up to minutes when the host is busy.
CLI_WAIT_S = 400.0


@pytest.mark.timeout(600)
def test_pull_names_the_rdma_transport(tmp_path: object) -> None:
    rng = np.random.default_rng(5)
    arrays = {"w": rng.standard_normal((128, 16)).astype(np.float32)}
    reference = os.path.join(str(tmp_path), "w.safetensors")
    save_file(arrays, reference)
    ended: list[tuple[str, str]] = []
    left = threading.Event()

    def on_client(peer: str, outcome: str) -> None:
        ended.append((peer, outcome))
        left.set()

    with rdmaxfer.Engine("rdma", rdma_device=devices()[1], secret="cli-test") as engine:
        with rdmaxfer.serve_weights(
            arrays, host=addrs()[1], engine=engine, on_client=on_client
        ) as server:
            pull = [sys.executable, "-m", "rdmaxfer", "pull", f"{addrs()[1]}:{server.port}"]
            pull += ["--transport", "rdma", "--quiet", "--verify", reference, "--timeout", "120"]
            env = {**os.environ, "RDMAXFER_RDMA_DEVICE": devices()[0]}
            env["RDMAXFER_SECRET"] = "cli-test"
            out = subprocess.run(pull, capture_output=True, text=True, timeout=CLI_WAIT_S, env=env)
            assert out.returncode == 0, out.stdout + out.stderr
            assert "pulled 1 tensors, 8192 bytes over rdma in" in out.stdout, out.stdout
            assert "every tensor identical" in out.stdout
            assert left.wait(60), "the server did not report the client"
    peer, outcome = ended[0]
    assert peer.startswith(f"{addrs()[0]}:") and outcome == "done", ended
