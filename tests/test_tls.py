"""TLS 1.3 on the tcp transport: bit-exact transfers on every stream under a pre-shared key
(the shared secret) or certificates; a plain peer and a TLS peer refuse each other, naming the
setting; a wrong key is refused; a relay between TLS peers can neither read the payload nor
alter a frame (the connection fails and nothing altered is delivered)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import _raw_peer as raw
from _tls_common import SECRET, Relay, pair, tls_unusable, transfers
from rdmaxfer import (
    ConnectionFailedError,
    Engine,
    InvalidArgumentError,
    RdmaxferError,
    TransferTimeoutError,
    UnsupportedError,
)
from rdmaxfer.options import TcpOptions

_WHY_NOT = tls_unusable()
needs_tls = pytest.mark.skipif(bool(_WHY_NOT), reason=f"TLS unusable here: {_WHY_NOT}")


@needs_tls
def test_psk_transfers_are_bit_exact_on_every_stream() -> None:
    with (
        Engine("tcp", tls=True, secret=SECRET) as server,
        Engine("tcp", options=TcpOptions(tls=True), secret=SECRET.encode()) as client,
    ):
        assert "TLS 1.3" in server.describe() and "pre-shared key" in client.describe()
        ep, peer = pair(server, client, streams=4)
        for n in (1, 100_003, 24 << 20):
            transfers(ep, peer, server, client, n)


@needs_tls
def test_tls_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RDMAXFER_TLS", "1")
    monkeypatch.setenv("RDMAXFER_SECRET", SECRET)
    with Engine("tcp") as server, Engine("tcp") as client:
        assert "TLS 1.3" in server.describe()
        ep, peer = pair(server, client, streams=2)
        transfers(ep, peer, server, client, 3 << 20)


@needs_tls
def test_whole_record_frames_complete_when_a_read_uses_up_its_budget() -> None:
    """16 MiB chunks on one stream: a frame (64-byte header, 16 MiB) goes as a first record
    of 16 KiB, 1023 full records and a last one of 64 bytes, so a receiver that reads a frame
    in one turn has used up its 16 MiB read budget just before that last record, which
    read-ahead may already hold; it must still be consumed (else the WRITE never completes
    and times out with 16 MiB missing). Whether a turn starts at a frame's first byte is up
    to timing: this test meets that case only sometimes (it was seen on a 16-CPU host)."""
    with (
        Engine("tcp", tls=True, secret=SECRET) as server,
        Engine("tcp", tls=True, secret=SECRET) as client,
    ):
        ep, _peer = pair(server, client, streams=1)
        data = np.random.default_rng(16).integers(0, 256, 64 << 20, dtype=np.uint8)
        dst = np.zeros_like(data)
        region = server.register(dst, access="rw")
        for i in range(12):
            dst[:: 1 << 20] = 0
            ep.write(data, region.descriptor(), chunk_size=16 << 20, timeout=60)  # type: ignore[attr-defined]
            assert np.array_equal(dst, data), f"write {i}"


@needs_tls
def test_tls_spreads_streams_over_more_io_threads_where_cpus_allow() -> None:
    """TLS encrypts and decrypts every byte on the I/O threads: its default is half the CPUs
    (2 to 8) and a stream per thread, at least 4; plain TCP keeps 2 threads and 4 streams;
    a setting given wins."""
    cpus = len(os.sched_getaffinity(0))
    io = min(cpus, max(2, min(8, cpus // 2)))
    with Engine("tcp", tls=True, secret=SECRET) as tls, Engine("tcp", secret=SECRET) as plain:
        assert f"{io} I/O threads, {max(4, io)} streams per connection" in tls.describe()
        assert f"{min(2, cpus)} I/O threads, 4 streams per connection" in plain.describe()
    with Engine("tcp", tls=True, secret=SECRET, io_threads=3, streams=5) as given:
        assert "3 I/O threads, 5 streams per connection" in given.describe()


def _openssl(*args: str | Path) -> None:
    subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True, timeout=60)


def _make_ca(d: Path, name: str) -> tuple[Path, Path]:
    key, crt = d / f"{name}.key", d / f"{name}.crt"
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
             "-keyout", key, "-out", crt, "-days", "2", "-subj", f"/CN={name}")  # fmt: skip
    return key, crt


def _make_leaf(d: Path, name: str, ca_key: Path, ca_crt: Path) -> tuple[Path, Path]:
    key, csr, crt = d / f"{name}.key", d / f"{name}.csr", d / f"{name}.crt"
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
             "-keyout", key, "-out", csr, "-subj", f"/CN={name}")  # fmt: skip
    _openssl("x509", "-req", "-in", csr, "-CA", ca_crt, "-CAkey", ca_key, "-CAcreateserial",
             "-out", crt, "-days", "2")  # fmt: skip
    return key, crt


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make certificates")
    d = tmp_path_factory.mktemp("pki")
    ca_key, ca = _make_ca(d, "ca")
    other_key, other_ca = _make_ca(d, "other-ca")
    s_key, s_crt = _make_leaf(d, "server", ca_key, ca)
    c_key, c_crt = _make_leaf(d, "client", ca_key, ca)
    x_key, x_crt = _make_leaf(d, "stranger", other_key, other_ca)
    return {"ca": ca, "s_key": s_key, "s_crt": s_crt, "c_key": c_key, "c_crt": c_crt,
            "x_key": x_key, "x_crt": x_crt, "other_ca": other_ca}  # fmt: skip


def _cert_options(pki: dict[str, Path], who: str, ca: str = "ca") -> TcpOptions:
    return TcpOptions(tls=True, tls_cert=str(pki[f"{who}_crt"]), tls_key=str(pki[f"{who}_key"]),
                      tls_ca=str(pki[ca]))  # fmt: skip


@needs_tls
def test_certificates_authenticate_both_sides(pki: dict[str, Path]) -> None:
    with (
        Engine("tcp", options=_cert_options(pki, "s")) as server,
        Engine("tcp", options=_cert_options(pki, "c")) as client,
    ):
        assert "certificates" in server.describe()
        ep, peer = pair(server, client, streams=3)
        transfers(ep, peer, server, client, 5 << 20)
        port = server.port
        assert port is not None
        # A client whose certificate another CA signed is refused, and the server stays usable.
        with Engine("tcp", options=_cert_options(pki, "x", ca="ca")) as stranger:
            with pytest.raises(ConnectionFailedError, match=r"TLS handshake with .* failed"):
                stranger.connect("127.0.0.1", port, timeout=20)
        with pytest.raises(TransferTimeoutError, match="certificate"):
            server.accept(timeout=1)
        # A client that does not trust the server's CA refuses it.
        with Engine("tcp", options=_cert_options(pki, "c", ca="other_ca")) as wary:
            with pytest.raises(ConnectionFailedError, match="certificate verify failed"):
                wary.connect("127.0.0.1", port, timeout=20)


@needs_tls
def test_settings_that_cannot_work_are_refused(pki: dict[str, Path]) -> None:
    with pytest.raises(InvalidArgumentError, match="tls needs a way to authenticate"):
        Engine("tcp", tls=True)
    with pytest.raises(InvalidArgumentError, match="not both"):
        Engine("tcp", secret="x", options=_cert_options(pki, "s"))
    with pytest.raises(InvalidArgumentError, match="tls_key="):
        mismatched = TcpOptions(
            tls=True, tls_cert=str(pki["s_crt"]), tls_key=str(pki["c_key"]), tls_ca=str(pki["ca"])
        )
        Engine("tcp", options=mismatched)
    with pytest.raises(InvalidArgumentError, match="Engine\\(tls=1\\)"):
        Engine("tcp", tls=1, secret="x")  # type: ignore[arg-type]
    with pytest.raises(
        UnsupportedError, match=r"TLS covers the .*tcp transports only, and this engine uses 'shm'"
    ):
        Engine("shm", tls=True, secret="x")


def test_certificates_without_tls_are_refused(
    pki: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A certificate given while TLS is off would go unchecked: refused, naming the file."""
    off = r"tls_cert='.*server\.crt' set but TLS is off"
    for kind in ("tcp", "auto"):
        with pytest.raises(InvalidArgumentError, match=off):
            Engine(kind, options=TcpOptions(tls=False, tls_cert=str(pki["s_crt"])))
    monkeypatch.setenv("RDMAXFER_TLS_CA", str(pki["ca"]))
    for kind in ("tcp", "shm"):
        with pytest.raises(InvalidArgumentError, match=r"tls_ca='.*' set but TLS is off.*TLS=1"):
            Engine(kind, secret=SECRET)


