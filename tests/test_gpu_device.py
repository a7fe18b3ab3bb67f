"""Real GPU memory (cuMemAlloc'd buffers, CuPy arrays when installed) over TCP and, where a NIC
is present, verbs. Marked ``gpu``: skipped with the loader's reason on machines without CUDA
(run them with ``pytest -m gpu``, e.g. from bench/gpu_check.sh)."""

from __future__ import annotations

import sys
import types

import ml_dtypes
import numpy as np
import pytest
import xxhash

import rdmaxfer
from _common import Pair
from _gpu_data import crc as _crc
from _gpu_data import device_random as _device_random
from rdmaxfer import Buffer, _core
from rdmaxfer.gpu.staging import to_user_array
from rdmaxfer.memory import cuda
from rdmaxfer.memory import meta as _meta

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not cuda.available(), reason=cuda.unavailable_reason() or "no GPU"),
]


def test_status_and_pointer_kinds() -> None:
    s = cuda.status()
    assert s["driver_version"] >= 11000 and s["gpus"]
    g = s["gpus"][0]
    assert g["pci_bus_id"].count(":") == 2 and g["total_memory"] > 1 << 30
    mem = _core.DeviceMemory(0, 1 << 20)
    assert _core.pointer_kind(mem.ptr) == ("device", 0)
    assert _core.pointer_kind(int(np.zeros(4).ctypes.data))[0] == "host"


def test_device_round_trip_copy(rng: np.random.Generator) -> None:
    buf, host = _device_random(rng, (1000, 1001), np.float32)
    np.testing.assert_array_equal(buf.copy_to_host(), host)


@pytest.mark.parametrize("size", [0, 1, 1_000_003, 3 * (8 << 20) + 77, 64 << 20])
def test_staged_send_recv_write_read(pair: Pair, rng: np.random.Generator, size: int) -> None:
    src, host = _device_random(rng, size, np.uint8)
    sent = pair.a.post_send(src)
    got = pair.b.recv(device="cuda:0", timeout=60)
    sent.wait(60)
    got_host = got.get() if hasattr(got, "get") else got.copy_to_host()
    assert _crc(got_host) == _crc(host)

    remote = np.zeros(size, np.uint8)
    region = pair.server.register(remote, "rw")
    pair.a.write(src, region.descriptor(), timeout=60)
    assert _crc(remote) == _crc(host)
    back = Buffer.empty(size, np.uint8, device="cuda:0")
    pair.a.read(back, region.descriptor(), timeout=60)
    assert _crc(back.copy_to_host()) == _crc(host)


def test_staged_sends_keep_their_order(pair: Pair, rng: np.random.Generator) -> None:
    """Messages match in send order, staged or not: 12 GPU sends posted back to back, largest
    first, so a later (smaller) device-to-host copy ends first; each recv gets its own."""
    sizes = [(12 - i) << 20 for i in range(12)]
    sources = [_device_random(rng, n + i, np.uint8) for i, n in enumerate(sizes)]
    sent = [pair.a.post_send(src) for src, _ in sources]
    for (_, host), n in zip(sources, sizes, strict=True):
        got = pair.b.recv(device="cuda:0", timeout=60)
        assert got.nbytes == host.nbytes, f"a {got.nbytes}-byte message overtook {n} bytes"
        assert _crc(got.get() if hasattr(got, "get") else got.copy_to_host()) == _crc(host)
    for s in sent:
        s.wait(60)


