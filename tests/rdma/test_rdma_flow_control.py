"""Bounded control traffic on verbs: messages are flow-controlled by credits, so a receiver that
does not call recv holds at most the credit window of announced messages, later sends wait at
the sender (bounded by their timeout, with an error that says why), and nothing is lost."""

from __future__ import annotations

import time

import numpy as np
import pytest

from rdmaxfer.errors import TransferTimeoutError

from .rdma_helpers import RW, RdmaPair, api_pair, random_bytes, region_array, wait_ok

pytestmark = pytest.mark.rdma


def test_sends_past_the_window_wait_for_the_receiver(
    rdma_pair: RdmaPair, rng: np.random.Generator
) -> None:
    a, b = rdma_pair.a, rdma_pair.b
    window = int(a.attributes()["credit_window"])
    assert 1 <= window <= 32
    n = window * 12  # far more than the window
    sizes = [4096 if i % 3 else 20000 for i in range(n)]  # EAGER and rendezvous messages
    offsets = np.cumsum([0, *sizes])
    src = rdma_pair.client.alloc_pinned(int(offsets[-1]), 0)
    region_array(src)[:] = random_bytes(rng, int(offsets[-1]))
    sends = [a.post_send(src, int(offsets[i]), sizes[i], f"m{i}".encode()) for i in range(n)]
    time.sleep(1.0)  # everything that could travel has
    assert b.attributes()["messages_waiting_for_recv"] == window
    assert a.attributes()["sends_waiting_for_credit"] == n - window
    assert not any(s.done() for s in sends)
    dst = rdma_pair.server.alloc_pinned(int(offsets[-1]), RW)
    for i in range(n):  # every message arrives, in order, byte-exact
        header = b.post_recv_header()
        wait_ok(header)
        msg_id, length, meta = header.message()
        assert (meta, length) == (f"m{i}".encode(), sizes[i])
        wait_ok(b.post_recv(msg_id, dst, int(offsets[i]), length))
        assert b.attributes()["messages_waiting_for_recv"] <= window
    for s in sends:
        wait_ok(s)
    np.testing.assert_array_equal(region_array(dst), region_array(src))
    assert a.attributes()["sends_waiting_for_credit"] == 0


def test_a_send_to_a_peer_that_never_receives_times_out_clearly(
    rng: np.random.Generator,
) -> None:
    with api_pair() as (_, _, ep, peer):
        window = int(ep.info["credit_window"])
        arrays = [random_bytes(rng, 1000) for _ in range(window * 10)]
        transfers = [ep.post_send(x) for x in arrays]
        time.sleep(1.0)
        assert peer.info["messages_waiting_for_recv"] == window  # bounded
        with pytest.raises(
            TransferTimeoutError,
            match=r"made no progress for 2 s \(timeout\): 0 of 1000 bytes moved in [\d.]+ s: "
            r"the receiver is not receiving.*waiting for flow-control credit",
        ):
            transfers[-1].wait(2)
        assert ep.closed  # a timed-out transfer aborts its endpoint; the engine goes on
