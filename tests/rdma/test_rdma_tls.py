"""TLS 1.3 on the verbs transport's bootstrap stream (soft-RoCE in the guest): the endpoint
records (QP numbers, PSNs, GIDs) and the GOODBYE travel inside TLS; WRITEs, READs and SENDs
stay on the fabric, bit-exact. A plain peer and a TLS peer refuse each other, and a relay on the
bootstrap stream cannot read the records or alter one."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from _tls_common import SECRET, Relay, tls_unusable, transfers
from rdmaxfer import ConnectionFailedError, EndpointClosedError, Engine

from .rdma_helpers import WAIT_S, addrs, rails

RECORD_MAGIC = b"RXEP"  # csrc/transport/rdma/endpoint_record.h


@pytest.fixture(autouse=True)
def tls_usable() -> None:
    why = tls_unusable("tcp")
    if why:
        pytest.skip(f"TLS unusable here: {why}")


@pytest.fixture
def relay_to() -> Iterator[list[Relay]]:
    made: list[Relay] = []
    yield made
    for r in made:
        r.close()


def _engines(tls: bool, secret: str = SECRET) -> tuple[Engine, Engine]:
    return (
        Engine("rdma", rdma_devices=rails(1), tls=tls, secret=secret),
        Engine("rdma", rdma_devices=rails(0), tls=tls, secret=secret),
    )


def test_psk_transfers_are_bit_exact_and_goodbye_goes_inside_tls() -> None:
    server, client = _engines(True)
    with server, client:
        assert "bootstrap under TLS 1.3" in server.describe()
        port = server.listen(addrs()[1], 0)
        ep = client.connect(addrs()[1], port, timeout=WAIT_S)
        peer = server.accept(timeout=WAIT_S)
        for n in (1, 4096, 3 << 20):  # eager, and rendezvous
            transfers(ep, peer, server, client, n)
        ep.close()
        with pytest.raises((ConnectionFailedError, EndpointClosedError), match="closed"):
            peer.recv(timeout=WAIT_S)


def test_plain_and_tls_refuse_each_other() -> None:
    tls_server, plain_client = _engines(True)[0], _engines(False)[1]
    with tls_server, plain_client:
        port = tls_server.listen(addrs()[1], 0)
        with pytest.raises(ConnectionFailedError, match=r"requires TLS \(tls on there\)"):
            plain_client.connect(addrs()[1], port, timeout=WAIT_S)
    plain_server, tls_client = _engines(False)[0], _engines(True)[1]
    with plain_server, tls_client:
        port = plain_server.listen(addrs()[1], 0)
        with pytest.raises(ConnectionFailedError, match="tls"):
            tls_client.connect(addrs()[1], port, timeout=WAIT_S)


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
def test_relay_reads_the_endpoint_record_only_without_tls(tls: bool, relay_to: list[Relay]) -> None:
    server, client = _engines(tls)
    with server, client:
        relay = Relay(server.listen("127.0.0.1", 0))
        relay_to.append(relay)
        ep = client.connect("127.0.0.1", relay.port, timeout=WAIT_S)
        peer = server.accept(timeout=WAIT_S)
        transfers(ep, peer, server, client, 4096)
    with relay.lock:
        seen = bytes(relay.seen)
    assert (RECORD_MAGIC in seen) is not tls


def test_relay_cannot_alter_the_bootstrap(relay_to: list[Relay]) -> None:
    server, client = _engines(True)
    with server, client:
        # One byte of the client's TLS ClientHello flipped (the 32-byte Hello comes first): the
        # handshake fails, so no endpoint record is exchanged. The records after the handshake
        # are AES-GCM records like ofi's control stream, whose tampering tests/test_tls_ofi.py
        # checks.
        relay = Relay(server.listen("127.0.0.1", 0), tamper_at=100)
        relay_to.append(relay)
        with pytest.raises(ConnectionFailedError, match="TLS handshake"):
            client.connect("127.0.0.1", relay.port, timeout=WAIT_S)
        assert relay.tampered == 1