@needs_tls
def test_auto_engine_with_certificates_takes_same_host_peers_only_under_tls(
    pki: dict[str, Path],
) -> None:
    """shm runs no TLS and cannot check a certificate: an automatic engine with TLS by
    certificates connects same-host peers over tcp with TLS, and refuses one without."""
    with Engine("auto", options=_cert_options(pki, "s")) as server:
        assert "no shm for peers on this host" in server.describe()
        port = server.listen("127.0.0.1", 0)
        with Engine("auto") as plain:
            with pytest.raises(ConnectionFailedError, match="the peer requires TLS"):
                plain.connect("127.0.0.1", port, timeout=20)
        with pytest.raises(TransferTimeoutError):
            server.accept(timeout=1)
        with Engine("auto", options=_cert_options(pki, "c")) as client:
            ep = client.connect("127.0.0.1", port, timeout=20, streams=2)
            peer = server.accept(timeout=20)
            assert ep.info["transport"] == "tcp"
            assert peer.info["transport"] == "tcp"
            transfers(ep, peer, server, client, 1 << 20)


@needs_tls
def test_plain_to_tls_and_tls_to_plain_are_refused_naming_the_setting() -> None:
    with Engine("tcp", tls=True, secret=SECRET) as tls_server:
        port = tls_server.listen("127.0.0.1", 0)
        with Engine("tcp", secret=SECRET) as plain:
            with pytest.raises(ConnectionFailedError, match="requires TLS \\(tls on there\\)"):
                plain.connect("127.0.0.1", port, timeout=20)
        with pytest.raises(TransferTimeoutError, match=r"requires TLS .* speaks plain TCP"):
            tls_server.accept(timeout=1)
    with Engine("tcp", secret=SECRET) as plain_server:
        port = plain_server.listen("127.0.0.1", 0)
        with Engine("tcp", tls=True, secret=SECRET) as tls_client:
            with pytest.raises(ConnectionFailedError, match="peer speaks plain TCP \\(tls off"):
                tls_client.connect("127.0.0.1", port, timeout=20)
        with pytest.raises(TransferTimeoutError, match=r"asked for TLS .* has tls off"):
            plain_server.accept(timeout=1)


