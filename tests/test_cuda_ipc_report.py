"""CUDA IPC in ``rdmaxfer info`` and ``rdmaxfer doctor`` (issue 14): whether the driver offers
the IPC calls and, per pair of GPUs, whether peer access is possible, decided once
(:func:`rdmaxfer.gpu.report.cuda_ipc_report`, from ``_core.cuda_status()``) and shown by both.
The commands run over the stand-in driver (two GPUs, with and without peer access); the
decision's other branches over given driver facts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

import _cuda_standin
from rdmaxfer.gpu.report import cuda_ipc_report
from rdmaxfer.tools import doctor


def _status(gpus: int, peers: dict[int, list[int]], **extra: Any) -> dict[str, Any]:
    status: dict[str, Any] = {
        "unavailable": "",
        "driver_version": 12080,
        "get_handle_for_address_range": False,
        "cuda_ipc": "",
        "can_access_peer": True,
        "gpus": [{"index": i, "peer_access": peers.get(i, [])} for i in range(gpus)],
    }
    status.update(extra)
    return status


def _standin(*args: str, **env: str) -> Any:
    """``rdmaxfer *args`` over the stand-in driver with ``env``; its --json output."""
    full = dict(os.environ, RDMAXFER_CUDA_LIBRARY=str(_cuda_standin.library()))
    full.update(env)
    out = subprocess.run(
        [sys.executable, "-m", "rdmaxfer", *args, "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        env=full,
        check=False,
    )
    assert out.returncode in (0, 1), out.stderr  # doctor exits 1 on warnings elsewhere
    return json.loads(out.stdout)


def _doctor_ipc(report: Any) -> list[dict[str, str]]:
    return [f for f in report["findings"] if f["check"] in ("gpu.cuda_ipc", "gpu.peer_access")]


@pytest.mark.parametrize("no_peer", ["", "1"])
def test_info_and_doctor_report_cuda_ipc_over_the_standin(no_peer: str) -> None:
    env = {"RDMAXFER_CUDA_STANDIN_GPUS": "2", "RDMAXFER_CUDA_STANDIN_NO_PEER": no_peer}
    ipc = _standin("info", **env)["gpu"]["cuda_ipc"]
    possible = not no_peer
    assert ipc == {
        "calls": "available",
        "pairs": [
            {"gpu": 0, "peer": 1, "peer_access": possible},
            {"gpu": 1, "peer": 0, "peer_access": possible},
        ],
    }
    findings = _doctor_ipc(_standin("doctor", **env))
    assert [(f["check"], f["severity"], f["subject"]) for f in findings] == [
        ("gpu.cuda_ipc", "ok", "CUDA IPC"),
        ("gpu.peer_access", "ok" if possible else "info", "cuda:0 -> cuda:1"),
        ("gpu.peer_access", "ok" if possible else "info", "cuda:1 -> cuda:0"),
    ]
    if not possible:
        assert "go through host memory" in findings[1]["message"]
        assert "nvidia-smi topo -m" in findings[1]["fix"]


def test_missing_ipc_calls_are_one_reason_in_info_and_doctor() -> None:
    why = "this NVIDIA driver lacks the CUDA IPC calls cuIpcGetMemHandle; upgrade the driver"
    status = _status(1, {}, cuda_ipc=why)
    assert cuda_ipc_report(status) == {"calls": why, "pairs": []}
    (finding,) = doctor.check_cuda_ipc(status)
    assert (finding.check, finding.severity) == ("gpu.cuda_ipc", "warn")
    assert finding.message == f"unavailable: {why}"
    assert "staged through host memory" in finding.fix


def test_peer_access_per_ordered_pair_and_unknown_without_the_call() -> None:
    status = _status(3, {0: [1], 1: [0, 2]})
    pairs = {(p["gpu"], p["peer"]): p["peer_access"] for p in cuda_ipc_report(status)["pairs"]}
    assert pairs == {
        (0, 1): True, (0, 2): False, (1, 0): True, (1, 2): True, (2, 0): False, (2, 1): False,
    }  # fmt: skip
    unknown = cuda_ipc_report(_status(2, {}, can_access_peer=False))["pairs"]
    assert [p["peer_access"] for p in unknown] == [None, None]
    findings = doctor.check_cuda_ipc(_status(2, {}, can_access_peer=False))
    assert [f.severity for f in findings] == ["ok", "info", "info"]
    assert "cannot say" in findings[1].message


def test_without_cuda_nothing_is_claimed() -> None:
    status = _status(0, {}, unavailable="no CUDA: libcuda.so.1 not found")
    assert cuda_ipc_report(status) == {"calls": "no CUDA: libcuda.so.1 not found", "pairs": []}
    (finding,) = doctor.check_cuda_ipc(status)
    assert finding.severity == "info" and "not checked: no CUDA" in finding.message
