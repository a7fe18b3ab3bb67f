"""GPU memory over verbs (rxe0 -> rxe1): device buffers sent, received, written and read,
weights pulled into device memory and served from it. Without a GPU this runs over the
stand-in CUDA driver (tests/_cuda_standin.py, ``pytest -m "gpu and rdma"``), whose device
memory the NIC cannot register, so every path here is the staged one (pinned bounce buffers),
as on a GPU server without nvidia-peermem or dmabuf."""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterator

import numpy as np
import pytest
import xxhash

import rdmaxfer
import rdmaxfer.memory.meta
from _gpu_data import crc as _crc
from _gpu_data import device_random as _device_random
from rdmaxfer import Buffer, Engine, _core, cuda
from rdmaxfer.errors import RdmaxferError

from .rdma_helpers import RW, WAIT_S, addrs, api_pair, devices

pytestmark = [
    pytest.mark.rdma,
    pytest.mark.gpu,
    pytest.mark.skipif(not cuda.available(), reason=cuda.unavailable_reason() or "no GPU"),
]

SECRET = "rxe-gpu-test"


@pytest.fixture
def engines() -> Iterator[tuple[Engine, Engine, rdmaxfer.Endpoint, rdmaxfer.Endpoint]]:
    with api_pair(SECRET) as engines:
        yield engines


def test_preflight_says_staging_and_why(
    engines: tuple[Engine, Engine, rdmaxfer.Endpoint, rdmaxfer.Endpoint],
) -> None:
    server, _, _, _ = engines
    check = server.gpu_preflight(0)
    assert check.method == "staging"
    assert check.reasons, "staging must say why neither dmabuf nor peermem applies"


