"""Fuzzing the parsers that read peer-controlled bytes (hypothesis).

Every input must be either accepted or rejected with ProtocolError: no crash, no hang, no other
exception. Each target runs RDMAXFER_FUZZ_EXAMPLES inputs (default 2,000; six or more targets,
so at least 10,000 in CI); raise it for a longer, nightly-style run.
"""

from __future__ import annotations

import os
import socket
import struct
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _common import ofi_record
from rdmaxfer import ConnectionFailedError, Engine, ProtocolError, _core
from rdmaxfer.memory import meta as _meta

EXAMPLES = int(os.environ.get("RDMAXFER_FUZZ_EXAMPLES", "2000"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=False,
    suppress_health_check=[HealthCheck.too_slow],
)


def valid_records() -> dict[str, bytes]:
    """One well-formed record of each kind, as seeds for mutation."""
    with Engine("tcp") as engine:
        region = engine.register(np.arange(64, dtype=np.uint8), access="rw")
        descriptor = region.descriptor().pack()
        region.close()
    hello = b"RXHI" + struct.pack("<HBBBB6xQQ", 1, 1, 0, 4, 0, 11, 22)
    ack = b"RXOK" + struct.pack("<HHQ", 1, 0, 33)
    frame = struct.pack("<HBBIQQQQIIQQ", 0x5852, 1, 1, 0, 5, 4096, 8, 0, 7, 0, 8, 8)
    ofi = ofi_record([b"A" * 16, b"B" * 16], b"tcp;ofi_rxm")
    return {
        "descriptor": descriptor,
        "hello": hello,
        "hello_ack": ack,
        "frame": frame,
        "ofi_endpoint_record": ofi,
    }


SEEDS = valid_records()


def check(kind: str, data: bytes) -> None:
    try:
        summary = _core.parse_record(kind, data)
    except ProtocolError:
        return
    assert isinstance(summary, str) and summary


def test_seeds_are_accepted() -> None:
    for kind, data in SEEDS.items():
        assert _core.parse_record(kind, data).startswith(kind.split("_")[0])
    assert set(SEEDS) <= set(_core.record_kinds())


def mutated(seed: bytes) -> st.SearchStrategy[bytes]:
    """The seed with random bytes overwritten, or truncated/extended."""

    def apply(edits: list[tuple[int, int]], cut: int, extra: bytes) -> bytes:
        out = bytearray(seed)
        for pos, value in edits:
            out[pos % len(out)] = value
        return bytes(out[: max(0, len(out) - cut)]) + extra

    return st.builds(
        apply,
        st.lists(st.tuples(st.integers(0, 1 << 16), st.integers(0, 255)), max_size=6),
        st.integers(0, 3),
        st.binary(max_size=3),
    )


@pytest.mark.parametrize("kind", sorted(SEEDS))
def test_random_bytes(kind: str) -> None:
    @FUZZ
    @given(st.binary(max_size=96))
    def run(data: bytes) -> None:
        check(kind, data)

    run()


@pytest.mark.parametrize("kind", sorted(SEEDS))
def test_mutated_records(kind: str) -> None:
    @FUZZ
    @given(mutated(SEEDS[kind]))
    def run(data: bytes) -> None:
        check(kind, data)

    run()


@FUZZ
@given(st.binary(max_size=200))
def test_message_metadata(data: bytes) -> None:
    try:
        _meta.decode(data, 64)
    except ProtocolError:
        pass


def test_live_listener_survives_garbage() -> None:
    """Random bytes and half-open handshakes at a listening engine; then a real peer still
    connects and transfers."""
    rng = np.random.default_rng(1234)
    with Engine("tcp") as server, Engine("tcp") as client:
        port = server.listen("127.0.0.1", 0)
        for i in range(200):
            with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                n = int(rng.integers(0, 64))
                blob = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
                if i % 4 == 0:
                    blob = SEEDS["hello"][:20] + blob  # a plausible start, then garbage
                s.sendall(blob)
        # The strangers' handshakes end as their sockets close, but on a loaded host up to 64
        # from this address may still run, and one more is closed at once: retry until they
        # are gone (each lasts at most the 2 s pre-auth deadline).
        give_up = time.monotonic() + 30
        while True:
            try:
                ep = client.connect("127.0.0.1", port, timeout=10)
                break
            except ConnectionFailedError:
                if time.monotonic() > give_up:
                    raise
                time.sleep(0.05)
        peer = server.accept(timeout=10)
        data = rng.integers(0, 256, 5000, dtype=np.uint8)
        sending = ep.post_send(data)
        assert peer.recv(timeout=10).tobytes() == data.tobytes()
        sending.wait(10)


def test_garbage_frames_close_only_that_endpoint() -> None:
    """A peer that passes the handshake and then sends a corrupt frame loses its endpoint
    with a ProtocolError; the engine keeps serving others."""
    with Engine("tcp") as server, Engine("tcp") as client:
        port = server.listen("127.0.0.1", 0)
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(SEEDS["hello"][:8] + bytes([1]) + SEEDS["hello"][9:])  # 1 stream
            assert s.recv(16, socket.MSG_WAITALL)[:4] == b"RXOK"
            bad = server.accept(timeout=10)
            s.sendall(b"\xff" * 64)
            with pytest.raises(Exception, match="bad frame magic"):
                bad.recv(timeout=10)
        ep = client.connect("127.0.0.1", port, timeout=10)
        peer = server.accept(timeout=10)
        sending = ep.post_send(np.arange(10.0))
        np.testing.assert_array_equal(peer.recv(timeout=10), np.arange(10.0))
        sending.wait(10)
