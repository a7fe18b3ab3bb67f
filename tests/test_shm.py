"""The shm transport's own promises (issue 14): same-host only, nothing left in /dev/shm, real
read-only input as the source, the peer's process named by its pid, ``rdmaxfer info``/``demo``.
The transfer, kill-loop, peer-death and auth suites run on shm through the ``transport``
fixture (conftest.py)."""

from __future__ import annotations

import json
import mmap
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from _common import Pair
from rdmaxfer import Engine, UnsupportedError, _core

pytestmark = pytest.mark.skipif(
    _core.available_transports().get("shm", "") != "",
    reason=f"shm unavailable: {_core.available_transports().get('shm')}",
)


@pytest.fixture
def shm_pair() -> Iterator[Pair]:
    with Engine("shm") as server, Engine("shm") as client:
        port = server.listen("127.0.0.1", 0)
        a = client.connect("127.0.0.1", port, timeout=10)
        b = server.accept(timeout=10)
        yield Pair(server, client, a, b, port)


def dev_shm() -> set[str]:
    """rdmaxfer's names in /dev/shm. Other processes (the suite's other workers, other users)
    add and remove their own files there meanwhile; test_load_weights's file is its own."""
    names = os.listdir("/dev/shm") if os.path.isdir("/dev/shm") else []
    return {n for n in names if "rdmaxfer" in n and not n.startswith("rdmaxfer-load-")}


def dev_shm_held() -> list[str]:
    """Files of /dev/shm this process maps or holds open (deleted ones included)."""
    with open("/proc/self/maps") as maps:
        held = [line.split(None, 5)[-1].strip() for line in maps if " /dev/shm/" in line]
    fds = (_readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd"))
    return held + [link for link in fds if link.startswith("/dev/shm/")]


def test_nothing_is_left_in_dev_shm(rng: np.random.Generator) -> None:
    before = dev_shm()
    with Engine("shm") as server, Engine("shm") as client:
        port = server.listen("127.0.0.1", 0)
        ep = client.connect("127.0.0.1", port, timeout=10)
        peer = server.accept(timeout=10)
        data = rng.integers(0, 256, 3 << 20, dtype=np.uint8)
        sending = ep.post_send(data)
        assert peer.recv(timeout=30).tobytes() == data.tobytes()
        sending.wait(30)
        assert dev_shm() == before  # the rings are memfds: never named in /dev/shm
        assert dev_shm_held() == []
        rings = [
            os.readlink(f"/proc/self/fd/{fd}")
            for fd in os.listdir("/proc/self/fd")
            if "rdmaxfer-shm-ring" in _readlink(f"/proc/self/fd/{fd}")
        ]
        assert rings == []  # mapped, then their descriptors closed
    assert dev_shm() == before


def _readlink(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return ""


def test_connect_to_another_host_is_refused_with_the_fix() -> None:
    with Engine("shm") as client:
        with pytest.raises(UnsupportedError, match=r"is not an address of this machine.*'tcp'"):
            client.connect("192.0.2.1", 5555, timeout=5)  # TEST-NET-1: never this host


def test_read_only_mmapped_file_and_read_only_array_as_sources(
    shm_pair: Pair, tmp_path: Path, rng: np.random.Generator
) -> None:
    payload = rng.integers(0, 256, (1 << 20) + 17, dtype=np.uint8)
    path = tmp_path / "weights.bin"
    path.write_bytes(payload.tobytes())
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        source = np.frombuffer(mapped, dtype=np.uint8)
        assert not source.flags.writeable
        target = np.zeros(payload.size, dtype=np.uint8)
        region = shm_pair.server.register(target)
        shm_pair.a.write(source, region.descriptor(), timeout=30)  # one-sided, from the file
        assert target.tobytes() == payload.tobytes()
        sending = shm_pair.a.post_send(source)  # two-sided (rendezvous), from the file
        assert shm_pair.b.recv(timeout=30).tobytes() == payload.tobytes()
        sending.wait(30)
        del source
    frozen = rng.standard_normal(5000)
    frozen.flags.writeable = False
    sending = shm_pair.a.post_send(frozen)
    np.testing.assert_array_equal(shm_pair.b.recv(timeout=30), frozen)
    sending.wait(30)


def test_the_endpoint_names_the_peer_process(shm_pair: Pair) -> None:
    info = shm_pair.a.info
    assert info["transport"] == "shm"
    assert info["peer_pid"] == os.getpid()  # both ends live in this test's process
    assert "process_vm_readv" in shm_pair.client.describe()


def test_info_lists_shm_and_bench_runs_over_it() -> None:
    run = [sys.executable, "-m", "rdmaxfer"]
    info = json.loads(
        subprocess.run(
            [*run, "info", "--json"], capture_output=True, text=True, timeout=120, check=True
        ).stdout
    )
    assert info["transports"]["shm"] == "available"
    if not os.environ.get("RDMAXFER_TRANSPORT"):
        assert info["auto_same_host"].startswith("shm when the peer runs as the same user")
    out = subprocess.run(
        [*run, "bench", "--transport", "shm", "--size", "8,1M", "--iters", "3", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in out.stdout.splitlines()]  # JSON Lines
    assert [r["bytes"] for r in rows] == [8, 1 << 20]
    assert all(r["bw_avg_GB_per_s"] > 0 for r in rows)


def test_demo_uses_shm_and_says_so() -> None:
    env = {k: v for k, v in os.environ.items() if k != "RDMAXFER_TRANSPORT"}
    out = subprocess.run(
        [sys.executable, "-m", "rdmaxfer", "demo", "--quiet"],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "both ends run on this host: transport auto picks shm for this peer" in out.stdout
    for pull in ("cold", "warm"):
        assert f"{pull} pull: 104 tensors, 90856960 bytes over shm in" in out.stdout
    assert "all 104 tensors bit-exact" in out.stdout


def test_doctor_reports_shm_and_yama(tmp_path: Path) -> None:
    from rdmaxfer.tools.doctor import check_shm

    assert check_shm(tmp_path, "")[0].severity == "ok"
    (tmp_path / "sys/kernel/yama").mkdir(parents=True)
    (tmp_path / "sys/kernel/yama/ptrace_scope").write_text("1\n")
    finding = check_shm(tmp_path, "")[0]
    assert finding.severity == "warn" and "ptrace_scope=0" in finding.fix
    refused = check_shm(tmp_path, "process_vm_readv (CMA) on this process: EPERM")[0]
    assert refused.severity == "warn" and "EPERM" in refused.message
