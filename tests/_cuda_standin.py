"""Builds the stand-in CUDA driver (tests/cuda_standin/*.cc) for ``pytest -m gpu``
on machines without a GPU.

The library is compiled once per source version into ``build/cuda-standin/`` (the rxe guest
sees the same folder, so it reuses the host's build) and handed to rdmaxfer through
``RDMAXFER_CUDA_LIBRARY``, the variable csrc/cuda/cuda_api.cc reads before it falls back to
``libcuda.so.1``. It is never part of the wheel: it lives under tests/.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE_DIR = ROOT / "tests" / "cuda_standin"
#: The library's sources (the driver API, its CUDA IPC, its VMM API, the cuFile API of GPUDirect
#: Storage) and their shared header.
SOURCES = (
    SOURCE_DIR / "cuda_standin.cc",
    SOURCE_DIR / "cuda_standin_ipc.cc",
    SOURCE_DIR / "cuda_standin_vmm.cc",
    SOURCE_DIR / "cufile_standin.cc",
)
HEADERS = (SOURCE_DIR / "standin_core.h",)
BUILD_DIR = ROOT / "build" / "cuda-standin"
#: Set to "0" to run ``pytest -m gpu`` against the real driver only (skips without a GPU).
SWITCH = "RDMAXFER_TEST_CUDA_STANDIN"


def library() -> Path:
    """The stand-in's path, compiled with the system C++ compiler when missing.

    Raises:
        RuntimeError: no C++ compiler, or it failed (its output is in the message).
    """
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in SOURCES + HEADERS)).hexdigest()[:16]
    out = BUILD_DIR / f"libcuda_standin-{digest}.so"
    if out.exists():
        return out
    compiler = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if compiler is None:
        raise RuntimeError("no C++ compiler (c++/g++) to build the CUDA stand-in; set CXX")
    BUILD_DIR.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(f".{os.getpid()}.tmp")
    cmd = [
        compiler,
        "-std=c++17",
        "-O2",
        "-shared",
        "-fPIC",
        "-pthread",
        "-Wall",
        "-Wextra",
        "-Werror",
        "-o",
        str(tmp),
        *(str(p) for p in SOURCES),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"building the CUDA stand-in failed: {' '.join(cmd)}\n{done.stderr}")
    tmp.replace(out)  # atomic: parallel sessions never load a half-written file
    return out


def real_driver_present() -> bool:
    """True when the machine has an NVIDIA driver (then the GPU tests use it, not the stand-in)."""
    return Path("/proc/driver/nvidia/version").exists() or any(
        Path(d, "libcuda.so.1").exists()
        for d in ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/local/nvidia/lib64")
    )


def install(env: dict[str, str] | os._Environ[str] = os.environ) -> str | None:
    """Points ``RDMAXFER_CUDA_LIBRARY`` (and ``RDMAXFER_CUFILE_LIBRARY``: the stand-in holds the
    cuFile API too) at the stand-in unless a driver or a choice is already there; returns the
    path it set, or None."""
    if env.get("RDMAXFER_CUDA_LIBRARY") or env.get(SWITCH) == "0" or real_driver_present():
        return None
    path = str(library())
    env["RDMAXFER_CUDA_LIBRARY"] = path
    env.setdefault("RDMAXFER_CUFILE_LIBRARY", path)
    return path
