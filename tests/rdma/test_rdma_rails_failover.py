"""Rail failover (``tests/rxe/run-in-vm.sh --rails 2``): the client on rxe0+rxe2, the server on
rxe1+rxe3 (rxe0/rxe1 on 10.77.0.0/24, rxe2/rxe3 on 10.78.0.0/24). A rail that fails
mid-transfer (its port down, its QP in error, or its device deleted with `rdma link delete`)
hands its chunks to the other and the transfer completes; a deleted device is let go of, so its
deletion completes; when the control rail fails, the control lane moves to the other rail on both
sides and messages, grants and notifications go on; only when no rail is left does it fail,
naming every rail's cause."""

from __future__ import annotations

import functools
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np
import pytest

from rdmaxfer import _core
from rdmaxfer.errors import ConnectionFailedError

from .rdma_helpers import (
    DELETE_BOUND_S,
    MIB,
    RW,
    TWO_RAILS,
    WAIT_S,
    deleted_within_bound,
    deleting,
    port_active,
    rail_bytes,
    rail_pair,
    random_bytes,
    region_array,
    run_cmd,
    send_and_notify,
    set_link,
    wait_for,
    wait_ok,
)

pytestmark = [pytest.mark.rdma, TWO_RAILS]


#: (client, server, the client's and the server's endpoint, the WRITE, a check that its bytes
#: landed exactly)
StripedWrite = tuple[
    _core.Engine, _core.Engine, _core.Endpoint, _core.Endpoint, _core.Request, Callable[[], bool]
]


@contextmanager
def striped_write(
    rng: np.random.Generator, size: int = 64 * MIB, before: tuple[str, ...] = ()
) -> Iterator[tuple[_core.Endpoint, _core.Request, Callable[[], bool]]]:
    """A striped WRITE of `size` random bytes in 64 KiB chunks, yielded once an eighth has moved,
    with the client's endpoint and a check that the server holds exactly the bytes sent.
    `before`: a command run once connected, before the WRITE is posted. 64 MiB by default: on an
    idle host the guest's rxe moved 24 MiB before the first look at its progress (0.1 s)."""
    with striped_write_on(rng, size, before) as (_, _, a, _, request, exact):
        yield a, request, exact