@pytest.mark.parametrize("size", [0, 1, 65_537, 1 << 20, 3 * (1 << 16) + 77])
def test_device_send_recv_write_read_over_verbs(
    engines: tuple[Engine, Engine, rdmaxfer.Endpoint, rdmaxfer.Endpoint],
    rng: np.random.Generator,
    size: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Over 64 KiB bounce slabs: the largest sizes take several slabs (write/read) or a one-off
    message buffer (send/recv)."""
    monkeypatch.setenv("RDMAXFER_BOUNCE_SLAB_BYTES", str(1 << 16))
    server, _, a, b = engines
    src, host = _device_random(rng, size)
    sent = a.post_send(src)
    got = b.recv(device="cuda:0", timeout=WAIT_S)
    sent.wait(WAIT_S)
    assert isinstance(got, Buffer) and got.device == "cuda:0"
    assert _crc(got.copy_to_host()) == _crc(host)

    remote = np.zeros(size, np.uint8)
    region = server.register(remote, "rw")
    a.write(src, region.descriptor(), timeout=WAIT_S)
    assert _crc(remote) == _crc(host)
    back = Buffer.empty(size, np.uint8, device="cuda:0")
    a.read(back, region.descriptor(), timeout=WAIT_S)
    assert _crc(back.copy_to_host()) == _crc(host)


def test_weights_served_from_device_memory_pulled_into_device_memory(
    rng: np.random.Generator,
) -> None:
    host = {f"layer{i}.weight": rng.standard_normal((96, 33)).astype(np.float32) for i in range(3)}
    device = {}
    for name, ref in host.items():
        buf = Buffer.empty(ref.shape, ref.dtype, device="cuda:0")
        cuda.copy_from_host(buf.device_array(), ref)
        device[name] = buf
    with (
        Engine("rdma", rdma_device=devices()[1], secret=SECRET) as serving,
        rdmaxfer.WeightServer(device, host=addrs()[1], engine=serving) as server,
        Engine("rdma", rdma_device=devices()[0], secret=SECRET) as client,
    ):
        server.start()
        got = rdmaxfer.pull_weights(
            f"{addrs()[1]}:{server.port}", engine=client, device="cuda:0", timeout=WAIT_S
        )
    assert set(got) == set(host)
    for name, ref in host.items():
        arr = got[name]
        assert isinstance(arr, Buffer) and arr.device == "cuda:0"
        np.testing.assert_array_equal(arr.copy_to_host(), ref)


def _standin() -> ctypes.CDLL:
    path = os.environ.get("RDMAXFER_CUDA_LIBRARY", "")
    if "cuda_standin" not in path:
        pytest.skip("reads the stand-in driver's records (RDMAXFER_CUDA_LIBRARY is not it)")
    return ctypes.CDLL(path)  # the same handle rdmaxfer loaded: the same state


def _sync_memops(lib: ctypes.CDLL, ptr: int) -> int:
    value = ctypes.c_int(-1)
    assert lib.cuPointerGetAttribute(ctypes.byref(value), 6, ctypes.c_ulonglong(ptr)) == 0
    return value.value


def test_nic_ranges_get_sync_memops_and_export_page_aligned(
    engines: tuple[Engine, Engine, rdmaxfer.Endpoint, rdmaxfer.Endpoint],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before the NIC may touch GPU memory it gets CU_POINTER_ATTRIBUTE_SYNC_MEMOPS (6), by
    either method; dmabuf exports the page-aligned range around an unaligned array (the
    stand-in refuses unaligned ranges, as the driver does). rxe then refuses the MR itself."""
    _, client, _, _ = engines
    lib = _standin()
    lib.rdmaxfer_standin_last_export.argtypes = [
        ctypes.POINTER(ctypes.c_ulonglong),
        ctypes.POINTER(ctypes.c_size_t),
    ]
    page = os.sysconf("SC_PAGE_SIZE")
    by_peermem = _core.DeviceMemory(0, 4 * page)
    assert _sync_memops(lib, by_peermem.ptr) == 0
    with pytest.raises(RdmaxferError):
        client.core.register_device(by_peermem.ptr + 100, 5000, RW, "peermem", 0)
    assert _sync_memops(lib, by_peermem.ptr) == 1

    monkeypatch.setenv("RDMAXFER_CUDA_STANDIN_DMABUF", "1")
    by_dmabuf = _core.DeviceMemory(0, 4 * page)
    with pytest.raises(RdmaxferError) as info:
        client.core.register_device(by_dmabuf.ptr + 100, 5000, RW, "dmabuf", 0)
    assert "cuMemGetHandleForAddressRange" not in str(info.value)  # the export succeeded
    assert _sync_memops(lib, by_dmabuf.ptr) == 1
    ptr, size = ctypes.c_ulonglong(), ctypes.c_size_t()
    lib.rdmaxfer_standin_last_export(ctypes.byref(ptr), ctypes.byref(size))
    assert ptr.value == by_dmabuf.ptr  # the page below ptr + 100
    assert size.value == 2 * page  # up to the page above ptr + 100 + 5000


def test_checksummed_gpu_messages_over_verbs(
    engines: tuple[Engine, Engine, rdmaxfer.Endpoint, rdmaxfer.Endpoint],
    rng: np.random.Generator,
) -> None:
    """checksum=True on GPU memory (issue 16 item 5): the sender hashes a host copy and sends
    it from a temporary MR; the receiver lands it in host memory, verifies, then copies up."""
    server, _, a, b = engines
    src, host = _device_random(rng, 1_000_003)
    sent = a.post_send(src, checksum=True)
    header = b.core.post_recv_header()
    assert header.wait(WAIT_S)
    msg_id, length, meta = header.message()
    assert rdmaxfer.memory.meta.checksum(meta) == xxhash.xxh3_64_intdigest(host.tobytes())
    landed = np.zeros(length, np.uint8)
    region = server.register(landed, "none")
    assert b.core.post_recv(msg_id, region.core, 0, length).wait(WAIT_S)
    sent.wait(WAIT_S)
    assert _crc(landed) == _crc(host)
    sent = a.post_send(src, checksum=True)
    out = Buffer.empty(host.size, np.uint8, device="cuda:0")
    assert b.recv(out=out, timeout=WAIT_S) is out
    sent.wait(WAIT_S)
    assert _crc(out.copy_to_host()) == _crc(host)


def test_corrupted_message_into_gpu_memory_over_verbs(
    engines: tuple[Engine, Engine, rdmaxfer.Endpoint, rdmaxfer.Endpoint],
    rng: np.random.Generator,
) -> None:
    _, client, a, b = engines
    data = rng.integers(0, 256, 1 << 20, dtype=np.uint8)
    meta = rdmaxfer.memory.meta.encode(
        data.dtype, data.shape, rdmaxfer.memory.meta.payload_checksum(data) ^ 0x1
    )
    region = client.register(data, access="none")
    request = a.core.post_send(region.core, 0, data.nbytes, meta)
    out, before = _device_random(rng, data.size)
    with pytest.raises(rdmaxfer.ChecksumError, match=r"corrupted .*device array was left"):
        b.recv(out=out, timeout=WAIT_S)
    assert request.wait(WAIT_S)
    assert _crc(out.copy_to_host()) == _crc(before)
