"""asyncio twins (asend/arecv/awrite/aread) and awaiting posted transfers."""

from __future__ import annotations

import asyncio
import os
import threading
import time

import ml_dtypes
import numpy as np
import pytest

from _common import MARGIN_S, Pair
from _peers import digest, make_array, same_bytes
from rdmaxfer import (
    Endpoint,
    Engine,
    InvalidArgumentError,
    ProtocolError,
    RdmaxferError,
    TransferTimeoutError,
)
from rdmaxfer.transport.notifications import Notifications

MiB = 1 << 20


def test_asend_arecv_many_concurrent(pair: Pair, seed: int) -> None:
    sent = [make_array(seed + k, (k + 1, 1021), np.float32) for k in range(16)]

    async def main() -> list[np.ndarray]:
        receiving = [asyncio.ensure_future(pair.b.arecv(timeout=30)) for _ in sent]
        await asyncio.gather(*(pair.a.asend(arr, timeout=30) for arr in sent))
        return await asyncio.gather(*receiving)

    got = asyncio.run(main())
    assert sorted(digest(a) for a in got) == sorted(digest(a) for a in sent)
    assert pair.a.inflight == 0 and pair.b.inflight == 0


@pytest.mark.parametrize("nbytes", [0, 1, 4095, MiB + 3])
def test_arecv_into_out(pair: Pair, nbytes: int, seed: int) -> None:
    sent = make_array(seed, nbytes)
    out = make_array(seed + 1, nbytes)

    async def main() -> np.ndarray:
        sending = asyncio.ensure_future(pair.a.asend(sent, timeout=30))
        got = await pair.b.arecv(out, timeout=30)
        await sending
        return got

    assert asyncio.run(main()) is out
    assert same_bytes(out, sent)


def test_awrite_aread_64_in_flight(pair: Pair, seed: int) -> None:
    n, count = 4099, 64
    target = np.empty(n * count, np.uint8)
    exposed = make_array(seed, n * count)
    t_desc = pair.server.register(target, "w").descriptor()
    e_desc = pair.server.register(exposed, "r").descriptor()
    src = make_array(seed + 1, n * count)
    dst = np.empty(n * count, np.uint8)

    async def main() -> None:
        ops = []
        for k in range(count):
            off = k * n
            ops.append(pair.a.awrite(src, t_desc, offset=off, remote_offset=off, nbytes=n))
            ops.append(pair.a.aread(dst, e_desc, offset=off, remote_offset=off, nbytes=n))
        await asyncio.gather(*ops)

    asyncio.run(main())
    assert same_bytes(target, src) and same_bytes(dst, exposed)


def test_await_posted_transfers(pair: Pair, seed: int) -> None:
    sent = make_array(seed, (3, 5), ml_dtypes.bfloat16)

    async def main() -> np.ndarray:
        receiving = pair.b.post_recv()
        await pair.a.post_send(sent)
        return await receiving

    got = asyncio.run(main())
    assert got.dtype == ml_dtypes.bfloat16 and same_bytes(got, sent)


def test_arecv_times_out_and_endpoint_stays_usable(pair: Pair, seed: int) -> None:
    async def main() -> None:
        start = time.monotonic()
        with pytest.raises(TransferTimeoutError, match=r"no message arrived"):
            await pair.b.arecv(timeout=0.3)
        assert time.monotonic() - start < 0.3 + MARGIN_S
        sent = make_array(seed, 5000)
        sending = asyncio.ensure_future(pair.a.asend(sent, timeout=30))
        assert same_bytes(await pair.b.arecv(timeout=30), sent)
        await sending

    asyncio.run(main())
    assert not pair.b.closed


def test_asend_times_out_and_aborts(pair: Pair, seed: int) -> None:
    async def main() -> None:
        start = time.monotonic()
        with pytest.raises(TransferTimeoutError, match=r"send of 4194304 bytes"):
            await pair.a.asend(make_array(seed, 4 * MiB), timeout=0.3)
        assert time.monotonic() - start < 0.3 + MARGIN_S

    asyncio.run(main())
    assert pair.a.closed