@contextmanager
def striped_write_on(
    rng: np.random.Generator, size: int = 64 * MIB, before: tuple[str, ...] = ()
) -> Iterator[StripedWrite]:
    """striped_write, with the client and server engines too."""
    with rail_pair() as (client, server, a, b):
        if before:
            run_cmd(*before)
        src = client.alloc_pinned(size, 0)
        dst = server.alloc_pinned(size, RW)
        data = random_bytes(rng, size)
        region_array(src)[:] = data
        request = a.post_write(src, 0, dst.descriptor(), 0, size, chunk_size=64 * 1024)
        wait_for("an eighth of the write", lambda: request.moved >= size // 8 or request.done())
        assert not request.done(), "the write finished before a rail could fail: make it larger"
        yield client, server, a, b, request, lambda: bool(np.array_equal(region_array(dst), data))


def test_port_down_mid_transfer_moves_its_chunks(rng: np.random.Generator) -> None:
    try:
        with striped_write(rng) as (a, request, exact):
            set_link("veth2", "down")  # rxe2's port goes down (PORT_ERR)
            wait_ok(request)
            assert exact()
            text = a.describe()
            assert "rxe0 up" in text and "rxe2 failed (" in text, text
            assert a.attributes()["rail_rxe2_up"] == 0 and not a.closed
            assert sum(rail_bytes(a).values()) >= 64 * MIB  # resent chunks count twice
    finally:
        set_link("veth2", "up")
        wait_for("rxe2 ACTIVE again", lambda: port_active("rxe2"))


def test_qp_in_error_mid_transfer_moves_its_chunks(
    rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """rxe2's QP goes to ERR once rxe2 carried 4 MiB of a striped WRITE (the tests-only knob
    RDMAXFER_RDMA_TEST_QP_ERR): its WRs flush, its chunks move to rxe0, the WRITE is exact.
    64 MiB, so that rxe2 still has most of its 32 MiB to carry when the completion crossing
    4 MiB is handled (completions are signaled sparsely and their thread can lag rxe: with
    24 MiB every WR had once completed by then, and nothing was left to fail over)."""
    monkeypatch.setenv("RDMAXFER_RDMA_TEST_QP_ERR", f"rxe2:{4 * MIB}")
    with striped_write(rng, 64 * MIB) as (a, request, exact):
        wait_ok(request)
        assert exact()
        text = a.describe()
        # Its flushed WRs (or, without an SRQ, its flushed receives) say why; the rail may
        # have rejoined since (its QP renewed and probed, test_rdma_rails_heal.py).
        assert "rxe0 up" in text, text
        assert "rxe2 failed (a " in text or "rxe2 up (rejoined 1x, last failure: a " in text, text
        assert "IBV_WC_WR_FLUSH_ERR" in text and not a.closed, text
        assert rail_bytes(a)["rxe2"] >= 4 * MIB


def test_device_deleted_mid_transfer_is_released(rng: np.random.Generator) -> None:
    """`rdma link delete rxe2` mid-transfer. rxe cannot revoke a process's handles, so the
    kernel's unregistration waits for every process to let go of rxe2; it stops listing the
    device at once, and the engine's rail watch sees that: the WRITE's chunks move to rxe0, the
    engine releases everything it held on rxe2 and the deletion completes. The WRITE is exact,
    the endpoint shows rxe2 removed with its cause and goes on over rxe0 (an old and a new
    registration alike). The test adds rxe2 back, as guest.sh made it, for the later tests."""
    # 64 MiB: still moving when the watch notices (it lists the devices every 0.5 s).
    with striped_write_on(rng, 64 * MIB) as (client, server, a, _, request, exact):
        started = time.monotonic()
        with deleting("rxe2", "veth2") as delete:
            wait_ok(request)
            assert exact()
            deleted_within_bound(delete, a)
            took = time.monotonic() - started
            assert not os.path.exists("/sys/class/infiniband/rxe2"), "rxe2 is still there"
            text = a.describe()
            assert "rxe0 up" in text and "rxe2 removed (device rxe2 was removed" in text, text
            attrs = a.attributes()
            assert attrs["rail_rxe2_removed"] == 1 and attrs["rail_rxe2_up"] == 0, attrs
            assert attrs["rail_rxe0_removed"] == 0 and not a.closed
            assert "rxe2 (10.78.0.1/24, " in client.describe()
            assert "removed (device rxe2 was removed" in client.describe(), client.describe()
            # The connection goes on over rxe0, for a registration made before the removal and
            # one made after it (no MR on rxe2).
            before_bytes = rail_bytes(a)["rxe0"]
            for _ in range(2):
                src = client.alloc_pinned(MIB + 77, 0)
                dst = server.alloc_pinned(MIB + 77, RW)
                data = random_bytes(rng, MIB + 77)
                region_array(src)[:] = data
                wait_ok(a.post_write(src, 0, dst.descriptor(), 0, MIB + 77))
                assert np.array_equal(region_array(dst), data)
            assert rail_bytes(a)["rxe0"] == before_bytes + 2 * (MIB + 77)
    assert took < DELETE_BOUND_S


def test_peer_is_told_of_a_deleted_rail(rng: np.random.Generator) -> None:
    """`rdma link delete rxe2` (the client's) while the server WRITEs into the client's memory
    without a pause, each WRITE striped over rxe1 and rxe3. The deletion sends nothing to the
    server, whose rxe3 keeps its port up: untold, a WRITE it posts there once the client let go
    of rxe2 waits for the retries to run out (rxe gave no retry-exceeded completion in 60 s).
    The client tells it (RAIL_DOWN on the control lane): the server's chunks on rxe3 move to
    rxe1, every WRITE completes, exact, and the server names the client's cause. A READ and a
    WRITE of the server's then go over rxe1 alone."""
    size = 16 * MIB
    with rail_pair() as (client, server, a, b):
        src = server.alloc_pinned(size, 0)
        dst = client.alloc_pinned(size, RW)
        data = random_bytes(rng, size)
        region_array(src)[:] = data
        wait_ok(b.post_write(src, 0, dst.descriptor(), 0, size, chunk_size=64 * 1024))
        carried = rail_bytes(b)
        assert carried["rxe1"] > 0 and carried["rxe3"] > 0, carried
        writes = 0
        with deleting("rxe2", "veth2") as delete:
            deadline = time.monotonic() + DELETE_BOUND_S
            while b.attributes()["rail_rxe3_up"] == 1 or writes < 2:
                assert time.monotonic() < deadline, (
                    f"the server never failed rxe3 over: {b.describe()}"
                )
                region_array(dst)[:] = 0
                wait_ok(b.post_write(src, 0, dst.descriptor(), 0, size, chunk_size=64 * 1024))
                assert np.array_equal(region_array(dst), data)
                writes += 1
            deleted_within_bound(delete, a)
            text = b.describe()
            assert "rxe1 up" in text and not b.closed, text
            assert "rxe3 failed (the peer's side of the rail failed: device rxe2 was removed" in (
                text
            ), text
            assert a.attributes()["rail_rxe2_removed"] == 1
            before = rail_bytes(b)
            small = 3 * MIB + 5
            mine = server.alloc_pinned(small, RW)
            theirs = client.alloc_pinned(small, RW)
            there = random_bytes(rng, small)
            region_array(theirs)[:] = there
            wait_ok(b.post_read(mine, 0, theirs.descriptor(), 0, small))
            assert np.array_equal(region_array(mine), there)
            back = random_bytes(rng, small)
            region_array(mine)[:] = back
            wait_ok(b.post_write(mine, 0, theirs.descriptor(), 0, small))
            assert np.array_equal(region_array(theirs), back)
            assert rail_bytes(b) == {"rxe1": before["rxe1"] + 2 * small, "rxe3": before["rxe3"]}


def test_control_rail_down_mid_transfer_moves_the_control_lane(rng: np.random.Generator) -> None:
    """rxe0, the control rail (control SENDs, grants, WRITE_WITH_IMM), goes down in the middle
    of a striped WRITE: the WRITE completes over rxe2, both sides move their control lane to
    rxe2, and messages, grants and notifications then flow both ways."""
    try:
        with striped_write_on(rng) as (client, server, a, b, request, exact):
            set_link("veth0", "down")  # rxe0 and rxe1: PORT_ERR on both sides
            wait_ok(request)
            assert exact()
            wait_for("the server to fail rxe1 over", lambda: b.attributes()["rail_rxe1_up"] == 0)
            text = a.describe()
            # The port's asynchronous event, or the port found down after a WR on it failed
            # when that completion came first.
            assert "rxe0 failed (device rxe0: asynchronous event: port error" in text or (
                "rxe0 failed (port 1 of rxe0 is DOWN, a WR failed: " in text
            ), text
            assert "rxe2 up" in text and not a.closed and not b.closed
            assert "control rail rxe2" in text and "control rail rxe3" in b.describe()
            send_and_notify(rng, (client, a), (server, b))
            send_and_notify(rng, (server, b), (client, a))
            assert not a.closed and not b.closed
            assert a.attributes()["rail_rxe2_up"] == 1 and b.attributes()["rail_rxe3_up"] == 1
    finally:
        set_link("veth0", "up")
        wait_for("rxe0 ACTIVE again", lambda: port_active("rxe0"))


def test_messages_go_on_while_the_control_rail_fails(rng: np.random.Generator) -> None:
    """Rendezvous messages back to back while the control rail's port goes down (`veth0`: both
    sides see it and move their control lane, each on its own time). A message granted on the
    failing rail pair either lands exact or fails alone with a clear error (its WRITE was in
    flight there, or its grant's rail failed before it was posted); none closes the
    connection, and 20 more go on over rxe2. (A WRITE into a grant goes on a QP paired with the
    rail whose rkey the grant carries, its route; it once went on the writer's control lane,
    which during the switch could pair with the other rail: REM_ACCESS_ERR, connection torn
    down. That race did not show in 8 runs of this test without the route.)"""
    size = 300_000 + 7
    outcomes: list[str] = []
    down = threading.Timer(0.5, set_link, ("veth0", "down"))
    try:
        with rail_pair() as (client, server, a, b):
            src = client.alloc_pinned(size, 0)
            dst = server.alloc_pinned(size, 0)
            down.start()
            deadline = time.monotonic() + WAIT_S
            switched = -1  # outcomes before the port went down
            while switched < 0 or outcomes[switched:].count("exact") < 20:
                assert time.monotonic() < deadline, outcomes
                if switched < 0 and down.finished.is_set():
                    switched = len(outcomes)
                data = random_bytes(rng, size)
                region_array(src)[:] = data
                send = a.post_send(src, 0, size, b"m", 0, 0)
                header = b.post_recv_header()
                wait_ok(header)
                msg_id, _, _ = header.message()
                recv = b.post_recv(msg_id, dst, 0, size)
                assert send.wait(WAIT_S), "the send neither completed nor failed"
                if not send.failed():
                    wait_ok(recv)
                    assert np.array_equal(region_array(dst), data)
                    outcomes.append("exact")
                    continue
                with pytest.raises(ConnectionFailedError, match="send it again"):
                    send.check()
                outcomes.append("failed alone")
                recv.wait(1.0)
                assert not a.closed and not b.closed, (a.error, b.error, outcomes)
            assert not a.closed and not b.closed, (a.error, b.error)
            assert "control rail rxe2" in a.describe() and "control rail rxe3" in b.describe()
            assert outcomes.count("failed alone") <= 2, outcomes
    finally:
        down.join()
        set_link("veth0", "up")
        wait_for("rxe0 ACTIVE again", lambda: port_active("rxe0"))


def test_message_failed_on_its_grants_rail_is_aborted_then_sent_again(
    rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """rxe0, the control rail, goes to ERR once it carried 4 MiB (the tests-only knob
    RDMAXFER_RDMA_TEST_QP_ERR) in the middle of a 64 MiB rendezvous message, whose WRITE is
    bound to the rail of the receiver's grant: the send fails alone and says to send it again.
    The sender tells the receiver (ABORT), whose RECV fails at once, naming the cause, instead
    of at its timeout; the connection goes on over rxe2 and the message sent again arrives
    exact."""
    monkeypatch.setenv("RDMAXFER_RDMA_TEST_QP_ERR", f"rxe0:{4 * MIB}")
    size = 64 * MIB
    with rail_pair() as (client, server, a, b):
        src = client.alloc_pinned(size, 0)
        dst = server.alloc_pinned(size, 0)
        data = random_bytes(rng, size)
        region_array(src)[:] = data
        send = a.post_send(src, 0, size, b"big", 64 * 1024, 0)  # chunks: the knob fires mid-way
        header = b.post_recv_header()
        wait_ok(header)
        msg_id, _, _ = header.message()
        recv = b.post_recv(msg_id, dst, 0, size)
        assert send.wait(WAIT_S), "the send neither completed nor failed"
        with pytest.raises(ConnectionFailedError, match=r"in flight on the control rail.*send it"):
            send.check()
        assert recv.wait(10.0), "the receiver was not told: its RECV waits for its timeout"
        with pytest.raises(ConnectionFailedError, match=f"gave up on message {msg_id} after it"):
            recv.check()
        assert not a.closed and not b.closed, (a.error, b.error)
        region_array(dst)[:] = 0
        again = a.post_send(src, 0, size, b"again", 0, 0)
        header = b.post_recv_header()
        wait_ok(header)
        msg_id, length, meta = header.message()
        assert (length, meta) == (size, b"again")
        wait_ok(b.post_recv(msg_id, dst, 0, size))
        wait_ok(again)
        assert np.array_equal(region_array(dst), data)
        assert "control rail rxe2" in a.describe() and "control rail rxe3" in b.describe()


def test_control_device_deleted_mid_transfer(rng: np.random.Generator) -> None:
    """`rdma link delete rxe0` (the control rail's device) mid-WRITE: the WRITE completes over
    rxe2, the deletion completes, and messages and notifications go on both ways over rxe2. The
    server's rxe1 keeps its port up; the server fails it over when it sees the client's control
    lane move to rxe2 or the client's RAIL_DOWN for rxe0 comes, whichever is first (else its
    WRITEs there would wait for the retries to run out). The test adds rxe0 back, as guest.sh
    made it, for the later tests."""
    with striped_write_on(rng, 64 * MIB) as (client, server, a, b, request, exact):
        with deleting("rxe0", "veth0") as delete:
            wait_ok(request)
            assert exact()
            deleted_within_bound(delete, a)
            text = a.describe()
            assert "rxe0 removed (device rxe0 was removed" in text, text
            assert "control rail rxe2" in text and not a.closed, text
            send_and_notify(rng, (client, a), (server, b))
            send_and_notify(rng, (server, b), (client, a))
            text = b.describe()
            assert "control rail rxe3" in text and not b.closed, text
            # rxe1's port stayed up: the server failed it over when the client told it.
            assert "rxe1 failed (the peer's side of the rail failed: device rxe0 was removed" in (
                text
            ), text
            assert not a.closed and a.attributes()["rail_rxe2_up"] == 1


def test_no_rail_left_fails_with_every_cause(rng: np.random.Generator) -> None:
    """rxe2's port goes down first (the connection goes on over rxe0), then rxe0's in the middle
    of a WRITE: the WRITE fails, and the side that saw its last rail fail first closes naming
    both its rails' causes (the other may see that peer go away before its own port error).
    A rail's cause is its port's asynchronous event, or its port found down after a WR on it
    failed when that completion came first (rxe completes it with IBV_WC_LOC_QP_OP_ERR)."""
    try:
        with striped_write_on(rng, 64 * MIB, before=("ip", "link", "set", "veth2", "down")) as (
            _,
            _,
            a,
            b,
            request,
            _,
        ):
            wait_for("rxe2 to fail over", lambda: a.attributes()["rail_rxe2_up"] == 0)
            set_link("veth0", "down")
            assert request.wait(WAIT_S), "the write neither completed nor failed"
            with pytest.raises(ConnectionFailedError):
                request.check()
            wait_for("both endpoints to close", lambda: a.closed and b.closed)
            errors = {"client": a.error, "server": b.error}
            lost = {side: e for side, e in errors.items() if "lost every rail" in e}
            assert lost, errors
            for side, text in lost.items():
                devices = ("rxe2", "rxe0") if side == "client" else ("rxe3", "rxe1")
                for device in devices:
                    event = f"{device}: device {device}: asynchronous event: port error"
                    found_down = f"{device}: port 1 of {device} is DOWN, a WR failed: "
                    assert event in text or found_down in text, text
    finally:
        for netdev, device in (("veth0", "rxe0"), ("veth2", "rxe2")):
            set_link(netdev, "up")
            wait_for(f"{device} ACTIVE again", functools.partial(port_active, device))


#: One CQ per rail held 16,384 entries and a connection reserved 288 on each before issue 15
#: item 3 reached the rails: 56 connections per engine.
