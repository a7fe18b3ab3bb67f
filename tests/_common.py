"""Names shared by the host test modules (kept out of conftest.py, which tests/rdma also has)."""

from __future__ import annotations

import importlib.util
import os
import signal
import struct
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import numpy as np

from rdmaxfer import Endpoint, Engine, _core

#: The host transports and "auto" (per connection: shm for a same-host peer): the failure suites
#: (peer death, kill loop) run on each through ``pytest.mark.parametrize("transport", ...,
#: indirect=True)`` of the ``transport`` fixture.
WITH_AUTO = ("tcp", "shm", "auto")

#: The environment of transport="ofi" in the tests: libfabric's tcp;ofi_rxm provider, pinned
#: to loopback (never another interface).
OFI_ENV = {
    "RDMAXFER_OFI_PROVIDER": "tcp;ofi_rxm",
    "RDMAXFER_OFI_IFACE": "lo",
    "FI_TCP_IFACE": "lo",
}


def bench_module(name: str) -> ModuleType:
    """The script ``bench/<name>.py`` loaded as a module (bench/ is not a package; its scripts
    import their siblings, as when run from there)."""
    path = Path(__file__).resolve().parents[1] / "bench" / f"{name}.py"
    if str(path.parent) not in sys.path:
        sys.path.append(str(path.parent))
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def same_host_transport(transport: str) -> str:
    """The transport of a connection between two processes of this host under ``transport``
    (RDMAXFER_TRANSPORT unset): "auto" gives shm where it can run, else tcp."""
    if transport != "auto":
        return transport
    return "shm" if _core.available_transports().get("shm") == "" else "tcp"


def write_halves(
    owner: Engine, first: Endpoint, second: Endpoint, rng: np.random.Generator, timeout: float
) -> None:
    """``first`` and ``second``, connections to ``owner`` over different transports, WRITE
    random bytes into the two halves of one registration of ``owner`` at once; ``first`` READs
    the whole back. Every byte is checked."""
    target = np.zeros(2 << 20, np.uint8)
    region = owner.register(target)
    x = rng.integers(0, 256, 1 << 20, dtype=np.uint8)
    y = rng.integers(0, 256, 1 << 20, dtype=np.uint8)
    wx = first.post_write(x, region.descriptor())
    wy = second.post_write(y, region.descriptor(), remote_offset=1 << 20)
    wx.wait(timeout)
    wy.wait(timeout)
    assert target[: 1 << 20].tobytes() == x.tobytes()
    assert target[1 << 20 :].tobytes() == y.tobytes()
    back = np.zeros_like(target)
    first.read(back, region.descriptor(), timeout=timeout)
    assert back.tobytes() == target.tobytes()
    region.deregister()


#: Slack allowed past a timeout before "raised within the timeout" counts as failed.
MARGIN_S = 5.0


@dataclass
class Pair:
    """Two engines in this process connected over loopback."""

    server: Engine
    client: Engine
    a: Endpoint  # the client's endpoint (connected)
    b: Endpoint  # the server's endpoint (accepted)
    port: int


def interrupt_when_waiting(thread_id: int, bound_s: float = 30.0) -> threading.Thread:
    """Send SIGINT to this process once the thread ``thread_id`` waits in the core (its
    innermost Python frame is one that waits in the core: the lean path's ``_run``, whose
    ``Endpoint.post_*_wait`` posts and waits, its ``_settle`` or ``Transfer._wait``, which call
    ``Request.wait``), so that the signal lands in the wait and not, on a loaded machine,
    in the Python code before it. After ``bound_s`` seconds it is sent anyway."""

    def run() -> None:
        end = time.monotonic() + bound_s
        while time.monotonic() < end:
            frame = sys._current_frames().get(thread_id)
            if frame is not None and frame.f_code.co_name in ("_run", "_settle", "_wait"):
                time.sleep(0.05)  # well inside the wait's first 0.1 s poll
                break
            time.sleep(0.005)
        os.kill(os.getpid(), signal.SIGINT)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def ofi_record(addresses: list[bytes], provider: bytes, max_msg: int = 1 << 30) -> bytes:
    """An ofi endpoint record (transport/ofi/ofi_wire.h): version 1 for one rail, 2 for more."""
    extra = b"".join(struct.pack("<H", len(a)) + a for a in addresses[1:])
    version = 2 if len(addresses) > 1 else 1
    head = b"RXOF" + struct.pack(
        "<HHQHBBI", version, len(addresses[0]), max_msg, len(provider), len(addresses) - 1, 0,
        len(extra),
    )  # fmt: skip
    return head + addresses[0] + provider + extra


def wait_for(what: str, check: Callable[[], bool], timeout: float = 60.0) -> None:
    """Polls `check` every 0.1 s until true; fails naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(0.1)
