"""The shared receive queue (issue 15 item 3), in the rxe guest: every RC QP of a rail takes its
two-sided receives (control SENDs, eager messages, WRITE_WITH_IMM) from one SRQ per rail
(csrc/transport/rdma/verbs_srq.h), so the receive buffers an engine posts do not grow with its
peers; RDMAXFER_SRQ=0 (and a device with max_srq 0) falls back to 32 buffers per QP.

- two-sided messages, eager and rendezvous, over many connections of one engine, bytes exact;
- the posted receive buffers as the connections go from 1 to 64: constant with the SRQ, 32 per
  connection without it;
- a peer killed while it sends leaves the SRQ serving the others, every buffer posted again.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from rdmaxfer import (
    ConnectionFailedError,
    Endpoint,
    EndpointClosedError,
    Engine,
    InvalidArgumentError,
)

from .rdma_helpers import WAIT_S, addrs, connect_many, devices, peers_by_tag, random_bytes

#: Receive buffers per QP without an SRQ (ctrl_depth), and the SRQ's first allocation.
PER_QP = 32
SRQ_FIRST = 256


def receive_buffers(endpoints: list[Endpoint]) -> int:
    """Receive buffers the engine of `endpoints` holds for them: its rails' SRQ buffers (the
    same on every endpoint of one rail) plus each QP's own."""
    infos = [ep.info for ep in endpoints]
    srq = int(infos[0]["srq_buffers"]) if infos else 0
    return srq + sum(int(i["posted_receives"]) for i in infos)


def connect_serially(
    client: Engine, server: Engine, port: int, n: int
) -> tuple[list[Endpoint], list[Endpoint]]:
    """`n` more connections, one after the other (each handshake completes before accept())."""
    ours = [client.connect(addrs()[1], port, timeout=WAIT_S) for _ in range(n)]
    return ours, [server.accept(timeout=WAIT_S) for _ in range(n)]


def exchange(rng: np.random.Generator, ours: list[Endpoint], theirs: list[Endpoint]) -> None:
    """From every client endpoint at once: an eager message (1-8000 bytes) and a rendezvous one
    (64 KiB) of random bytes; each arrives exact at its peer."""
    peer_of = peers_by_tag(rng, ours, theirs)
    sent: list[tuple[int, bytes, bytes]] = []
    requests = []
    for i in range(len(theirs)):
        small = random_bytes(rng, int(rng.integers(1, 8000)))
        large = random_bytes(rng, 65536)
        mine = ours[peer_of[i]]
        requests += [mine.post_send(small), mine.post_send(large)]
        sent.append((i, small.tobytes(), large.tobytes()))
    for i, small, large in sent:
        assert theirs[i].recv(timeout=WAIT_S).tobytes() == small
        assert theirs[i].recv(timeout=WAIT_S).tobytes() == large
    for r in requests:
        r.wait(WAIT_S)


def assert_all_reposted(ep: Endpoint) -> None:
    """Every buffer of the SRQ serving ``ep`` is posted again (waited for, bounded by WAIT_S)."""
    info = ep.info
    deadline = time.monotonic() + WAIT_S
    while info["srq_posted"] != info["srq_buffers"] and time.monotonic() < deadline:
        time.sleep(0.05)
        info = ep.info
    assert info["srq_posted"] == info["srq_buffers"] >= SRQ_FIRST, info


def test_messages_over_many_connections_through_the_srq(rng: np.random.Generator) -> None:
    with (
        Engine("rdma", rdma_device=devices()[1]) as server,
        Engine("rdma", rdma_device=devices()[0]) as client,
    ):
        assert f"{devices()[1]} SRQ, {SRQ_FIRST} posted of {SRQ_FIRST}" in server.describe()
        host = addrs()[1]
        port = server.listen(host, 0)
        ours, theirs = connect_many(client, server, host, port, 48)
        for ep in ours + theirs:
            info = ep.info
            assert info["srq"] == 1 and info["posted_receives"] == 0, info
        for _ in range(3):
            exchange(rng, ours, theirs)
        # Every buffer went back to the SRQ once its message was copied out.
        assert_all_reposted(theirs[0])
        assert server.stats()["recv.ops"] >= 2 * 3 * 48


