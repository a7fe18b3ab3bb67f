"""The ofi transport over a libfabric RDMA provider between two domains: by default
verbs;ofi_rxm on the soft-RoCE devices of the test VM, the server's engine on rxe1 (10.77.0.2),
the client's on rxe0, each pinned to its domain with RDMAXFER_OFI_IFACE (so ``run-in-vm.sh
--rails 2`` changes nothing here). One-sided WRITE and READ bit-exact at 8 B, 64 KiB and 4 MiB,
a batch of WRITEs with a notification, SEND/RECV, and the main job: the MiniLM file served and
pulled bit-exact (one READ batch of 90 MB: READs over verbs;ofi_rxm on rxe under TCG move about
1.5 MB/s, a tenth of WRITEs, so its bounds are 300 s).

Run by tests/rdma/test_rdma_ofi.py in a pytest process of its own (see there why), and by
bench/efa_check.sh on an EFA machine: RDMAXFER_TEST_OFI_PROVIDER names the provider
(``efa``), RDMAXFER_RXE_DEVICES the two domains and RDMAXFER_RXE_ADDRS the two addresses the
engines listen on."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator

import numpy as np
import pytest

from rdmaxfer import Endpoint, Engine, _core, pull_weights, serve_weights

from .rdma_helpers import WAIT_S, addrs, devices, random_bytes
from .test_rdma_weights import digests, model_file, pulled_bit_exact

pytestmark = pytest.mark.rdma

PROVIDER = os.environ.get("RDMAXFER_TEST_OFI_PROVIDER", "verbs;ofi_rxm")
SECRET = "rxe-ofi-test"


def ofi_engine(monkeypatch: pytest.MonkeyPatch, side: int) -> Engine:
    """An ofi engine on verbs;ofi_rxm, on the domain of side `side` (0: rxe0, 1: rxe1); skips
    when libfabric or its verbs provider cannot open that device."""
    monkeypatch.setenv("RDMAXFER_OFI_PROVIDER", PROVIDER)
    monkeypatch.setenv("RDMAXFER_OFI_IFACE", devices()[side])
    why = _core.available_transports().get("ofi", "unknown transport")
    if why:
        pytest.skip(f"libfabric's {PROVIDER} provider is unavailable on {devices()[side]}: {why}")
    return Engine("ofi", secret=SECRET)


@pytest.fixture(scope="module")
def engines() -> Iterator[tuple[Engine, Engine]]:
    """(server on rxe1, client on rxe0), shared by the module: opening a domain is slow here."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        server = ofi_engine(monkeypatch, 1)
        with server, ofi_engine(monkeypatch, 0) as client:
            yield server, client


@pytest.fixture(scope="module")
def endpoints(engines: tuple[Engine, Engine]) -> tuple[Endpoint, Endpoint]:
    """(the client's endpoint, the server's) of one connection."""
    server, client = engines
    port = server.listen(addrs()[1], 0)
    ep = client.connect(addrs()[1], port, timeout=WAIT_S)
    return ep, server.accept(timeout=WAIT_S)


def digest(data: np.ndarray) -> str:
    return hashlib.sha256(data.tobytes()).hexdigest()


def test_the_connection_names_the_provider_and_domains(
    engines: tuple[Engine, Engine], endpoints: tuple[Endpoint, Endpoint]
) -> None:
    server, client = engines
    ep, peer = endpoints
    assert ep.info["transport"] == peer.info["transport"] == "ofi"
    assert f"provider {PROVIDER} on {devices()[0]}" in client.describe()
    assert f"provider {PROVIDER} on {devices()[1]}" in server.describe()
    if PROVIDER == "verbs;ofi_rxm":  # it takes FI_DELIVERY_COMPLETE (efa need not)
        assert client.describe().endswith(", delivery complete")
    assert f"over libfabric {PROVIDER} ({devices()[0]})" in ep.describe()
    assert (ep.info["provider"], ep.info["domain"]) == (PROVIDER, devices()[0])
    assert (peer.info["provider"], peer.info["domain"]) == (PROVIDER, devices()[1])


@pytest.mark.parametrize("nbytes", [8, 64 << 10, 4 << 20])
def test_write_and_read_bit_exact(
    engines: tuple[Engine, Engine],
    endpoints: tuple[Endpoint, Endpoint],
    rng: np.random.Generator,
    nbytes: int,
) -> None:
    server, _ = engines
    ep, _ = endpoints
    target = np.zeros(nbytes, np.uint8)
    region = server.register(target, "rw")
    src = random_bytes(rng, nbytes)
    ep.write(src, region.descriptor(), timeout=WAIT_S)
    assert digest(target) == digest(src)
    target[:] = random_bytes(rng, nbytes)
    back = np.zeros(nbytes, np.uint8)
    ep.read(back, region.descriptor(), timeout=WAIT_S)
    assert digest(back) == digest(target)


def test_a_batch_notifies_after_every_byte(
    engines: tuple[Engine, Engine],
    endpoints: tuple[Endpoint, Endpoint],
    rng: np.random.Generator,
) -> None:
    server, _ = engines
    ep, peer = endpoints
    pages, size = 8, 64 << 10
    dst = np.zeros(pages * size, np.uint8)
    desc = server.register(dst, "rw").descriptor()
    src = random_bytes(rng, pages * size)
    order = rng.permutation(pages)
    entries = [(src[i * size : (i + 1) * size], desc, int(order[i]) * size) for i in range(pages)]
    assert ep.write_batch(entries, notify=b"all landed").notified
    assert server.wait_notification(WAIT_S) == (peer.peer, b"all landed")
    expected = src.reshape(pages, size)[np.argsort(order)].reshape(-1)
    assert digest(dst) == digest(expected)


def test_send_and_recv(endpoints: tuple[Endpoint, Endpoint], rng: np.random.Generator) -> None:
    ep, peer = endpoints
    for size in (8, 300_007):
        data = random_bytes(rng, size)
        sent = ep.post_send(data)
        got = peer.recv(timeout=WAIT_S)
        sent.wait(WAIT_S)
        assert digest(got) == digest(data)
    reply = rng.standard_normal((33, 7)).astype(np.float32)
    sent = peer.post_send(reply)  # a send completes once the receiver took it
    back = ep.recv(timeout=WAIT_S)
    sent.wait(WAIT_S)
    assert back.dtype == np.float32 and back.shape == (33, 7)
    np.testing.assert_array_equal(back, reply)


def test_minilm_served_and_pulled_bit_exact(monkeypatch: pytest.MonkeyPatch) -> None:
    path = model_file()
    with (
        ofi_engine(monkeypatch, 1) as server,
        serve_weights(path, host=addrs()[1], engine=server, timeout=WAIT_S * 5) as weights,
        ofi_engine(monkeypatch, 0) as client,
    ):
        arrays = pull_weights(f"{addrs()[1]}:{weights.port}", engine=client, timeout=WAIT_S * 5)
        differ = pulled_bit_exact(arrays, path, client)
        pulled = digests(arrays)
    assert not differ, differ
    assert digests(arrays) == pulled  # the caller's arrays: closing the engines leaves them be
