"""rdmaxfer inside Ray (rdmaxfer.ray): the RDMAXFER Ray Direct Transport between actors of a
local Ray cluster, bit-exact from 1 KiB to 256 MiB, into new tensors and into target buffers
(CPU tensors, and GPU tensors where torch sees a CUDA device: ``pytest -m gpu``); a source
that dies mid-transfer; weight sync to actors that stall, die, come back and join; the
weight-sync example with its kill.

Needs the ray extra (``pip install '.[ray]'``); skips without it. The cases run in one Ray
driver process with one local cluster (tests/_ray_cases.py, ``ray.init(num_cpus=2)``); CI
runs these with ``pytest -m "ray and not gpu"``, and bench/gpu_check.sh the GPU cases on a GPU
machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("ray", reason="Ray is not installed (pip install '.[ray]')")
pytest.importorskip("torch", reason="torch is not installed")

pytestmark = pytest.mark.ray

ROOT = Path(__file__).resolve().parents[1]
CASES = [
    *(f"new_tensor_{n}" for n in (1 << 10, (1 << 20) + 24, 64 << 20, 256 << 20)),
    "several_dtypes_and_a_view_with_an_offset_in_one_object",
    "a_freed_receive_lends_its_memory_to_the_next",
    "into_target_buffers_set_for_the_ref",
    "registrations_are_released_when_ray_frees_the_object",
    "a_pinned_storage_outlives_its_objects",
    "source_death_mid_transfer_raises_rays_transport_error",
    "a_destination_without_a_transfer_thread_is_warned_about_once",
    "weight_sync_skips_a_stalled_actor_and_reports_a_dead_one",
]


GPU_CASES = [
    "cuda_tensors_between_two_actors_on_one_gpu",
    "cuda_into_target_buffers_set_for_the_ref",
]


def _run_cases(cases: list[str], timeout: float = 1500) -> dict[str, dict[str, Any]]:
    """Each case's outcome, from one run of tests/_ray_cases.py (one cluster); a run past
    ``timeout`` fails with what it printed (which case started last, its stacks)."""
    try:
        run = subprocess.run(
            [sys.executable, str(ROOT / "tests" / "_ray_cases.py"), *cases],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=ROOT,
        )
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
        err = exc.stderr.decode() if isinstance(exc.stderr, bytes) else exc.stderr or ""
        pytest.fail(f"the cases ran past {timeout:g} s\n{out[-4000:]}\n{err[-8000:]}")
    lines = [json.loads(x) for x in run.stdout.splitlines() if x.startswith("{")]
    found = {line["case"]: line for line in lines}
    assert run.returncode == 0 and found, f"exit {run.returncode}\n{run.stderr[-4000:]}"
    return found


@pytest.fixture(scope="module")
def outcomes() -> dict[str, dict[str, Any]]:
    return _run_cases(CASES)


@pytest.fixture(scope="module")
def gpu_outcomes() -> dict[str, dict[str, Any]]:
    import torch

    if not torch.cuda.is_available():
        pytest.skip(
            f"torch {torch.__version__} sees no CUDA device (Ray moves GPU tensors only "
            "as CUDA torch tensors, which the stand-in driver cannot back)"
        )
    return _run_cases(GPU_CASES, timeout=120)  # within gpu_check.sh's cap of the step


@pytest.mark.timeout(1600)
@pytest.mark.parametrize("case", CASES)
def test_case(outcomes: dict[str, dict[str, Any]], case: str) -> None:
    assert case in outcomes, f"{case} did not run: {sorted(outcomes)}"
    assert outcomes[case]["ok"], outcomes[case]["error"]


@pytest.mark.gpu
@pytest.mark.timeout(1600)
@pytest.mark.parametrize("case", GPU_CASES)
def test_cuda_case(gpu_outcomes: dict[str, dict[str, Any]], case: str) -> None:
    """GPU tensors between actors of one GPU (CUDA IPC) and into the driver's GPU buffers."""
    assert case in gpu_outcomes, f"{case} did not run: {sorted(gpu_outcomes)}"
    assert gpu_outcomes[case]["ok"], gpu_outcomes[case]["error"]


@pytest.mark.timeout(600)
def test_the_ray_weight_sync_example_runs_with_its_kill() -> None:
    """examples/ray_weight_sync.py as written (its own local cluster, in a child process; the
    workers at niceness 0, as in tests/_ray_cases.py)."""
    run = subprocess.run(
        [sys.executable, "-W", "error", str(ROOT / "examples" / "ray_weight_sync.py")],
        capture_output=True,
        text=True,
        timeout=540,
        cwd=ROOT,
        env={"RAY_worker_niceness": "0", **os.environ},
    )
    assert run.returncode == 0, f"exit {run.returncode}\n{run.stdout}\n{run.stderr[-4000:]}"
    lines = run.stdout.splitlines()
    assert any(line.startswith("version 3:") and "dead" in line for line in lines), lines
    assert lines[-1] == ("versions 1..5, inference-1 killed and restarted: 3 actors at 5, exact"), (
        lines
    )
