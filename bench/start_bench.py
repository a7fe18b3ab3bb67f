#!/usr/bin/env python3
"""A newcomer's first minutes, timed from a fresh clone: the README's two set-up commands, on a
quiet machine and on a busy one, and ``import rdmaxfer``.

    python bench/start_bench.py [--busy-loops N] [--no-tests] [--json OUT]

The checkout's committed HEAD is cloned into a temporary directory and each command of the
README's "Set-up: two commands" section runs there as written (``bash -c``, a fresh venv,
pip without its cache: ``PIP_NO_CACHE_DIR=1``, so nothing built before is reused):

- ``main job``: the first command (build, install, ``rdmaxfer demo``: a real pull, checked),
  quiet, then again in a new clone while ``--busy-loops`` processes (default: one per logical
  core) spin on the CPU;
- ``tests``: the second command (build, install with the test extra, the suite), quiet
  (``--no-tests`` leaves it out: it takes minutes);
- ``import rdmaxfer`` in the main job's venv: a fresh interpreter per run, ``perf_counter``
  around the import, the median of 7.

Seconds are wall time of the whole command; ``load`` is the 1-minute load average when it
started. Written: bench/results/newcomer-start.json.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_JSON = ROOT / "bench" / "results" / "newcomer-start.json"
IMPORT_RUNS = 7
#: The README's set-up: two ```sh blocks under this heading.
SETUP_HEADING = "## Set-up: two commands"


def readme_commands() -> list[str]:
    """The README's two set-up commands, as written (RuntimeError when the section moved)."""
    text = (ROOT / "README.md").read_text()
    start = text.index(SETUP_HEADING)
    end = text.find("\n## ", start + len(SETUP_HEADING))
    blocks = re.findall(r"```sh\n(.*?)\n```", text[start : end if end > 0 else None], re.DOTALL)
    if len(blocks) != 2:
        raise RuntimeError(f"expected 2 sh blocks under {SETUP_HEADING!r}, found {len(blocks)}")
    return [b.strip() for b in blocks]


def spin() -> None:
    while True:
        pass


def timed(command: str, workdir: Path, busy_loops: int) -> dict[str, Any]:
    """Runs `command` in a fresh clone at `workdir`; its wall time and the load it met."""
    subprocess.run(["git", "clone", "-q", str(ROOT), str(workdir)], check=True)
    loops = [multiprocessing.Process(target=spin, daemon=True) for _ in range(busy_loops)]
    for p in loops:
        p.start()
    try:
        load = os.getloadavg()[0]
        env = {**os.environ, "PIP_NO_CACHE_DIR": "1"}
        env.pop("VIRTUAL_ENV", None)
        start = time.perf_counter()
        run = subprocess.run(
            ["bash", "-c", command], cwd=workdir, env=env, capture_output=True, text=True
        )
        seconds = time.perf_counter() - start
    finally:
        for p in loops:
            p.terminate()
            p.join()
    if run.returncode != 0:
        raise RuntimeError(
            f"{command!r} failed ({run.returncode}):\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
        )
    return {"seconds": round(seconds, 1), "load": round(load, 2), "busy_loops": busy_loops}


def import_ms(venv_python: Path) -> float:
    code = "import time; t = time.perf_counter(); import rdmaxfer; print(time.perf_counter() - t)"
    runs = [
        float(
            subprocess.run(
                [str(venv_python), "-c", code], capture_output=True, text=True, check=True
            ).stdout
        )
        for _ in range(IMPORT_RUNS)
    ]
    return round(statistics.median(runs) * 1e3, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--busy-loops",
        type=int,
        default=os.cpu_count() or 1,
        help="CPU-bound processes during the busy run (default: one per core)",
    )
    parser.add_argument("--no-tests", action="store_true", help="leave out the test command")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON, help="result file")
    args = parser.parse_args()
    main_job, tests = readme_commands()
    rows = []
    with tempfile.TemporaryDirectory(prefix="rdmaxfer-start-") as tmp:
        quiet = timed(main_job, Path(tmp) / "quiet", 0)
        rows.append({"command": "main job", "machine": "quiet", **quiet})
        print(f"main job, quiet: {quiet['seconds']} s", flush=True)
        millis = import_ms(Path(tmp) / "quiet" / ".venv" / "bin" / "python")
        print(f"import rdmaxfer: {millis} ms", flush=True)
        busy = timed(main_job, Path(tmp) / "busy", args.busy_loops)
        rows.append({"command": "main job", "machine": "busy", **busy})
        print(f"main job, busy: {busy['seconds']} s", flush=True)
        if not args.no_tests:
            suite = timed(tests, Path(tmp) / "tests", 0)
            rows.append({"command": "tests", "machine": "quiet", **suite})
            print(f"tests, quiet: {suite['seconds']} s", flush=True)
    result = {
        "cores": os.cpu_count(),
        "python": sys.version.split()[0],
        "commands": rows,
        "import_ms": millis,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
