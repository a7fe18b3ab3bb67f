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


def plant(header: Path, include: str) -> int:
    """Adds ``#include "include"`` before the first include of ``header``; returns its line."""
    lines = header.read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith('#include "'))
    lines.insert(at, f'#include "{include}"')
    header.write_text("\n".join(lines) + "\n")
    return at + 1


def test_transport_rooms_in_a_circle_fail(tmp_path: Path) -> None:
    csrc = tmp_path / "csrc"
    shutil.copytree(ROOT / "csrc", csrc)
    plant(csrc / "transport" / "shm" / "shm_transport.h", "transport/tcp/tcp_transport.h")
    one_way = run_check(csrc)
    assert one_way.returncode == 0, one_way.stdout  # a use, not yet a circle
    plant(csrc / "transport" / "tcp" / "tcp_transport.h", "transport/shm/shm_channel.h")
    result = run_check(csrc)
    assert result.returncode == 1
    assert result.stdout == (
        "include cycle between rooms: transport/shm -> transport/tcp -> transport/shm\n"
    )


def test_interface_including_a_transport_fails(tmp_path: Path) -> None:
    csrc = tmp_path / "csrc"
    shutil.copytree(ROOT / "csrc", csrc)
    line = plant(csrc / "transport" / "registry.h", "transport/rdma/rdma_transport.h")
    result = run_check(csrc)
    assert result.returncode == 1
    assert result.stdout == (
        f"transport/registry.h:{line}: the interface of floor 'transport' includes "
        "'transport/rdma/rdma_transport.h' (room 'transport/rdma')\n"
    )


def test_every_transport_folder_is_built_from_its_own_list() -> None:
    """A transport is its folder (sources.cmake, a registration) and its name in the one list
    of CMakeLists.txt."""
    cmake = (ROOT / "CMakeLists.txt").read_text()
    start = "set(RDMAXFER_TRANSPORTS"
    listed = next(line.split()[1:] for line in cmake.splitlines() if line.startswith(start))
    names = [name.rstrip(")") for name in listed]
    folders = sorted(p.parent.name for p in (ROOT / "csrc" / "transport").glob("*/sources.cmake"))
    assert sorted(names) == folders
    for name in names:
        folder = ROOT / "csrc" / "transport" / name
        built = (folder / "sources.cmake").read_text()
        for source in folder.glob("*.cc"):
            assert f"csrc/transport/{name}/{source.name}" in built, source
        assert "TransportRegistration" in (folder / f"{name}_registration.cc").read_text()
        assert f"csrc/transport/{name}/" not in cmake  # only through its sources.cmake
