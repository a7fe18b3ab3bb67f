"""``rdmaxfer info`` and ``rdmaxfer doctor`` report GPUDirect Storage: where libcufile loads from
and its version (the tests' stand-in cuFile), and why not where it is absent. Each case runs
the CLI in a child process: libcufile is loaded once per process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import _cuda_standin


def cli(*args: str, cufile: str, cuda: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RDMAXFER_CU")}
    env["RDMAXFER_CUFILE_LIBRARY"] = cufile
    if cuda is not None:
        env["RDMAXFER_CUDA_LIBRARY"] = cuda
    return subprocess.run(
        [sys.executable, "-m", "rdmaxfer", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def gds_findings(out: str) -> dict[str, dict[str, Any]]:
    return {f["check"]: f for f in json.loads(out)["findings"] if f["check"].startswith("gds.")}


def test_without_libcufile(tmp_path: Path) -> None:
    missing = str(tmp_path / "libcufile.so.0")
    info = cli("info", "--json", cufile=missing)
    assert info.returncode == 0, info.stderr
    gds = json.loads(info.stdout)["gds"]
    assert gds["available"] is False and gds["path"] is None and gds["version"] is None
    assert gds["library"] == missing
    assert gds["unavailable"].startswith(f"no GPUDirect Storage: {missing} not found (")
    assert gds["needs"][0].startswith(f"libcufile ({missing} does not load): install the CUDA")
    assert "apt install nvidia-gds" in gds["needs"][0]
    text = cli("info", cufile=missing).stdout
    assert f"GPUDirect Storage: unavailable: no GPUDirect Storage: {missing} not found" in text
    assert "load_weights reads GPU arrays through pinned host buffers" in text
    doctor = cli("doctor", "--json", cufile=missing)
    lib = gds_findings(doctor.stdout)["gds.library"]
    assert f"{missing} not found" in lib["message"] and "nvidia-gds" in lib["fix"]
    no_gpu = not Path("/proc/driver/nvidia/version").exists()
    assert lib["severity"] == ("info" if no_gpu else "warn")


@pytest.mark.skipif(_cuda_standin.real_driver_present(), reason="an NVIDIA driver is here")
def test_over_the_standin_cufile() -> None:
    """The stand-in cuFile (cuFileGetVersion says 1.15) loads: info and doctor name the file it
    was loaded from and its version; nvidia-fs is not loaded on this machine."""
    standin = str(_cuda_standin.library())
    info = cli("info", "--json", cufile=standin, cuda=standin)
    assert info.returncode == 0, info.stderr
    gds = json.loads(info.stdout)["gds"]
    assert gds["available"] is True and gds["unavailable"] == ""
    assert gds["path"] == os.path.realpath(standin) and gds["version"] == "1.15"
    assert gds["nvidia_fs"] == {"loaded": False, "version": None}
    assert any(need.startswith("nvidia-fs not loaded") for need in gds["needs"])
    text = cli("info", cufile=standin, cuda=standin).stdout
    assert f"by cuFileRead): libcufile 1.15 from {os.path.realpath(standin)}" in text
    assert "  nvidia-fs: not loaded" in text
    found = gds_findings(cli("doctor", "--json", cufile=standin, cuda=standin).stdout)
    assert found["gds.library"]["severity"] == "ok"
    real = os.path.realpath(standin)
    assert found["gds.library"]["message"].startswith(f"libcufile 1.15 from {real}")
    assert found["gds.nvidia_fs"]["severity"] == "info"
    assert "modprobe nvidia-fs" in found["gds.nvidia_fs"]["fix"]
