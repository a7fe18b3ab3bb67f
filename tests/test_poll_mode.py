"""Poll modes of TCP and shm (``Engine(poll_mode=...)``, ``RDMAXFER_POLL_MODE``): every mode
moves the right bytes; a bad mode is refused by name; an idle engine sleeps in every mode (its
process's CPU time over a quiet second stays small, after a burst of small WRITEs taught the
adaptive mode to spin); an I/O thread's linger follows its mode (adaptive within its share of
the thread's time); a busy-mode wait still ends at its timeout and on Ctrl-C."""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Iterator

import numpy as np
import pytest

from _interrupts import check_prompt, child_env, interrupt, server
from _peers import digest, make_array
from rdmaxfer import Endpoint, Engine, InvalidArgumentError, TransferTimeoutError

MODES = ("adaptive", "busy", "event")
TRANSPORTS = ("tcp", "shm")
#: A quiet engine's CPU over IDLE_S seconds stays under this share of one CPU (it is ~0; an I/O
#: thread or waiter that kept spinning would take ~100 %).
IDLE_S = 1.0
IDLE_CPU_SHARE = 0.25

Linked = tuple[Engine, Engine, Endpoint, str]


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


@pytest.fixture(params=[(t, m) for t in TRANSPORTS for m in MODES], ids=lambda p: f"{p[0]}-{p[1]}")
def linked(request: pytest.FixtureRequest) -> Iterator[Linked]:
    """(initiator, target, an endpoint from the initiator to the target, the mode) of one
    transport and poll mode, both engines in this process."""
    transport, mode = request.param
    target, initiator = Engine(transport, poll_mode=mode), Engine(transport, poll_mode=mode)
    try:
        port = target.listen("127.0.0.1", 0)
        ep = initiator.connect(f"127.0.0.1:{port}", timeout=30)
        target.accept(timeout=30)
        yield initiator, target, ep, mode
    finally:
        initiator.close()
        target.close()


def test_every_mode_moves_the_right_bytes_and_says_its_mode(linked: Linked) -> None:
    initiator, target, ep, mode = linked
    for engine in (initiator, target):
        assert f"poll mode {mode}" in engine.describe()
    dest = np.zeros(1 << 20, np.uint8)
    region = target.register(dest, access="rw")
    small = make_array(1, 8)
    for i in range(200):  # back-to-back small WRITEs: what the spinning is for
        ep.write(small, region.descriptor(), remote_offset=8 * i, timeout=30)
    assert dest[: 8 * 200].tobytes() == small.tobytes() * 200
    big = make_array(2, 1 << 20)
    ep.write(big, region.descriptor(), timeout=30)
    back = np.zeros_like(big)
    ep.read(back, region.descriptor(), timeout=30)
    assert digest(back) == digest(big) == digest(dest)


def test_an_idle_engine_sleeps_in_every_mode(linked: Linked) -> None:
    _, target, ep, _ = linked
    region = target.register(np.zeros(64, np.uint8), access="rw")
    small = make_array(3, 8)
    for _ in range(300):  # adaptive learns to spin; busy I/O threads linger after these
        ep.write(small, region.descriptor(), timeout=30)
    time.sleep(0.1)  # past busy's linger after the last event
    cpu, wall = _cpu_s(), time.monotonic()
    time.sleep(IDLE_S)
    share = (_cpu_s() - cpu) / (time.monotonic() - wall)
    assert share < IDLE_CPU_SHARE, f"an idle engine used {100 * share:.0f} % of a CPU"


#: An adaptive I/O thread spins at most 20 % of its time (SpinBudget::kLingerSharePct) where
#: the process has more than one CPU; a spin that starts under that share may run past it, the
#: more on a loaded machine.
ADAPTIVE_LINGER_SHARE = 0.45