def test_received_bfloat16_stays_a_buffer_where_cupy_has_no_type(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Found on an H200 with CuPy installed: CuPy fell back to ``__array__`` for a bfloat16
    device Buffer (no CUDA Array Interface typestr names it) and the receive raised TypeError.
    Dtypes CuPy can name become CuPy arrays; the others stay Buffers (torch.from_dlpack)."""
    fake = types.ModuleType("cupy")
    fake.asarray = lambda b: ("cupy", b.__cuda_array_interface__["typestr"])  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.setattr(cuda, "standin", False)
    f32 = Buffer.empty(4, np.float32, device="cuda:0")
    bf16 = Buffer.empty(4, ml_dtypes.bfloat16, device="cuda:0")
    assert to_user_array(f32) == ("cupy", "<f4")
    assert to_user_array(bf16) is bf16


def test_cupy_arrays(pair: Pair, rng: np.random.Generator) -> None:
    cupy = pytest.importorskip("cupy")
    host = rng.standard_normal((512, 513)).astype(np.float32)
    x = cupy.asarray(host)
    sent = pair.a.post_send(x)
    y = pair.b.recv(device="cuda:0", timeout=60)
    sent.wait(60)
    assert isinstance(y, cupy.ndarray)
    np.testing.assert_array_equal(cupy.asnumpy(y), host)
    out = cupy.zeros_like(x)
    sent = pair.b.post_send(host)
    assert pair.a.recv(out=out, timeout=60) is out
    sent.wait(60)
    np.testing.assert_array_equal(cupy.asnumpy(out), host)
    # Zero-copy views both ways: CuPy on our Buffer, our Buffer on CuPy.
    buf = Buffer.wrap(x)
    assert buf.addr == x.data.ptr
    assert cupy.asarray(buf).data.ptr == x.data.ptr


def test_torch_dlpack(rng: np.random.Generator) -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    buf, host = _device_random(rng, (33, 17), np.float32)
    t = torch.from_dlpack(buf)
    assert t.is_cuda and t.data_ptr() == buf.addr
    np.testing.assert_array_equal(t.cpu().numpy(), host)
    wrapped = Buffer.wrap(t)
    assert wrapped.addr == t.data_ptr()


def test_pull_weights_into_gpu(rng: np.random.Generator) -> None:
    tensors = {f"t{i}": rng.standard_normal((128, 65)).astype(np.float32) for i in range(4)}
    with rdmaxfer.WeightServer(tensors, transport="tcp") as server:
        server.start()
        got = rdmaxfer.pull_weights(f"127.0.0.1:{server.port}", transport="tcp", device="cuda:0")
    for name, ref in tensors.items():
        arr = got[name]
        host = arr.get() if hasattr(arr, "get") else arr.copy_to_host()
        np.testing.assert_array_equal(host, ref)


@pytest.mark.rdma
def test_gpu_direct_registration_or_clear_reason() -> None:
    transports = _core.available_transports()
    if transports.get("rdma"):
        pytest.skip(f"no RDMA device: {transports['rdma']}")
    with rdmaxfer.Engine("rdma") as engine:
        check = engine.gpu_preflight(0)
        buf = Buffer.empty(1 << 20, np.uint8, device="cuda:0")
        if check.method == "staging":
            with pytest.raises(rdmaxfer.UnsupportedError, match="staged"):
                engine.register(buf)
        else:
            region = engine.register(buf, access="rw")
            assert region.device == 0 and region.key != 0
            region.close()


def test_device_buffer_exports_cuda_interfaces(rng: np.random.Generator) -> None:
    buf, host = _device_random(rng, (64, 48), np.float32)
    cai = buf.__cuda_array_interface__
    assert cai["data"] == (buf.addr, False)
    assert cai["shape"] == (64, 48) and cai["typestr"] == "<f4" and cai["version"] == 3
    assert buf.__dlpack_device__() == (2, 0)  # kDLCUDA, GPU 0
    capsule = buf.__dlpack__(stream=None)
    assert type(capsule).__name__ == "PyCapsule"
    np.testing.assert_array_equal(buf.copy_to_host(), host)


def test_weights_served_from_device_memory(rng: np.random.Generator) -> None:
    host = {f"w{i}": rng.standard_normal((77, 31)).astype(np.float32) for i in range(3)}
    device = {}
    for name, ref in host.items():
        buf = Buffer.empty(ref.shape, ref.dtype, device="cuda:0")
        cuda.copy_from_host(buf.device_array(), ref)
        device[name] = buf
    with rdmaxfer.WeightServer(device, transport="tcp") as server:
        server.start()
        got = rdmaxfer.pull_weights(f"127.0.0.1:{server.port}", transport="tcp")
    assert set(got) == set(host)
    for name, ref in host.items():
        np.testing.assert_array_equal(got[name], ref)


# -- checksum=True on GPU memory (issue 16 item 5) ------------------------------------------------
def test_checksummed_send_from_gpu_carries_the_hash_of_its_bytes(
    pair: Pair, rng: np.random.Generator
) -> None:
    src, host = _device_random(rng, 1_000_003, np.uint8)
    sent = pair.a.post_send(src, checksum=True)
    header = pair.b.core.post_recv_header()
    assert header.wait(60)
    msg_id, length, meta = header.message()
    assert length == host.nbytes
    assert _meta.checksum(meta) == xxhash.xxh3_64_intdigest(host.tobytes())
    landed = np.zeros(length, np.uint8)
    region = pair.server.register(landed, "none")
    assert pair.b.core.post_recv(msg_id, region.core, 0, length).wait(60)
    sent.wait(60)
    assert landed.tobytes() == host.tobytes()


@pytest.mark.parametrize("into", ["device", "out"])
def test_checksummed_message_into_gpu_memory(
    pair: Pair, rng: np.random.Generator, into: str
) -> None:
    data = rng.standard_normal((1023, 515)).astype(np.float32)
    sending = pair.a.post_send(data, checksum=True)
    if into == "device":
        got = pair.b.recv(device="cuda:0", timeout=60)
    else:
        out, _ = _device_random(rng, data.shape, np.float32)
        got = pair.b.recv(out=out, timeout=60)
        assert got is out
    sending.wait(60)
    host = got.get() if hasattr(got, "get") else got.copy_to_host()
    assert host.dtype == np.float32 and host.tobytes() == data.tobytes()


def test_checksummed_gpu_to_gpu(pair: Pair, rng: np.random.Generator) -> None:
    src, host = _device_random(rng, (3, 700_001), np.uint16)
    sending = pair.a.post_send(src, checksum=True)
    got = pair.b.recv(device="cuda:0", timeout=60)
    sending.wait(60)
    back = got.get() if hasattr(got, "get") else got.copy_to_host()
    assert back.shape == (3, 700_001) and back.tobytes() == host.tobytes()


def test_corrupted_message_into_gpu_memory_raises_and_leaves_it(
    pair: Pair, rng: np.random.Generator
) -> None:
    """The sender's checksum does not match the bytes (as if corrupted on the wire): the
    receive into GPU memory raises, and the device array keeps what it held."""
    data = rng.integers(0, 256, 1 << 20, dtype=np.uint8)
    meta = _meta.encode(data.dtype, data.shape, _meta.payload_checksum(data) ^ 0x1)
    region = pair.client.register(data, access="none")
    request = pair.a.core.post_send(region.core, 0, data.nbytes, meta)
    out, before = _device_random(rng, data.shape, np.uint8)
    with pytest.raises(
        rdmaxfer.ChecksumError, match=r"corrupted .*device array was left untouched"
    ):
        pair.b.recv(out=out, timeout=60)
    assert request.wait(60)
    assert out.copy_to_host().tobytes() == before.tobytes()
    # The endpoint carries on.
    sending = pair.a.post_send(data, checksum=True)
    pair.b.recv(out=out, timeout=60)
    sending.wait(60)
    assert out.copy_to_host().tobytes() == data.tobytes()
