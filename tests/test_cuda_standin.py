"""The stand-in CUDA driver (tests/cuda_standin/) is honest where it matters: device memory is
not host memory (a CPU access through a device pointer faults, as on a GPU), copies are
checked against the allocation, and it says it has neither dmabuf nor GPUDirect RDMA."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import _cuda_standin


def _run(code: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, RDMAXFER_CUDA_LIBRARY=str(_cuda_standin.library()))
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_standin_reports_one_gpu_without_dmabuf() -> None:
    done = _run(
        """
        from rdmaxfer import cuda
        s = cuda.status()
        g = s["gpus"][0]
        print(len(s["gpus"]), s["driver_version"], g["dma_buf"], g["gpu_direct_rdma"])
        print(g["name"])
        """
    )
    assert done.returncode == 0, done.stderr
    counts, name = done.stdout.splitlines()
    assert counts.split() == ["1", "12080", "False", "False"]
    assert name == "rdmaxfer CUDA stand-in (host memory)"


def test_a_cpu_access_to_device_memory_faults() -> None:
    done = _run(
        """
        import ctypes
        import numpy as np
        from rdmaxfer import Buffer
        buf = Buffer.empty(4096, np.uint8, device="cuda:0")
        print("allocated", flush=True)
        ctypes.string_at(buf.addr, 1)
        print("read device memory from the CPU", flush=True)
        """
    )
    assert done.stdout.strip() == "allocated"
    assert done.returncode == -signal.SIGSEGV


def test_a_copy_past_the_allocation_is_refused() -> None:
    done = _run(
        """
        import numpy as np
        from rdmaxfer import _core
        mem = _core.DeviceMemory(0, 1000)
        host = np.arange(200, dtype=np.uint8)
        try:
            _core.cuda_copy_to_device(0, mem.ptr + 900, int(host.ctypes.data), host.nbytes)
        except Exception as exc:
            print(type(exc).__name__, exc)
        """
    )
    assert done.returncode == 0, done.stderr
    assert "CUDA_ERROR_INVALID_VALUE" in done.stdout, done.stdout