@needs_tls
def test_wrong_psk_is_refused_and_the_server_stays_usable() -> None:
    with Engine("tcp", tls=True, secret="right") as server:
        port = server.listen("127.0.0.1", 0)
        with Engine("tcp", tls=True, secret="wrong") as bad:
            with pytest.raises(ConnectionFailedError, match=r"TLS handshake with .* failed"):
                bad.connect("127.0.0.1", port, timeout=20)
        with Engine("tcp", tls=True, secret="right") as good:
            ep = good.connect("127.0.0.1", port, timeout=20)
            peer = server.accept(timeout=20)
            transfers(ep, peer, server, good, 4096)


@pytest.fixture
def relay_to() -> Iterator[list[Relay]]:
    made: list[Relay] = []
    yield made
    for r in made:
        r.close()


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
def test_relay_reads_the_payload_only_without_tls(tls: bool, relay_to: list[Relay]) -> None:
    if tls and _WHY_NOT:
        pytest.skip(f"TLS unusable here: {_WHY_NOT}")
    payload = np.random.default_rng(7).integers(0, 256, 1 << 20, dtype=np.uint8)
    with (
        Engine("tcp", tls=tls, secret=SECRET) as server,
        Engine("tcp", tls=tls, secret=SECRET) as client,
    ):
        relay = Relay(server.listen("127.0.0.1", 0))
        relay_to.append(relay)
        ep = client.connect("127.0.0.1", relay.port, timeout=20, streams=2)
        peer = server.accept(timeout=20)
        dst = np.zeros_like(payload)
        region = server.register(dst, access="rw")
        ep.write(payload, region.descriptor(), timeout=60)
        assert dst.tobytes() == payload.tobytes()
        ep.close()
        peer.close()
    with relay.lock:
        seen = bytes(relay.seen)
    assert len(seen) > len(payload)  # the payload did pass through the relay
    # Any 32-byte window of the random payload: found in the plain stream, never under TLS.
    windows = [payload[i : i + 32].tobytes() for i in range(0, len(payload), 65_536)]
    found = sum(w in seen for w in windows)
    assert found == (0 if tls else len(windows))


