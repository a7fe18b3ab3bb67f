"""The rdmaxfer command: info, bench --json, pull --out/--verify, demo, bad input (its
version, help, Ctrl-C and warnings: tests/test_cli_usage.py)."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from rdmaxfer import Engine, bench
from rdmaxfer.errors import InvalidArgumentError
from rdmaxfer.tools.cli_weights import EXIT_INTERRUPTED, start_serve_process


def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rdmaxfer", *args], capture_output=True, text=True, timeout=timeout
    )


def test_info_names_transports_and_reasons() -> None:
    out = run("info", "--json")
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout)
    assert info["transports"]["tcp"] == "available"
    assert info["transports"]["rdma"] != "available" or info["auto_selects"] == "rdma"
    shm = info["transports"]["shm"]
    assert info["auto_same_host"].startswith("shm when") or shm in info["auto_same_host"]
    assert info["memlock_limit"]
    assert info["rdma_rails"] == [] or info["transports"]["rdma"] == "available"
    assert all("nearest_rail" in g for g in info["gpu"]["gpus"])


def test_bench_json_schema() -> None:
    out = run(
        "bench", "--transport", "tcp", "--op", "write", "--size", "1K,64K", "--iters", "5", "--json"
    )
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in out.stdout.splitlines()]  # JSON Lines: one per row
    assert [r["bytes"] for r in rows] == [1024, 65536]
    for r in rows:
        assert r["iters"] == 5
        assert r["bw_avg_GB_per_s"] > 0 and r["lat_us_p50"] > 0
        assert r["bw_peak_GB_per_s"] >= r["bw_avg_GB_per_s"] * 0.999
        assert r["lat_us_min"] <= r["lat_us_p50"] <= r["lat_us_p99"]


def test_bench_send_and_read_run() -> None:
    for op in ("send", "read"):
        rows = bench.run_bench(transport="tcp", op=op, sizes=[3, 70000], iters=3, warmup=1)
        assert [r.bytes for r in rows] == [3, 70000]


def test_parse_sizes() -> None:
    assert bench.parse_sizes("64K,1M,1G") == [65536, 1 << 20, 1 << 30]
    assert bench.parse_sizes("2:16") == [2, 4, 8, 16]
    assert bench.parse_size("1MiB") == 1 << 20
    try:
        bench.parse_size("ten")
    except InvalidArgumentError as exc:
        assert "'ten' is not a size" in str(exc)
    else:
        raise AssertionError("parse_size('ten') did not raise")


def test_pull_out_and_verify(tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    src = tmp_path / "src.safetensors"
    save_file(
        {
            "a": rng.standard_normal((64, 3)).astype(np.float32),
            "b": rng.integers(0, 9, 11, dtype=np.int32),
        },
        str(src),
    )
    server, line = start_serve_process(src, "tcp")
    try:
        address = line.rsplit(" ", 1)[-1].strip()
        out = run(
            "pull",
            address,
            "--out",
            str(tmp_path / "o"),
            "--verify",
            str(src),
            "--transport",
            "tcp",
            "--quiet",
        )
        assert out.returncode == 0, out.stderr
        assert "pulled 2 tensors, 812 bytes over tcp in" in out.stdout
        assert "every tensor identical" in out.stdout
        assert (tmp_path / "o" / "model.safetensors").read_bytes() == src.read_bytes()
    finally:
        server.kill()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_serve_stops_cleanly_on_signal(tmp_path: Path, sig: signal.Signals) -> None:
    """`docker stop` sends SIGTERM to serve (the container's main process), Ctrl-C SIGINT:
    serve closes the server and its engine (a client still connected included), exits 0 well
    within docker stop's 10 s grace period, and frees its port."""
    rng = np.random.default_rng(11)
    src = tmp_path / "src.safetensors"
    save_file({"w": rng.standard_normal((256, 16)).astype(np.float32)}, str(src))
    server, line = start_serve_process(src, "tcp", max_clients=3)
    try:
        address = line.rsplit(" ", 1)[-1].strip()
        port = int(address.rsplit(":", 1)[1])
        out = run("pull", address, "--transport", "tcp", "--quiet", "--verify", str(src))
        assert out.returncode == 0, out.stderr
        assert "every tensor identical" in out.stdout
        with Engine("tcp") as client, client.connect(address, timeout=10):
            time.sleep(0.2)  # the server has accepted this client and waits for its request
            start = time.monotonic()
            server.send_signal(sig)
            rest, _ = server.communicate(timeout=30)
            elapsed = time.monotonic() - start
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    # Ctrl-C exits as a shell reports it; `docker stop` (SIGTERM) is a clean stop.
    assert server.returncode == (EXIT_INTERRUPTED if sig == signal.SIGINT else 0), rest
    # A line per client (serve's log), the connected one cut off by the close, then the stop.
    lines = rest.strip().splitlines()
    assert lines[-1] == f"stopped by {sig.name}: server and engine closed", rest
    assert lines[-2].endswith(": stopped: the server is closing"), rest
    assert lines[:-2] == [lines[0]] and lines[0].endswith(": done"), rest
    assert elapsed < 5.0, f"serve took {elapsed:.1f} s to stop after {sig.name}"
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(("127.0.0.1", port))  # EADDRINUSE while anything still listens there
        probe.listen()


def test_demo_runs_the_main_job() -> None:
    out = run("demo", "--transport", "tcp", "--quiet")
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    cold = [line for line in lines if line.startswith("cold pull: ")]
    warm = [line for line in lines if line.startswith("warm pull: ")]
    assert len(cold) == len(warm) == 1, out.stdout
    for line in (cold[0], warm[0]):
        assert "104 tensors, 90856960 bytes over tcp in" in line
    assert "registering" in cold[0] and "repeated weight sync" in warm[0]
    assert lines.index(cold[0]) < lines.index(warm[0])
    assert "all 104 tensors bit-exact" in out.stdout


def test_bad_input_exit_codes() -> None:
    out = run("pull", "127.0.0.1:1", "--transport", "tcp", "--quiet", "--timeout", "0.5")
    assert out.returncode == 2
    assert "cannot connect to 127.0.0.1:1" in out.stderr
    out = run("serve", "/nonexistent.safetensors", "--transport", "tcp")
    assert out.returncode == 2
    assert "not a readable safetensors file" in out.stderr
