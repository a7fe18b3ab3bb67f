"""Shared fixtures: engines, a connected endpoint pair over loopback, seeded random data and
peers in other processes (see _peers.py)."""

from __future__ import annotations

import os
import signal
import socket
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

import _cuda_standin
import rdmaxfer
from _common import OFI_ENV, Pair
from _peers import Peer
from rdmaxfer import Engine

#: The host transports every test of the pair/server/client fixtures runs on.
HOST_TRANSPORTS = ("tcp", "shm")

#: libfabric's tcp provider binds the first interface unless told: loopback only, in this
#: process and every peer it starts (read when libfabric first initialises its providers).
os.environ["FI_TCP_IFACE"] = "lo"

#: The modules whose pair/server/client tests also run over transport="ofi" (libfabric's
#: tcp;ofi_rxm provider on loopback): the promises every transport keeps (one-sided bounds and
#: revocation, messages, batches with per-entry status and notifications, timeouts,
#: integrity), without multiplying the rest of the matrix.
OFI_MODULES = frozenset(
    {
        "test_endpoint",
        "test_endpoint_one_sided",
        "test_batch",
        "test_timeouts",
        "test_integrity",
        "test_api",
        "test_async",
        "test_peer_death",
    }
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keeps the "ofi" runs of the transport fixture to the tests of OFI_MODULES."""
    kept, dropped = [], []
    for item in items:
        callspec = getattr(item, "callspec", None)
        ofi = callspec is not None and callspec.params.get("transport") == "ofi"
        module = item.module.__name__ if isinstance(item, pytest.Function) else ""
        (dropped if ofi and module not in OFI_MODULES else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


@pytest.fixture(params=(*HOST_TRANSPORTS, "ofi"))
def transport(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each host transport in turn ("shm" skips, with the reason, where it cannot run; "auto",
    from _common.WITH_AUTO, always runs; "ofi" runs libfabric's tcp;ofi_rxm provider on
    loopback, OFI_ENV). It is also RDMAXFER_TRANSPORT for the test, so that the module-level API
    and peers started in other processes use it too."""
    name = str(request.param)
    if name == "ofi":
        for key, value in OFI_ENV.items():
            monkeypatch.setenv(key, value)
    known = {**rdmaxfer._core.available_transports(), "auto": ""}
    why = known.get(name, "unknown transport")
    if why:
        pytest.skip(f"transport {name!r} is unavailable here: {why}")
    monkeypatch.setenv("RDMAXFER_TRANSPORT", name)
    return name


@pytest.fixture
def server(transport: str) -> Iterator[Engine]:
    with Engine(transport) as engine:
        yield engine


@pytest.fixture
def client(transport: str) -> Iterator[Engine]:
    with Engine(transport) as engine:
        yield engine


@pytest.fixture
def pair(server: Engine, client: Engine) -> Pair:
    port = server.listen("127.0.0.1", 0)
    a = client.connect("127.0.0.1", port, timeout=10)
    b = server.accept(timeout=10)
    return Pair(server, client, a, b, port)


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    """A generator seeded from the test's id: random, yet reproducible per test."""
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


@pytest.fixture
def seed(rng: np.random.Generator) -> int:
    return int(rng.integers(1, 2**31))


@pytest.fixture
def spawn() -> Iterator[Callable[..., Peer]]:
    """spawn(target, *args) starts ``target(conn, *args)`` in a new process; every peer is
    killed at the end of the test."""
    peers: list[Peer] = []

    def start(target: Any, *args: Any) -> Peer:
        peer = Peer(target, *args)
        peers.append(peer)
        return peer

    yield start
    for peer in peers:
        peer.close()


@pytest.fixture
def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(autouse=True)
def _fresh_api() -> Iterator[None]:
    """Each test starts and ends without module-level engines or cached endpoints."""
    rdmaxfer.shutdown()
    yield
    rdmaxfer.shutdown()


def pytest_addoption(parser: pytest.Parser, pluginmanager: pytest.PytestPluginManager) -> None:
    """pyproject.toml's addopts give ``-n 4 --dist worksteal`` (pytest-xdist, of the test
    extra). Where pytest-xdist is not installed or is turned off (``-p no:xdist``), both are
    accepted and the suite runs in this process."""
    if not pluginmanager.hasplugin("xdist"):
        # _addoption: a plugin's way to add a one-letter option (pytest-xdist adds -n so too)
        group = parser.getgroup("xdist", "without pytest-xdist: accepted, ignored")
        group._addoption("-n", dest="numprocesses", default=0, help="ignored")
        group._addoption("--dist", dest="dist", default="no", help="ignored")


#: The stand-in's path, when pytest_configure installed it.
_STANDIN = pytest.StashKey[str]()


def _gpu_selected(config: pytest.Config) -> bool:
    """True when ``-m`` asks for the GPU tests (``-m gpu``, ``-m "gpu and rdma"``...)."""
    expr = str(config.getoption("markexpr") or "")
    return "gpu" in expr and "not gpu" not in expr


def pytest_configure(config: pytest.Config) -> None:
    """``pytest -m gpu`` on a machine without an NVIDIA driver runs the GPU tests over the
    stand-in driver (tests/_cuda_standin.py). It is set before any test loads CUDA.

    A suite started in the background of a non-interactive shell (``pytest &`` in a script)
    inherits SIGINT ignored, and so would every child it starts: the Ctrl-C tests would wait
    for children that never see their SIGINT. Python's own handler is put back (a handler,
    unlike "ignored", is reset to the default in a child at exec)."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if _gpu_selected(config):
        path = _cuda_standin.install()
        if path is not None:
            config.stash[_STANDIN] = path


def pytest_report_header(config: pytest.Config) -> str | None:
    path = config.stash.get(_STANDIN, None)
    return f"CUDA: stand-in driver {path} (no NVIDIA driver here)" if path else None


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """``-m gpu`` that ran no GPU test fails: a GPU run that only skipped proves nothing.
    ``--collect-only`` runs none, and is left alone."""
    if not _gpu_selected(session.config) or exitstatus != 0 or session.config.option.collectonly:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    passed = reporter.stats.get("passed", []) if reporter is not None else []
    if not any("gpu" in report.keywords for report in passed):
        if reporter is not None:
            reporter.write_line("FAILED: -m gpu selected, but no GPU test passed", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