@needs_tls
@pytest.mark.parametrize("mode", ["flip", "inject"])
def test_relay_cannot_alter_a_frame(mode: str, relay_to: list[Relay]) -> None:
    n = 8 << 20
    payload = np.random.default_rng(11).integers(1, 256, n, dtype=np.uint8)  # no zero byte
    with (
        Engine("tcp", tls=True, secret=SECRET) as server,
        Engine("tcp", tls=True, secret=SECRET) as client,
    ):
        relay = Relay(server.listen("127.0.0.1", 0), tamper_at=200_000, mode=mode)
        relay_to.append(relay)
        ep = client.connect("127.0.0.1", relay.port, timeout=20, streams=2)
        peer = server.accept(timeout=20)
        out = np.zeros(n, dtype=np.uint8)
        receiving = peer.post_recv(out=out)
        sending = ep.post_send(payload)
        with pytest.raises(ConnectionFailedError, match="TLS record rejected"):
            receiving.wait(60)
        # The sender sees the connection fail too, unless all its bytes had left by then.
        with contextlib.suppress(RdmaxferError):
            sending.wait(60)
        assert relay.tampered >= 1
        # Nothing altered was delivered: every byte is still 0 or the sender's.
        assert bool(np.all((out == 0) | (out == payload)))


@needs_tls
@pytest.mark.parametrize(
    ("upstream", "at"), [(True, 25), (False, 9)], ids=["hello-connection-id", "ack-engine-id"]
)
def test_relay_cannot_alter_the_clear_hello(upstream: bool, at: int, relay_to: list[Relay]) -> None:
    """The Hello and its reply go in clear before TLS; both sides compare them inside TLS, so
    a relay that alters one (a byte of the Hello's connection id, or of the reply's engine
    id) fails the connection on both sides, and the engines stay usable."""
    with (
        Engine("tcp", tls=True, secret=SECRET) as server,
        Engine("tcp", tls=True, secret=SECRET) as client,
    ):
        port = server.listen("127.0.0.1", 0)
        relay = Relay(port, tamper_at=at, upstream=upstream)
        relay_to.append(relay)
        altered = "the Hello or its reply .* differs between the two sides"
        with pytest.raises(ConnectionFailedError, match=altered):
            client.connect("127.0.0.1", relay.port, timeout=20, streams=1)
        assert relay.tampered == 1
        with pytest.raises(TransferTimeoutError, match=altered):
            server.accept(timeout=5)
        ep = client.connect("127.0.0.1", port, timeout=20, streams=1)
        peer = server.accept(timeout=20)
        transfers(ep, peer, server, client, 4096)


@needs_tls
def test_a_stranger_claiming_a_large_client_hello_is_refused_from_its_headers() -> None:
    """OpenSSL sizes its handshake buffer by the length a ClientHello claims, before anyone
    is authenticated: a claim beyond 16 KiB is refused from the first 9 bytes, and the
    listener stays usable."""
    with Engine("tcp", tls=True, secret=SECRET) as server:
        port = server.listen("127.0.0.1", 0)
        with raw.connect(port) as s:
            s.sendall(raw.hello(flags=raw.FLAG_TLS))
            assert raw.recv_exact(s, 16)[:4] == b"RXOK"
            # A handshake record holding the first 60 bytes of a ClientHello of 131,000.
            s.sendall(b"\x16\x03\x01\x00\x40\x01" + (131_000).to_bytes(3, "big") + bytes(60))
            s.settimeout(10)
            with contextlib.suppress(ConnectionResetError):  # closed unread: a reset
                assert s.recv(4096) == b""  # closed by the server
        with pytest.raises(TransferTimeoutError, match=r"ClientHello claims 131000 bytes"):
            server.accept(timeout=1)
        with Engine("tcp", tls=True, secret=SECRET) as client:
            ep = client.connect("127.0.0.1", port, timeout=20)
            peer = server.accept(timeout=20)
            transfers(ep, peer, server, client, 4096)