def _linger_shares(transport: str) -> dict[str, float]:
    """Per poll mode, the share of wall time that the target's one I/O thread spent polling
    for its next request (``io_linger_us``) during a closed loop of 2,500 8-byte WRITEs."""
    shares = {}
    for mode in MODES:
        threads = {"io_threads": 1} if transport == "tcp" else {}
        with (
            Engine(transport, poll_mode=mode, **threads) as target,
            Engine(transport, poll_mode=mode, **threads) as initiator,
        ):
            port = target.listen("127.0.0.1", 0)
            ep = initiator.connect(f"127.0.0.1:{port}", timeout=30)
            target.accept(timeout=30)
            dest = np.zeros(8 * 3000, np.uint8)
            remote = target.register(dest, access="rw").descriptor()
            small = make_array(5, 8)
            linger_us, start = 0, 0.0
            for i in range(3000):  # the first 500 tune the adaptive budget
                if i == 500:
                    linger_us, start = target.stats()["io_linger_us"], time.monotonic()
                ep.write(small, remote, remote_offset=8 * i, timeout=30)
            wall = time.monotonic() - start
            shares[mode] = (target.stats()["io_linger_us"] - linger_us) / 1e6 / wall
            assert dest.tobytes() == small.tobytes() * 3000
    return shares


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs (the cap's case)")
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_io_threads_linger_by_their_mode_and_adaptive_within_its_share(transport: str) -> None:
    """The target's I/O thread polls for the next request at most its share of the time in
    adaptive mode, most of it in busy mode, never in event mode."""
    shares = _linger_shares(transport)
    assert shares["event"] == 0, shares
    assert shares["adaptive"] <= ADAPTIVE_LINGER_SHARE, shares
    assert shares["busy"] > max(0.3, shares["adaptive"]), shares


def test_on_one_cpu_adaptive_lingering_has_no_cap() -> None:
    """Engines made while the process may run on one CPU only: the adaptive I/O thread polls
    past the share (its spin yields the CPU every few turns, so it takes only idle time)."""
    allowed = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(allowed)})
    try:
        shares = _linger_shares("tcp")
    finally:
        os.sched_setaffinity(0, allowed)
    assert shares["event"] == 0, shares
    assert shares["adaptive"] > ADAPTIVE_LINGER_SHARE, shares


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("mode", ["spin", "Busy", "poll"])
def test_a_bad_poll_mode_is_refused_by_name(transport: str, mode: str) -> None:
    with pytest.raises(InvalidArgumentError, match=rf"poll_mode='{mode}' must be 'adaptive'"):
        Engine(transport, poll_mode=mode)


def test_a_bad_poll_mode_in_the_environment_is_refused_by_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RDMAXFER_POLL_MODE", "fast")
    with pytest.raises(InvalidArgumentError, match="RDMAXFER_POLL_MODE='fast' must be"):
        Engine("tcp")
    monkeypatch.setenv("RDMAXFER_POLL_MODE", "event")
    with Engine("tcp") as engine:
        assert "poll mode event" in engine.describe()


def test_the_default_mode_is_adaptive(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RDMAXFER_POLL_MODE", raising=False)
    for transport in TRANSPORTS:
        with Engine(transport) as engine:
            assert "poll mode adaptive" in engine.describe()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_busy_wait_ends_at_its_timeout(transport: str) -> None:
    env = child_env(RDMAXFER_TRANSPORT=transport)
    with (
        server("serve", "127.0.0.1", env) as (peer, address),
        Engine(transport, poll_mode="busy") as engine,
    ):
        ep = engine.connect(address, timeout=30)
        remote = ep.recv(timeout=30).tobytes()
        local = make_array(4, 1 << 20)
        ep.write(local, remote, timeout=30)
        peer.pause()  # it no longer serves: the next operations never complete
        start = time.monotonic()
        with pytest.raises(TransferTimeoutError):
            for _ in range(64):  # the socket or ring takes a few before one waits
                ep.write(local, remote, timeout=0.5)
        assert time.monotonic() - start < 30


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("kind", ["write", "read"])
def test_ctrl_c_ends_a_busy_wait(transport: str, kind: str) -> None:
    env = child_env(RDMAXFER_TRANSPORT=transport, RDMAXFER_POLL_MODE="busy")
    with server("serve", "127.0.0.1", env) as (peer, address):
        check_prompt(interrupt(kind, address, env, before=peer.pause))
