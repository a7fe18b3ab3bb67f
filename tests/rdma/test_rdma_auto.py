"""transport="auto" inside the rxe guest (issue 14, item 2): both soft-RoCE devices are on one
host, so an automatic engine's network transport is verbs, yet a peer process of the guest that
connects automatically gets shm, served by the same verbs registrations (keyed by rkey), while
a peer that forces "rdma" gets a verbs connection to the same listener at the same time."""

from __future__ import annotations

import numpy as np
import pytest

from _common import write_halves
from rdmaxfer import Engine, _core

from .rdma_helpers import WAIT_S, addrs, devices

SHM_WHY = _core.available_transports().get("shm", "unknown")
pytestmark = [
    pytest.mark.rdma,
    pytest.mark.skipif(SHM_WHY != "", reason=f"shm unavailable in the guest: {SHM_WHY}"),
]


def test_auto_gives_shm_to_a_guest_peer_and_rdma_to_a_forced_one(
    rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RDMAXFER_TRANSPORT", raising=False)
    secret = "rxe-auto"
    with (
        Engine("auto", rdma_device=devices()[1], secret=secret) as server,
        Engine("auto", rdma_device=devices()[0], secret=secret) as near,
        Engine("rdma", rdma_device=devices()[0], secret=secret) as forced,
    ):
        assert server.transport == "rdma" and server.shm_off == ""
        port = server.listen(addrs()[1], 0)
        a = near.connect(addrs()[1], port, timeout=WAIT_S)
        b = server.accept(timeout=WAIT_S)
        c = forced.connect(addrs()[1], port, timeout=WAIT_S)
        d = server.accept(timeout=WAIT_S)
        assert (a.info["transport"], b.info["transport"]) == ("shm", "shm")
        assert (c.info["transport"], d.info["transport"]) == ("rdma", "rdma")
        assert server.links() == {"shm": 1, "rdma": 1}
        write_halves(server, a, c, rng, WAIT_S)  # one verbs registration (rkey) serves both
        data = rng.integers(0, 256, 3 << 20, dtype=np.uint8)
        sending = b.post_send(data)
        assert a.recv(timeout=WAIT_S).tobytes() == data.tobytes()
        sending.wait(WAIT_S)
