"""A thread that waits for a one-stream WRITE or READ on TCP drives the stream itself
(TcpStream::drive): it polls the socket and reads the acknowledgement or the data, so the
completion reaches it without waking the engine's I/O threads (one thread hand-off less per
transfer; the speed this buys is shown by bench/tcp_vs_peers.py, issue 12 item 6). Before, every
completion woke an I/O thread, which then woke the waiter. The promises hold on that path too:
the bytes arrive intact and several threads may wait on one stream (a dead peer failing such a
wait at once: test_endpoint.py's test_peer_killed_during_writes_fails_the_writer[one-stream]).

On shm the waiting thread likewise reads the inbound ring itself for a while (ShmChannel::drive)
instead of being woken by the connection's reader thread (issue 14's small-message speed,
bench/shm_vs_memcpy.py); the shm runs of test_peer_death, test_interrupt and test_timeouts hold
the promises on that path."""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest

from _peers import digest, make_array, same_bytes
from _throttle import ThrottledRelay
from rdmaxfer import Engine, _core
from rdmaxfer.tools import bench

KiB = 1024
#: Below 4 MiB a transfer is one chunk train on one stream (engine/chunking.h).
SIZE = 64 * KiB
ROUNDS = 10
#: Relay rate, bytes/s: a 64 KiB response takes about 30 ms, in 16 KiB pieces.
RATE = 2e6


def _threads() -> set[int]:
    return {int(tid) for tid in os.listdir("/proc/self/task")}


def _wakeups(tids: set[int]) -> int:
    """Voluntary context switches of these threads so far (each sleep that ended)."""
    total = 0
    for tid in tids:
        with open(f"/proc/self/task/{tid}/status") as f:
            for line in f:
                if line.startswith("voluntary_ctxt_switches:"):
                    total += int(line.split()[1])
    return total


def test_a_waiting_thread_reads_its_completion_itself(seed: int) -> None:
    # Through a slow relay the response arrives well after the wait began, in pieces: before,
    # each piece woke an I/O thread; now the waiting thread has the stream and reads them.
    with Engine("tcp") as server:
        port = server.listen("127.0.0.1", 0)
        before = _threads()
        with Engine("tcp") as client:
            io_threads = _threads() - before  # the client's I/O loops, started with it
            assert io_threads, "the TCP engine starts its I/O threads when it is created"
            relay = ThrottledRelay(("127.0.0.1", port), RATE)
            try:
                ep = client.connect(relay.address, timeout=10)
                server.accept(timeout=10)
                source = make_array(seed, SIZE)
                descriptor = server.register(source, "r").descriptor()
                back = make_array(seed + 1, SIZE)
                ep.read(back, descriptor, timeout=30)  # warm-up
                start = _wakeups(io_threads)
                for i in range(ROUNDS):
                    back = make_array(seed + 2 + i, SIZE)
                    ep.read(back, descriptor, timeout=30)
                    assert same_bytes(back, source)
                woken = _wakeups(io_threads) - start
            finally:
                relay.close()
    # An idle I/O thread still wakes once a second (its epoll timeout).
    assert woken <= 2 * len(io_threads) + 2, (
        f"the client's I/O threads woke {woken} times for {ROUNDS} one-stream READs: the "
        "waiting thread should have read the responses itself"
    )


def test_threads_waiting_on_one_stream_all_complete_intact(seed: int) -> None:
    with Engine("tcp", streams=1) as server, Engine("tcp", streams=1) as client:
        port = server.listen("127.0.0.1", 0)
        ep = client.connect("127.0.0.1", port, timeout=10)
        server.accept(timeout=10)
        n_threads = 4
        targets = [make_array(seed + i, SIZE) for i in range(n_threads)]
        descriptors = [server.register(t, "rw").descriptor() for t in targets]
        sources = [make_array(seed + 100 + i, SIZE) for i in range(n_threads)]
        errors: list[BaseException] = []

        def writer(i: int) -> None:
            try:
                for _ in range(20):
                    ep.write(sources[i], descriptors[i], timeout=30)
                    back = make_array(seed + 200 + i, SIZE)
                    ep.read(back, descriptors[i], timeout=30)
                    assert same_bytes(back, sources[i])
            except BaseException as exc:  # reported below, with the thread's number
                errors.append(exc)

        threads = [threading.Thread(target=writer, args=(i,)) for i in range(n_threads)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert not any(t.is_alive() for t in threads), "a waiting thread hung"
        assert not errors, errors
        for target, source in zip(targets, sources, strict=True):
            assert digest(target) == digest(source)


SHM_ROUNDS = 30
#: The shortest nap of the shm reader while waiters drive: it naps until the hand-back is due
#: (kHandBack, 2 ms after the last waiter, csrc/transport/shm/shm_channel.cc), in whole ms.
NAP_MIN_S = 0.001


@pytest.mark.skipif(
    _core.available_transports().get("shm", "") != "",
    reason=f"shm unavailable: {_core.available_transports().get('shm')}",
)
def test_a_waiting_thread_reads_the_shm_ring_itself(seed: int) -> None:
    # The peer is another process, so every thread this one gains on connecting is the shm
    # reader of this end. Before, every acknowledgement of a loop of blocking WRITEs and READs
    # found the reader asleep (a round trip outlasts its spin) and woke it, which then woke the
    # waiter; now the waiting thread reads the ring, and the reader, its doorbell unarmed while
    # waiters keep coming, naps (2 ms at a time) until they stop.
    sources = [make_array(seed + i, SIZE) for i in range(SHM_ROUNDS)]
    backs = [np.zeros(SIZE, dtype=np.uint8) for _ in range(SHM_ROUNDS)]
    with bench.peer_process("shm", SIZE, 0, bench.RdmaSetup(), "s" * 32) as (_, port, packed):
        with Engine("shm", secret="s" * 32) as client:
            before = _threads()
            ep = client.connect("127.0.0.1", port, timeout=10)
            reader = _threads() - before
            assert reader, "an shm connection starts its reader thread when it connects"
            start, t0 = _wakeups(reader), time.monotonic()
            for source, back in zip(sources, backs, strict=True):
                ep.write(source, packed, timeout=30)
                ep.read(back, packed, timeout=30)
            woken, elapsed = _wakeups(reader) - start, time.monotonic() - t0
    for source, back in zip(sources, backs, strict=True):
        assert digest(back) == digest(source)
    # While waiters keep coming its naps last NAP_MIN_S or more: a bound that grows with the
    # loop's time, not with the number of operations.
    bound = elapsed / NAP_MIN_S + 4
    assert woken <= bound, (
        f"the shm reader woke {woken} times for {2 * SHM_ROUNDS} WRITEs and READs in "
        f"{elapsed:.3f} s (at most {bound:.0f} naps): the waiting thread should have read the "
        "acknowledgements from the ring itself"
    )
