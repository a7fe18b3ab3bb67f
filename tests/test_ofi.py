"""The ofi transport (libfabric) on the host, over the tcp;ofi_rxm provider pinned to loopback:
what the other transports promise and the pair suites do not cover (weights served, pulled,
sharded, versioned and pushed; the demo's main job bit-exact; fork), and a machine without
libfabric, which still imports and runs TCP. The pair suites run over ofi too (conftest.py,
OFI_MODULES)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

import rdmaxfer
from _common import OFI_ENV
from _fork_scenario import run_fork_scenario
from rdmaxfer import (
    Engine,
    InvalidArgumentError,
    UnsupportedError,
    _core,
    pull_weights,
    push_weights,
    receive_weights,
)
from rdmaxfer.tools.cli_weights import default_model_file
from rdmaxfer.weights import WeightServer

ROOT = Path(__file__).resolve().parents[1]
ROWS = "encoder.layer.0.intermediate.dense.weight"  # [1536, 384] F32
BIAS = "encoder.layer.0.attention.self.key.bias"  # [384] F32


@pytest.fixture(autouse=True)
def ofi_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """tcp;ofi_rxm on loopback; the test skips where libfabric or that provider is missing."""
    for key, value in OFI_ENV.items():
        monkeypatch.setenv(key, value)
    why = _core.available_transports().get("ofi", "unknown transport")
    if why:
        pytest.skip(f"transport 'ofi' is unavailable here: {why}")
    yield


def model_file() -> Path:
    try:
        return default_model_file()
    except FileNotFoundError as exc:  # a required test input, not an optional one
        pytest.fail(f"{exc} (the README's test command installs it)")


def test_an_endpoint_names_its_provider() -> None:
    with Engine("ofi") as server, Engine("ofi") as client:
        port = server.listen("127.0.0.1", 0)
        ep = client.connect("127.0.0.1", port, timeout=30)
        server.accept(timeout=30)
        assert ep.info["transport"] == "ofi"
        assert "over libfabric tcp;ofi_rxm (lo)" in ep.describe()
        assert ep.info["max_message"] > 0 and ep.info["notify_chunk"] == 4 << 20
        assert (ep.info["provider"], ep.info["domain"]) == ("tcp;ofi_rxm", "lo")
        assert isinstance(ep.info["fabric"], str) and ep.info["fabric"]
        assert "provider tcp;ofi_rxm on lo" in server.describe()


def test_pull_the_model_file_bit_exact_with_shards() -> None:
    path = model_file()
    ref = load_file(str(path))
    with WeightServer(path, transport="ofi") as server:
        server.start()
        address = f"127.0.0.1:{server.port}"
        got = pull_weights(address, transport="ofi", timeout=120)
        assert set(got) == set(ref)
        for name, arr in ref.items():
            np.testing.assert_array_equal(got[name], arr, err_msg=name)
        shards = {ROWS: np.s_[256:512], BIAS: np.s_[100:200:3]}
        part = pull_weights(address, transport="ofi", shard=shards, names=list(shards))
        for name, index in shards.items():
            np.testing.assert_array_equal(part[name], ref[name][index], err_msg=name)


def test_versions_and_push(rng: np.random.Generator) -> None:
    shapes = {"w": (256, 384), "b": (384,)}
    with WeightServer(
        {n: np.full(s, 1, np.float32) for n, s in shapes.items()}, transport="ofi"
    ) as server:
        server.start()
        address = f"127.0.0.1:{server.port}"
        assert server.update({n: np.full(s, 2, np.float32) for n, s in shapes.items()}) == 2
        got = pull_weights(address, transport="ofi", min_version=2, timeout=30)
        assert got.version == 2 and all((arr == 2).all() for arr in got.values())
    dest = {n: np.zeros(s, np.float32) for n, s in shapes.items()}
    with receive_weights(dest, "127.0.0.1", 0, transport="ofi", timeout=30) as receiver:
        weights = {n: rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()}
        pusher = threading.Thread(
            target=push_weights,
            args=(f"127.0.0.1:{receiver.port}", weights),
            kwargs={"version": 1, "transport": "ofi", "timeout": 30},
        )
        pusher.start()
        assert receiver.wait(timeout=60) == 1
        pusher.join(60)
        for name, arr in weights.items():
            np.testing.assert_array_equal(dest[name], arr, err_msg=name)


def test_demo_runs_the_main_job_over_ofi() -> None:
    model_file()
    out = subprocess.run(
        [sys.executable, "-m", "rdmaxfer", "demo", "--transport", "ofi", "--quiet"],
        capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONPATH": str(Path(rdmaxfer.__file__).parents[1])},
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert "104 tensors, 90856960 bytes over ofi in" in out.stdout
    assert "all 104 tensors bit-exact" in out.stdout


@pytest.mark.parametrize("fork_safe", [False, True], ids=["plain", "RDMAV_FORK_SAFE"])
def test_fork_with_live_ofi_engines(fork_safe: bool) -> None:
    run_fork_scenario(["ofi"], fork_safe)


def test_a_descriptor_of_another_transport_is_refused() -> None:
    with Engine("tcp") as tcp, Engine("ofi") as server, Engine("ofi") as client:
        port = server.listen("127.0.0.1", 0)
        ep = client.connect("127.0.0.1", port, timeout=30)
        server.accept(timeout=30)
        foreign = tcp.register(np.zeros(64, np.uint8), "rw").descriptor()
        with pytest.raises(InvalidArgumentError, match=r"memory of a tcp engine"):
            ep.write(np.ones(64, np.uint8), foreign, timeout=10)
        assert not ep.closed


def test_without_libfabric_the_package_imports_and_runs_tcp() -> None:
    script = """
import numpy as np, rdmaxfer
from rdmaxfer import Engine, UnsupportedError, _core
why = _core.available_transports()["ofi"]
assert "not found" in why and "libfabric1" in why, why
try:
    Engine("ofi")
except UnsupportedError as exc:
    assert "not found" in str(exc), exc
else:
    raise AssertionError("Engine('ofi') without libfabric")
with Engine("tcp") as s, Engine("tcp") as c:
    port = s.listen("127.0.0.1", 0)
    ep = c.connect("127.0.0.1", port, timeout=30)
    peer = s.accept(timeout=30)
    x = np.arange(1 << 16, dtype=np.float32)
    ep.post_send(x)
    assert np.array_equal(peer.recv(timeout=30), x)
print("OK", why)
"""
    env = {
        **os.environ,
        "PYTHONPATH": str(Path(rdmaxfer.__file__).parents[1]),
        "RDMAXFER_OFI_LIBRARY": "/nonexistent/libfabric.so.1",
    }
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.startswith("OK /nonexistent/libfabric.so.1 not found")


def test_an_emulated_provider_is_used_only_when_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RDMAXFER_OFI_PROVIDER")
    why = _core.available_transports()["ofi"]
    if why == "":
        pytest.skip("a hardware RDMA provider is present here")
    assert "tcp;ofi_rxm emulates RDMA" in why and "RDMAXFER_OFI_PROVIDER" in why
    with pytest.raises(UnsupportedError, match="RDMAXFER_OFI_PROVIDER"):
        Engine("ofi")