def test_cancelled_arecv_withdraws_and_the_next_message_is_received(pair: Pair, seed: int) -> None:
    async def main() -> np.ndarray:
        task = asyncio.ensure_future(pair.b.arecv(timeout=30))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        sending = asyncio.ensure_future(pair.a.asend(make_array(seed, 3000), timeout=30))
        got = await pair.b.arecv(timeout=30)
        await sending
        return got

    assert same_bytes(asyncio.run(main()), make_array(seed, 3000))


def test_async_mismatch_rejects(pair: Pair, seed: int) -> None:
    out = make_array(seed + 1, 100, np.int16)
    before = out.copy()

    async def main() -> None:
        sending = asyncio.ensure_future(pair.a.asend(make_array(seed, 100, np.float32)))
        with pytest.raises(InvalidArgumentError, match=r"rejected"):
            await pair.b.arecv(out, timeout=30)
        with pytest.raises(ProtocolError, match=r"receiver .*rejected the message"):
            await sending

    asyncio.run(main())
    assert same_bytes(out, before)


def test_one_engine_serves_loops_in_two_threads(server: Engine, client: Engine, seed: int) -> None:
    """Notifications read by one loop must still wake waiters of another loop."""
    port = server.listen()
    # One connection accepted before the next is made: accept() need not return endpoints in
    # the order their connects completed (seen swapped on a loaded machine).
    eps: list[Endpoint] = []
    peers: list[Endpoint] = []
    for _ in range(2):
        eps.append(client.connect("127.0.0.1", port, timeout=10))
        peers.append(server.accept(timeout=10))
    results: dict[int, list[str]] = {}
    errors: list[BaseException] = []

    def run(k: int) -> None:
        async def main() -> list[str]:
            got = []
            for _ in range(20):
                got.append(digest(await eps[k].arecv(timeout=30)))
                await asyncio.sleep(0)
            return got

        try:
            results[k] = asyncio.run(main())
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    sent = {k: [make_array(seed + 100 * k + i, 1000 + i) for i in range(20)] for k in range(2)}
    for i in range(20):
        for k in range(2):
            peers[k].send(sent[k][i], timeout=30)
    for t in threads:
        t.join(60)
    assert not errors, errors
    for k in range(2):
        assert results[k] == [digest(a) for a in sent[k]]


def test_engine_close_fails_awaiting_transfers(server: Engine, client: Engine) -> None:
    port = server.listen()
    ep = client.connect("127.0.0.1", port, timeout=10)
    server.accept(timeout=10)

    async def main() -> None:
        waiting = asyncio.ensure_future(ep.arecv(timeout=30))
        await asyncio.sleep(0.05)
        client.close()
        with pytest.raises(RdmaxferError):
            await asyncio.wait_for(waiting, 10)

    asyncio.run(main())


def test_a_finishing_loop_runs_the_callbacks_it_reads() -> None:
    """A loop whose executor asyncio.run has shut down still reads ``notify_fd`` until it
    closes; callbacks it takes (perhaps another loop's) must run, not be dropped."""

    request_id = 7

    class Core:
        def __init__(self) -> None:
            self.notify_fd = os.eventfd(0)

        def drain_notifications(self) -> list[int]:
            os.eventfd_read(self.notify_fd)
            return [request_id]

    core = Core()
    notes = Notifications(core)  # type: ignore[arg-type]
    ran = threading.Event()
    # as call_when_done records it, without starting the progress thread, so that only the
    # loop reads the notification
    notes._callbacks[request_id] = [ran.set]

    async def main() -> None:
        loop = asyncio.get_running_loop()
        await loop.shutdown_default_executor()
        os.eventfd_write(core.notify_fd, 1)
        notes._drain_on_loop()

    try:
        asyncio.run(main())
        assert ran.wait(5), "the callback taken by a finishing loop was dropped"
    finally:
        os.close(core.notify_fd)
