"""What a peer can make an engine hold: two-sided messages beyond max_message_bytes are refused
before anything is allocated (any announced size, 2**62 included); before authentication a
stranger holds a few handshake slots per address for a short deadline; incomplete stream groups
release their descriptors as soon as their peer leaves. Against ``rdmaxfer serve`` too: its RSS
stays near its idle value whatever strangers send, and a legitimate client still gets in."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import _raw_peer as raw
import rdmaxfer
from rdmaxfer import Engine, EngineOptions, ProtocolError, TransferTimeoutError, weights

BOUND = 4096
PRE_AUTH_S = 2.0  # kPreAuthTimeoutS (transport/bootstrap.h)
PER_ADDRESS = 64  # Acceptor::kMaxHandshakesPerAddress
#: Generous bounds for a loaded machine (the acceptor's pre-auth deadline is 2 s).
CONNECT_WITHIN_S = 1.5
LEFT_GROUPS_RELEASED_WITHIN_S = 5.0  # well below the 10 s an incomplete group may wait
RSS_SLACK_BYTES = 64 << 20


def bounded(bound: int, transport: str = "tcp") -> Engine:
    return Engine(transport, options=EngineOptions(max_message_bytes=bound))


@pytest.mark.parametrize("size", [BOUND - 1, BOUND, BOUND + 1, 1 << 20])
def test_messages_up_to_the_bound_pass_larger_ones_are_refused(
    transport: str, size: int, rng: np.random.Generator
) -> None:
    with bounded(BOUND, transport) as server, Engine(transport) as client:
        port = server.listen("127.0.0.1", 0)
        ep = client.connect("127.0.0.1", port, timeout=10)
        peer = server.accept(timeout=10)
        if size <= BOUND:
            data = rng.integers(0, 256, size, dtype=np.uint8)
            sending = ep.post_send(data)
            assert peer.recv(timeout=10).tobytes() == data.tobytes()
            sending.wait(10)
            return
        receiving = peer.post_recv()  # waits for the next message: the refused one
        with pytest.raises(ProtocolError, match=f"exceeds its max_message_bytes={BOUND}"):
            ep.send(np.zeros(size, np.uint8), timeout=10)
        with pytest.raises(ProtocolError, match=f"exceeds this engine's max_message_bytes={BOUND}"):
            receiving.wait(10)
        with pytest.raises(TransferTimeoutError):
            peer.recv(timeout=0.3)  # never announced to the receiver: nothing was allocated
        # The connection stays up.
        small = rng.integers(0, 256, 100, dtype=np.uint8)
        sending = ep.post_send(small)
        assert peer.recv(timeout=10).tobytes() == small.tobytes()
        sending.wait(10)


@pytest.mark.parametrize(
    "size", [BOUND + 1, 1 << 31, 1 << 32, (1 << 33) + 1, 1 << 62, (1 << 63) + 1, (1 << 64) - 1]
)
def test_any_announced_size_beyond_the_bound_gets_a_reject(size: int) -> None:
    """An RTS written by hand, of sizes no array could have: answered by a REJECT that names
    the bound; the receiving engine never sees the message and keeps the connection."""
    with bounded(BOUND) as server:
        port = server.listen("127.0.0.1", 0)
        with raw.handshake(port) as s:
            peer = server.accept(timeout=10)
            for msg_id in (1, 2):
                s.sendall(raw.frame(raw.MSG_RTS, req_id=msg_id, size=size, meta=b"u8|x"))
                kind, req_id, meta = raw.read_frame(s)
                assert (kind, req_id) == (raw.MSG_REJECT, msg_id)
                assert f"a message of {size} bytes exceeds its max_message_bytes={BOUND}" in (
                    meta.decode()
                )
            with pytest.raises(TransferTimeoutError):
                peer.recv(timeout=0.3)


def closed_by_server(s: socket.socket, within_s: float) -> float:
    """Seconds until the server closed ``s`` (its end of stream, or a reset)."""
    start = time.monotonic()
    s.settimeout(within_s)
    try:
        while s.recv(4096):
            pass
    except ConnectionResetError:
        pass
    return time.monotonic() - start


def hung_up(s: socket.socket) -> bool:
    """Whether the server has closed ``s`` already (without waiting)."""
    s.setblocking(False)
    try:
        return s.recv(1) == b""
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True


def test_a_silent_stranger_is_cut_at_the_pre_auth_deadline() -> None:
    with bounded(BOUND) as server:
        port = server.listen("127.0.0.1", 0)
        with raw.connect(port) as s:
            took = closed_by_server(s, 10.0)
        assert 1.0 < took < PRE_AUTH_S + 3.0


def test_handshakes_from_one_address_are_capped() -> None:
    """One address holds at most PER_ADDRESS handshake slots: the next connection from it
    is closed at once, while another address still connects."""
    with bounded(BOUND) as server, Engine("tcp") as client:
        port = server.listen("127.0.0.1", 0)
        held = [raw.connect(port, "127.0.0.5") for _ in range(PER_ADDRESS)]
        try:
            # Accepted after the held ones (the backlog is first come, first served): over the
            # cap, so closed at once rather than at the deadline.
            with raw.connect(port, "127.0.0.5") as extra:
                took = closed_by_server(extra, 10.0)
            assert took < PRE_AUTH_S / 2
            client.connect("127.0.0.1", port, timeout=CONNECT_WITHIN_S).close()
        finally:
            for s in held:
                s.close()


def test_a_client_gets_in_while_strangers_from_many_addresses_hold_every_slot() -> None:
    """Silent strangers from four addresses take all 256 handshake slots (64 each, under the
    per-address cap); while a client waits in the backlog, handshakes older than 0.5 s are
    cut, so the client connects before the strangers' own 2 s deadline would free a slot."""
    with bounded(BOUND) as server, Engine("tcp") as client:
        port = server.listen("127.0.0.1", 0)
        held = [raw.connect(port, f"127.0.0.{a}") for a in range(2, 6) for _ in range(PER_ADDRESS)]
        try:
            # Within 1.5 s: before any stranger's 2 s deadline could free a slot.
            client.connect("127.0.0.1", port, timeout=CONNECT_WITHIN_S).close()
            assert sum(map(hung_up, held)) >= 1  # strangers the server cut to let it in
        finally:
            for s in held:
                s.close()


