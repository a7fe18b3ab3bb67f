"""The build keeps the verbs and ofi transports on a machine without libibverbs-dev or
libfabric-dev.

The verbs sources compile against rdma-core's headers vendored in third_party/rdma-core, so a
build where /usr/include/infiniband and /usr/include/rdma are hidden (a private mount namespace,
tests/without-verbs-headers.sh) still compiles the rdma transport. CI (.ci/run) builds a
whole wheel that way and checks ``rdmaxfer info`` in the rxe guest; this test configures the
project file by file (``RDMAXFER_UNITY=OFF``, so that an object is one source) and compiles the
translation units that need the verbs headers.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HIDE = ROOT / "tests" / "without-verbs-headers.sh"
VENDORED = ROOT / "third_party" / "rdma-core" / "include"
OBJECTS = {
    "verbs_api": "CMakeFiles/rdmaxfer_core.dir/csrc/transport/rdma/verbs_api.cc.o",
    "registration": "CMakeFiles/rdmaxfer_core.dir/csrc/transport/rdma/rdma_registration.cc.o",
    # libfabric's headers are vendored too (third_party/libfabric), hidden with /usr/include/rdma
    "ofi_domain": "CMakeFiles/rdmaxfer_core.dir/csrc/transport/ofi/ofi_domain.cc.o",
}


def _hidden(command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(HIDE), "bash", "-c", command], capture_output=True, text=True, timeout=240
    )


@pytest.fixture(scope="module")
def hidden_build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CMake build tree configured with the system verbs headers hidden, holding the objects
    in OBJECTS compiled there."""
    import pybind11

    for tool in ("cmake", "ninja", "unshare", "c++"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} not found: the build test needs it (pip install '.[test]')")
    probe = _hidden("echo '#include <infiniband/verbs.h>' | c++ -fsyntax-only -x c++ -")
    if "rdmaxfer-hidden" not in _hidden("cat /proc/self/mounts").stdout:
        pytest.skip(f"cannot hide the system headers (no private mount namespace): {probe.stderr}")
    assert probe.returncode != 0, "the system's infiniband/verbs.h is still visible"
    assert "infiniband/verbs.h" in probe.stderr
    build = tmp_path_factory.mktemp("hidden-verbs-build")
    configure = (
        f"cmake -S {ROOT} -B {build} -G Ninja -DCMAKE_BUILD_TYPE=Debug "
        f"-DRDMAXFER_UNITY=OFF -Dpybind11_DIR={pybind11.get_cmake_dir()} "
        f"-DPython_EXECUTABLE={sys.executable}"
    )
    compile_ = f"ninja -C {build} {' '.join(OBJECTS.values())}"
    done = _hidden(f"{configure} && {compile_}")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return build


def _headers_used(build: Path, obj: str) -> list[str]:
    deps = subprocess.run(
        ["ninja", "-C", str(build), "-t", "deps", obj], capture_output=True, text=True, check=True
    ).stdout
    return [line.strip() for line in deps.splitlines()[1:] if line.strip()]


def test_verbs_transport_compiles_without_system_headers(hidden_build: Path) -> None:
    for name, obj in OBJECTS.items():
        assert (hidden_build / obj).stat().st_size > 0, name
    used = _headers_used(hidden_build, OBJECTS["verbs_api"])
    verbs_h = [h for h in used if h.endswith("/infiniband/verbs.h")]
    assert verbs_h == [str(VENDORED / "infiniband" / "verbs.h")]


def test_registration_builds_the_rdma_transport_without_system_headers(hidden_build: Path) -> None:
    # The registration is what makes 'rdma' constructible: it must have compiled RdmaTransport in.
    used = _headers_used(hidden_build, OBJECTS["registration"])
    assert str(ROOT / "csrc" / "transport" / "rdma" / "rdma_transport.h") in used
    assert str(VENDORED / "rdma" / "ib_user_verbs.h") in used
    symbols = subprocess.run(
        ["nm", "-C", str(hidden_build / OBJECTS["registration"])],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "rdmaxfer::RdmaTransport::RdmaTransport" in symbols


def test_ofi_transport_compiles_against_the_vendored_libfabric_headers(hidden_build: Path) -> None:
    used = _headers_used(hidden_build, OBJECTS["ofi_domain"])
    fabric_h = [h for h in used if h.endswith("/rdma/fabric.h")]
    assert fabric_h == [str(ROOT / "third_party" / "libfabric" / "include" / "rdma" / "fabric.h")]


def test_installed_core_has_the_rdma_transport() -> None:
    from rdmaxfer import _core

    assert {"endpoint_record", "control"} <= set(_core.record_kinds())
    reason = _core.available_transports()["rdma"]
    assert "built without" not in reason
