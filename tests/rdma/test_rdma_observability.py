"""Observability over verbs (issue 12 item 5; the TCP twin is tests/test_observability.py):
Endpoint.stats() / Engine.stats() count exactly what moved, per kind and per QP (lane),
including credit stalls when more sends are posted than the credit window, and the core logs
set-up, teardown and failures to the "rdmaxfer" logger with the peer and the cause."""

from __future__ import annotations

import logging
import time

import numpy as np
import pytest

from rdmaxfer import RemoteAccessError
from rdmaxfer.transport.stats import nonzero

from .rdma_helpers import WAIT_S, api_pair, random_bytes

pytestmark = pytest.mark.rdma


def lane_total(stats: dict[str, int]) -> int:
    return sum(v for k, v in stats.items() if k.startswith("lane") and k.endswith(".bytes"))


def messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "rdmaxfer"]


def test_stats_and_logs_over_verbs_with_a_credit_stall(
    caplog: pytest.LogCaptureFixture, rng: np.random.Generator
) -> None:
    caplog.set_level(logging.DEBUG, logger="rdmaxfer")
    with api_pair() as (server, client, ep, peer):
        assert any(m.startswith("endpoint connected over rdma: rdma to " + ep.peer)
                   for m in messages(caplog)), messages(caplog)  # fmt: skip
        assert any(m.startswith("endpoint accepted over rdma: rdma to ") for m in messages(caplog))
        window = int(ep.info["credit_window"])
        n = window + 4  # 4 sends wait for a credit
        arrays = [random_bytes(rng, 1000 if i % 2 else 20000) for i in range(n)]
        sends = [ep.post_send(x) for x in arrays]
        time.sleep(0.5)
        assert ep.stats()["credit_stalls"] == n - window
        for x in arrays:
            got = peer.recv(timeout=WAIT_S)
            np.testing.assert_array_equal(got, x)
        for s in sends:
            s.wait(timeout=WAIT_S)
        target = np.zeros((1 << 20) + 3, np.uint8)
        region = server.register(target, "rw")
        src = random_bytes(rng, target.size)
        ep.write(src, region.descriptor(), timeout=WAIT_S)
        back = np.zeros(target.size, np.uint8)
        ep.read(back, region.descriptor(), timeout=WAIT_S)
        np.testing.assert_array_equal(target, src)
        np.testing.assert_array_equal(back, src)

        msg_bytes = sum(x.size for x in arrays)
        sa, sb = ep.stats(), peer.stats()
        assert (sa["send.ops"], sa["send.bytes"]) == (n, msg_bytes)
        assert (sb["recv.ops"], sb["recv.bytes"]) == (n, msg_bytes)
        assert (sa["write.ops"], sa["write.bytes"]) == (1, target.size)
        assert (sa["read.ops"], sa["read.bytes"]) == (1, target.size)
        assert sa["ctrl.ops"] == n and sb["ctrl.ops"] == n  # RTS/EAGER one way, CTS back
        assert lane_total(sa) == msg_bytes + 2 * target.size
        assert lane_total(sb) == msg_bytes
        assert all(v == 0 for k, v in sa.items() if k.startswith("errors."))
        # The engine's counters are its one endpoint's; on verbs it also has the level of its
        # receive buffers (the rail's SRQ, or the QP's own), all posted again once the messages
        # were copied out.
        engine = nonzero(client.stats())
        levels = {k: engine.pop(k) for k in ("recv_buffers.posted", "recv_buffers.allocated")}
        assert engine == nonzero(sa)
        held = int(ep.info["srq_buffers"]) + int(ep.info["posted_receives"])
        assert levels["recv_buffers.posted"] == levels["recv_buffers.allocated"] == held > 0, levels

        ep.close()
        closed = [m for m in messages(caplog) if "closed locally" in m]
        assert closed and closed[0].startswith("rdma endpoint to " + ep.peer)
        end = time.monotonic() + WAIT_S
        while not any("closed the endpoint" in m for m in messages(caplog)):
            assert time.monotonic() < end, messages(caplog)
            time.sleep(0.05)
        assert server.stats()["errors.connection"] == 0


def test_a_failed_completion_is_counted_and_logged_with_the_peer(
    caplog: pytest.LogCaptureFixture, rng: np.random.Generator
) -> None:
    caplog.set_level(logging.DEBUG, logger="rdmaxfer")
    with api_pair() as (server, client, ep, _):
        region = server.register(np.zeros(4096, np.uint8), "w")
        desc = region.descriptor()
        region.deregister()
        with pytest.raises(RemoteAccessError):
            ep.write(random_bytes(rng, 4096), desc, timeout=WAIT_S)
        assert ep.stats()["errors.write"] == 1
        assert ep.stats()["errors.connection"] == 1  # verbs tears the QPs down
        assert client.stats()["errors.write"] == 1
        # The message comes from the poller thread once it gets the GIL: maybe after the call.
        end = time.monotonic() + WAIT_S
        while True:
            failed = [
                r
                for r in caplog.records
                if r.getMessage().startswith(f"rdma endpoint to {ep.peer} closed")
            ]
            if failed or time.monotonic() >= end:
                break
            time.sleep(0.01)
        assert failed, caplog.text
        assert failed[0].levelno >= logging.WARNING
        assert "IBV_WC_REM_ACCESS_ERR" in failed[0].getMessage()
