"""A peer that dies fails every transfer at once, on TCP, shm and ofi too: the receiver is killed
while a 256 MiB post_send is under way (its data chunks only referenced by frames queued on the
streams, in no table). Before, the sender raised TransferTimeoutError at its timeout plus 5 s
although the connection saw ECONNRESET at once. The verbs twin is in
tests/rdma/test_rdma_waits.py."""

from __future__ import annotations

import time

import numpy as np
import pytest

from _common import WITH_AUTO, same_host_transport
from _interrupts import child_env, server
from rdmaxfer import ConnectionFailedError, Engine

#: Seconds from the kill to the sender's error ("at once", with room for a loaded machine).
AT_ONCE_S = 2.0


def wait_stopped(pid: int, timeout: float) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        with open(f"/proc/{pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "T":
                return
        time.sleep(0.01)
    raise AssertionError(f"the receiver did not stop within {timeout} s")


@pytest.mark.parametrize("transport", (*WITH_AUTO, "ofi"), indirect=True)
def test_killing_the_receiver_fails_a_large_send_at_once(transport: str) -> None:
    with (
        server("receive-stop", "127.0.0.1", child_env(RDMAXFER_TRANSPORT=transport)) as (
            receiver,
            address,
        ),
        Engine(transport) as engine,
    ):
        ep = engine.connect(address, timeout=30)
        assert ep.info["transport"] == same_host_transport(transport)
        header_wait = ep.post_recv()  # a request in another table: fails too
        data = np.full(256 << 20, 0x5A, np.uint8)
        transfer = ep.post_send(data)
        receiver.expect("RECEIVING", 30)
        wait_stopped(receiver.proc.pid, 30)
        assert not transfer.done()
        receiver.proc.kill()
        killed = time.monotonic()
        with pytest.raises(ConnectionFailedError, match="lost"):
            transfer.wait(timeout=10)
        assert time.monotonic() - killed < AT_ONCE_S
        with pytest.raises(ConnectionFailedError):
            header_wait.wait(timeout=10)
        assert time.monotonic() - killed < AT_ONCE_S
        assert ep.closed
        assert engine.registered_count() == 0  # the temporary registration was released
