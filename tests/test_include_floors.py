"""The C++ include floors (tools/check_layers.py): the tree passes, an upward include fails."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tools" / "check_layers.py"


def run_check(csrc: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), str(csrc)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_csrc_includes_only_its_own_floor_and_below() -> None:
    result = run_check(ROOT / "csrc")
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout == ""


def test_planted_upward_include_fails(tmp_path: Path) -> None:
    csrc = tmp_path / "csrc"
    shutil.copytree(ROOT / "csrc", csrc)
    header = csrc / "transport" / "transport.h"
    lines = header.read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith('#include "'))
    lines.insert(at, '#include "engine/engine.h"')
    header.write_text("\n".join(lines) + "\n")
    result = run_check(csrc)
    assert result.returncode == 1
    assert result.stdout == (
        f"transport/transport.h:{at + 1}: floor 'transport' includes 'engine/engine.h' "
        "(floor 'engine', above)\n"
    )
    assert "1 include(s) against the floors common -> core -> cuda" in result.stderr


def test_file_outside_the_floors_fails(tmp_path: Path) -> None:
    csrc = tmp_path / "csrc"
    (csrc / "misc").mkdir(parents=True)
    (csrc / "misc" / "x.h").write_text("#pragma once\n")
    result = run_check(csrc)
    assert result.returncode == 1
    assert result.stdout.startswith("misc/x.h: not on a floor")