@pytest.mark.parametrize("srq", [True, False])
def test_receive_buffers_do_not_grow_with_the_peers(
    srq: bool, monkeypatch: pytest.MonkeyPatch, rng: np.random.Generator
) -> None:
    if not srq:
        monkeypatch.setenv("RDMAXFER_SRQ", "0")
    with (
        Engine("rdma", rdma_device=devices()[1]) as server,
        Engine("rdma", rdma_device=devices()[0]) as client,
    ):
        if not srq:
            assert "per QP, 32 each (turned off by RDMAXFER_SRQ=0)" in server.describe()
        host = addrs()[1]
        port = server.listen(host, 0)
        ours: list[Endpoint] = []
        theirs: list[Endpoint] = []
        held: dict[int, int] = {}
        for n in (1, 8, 64):
            more_ours, more_theirs = connect_serially(client, server, port, n - len(theirs))
            ours += more_ours
            theirs += more_theirs
            exchange(rng, more_ours, more_theirs)
            held[n] = receive_buffers(theirs)
            # The engine's level says the same (its client side holds none for the server).
            assert server.stats()["recv_buffers.allocated"] == held[n], server.stats()
        print(f"receive buffers posted by the server (srq={srq}): {held}")
        if srq:
            assert all(e.info["srq"] == 1 for e in theirs)
            assert held[1] == held[8] == held[64] == SRQ_FIRST, held
        else:
            assert all(e.info["srq"] == 0 for e in theirs)
            assert held == {n: PER_QP * n for n in (1, 8, 64)}, held


SENDER_SCRIPT = textwrap.dedent(
    """
    import sys
    import numpy as np
    from rdmaxfer import Engine
    with Engine("rdma", rdma_device=sys.argv[1]) as engine:
        ep = engine.connect(sys.argv[2], int(sys.argv[3]), timeout=60)
        data = np.arange(4000, dtype=np.uint8)
        for i in range(10**9):
            ep.send(data, timeout=60)
            if i == 20:
                print("sending", flush=True)
    """
)


def test_a_dead_peer_leaves_the_srq_serving_the_others(rng: np.random.Generator) -> None:
    with (
        Engine("rdma", rdma_device=devices()[1]) as server,
        Engine("rdma", rdma_device=devices()[0]) as client,
    ):
        host = addrs()[1]
        port = server.listen(host, 0)
        child = subprocess.Popen(
            [sys.executable, "-c", SENDER_SCRIPT, devices()[0], host, str(port)],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            doomed = server.accept(timeout=WAIT_S)
            ours, theirs = connect_many(client, server, host, port, 8)
            expected = np.arange(4000, dtype=np.uint8).tobytes()
            for _ in range(21):  # the peer's messages, through the same SRQ
                assert doomed.recv(timeout=WAIT_S).tobytes() == expected
            assert child.stdout is not None and child.stdout.readline() == "sending\n"
            child.kill()  # while it sends
            child.wait(30)
            with pytest.raises((ConnectionFailedError, EndpointClosedError)):
                while True:
                    doomed.recv(timeout=WAIT_S)
            for _ in range(3):
                exchange(rng, ours, theirs)
            assert_all_reposted(theirs[0])
        finally:
            if child.poll() is None:
                child.kill()
                child.wait(10)


def test_an_srq_short_of_buffers_grows(
    monkeypatch: pytest.MonkeyPatch, rng: np.random.Generator
) -> None:
    """An SRQ of one buffer (RDMAXFER_SRQ_BUFFERS=1, the step too): the first receive leaves
    none posted, below the low water, so the SRQ adds a step before the buffer goes back; 4
    peers sending 2 eager messages each at once then wait at most a few RNR retries while it
    grows. Every message arrives exact and the buffers add up."""
    monkeypatch.setenv("RDMAXFER_SRQ_BUFFERS", "1")
    with (
        Engine("rdma", rdma_device=devices()[1]) as server,
        Engine("rdma", rdma_device=devices()[0]) as client,
    ):
        assert f"{devices()[1]} SRQ, 1 posted of 1 (at most 8192)" in server.describe()
        port = server.listen(addrs()[1], 0)
        ours, theirs = connect_serially(client, server, port, 4)
        peer_of = peers_by_tag(rng, ours, theirs)  # tags to the client: its SRQ, not ours
        burst = {i: [random_bytes(rng, 4000) for _ in range(2)] for i in range(4)}
        sends = [ours[peer_of[i]].post_send(x) for i, xs in burst.items() for x in xs]
        got = {i: [theirs[i].recv(timeout=WAIT_S).tobytes() for _ in range(2)] for i in range(4)}
        assert got == {i: [x.tobytes() for x in xs] for i, xs in burst.items()}
        for r in sends:
            r.wait(WAIT_S)
        info = theirs[0].info
        print(f"SRQ of the server after the burst: {info['srq_buffers']} buffers, "
              f"{info['srq_grows']} step(s) added")  # fmt: skip
        assert int(info["srq_grows"]) >= 1, info
        assert info["srq_buffers"] == 1 + int(info["srq_grows"]), info
        assert server.stats()["recv_buffers.allocated"] == info["srq_buffers"]


def test_a_bad_srq_size_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RDMAXFER_SRQ_BUFFERS", "0")
    expected = r"RDMAXFER_SRQ_BUFFERS=0 is not an integer in 1\.\.8192"
    with pytest.raises(InvalidArgumentError, match=expected):
        Engine("rdma", rdma_device=devices()[1])
