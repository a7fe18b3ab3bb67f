"""Helpers shared by the verbs-transport tests (engines on the rxe devices of the test VM)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from rdmaxfer import Endpoint, Engine, _core

SKIP_REASON = "no RDMA device (run inside tests/rxe/run-in-vm.sh)"
#: Every bounded wait in these tests (TCG emulation is slow, but never this slow).
WAIT_S = 60.0

RW = _core.ACCESS_REMOTE_READ | _core.ACCESS_REMOTE_WRITE


def rdma_reason() -> str:
    return _core.available_transports().get("rdma", "unknown transport")


def devices() -> list[str]:
    return os.environ.get("RDMAXFER_RXE_DEVICES", "rxe0 rxe1").split()


def rails(index: int) -> list[str]:
    """The rails of side `index` (0: client, 1: server): with ``run-in-vm.sh --rails 2``
    (``RDMAXFER_RXE_RAIL_DEVICES="rxe0,rxe2 rxe1,rxe3"``) two devices each, else
    ``[devices()[index]]``."""
    sides = os.environ.get("RDMAXFER_RXE_RAIL_DEVICES", "").split()
    return sides[index].split(",") if len(sides) == 2 else [devices()[index]]


def addrs() -> list[str]:
    return os.environ.get("RDMAXFER_RXE_ADDRS", "10.77.0.1 10.77.0.2").split()


def make_engine(index: int, **kwargs: object) -> _core.Engine:
    """An rdma engine on side `index`'s rails (0: rxe0 [+rxe2], 1: rxe1 [+rxe3]); GID from
    RDMAXFER_GID_INDEX/auto."""
    return _core.Engine("rdma", rdma_devices=rails(index), **kwargs)  # type: ignore[arg-type]


@dataclass
class RdmaPair:
    server: _core.Engine  # on rxe1, listening on 10.77.0.2
    client: _core.Engine  # on rxe0
    a: _core.Endpoint  # the client's (connected) endpoint
    b: _core.Endpoint  # the server's (accepted) endpoint
    port: int

    def reconnect(self, streams: int = 0) -> tuple[_core.Endpoint, _core.Endpoint]:
        a = self.client.connect(addrs()[1], self.port, streams, WAIT_S)
        b = self.server.accept(WAIT_S)
        return a, b


def connect_pair(streams: int = 0, **kwargs: object) -> RdmaPair:
    server = make_engine(1, **kwargs)
    client = make_engine(0, **kwargs)
    port = server.listen(addrs()[1], 0)
    a = client.connect(addrs()[1], port, streams, WAIT_S)
    b = server.accept(WAIT_S)
    return RdmaPair(server, client, a, b, port)


@contextmanager
def api_pair(secret: str = "rxe-tests") -> Iterator[tuple[Engine, Engine, Endpoint, Endpoint]]:
    """Python-API engines on rxe1 (server, listening on 10.77.0.2) and rxe0 (client), and the
    client's and the server's endpoint of one connection; everything closed on exit."""
    with (
        Engine("rdma", rdma_devices=rails(1), secret=secret) as server,
        Engine("rdma", rdma_devices=rails(0), secret=secret) as client,
    ):
        port = server.listen(addrs()[1], 0)
        ep = client.connect(addrs()[1], port, timeout=WAIT_S)
        peer = server.accept(timeout=WAIT_S)
        yield server, client, ep, peer


def random_bytes(rng: np.random.Generator, n: int) -> np.ndarray:
    """n random bytes, never all zeros."""
    data = rng.integers(0, 256, size=n, dtype=np.uint8)
    if n and not data.any():
        data[0] = 1
    return data


def region_array(region: _core.Region) -> np.ndarray:
    return np.frombuffer(region, dtype=np.uint8)  # type: ignore[call-overload]


def wait_ok(request: _core.Request, timeout: float = WAIT_S) -> None:
    assert request.wait(timeout), f"{request.op} did not finish within {timeout} s"
    request.check()
