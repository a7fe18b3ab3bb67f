"""Scale and fabric settings on verbs (issue 15 items 3-5), in the rxe guest:

- one engine holds 512 connections (its QPs complete on CQs created on demand, cq_set.h),
  while two handshakes stall (a client that never speaks and one that stops after its Hello);
  bytes are exact on every connection (a tag each) and on a sample (64 KiB each); the
  receive buffers stay those of one SRQ per engine (verbs_srq.h), not 32 per connection;
- the service level, traffic class and min_rnr_timer given to the engine (or in the
  environment) reach ibv_modify_qp, and the QPs hold what their link layer carries, read back
  with ibv_query_qp (Endpoint.info): on RoCE the traffic class, on InfiniBand the SL.
"""

from __future__ import annotations

import socket
import time

import numpy as np
import pytest

from rdmaxfer import ConnectionFailedError, Endpoint, Engine, EngineOptions, RdmaOptions

from .rdma_helpers import (
    WAIT_S,
    addrs,
    connect_many,
    devices,
    peers_by_tag,
    raise_fd_limit,
    random_bytes,
)

N_CONNECTIONS = 512
SAMPLE = 32
#: One engine's CQ held 16,384 entries and a connection reserves 288 before issue 15: 56.
OLD_LIMIT = 56


def test_512_connections_with_stalled_handshakes(rng: np.random.Generator) -> None:
    raise_fd_limit(4 * N_CONNECTIONS + 256, f"{N_CONNECTIONS} connections")
    with (
        Engine("rdma", rdma_device=devices()[1]) as server,
        Engine("rdma", rdma_device=devices()[0]) as client,
    ):
        host = addrs()[1]
        port = server.listen(host, 0)
        silent = socket.create_connection((host, port), timeout=10)
        spoke = socket.create_connection((host, port), timeout=10)
        # A valid rdma Hello (transport 2), then nothing: the acceptor waits for its endpoint
        # record on that client's own thread.
        spoke.sendall(
            b"RXHI"
            + bytes([1, 0, 2, 0, 1, 0])
            + bytes(6)
            + (5).to_bytes(8, "little")
            + (11).to_bytes(8, "little")
        )
        assert spoke.recv(16, socket.MSG_WAITALL)[:4] == b"RXOK"

        start = time.monotonic()
        ours, theirs = connect_many(client, server, host, port, N_CONNECTIONS)
        elapsed = time.monotonic() - start
        assert len(ours) > OLD_LIMIT
        print(f"{N_CONNECTIONS} rdma connections set up in {elapsed:.1f} s")

        # Every connection carries a tag from the server; the client learns which of its
        # endpoints is which server endpoint's peer.
        peer_of = peers_by_tag(rng, ours, theirs)

        # 64 KiB of random bytes each way on a sample of the connections.
        for i in rng.choice(N_CONNECTIONS, size=SAMPLE, replace=False):
            mine, yours = ours[peer_of[int(i)]], theirs[int(i)]
            up, down = random_bytes(rng, 65536), random_bytes(rng, 65536)
            r1, r2 = mine.post_send(up), yours.post_send(down)
            assert yours.recv(timeout=WAIT_S).tobytes() == up.tobytes()
            assert mine.recv(timeout=WAIT_S).tobytes() == down.tobytes()
            r1.wait(WAIT_S)
            r2.wait(WAIT_S)
        silent.close()
        spoke.close()

        # Receive buffers (16 KiB each) come from each engine's SRQ, not 32 per QP: 512 peers
        # would have held 16,384 (256 MiB) each; the burst of 512 tags may grow the client's.
        held = {
            "server": server.stats()["recv_buffers.allocated"],
            "client": client.stats()["recv_buffers.allocated"],
        }
        print(f"receive buffers with {N_CONNECTIONS} connections: {held}")
        assert all(256 <= n <= 1024 for n in held.values()), held

        # Closing the server engine starts all 512 closes, then waits: each client endpoint
        # learns of its own (the GOODBYE, not an error) and every receive pending there fails.
        pending = [ep.post_recv() for ep in ours]
        server.close()
        assert all(ep.closed for ep in theirs)
        for r in pending:
            with pytest.raises(ConnectionFailedError, match="closed the endpoint"):
                r.wait(WAIT_S)


def applied(ep: Endpoint) -> tuple[object, object, object]:
    """The settings the engine gave ibv_modify_qp (INIT -> RTR)."""
    info = ep.info
    return (
        info["applied_service_level"],
        info["applied_traffic_class"],
        info["applied_min_rnr_timer"],
    )


def assert_held(ep: Endpoint, service_level: int, traffic_class: int, min_rnr_timer: int) -> None:
    """What the QP holds (ibv_query_qp) and what the link layer carries: on RoCE the traffic
    class (the IP TOS byte) rides in every packet's GRH, and the SL is no field of the QP that
    rxe keeps (it reads back 0); on InfiniBand the SL is in the address, with no GRH."""
    info = ep.info
    assert info["min_rnr_timer"] == min_rnr_timer
    if info["roce"]:
        assert applied(ep) == (service_level, traffic_class, min_rnr_timer)
        assert info["traffic_class"] == traffic_class
    else:
        assert applied(ep) == (service_level, 0, min_rnr_timer)
        assert info["service_level"] == service_level


def _engine(source: str, device: str) -> Engine:
    if source == "arguments":
        return Engine(
            "rdma", rdma_device=device, service_level=3, traffic_class=104, min_rnr_timer=12
        )
    if source == "options":
        settings = RdmaOptions(device=device, service_level=3, traffic_class=104, min_rnr_timer=12)
        return Engine("rdma", options=[settings, EngineOptions(poll_mode="event")])
    return Engine("rdma", rdma_device=device)


@pytest.mark.parametrize("source", ["arguments", "environment", "options"])
def test_fabric_settings_reach_the_qps(
    source: str, monkeypatch: pytest.MonkeyPatch, rng: np.random.Generator
) -> None:
    if source == "environment":
        monkeypatch.setenv("RDMAXFER_SERVICE_LEVEL", "3")
        monkeypatch.setenv("RDMAXFER_TRAFFIC_CLASS", "104")
        monkeypatch.setenv("RDMAXFER_MIN_RNR_TIMER", "12")
    with _engine(source, devices()[1]) as server, _engine(source, devices()[0]) as client:
        assert "SL 3, traffic class 104 (DSCP 26), min RNR timer 12 (0.64 ms)" in server.describe()
        port = server.listen(addrs()[1], 0)
        ep = client.connect(addrs()[1], port, timeout=WAIT_S)
        peer = server.accept(timeout=WAIT_S)
        assert ep.info["roce"] == 1  # rxe: RoCE v2
        assert_held(ep, 3, 104, 12)
        assert_held(peer, 3, 104, 12)
        data = random_bytes(rng, 300_000)
        sending = ep.post_send(data)
        assert peer.recv(timeout=WAIT_S).tobytes() == data.tobytes()
        sending.wait(WAIT_S)


def test_default_fabric_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RDMAXFER_SERVICE_LEVEL", "RDMAXFER_TRAFFIC_CLASS", "RDMAXFER_MIN_RNR_TIMER"):
        monkeypatch.delenv(name, raising=False)
    with (
        Engine("rdma", rdma_device=devices()[1]) as server,
        Engine("rdma", rdma_device=devices()[0]) as client,
    ):
        port = server.listen(addrs()[1], 0)
        ep = client.connect(addrs()[1], port, timeout=WAIT_S)
        peer = server.accept(timeout=WAIT_S)
        assert_held(ep, 0, 0, 18)
        assert_held(peer, 0, 0, 18)