def test_the_bound_is_a_setting() -> None:
    row = rdmaxfer.options.declared("RDMAXFER_MAX_MESSAGE_BYTES")
    assert (row.name, row.default, row.unit) == ("max_message_bytes", 1 << 34, "bytes")
    with pytest.raises(rdmaxfer.InvalidArgumentError, match="max_message_bytes"):
        EngineOptions(max_message_bytes=0)


# -- against `rdmaxfer serve` ------------------------------------------------------------------


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], int, dict[str, np.ndarray]]]:
    arrays = {"a": np.arange(4096, dtype=np.uint8), "b": np.full(1000, 7, np.uint8)}
    path = tmp_path / "m.safetensors"
    raw.write_safetensors(path, arrays)
    env = {k: v for k, v in os.environ.items() if k != "RDMAXFER_MAX_MESSAGE_BYTES"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "rdmaxfer", "serve", str(path), "--port", "0",
         "--transport", "tcp"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**env, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    assert proc.stdout is not None
    line = proc.stdout.readline()
    try:
        assert line.startswith("serving"), line
        yield proc, int(line.split(":")[-1]), arrays
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
        assert "Traceback" not in err, err


def pull_within(port: int, arrays: dict[str, np.ndarray], limit_s: float) -> float:
    with Engine("tcp") as engine:
        start = time.monotonic()
        engine.connect("127.0.0.1", port, timeout=limit_s).close()
        took = time.monotonic() - start
        got = weights.pull_weights(f"127.0.0.1:{port}", engine=engine, timeout=30)
    assert {k: v.tobytes() for k, v in got.items()} == {k: v.tobytes() for k, v in arrays.items()}
    return took


def wait_for(what: str, check: object, limit_s: float) -> None:
    deadline = time.monotonic() + limit_s
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_serve_holds_little_for_strangers_and_admits_a_client(
    served: tuple[subprocess.Popen[str], int, dict[str, np.ndarray]],
) -> None:
    proc, port, arrays = served
    pull_within(port, arrays, 10.0)  # warm: the idle RSS includes one served client
    idle_rss, idle_fds = rss(proc.pid), fds(proc.pid)
    held = []
    try:
        # 500 idle connections from one address and 1,000 groups that announced 64 streams and
        # sent one, from 16 more.
        held += [raw.connect(port, "127.0.0.2") for _ in range(500)]
        for i in range(1000):
            held.append(raw.handshake(port, source=f"127.0.1.{i % 16 + 1}", n_streams=64,
                                      conn_id=1000 + i))  # fmt: skip
        # Announcements of 8 GiB and 2**62 bytes, and a real 1 MiB request.
        for size in (8 << 30, 1 << 62):
            with raw.handshake(port, source="127.0.0.3") as s:
                s.sendall(raw.frame(raw.MSG_RTS, size=size, meta=b"u8|x"))
                kind, _, meta = raw.read_frame(s)
                assert kind == raw.MSG_REJECT and b"max_message_bytes=65536" in meta
        with Engine("tcp") as stranger:
            ep = stranger.connect("127.0.0.1", port, timeout=10)
            with pytest.raises(ProtocolError, match="exceeds its max_message_bytes=65536"):
                ep.send(np.zeros(1 << 20, np.uint8), timeout=10)
        took = pull_within(port, arrays, 10.0)
        assert took < CONNECT_WITHIN_S, f"the client took {took:.2f} s to connect"
        assert rss(proc.pid) - idle_rss < RSS_SLACK_BYTES
    finally:
        for s in held:
            s.close()
    # The incomplete groups go as their peers leave, long before their own timeout.
    wait_for(
        f"fds back near {idle_fds}",
        lambda: fds(proc.pid) <= idle_fds + 8,
        LEFT_GROUPS_RELEASED_WITHIN_S,
    )
    assert proc.poll() is None


def test_serve_without_a_secret_warns_on_every_address(
    served: tuple[subprocess.Popen[str], int, dict[str, np.ndarray]],
) -> None:
    proc, port, _ = served
    proc.terminate()
    _, err = proc.communicate(timeout=30)
    assert (
        f"rdmaxfer serve: warning: serving without a shared secret on 127.0.0.1:{port}: every "
        "user and process "
        "of this host can connect and READ the 2 tensors (5096 bytes) published" in err
    )


def test_a_descriptor_works_only_with_the_engine_and_transport_that_made_it(
    rng: np.random.Generator,
) -> None:
    with Engine("tcp") as server, Engine("tcp") as other, Engine("tcp") as client:
        port = server.listen("127.0.0.1", 0)
        ep = client.connect("127.0.0.1", port, timeout=10)
        server.accept(timeout=10)
        target = np.zeros(64, np.uint8)
        theirs = other.register(np.zeros(64, np.uint8), access="rw").descriptor()
        ours = server.register(target, access="rw").descriptor()
        data = rng.integers(0, 256, 64, dtype=np.uint8)
        with pytest.raises(rdmaxfer.InvalidArgumentError) as caught:
            ep.write(data, theirs, timeout=10)
        message = str(caught.value)
        assert f"made by a tcp engine (id {other.engine_id:016x})" in message
        assert f"connects to the tcp engine {server.engine_id:016x}" in message
        assert not target.any()
        packed = bytearray(ours.pack())
        packed[6] = 4  # the transport byte: shm
        with pytest.raises(rdmaxfer.InvalidArgumentError, match="made by a shm engine"):
            ep.read(np.zeros(64, np.uint8), bytes(packed), timeout=10)
        ep.write(data, ours, timeout=10)
        assert target.tobytes() == data.tobytes()
