"""TLS 1.3 on the ofi transport's bootstrap stream (tcp;ofi_rxm on loopback): the endpoint
records and every control message after them (eager messages, rendezvous metadata,
notifications, GOODBYE) travel inside TLS, while WRITEs and READs stay on the fabric. Transfers
are bit-exact; a plain peer and a TLS peer refuse each other; a wrong key is refused; a relay
on the bootstrap stream can neither read an eager message nor alter a control frame."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from _common import OFI_ENV
from _tls_common import SECRET, Relay, pair, tls_unusable, transfers
from rdmaxfer import ConnectionFailedError, EndpointClosedError, Engine, TransferTimeoutError, _core


@pytest.fixture(autouse=True)
def ofi_with_tls(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """tcp;ofi_rxm on loopback; skips where libfabric, that provider or libssl is missing."""
    for key, value in OFI_ENV.items():
        monkeypatch.setenv(key, value)
    why = _core.available_transports().get("ofi", "unknown transport")
    if why:
        pytest.skip(f"transport 'ofi' is unavailable here: {why}")
    why = tls_unusable("ofi")
    if why:
        pytest.skip(f"TLS unusable here: {why}")
    yield


@pytest.fixture
def relay_to() -> Iterator[list[Relay]]:
    made: list[Relay] = []
    yield made
    for r in made:
        r.close()


def test_psk_transfers_are_bit_exact() -> None:
    with (
        Engine("ofi", tls=True, secret=SECRET) as server,
        Engine("ofi", tls=True, secret=SECRET) as client,
    ):
        assert "bootstrap and control stream under TLS 1.3" in server.describe()
        ep, peer = pair(server, client)
        for n in (1, 4096, 3 << 20):  # eager, and rendezvous over the fabric
            transfers(ep, peer, server, client, n)
        ep.close()  # the GOODBYE goes inside TLS too
        with pytest.raises((ConnectionFailedError, EndpointClosedError), match="closed"):
            peer.recv(timeout=30)  # type: ignore[attr-defined]


def test_plain_and_tls_refuse_each_other() -> None:
    with Engine("ofi", tls=True, secret=SECRET) as tls_server:
        port = tls_server.listen("127.0.0.1", 0)
        with Engine("ofi", secret=SECRET) as plain:
            with pytest.raises(ConnectionFailedError, match=r"requires TLS \(tls on there\)"):
                plain.connect("127.0.0.1", port, timeout=20)
        with pytest.raises(TransferTimeoutError, match=r"requires TLS .* speaks plain TCP"):
            tls_server.accept(timeout=2)
    with Engine("ofi", secret=SECRET) as plain_server:
        port = plain_server.listen("127.0.0.1", 0)
        with Engine("ofi", tls=True, secret=SECRET) as tls_client:
            with pytest.raises(ConnectionFailedError, match="tls"):
                tls_client.connect("127.0.0.1", port, timeout=20)


def test_wrong_psk_is_refused_and_the_server_stays_usable() -> None:
    with Engine("ofi", tls=True, secret="right") as server:
        port = server.listen("127.0.0.1", 0)
        with Engine("ofi", tls=True, secret="wrong") as bad:
            with pytest.raises(ConnectionFailedError, match=r"TLS handshake with .* failed"):
                bad.connect("127.0.0.1", port, timeout=20)
        with Engine("ofi", tls=True, secret="right") as good:
            ep = good.connect("127.0.0.1", port, timeout=20)
            transfers(ep, server.accept(timeout=20), server, good, 4096)


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
def test_relay_reads_eager_messages_only_without_tls(tls: bool, relay_to: list[Relay]) -> None:
    rng = np.random.default_rng(5)
    messages = [rng.integers(0, 256, 8192, dtype=np.uint8) for _ in range(8)]  # eager: 8 KiB
    with (
        Engine("ofi", tls=tls, secret=SECRET) as server,
        Engine("ofi", tls=tls, secret=SECRET) as client,
    ):
        relay = Relay(server.listen("127.0.0.1", 0))
        relay_to.append(relay)
        ep = client.connect("127.0.0.1", relay.port, timeout=20)
        peer = server.accept(timeout=20)
        for message in messages:
            sending = ep.post_send(message)
            assert peer.recv(timeout=30).tobytes() == message.tobytes()
            sending.wait(30)
        ep.close()
        peer.close()
    with relay.lock:
        seen = bytes(relay.seen)
    assert len(seen) > sum(m.nbytes for m in messages)  # they did pass through the relay
    found = sum(m[:32].tobytes() in seen for m in messages)
    assert found == (0 if tls else len(messages))


def test_relay_cannot_alter_a_control_frame(relay_to: list[Relay]) -> None:
    rng = np.random.default_rng(9)
    messages = [rng.integers(1, 256, 8192, dtype=np.uint8) for _ in range(64)]  # 512 KiB
    with (
        Engine("ofi", tls=True, secret=SECRET) as server,
        Engine("ofi", tls=True, secret=SECRET) as client,
    ):
        relay = Relay(server.listen("127.0.0.1", 0), tamper_at=200_000)
        relay_to.append(relay)
        ep = client.connect("127.0.0.1", relay.port, timeout=20)
        peer = server.accept(timeout=20)
        delivered = 0
        with pytest.raises(ConnectionFailedError, match="TLS record rejected"):
            for message in messages:
                ep.post_send(message)
                got = peer.recv(timeout=30)
                assert got.tobytes() == message.tobytes()  # nothing altered is delivered
                delivered += 1
        assert relay.tampered == 1
        assert delivered < len(messages)
