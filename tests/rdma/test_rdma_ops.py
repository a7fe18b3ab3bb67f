"""Every verbs operation between rxe0 and rxe1, byte-exact on random data of odd sizes."""

from __future__ import annotations

import numpy as np
import pytest

from rdmaxfer.errors import ConnectionFailedError, ProtocolError

from .rdma_helpers import (
    RW,
    RdmaPair,
    api_pair,
    connect_pair,
    rails,
    random_bytes,
    region_array,
    wait_ok,
)

pytestmark = pytest.mark.rdma

SIZES = [1, 4095, (1 << 20) + 3]


def test_connection_set_up_and_capabilities(rdma_pair: RdmaPair) -> None:
    caps = rdma_pair.client.capabilities()
    assert caps["transport"] == "rdma"
    assert caps["write_with_imm"] is True
    assert caps["one_sided"] is True
    assert int(caps["max_message"]) > 0
    text = rdma_pair.client.describe()
    for word in ("rxe0", "port 1", "GID index", "active MTU", "link layer", "poll mode event"):
        assert word in text, text
    assert (
        rdma_pair.a.streams == len(rails(0)) and not rdma_pair.a.closed and not rdma_pair.b.closed
    )


def test_negotiated_rc_attributes_are_shown() -> None:
    """path MTU, max_rd_atomic and max_dest_rd_atomic come from both endpoint records and show in
    Endpoint.info and Endpoint.describe() (rxe: active MTU 4096 on the MTU-9000 veth pair,
    READ depths clamped to 16)."""
    with api_pair() as (_, _, ep, peer):
        for side in (ep, peer):
            info = side.info
            # One RC QP per rail pair (run-in-vm.sh --rails 2: two).
            assert info["transport"] == "rdma" and info["streams"] == len(rails(0)), info
            assert info["path_mtu"] == 4096, info
            assert info["max_rd_atomic"] == info["max_dest_rd_atomic"] == 16, info
            assert 0 < int(info["rnr_retry"]) < 7, info  # finite
            text = side.describe()
            assert text.startswith("rdma to ") and "path_mtu 4096" in text, text
            assert "max_rd_atomic 16, max_dest_rd_atomic 16" in text, text


def test_close_is_seen_by_the_peer(rdma_pair: RdmaPair) -> None:
    header = rdma_pair.b.post_recv_header()
    rdma_pair.a.close()
    assert rdma_pair.a.closed
    assert header.wait(30), "the peer did not notice the close"
    with pytest.raises(ConnectionFailedError, match="closed the endpoint"):
        header.check()
    assert rdma_pair.b.closed


@pytest.mark.parametrize("size", SIZES)
def test_write_then_read(rdma_pair: RdmaPair, rng: np.random.Generator, size: int) -> None:
    src = rdma_pair.client.alloc_pinned(size, 0)
    dst = rdma_pair.server.alloc_pinned(size, RW)
    data = random_bytes(rng, size)
    region_array(src)[:] = data
    wait_ok(rdma_pair.a.post_write(src, 0, dst.descriptor(), 0, size))
    np.testing.assert_array_equal(region_array(dst), data)

    back = rdma_pair.client.alloc_pinned(size, 0)
    other = random_bytes(rng, size)
    region_array(dst)[:] = other
    wait_ok(rdma_pair.a.post_read(back, 0, dst.descriptor(), 0, size))
    np.testing.assert_array_equal(region_array(back), other)


def test_write_into_user_numpy_memory(rdma_pair: RdmaPair, rng: np.random.Generator) -> None:
    size = 3 * 4096 + 17
    src_arr = random_bytes(rng, size)
    dst_arr = np.ones(size + 100, dtype=np.uint8)
    src = rdma_pair.client.register(src_arr.ctypes.data, size, 0)
    dst = rdma_pair.server.register(dst_arr.ctypes.data, dst_arr.nbytes, RW)
    wait_ok(rdma_pair.a.post_write(src, 0, dst.descriptor(), 50, size))
    np.testing.assert_array_equal(dst_arr[50 : 50 + size], src_arr)
    assert (dst_arr[:50] == 1).all() and (dst_arr[50 + size :] == 1).all()


@pytest.mark.parametrize("size", [0, *SIZES])
@pytest.mark.parametrize("remote_writable", [False, True])
def test_send_recv(
    rdma_pair: RdmaPair, rng: np.random.Generator, size: int, remote_writable: bool
) -> None:
    src = rdma_pair.client.alloc_pinned(size, 0)
    data = random_bytes(rng, size)
    region_array(src)[:] = data
    send = rdma_pair.a.post_send(src, 0, size, b"meta:uint8", 0, 0)
    header = rdma_pair.b.post_recv_header()
    wait_ok(header)
    msg_id, length, meta = header.message()
    assert (length, meta) == (size, b"meta:uint8")
    # Without REMOTE_WRITE the receiver registers a temporary MR over the destination.
    dst = rdma_pair.server.alloc_pinned(size, RW if remote_writable else 0)
    recv = rdma_pair.b.post_recv(msg_id, dst, 0, size)
    wait_ok(recv)
    wait_ok(send)
    np.testing.assert_array_equal(region_array(dst), data)


def test_reject_fails_the_sender(rdma_pair: RdmaPair) -> None:
    src = rdma_pair.client.alloc_pinned(100_000, 0)
    send = rdma_pair.a.post_send(src, 0, 100_000, b"x", 0, 0)
    header = rdma_pair.b.post_recv_header()
    wait_ok(header)
    rdma_pair.b.reject(header.message()[0], "wrong dtype")
    assert send.wait(30)
    with pytest.raises(ProtocolError, match="rejected the message: wrong dtype"):
        send.check()
    # The connection stays usable.
    send2 = rdma_pair.a.post_send(src, 0, 10, b"y", 0, 0)
    header2 = rdma_pair.b.post_recv_header()
    wait_ok(header2)
    dst = rdma_pair.server.alloc_pinned(10, 0)
    wait_ok(rdma_pair.b.post_recv(header2.message()[0], dst, 0, 10))
    wait_ok(send2)


def test_rendezvous_write_with_imm_over_many_wrs(
    rdma_pair: RdmaPair, rng: np.random.Generator
) -> None:
    """A 1 MiB + 3 message in 4 KiB chunks: 257 WRs (more than the send queue holds), the last
    a WRITE_WITH_IMM whose receive completion is the only thing that completes the RECV."""
    size = (1 << 20) + 3
    src = rdma_pair.client.alloc_pinned(size, 0)
    data = random_bytes(rng, size)
    region_array(src)[:] = data
    send = rdma_pair.a.post_send(src, 0, size, b"", 4096, 0)
    header = rdma_pair.b.post_recv_header()
    wait_ok(header)
    dst = rdma_pair.server.alloc_pinned(size, 0)
    recv = rdma_pair.b.post_recv(header.message()[0], dst, 0, size)
    wait_ok(recv)
    np.testing.assert_array_equal(region_array(dst), data)
    wait_ok(send)


@pytest.mark.parametrize("streams", [1, 3])
def test_one_sided_larger_than_one_wr(rng: np.random.Generator, streams: int) -> None:
    pair = connect_pair(streams=streams)
    try:
        qps = streams * len(rails(0))  # QPs per rail pair, on every rail pair
        assert pair.a.streams == qps and pair.b.streams == qps
        size = (1 << 20) + 3
        src = pair.client.alloc_pinned(size, 0)
        dst = pair.server.alloc_pinned(size, RW)
        data = random_bytes(rng, size)
        region_array(src)[:] = data
        wait_ok(pair.a.post_write(src, 0, dst.descriptor(), 0, size, 4096, streams))
        np.testing.assert_array_equal(region_array(dst), data)
        back = pair.client.alloc_pinned(size, 0)
        wait_ok(pair.a.post_read(back, 0, dst.descriptor(), 0, size, 8192, streams))
        np.testing.assert_array_equal(region_array(back), data)
    finally:
        pair.client.close()
        pair.server.close()


def test_many_in_flight(rdma_pair: RdmaPair, rng: np.random.Generator) -> None:
    n, size = 32, 64 * 1024 + 5
    src = rdma_pair.client.alloc_pinned(n * size, 0)
    dst = rdma_pair.server.alloc_pinned(n * size, RW)
    data = random_bytes(rng, n * size)
    region_array(src)[:] = data
    desc = dst.descriptor()
    writes = [
        rdma_pair.a.post_write(src, i * size, desc, i * size, size, 16384, 0) for i in range(n)
    ]
    sends = [rdma_pair.a.post_send(src, i * size, size, str(i).encode(), 0, 0) for i in range(n)]
    for w in writes:
        wait_ok(w)
    np.testing.assert_array_equal(region_array(dst), data)
    out = rdma_pair.server.alloc_pinned(n * size, 0)
    recvs = []
    for _ in range(n):
        header = rdma_pair.b.post_recv_header()
        wait_ok(header)
        msg_id, length, meta = header.message()
        i = int(meta)
        recvs.append(rdma_pair.b.post_recv(msg_id, out, i * size, length))
    for r in recvs + sends:
        wait_ok(r)
    np.testing.assert_array_equal(region_array(out), data)


@pytest.mark.parametrize("srq", ["1", "0"])
def test_close_drains_the_flushes_before_releasing(
    srq: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """close() moves the QPs to ERR, retires every flushed WR and receive, and only then lets
    go of what they used: when it returns nothing is on the device and no region is in use.
    With the rail's SRQ the QPs own no receive (the SRQ keeps its buffers posted); without it
    (RDMAXFER_SRQ=0) each QP posts its 32 and the close flushes them."""
    monkeypatch.setenv("RDMAXFER_SRQ", srq)
    pair = connect_pair()
    try:
        src = pair.client.alloc_pinned(1 << 20, 0)
        dst = pair.server.alloc_pinned(1 << 20, RW)
        before = pair.a.attributes()
        assert before["srq"] == int(srq), before
        assert before["posted_receives"] == (0 if srq == "1" else 32 * pair.a.streams), before
        writes = [pair.a.post_write(src, 0, dst.descriptor(), 0, 1 << 20, 16384) for _ in range(4)]
        pair.a.close()
        attrs = pair.a.attributes()
        assert attrs["outstanding_wrs"] == 0 and attrs["posted_receives"] == 0, attrs
        assert all(w.done() for w in writes)
        pair.client.deregister(src, 0.0)  # no operation holds it any more: no wait
    finally:
        pair.client.close()
        pair.server.close()
