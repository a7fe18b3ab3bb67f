"""GPU interop without a GPU: the "no CUDA" report, ``__cuda_array_interface__`` and DLPack
parsing (over host memory, for the parsing only), and the whole GPU path of the Endpoint API
with host memory standing in for the device (``rdmaxfer.gpu.staging.host_standin``: the real
staging pipeline and the real TCP transport, ``_core.HostCopier`` for the device copies)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import rdmaxfer
from _common import MARGIN_S, Pair
from _gpu_data import crc as _crc
from rdmaxfer import Buffer, _core
from rdmaxfer.errors import (
    InvalidArgumentError,
    ProtocolError,
    TransferTimeoutError,
    TransportError,
    UnsupportedError,
)
from rdmaxfer.gpu import staging
from rdmaxfer.memory import cuda
from rdmaxfer.memory import dlpack as _dlpack
from rdmaxfer.memory.buffer import device_view

NO_GPU = not cuda.available()


class FakeCudaArray:
    """Exposes ``__cuda_array_interface__`` over host memory (parsing and stand-in tests)."""

    def __init__(
        self,
        arr: np.ndarray,
        *,
        stream: int | None = None,
        readonly: bool = False,
        strides: Any = None,
        version: int = 3,
    ) -> None:
        self.arr = arr
        self.cai: dict[str, Any] = {
            "version": version,
            "shape": arr.shape,
            "typestr": arr.dtype.str,
            "data": (int(arr.ctypes.data), readonly),
            "strides": strides,
            "stream": stream,
        }

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return self.cai


# -- the loader ------------------------------------------------------------------------------


def test_no_cuda_is_reported_cleanly() -> None:
    code = (
        "import json, rdmaxfer; from rdmaxfer import cuda, _core; "
        "print(json.dumps([cuda.available(), cuda.unavailable_reason(), _core.cuda_status()]))"
    )
    env = {**os.environ, "RDMAXFER_CUDA_LIBRARY": "/nonexistent/libcuda.so.1"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    available, reason, status = json.loads(out.stdout)
    assert available is False
    assert reason.startswith("no CUDA: /nonexistent/libcuda.so.1 not found (")
    assert status["gpus"] == [] and status["driver_version"] == 0


@pytest.mark.skipif(not NO_GPU, reason="this machine has a usable GPU")
def test_gpu_requests_raise_unsupported_with_the_reason() -> None:
    reason = cuda.unavailable_reason()
    assert reason
    with pytest.raises(UnsupportedError, match=r"no CUDA|CUDA"):
        Buffer.empty((4, 4), np.float32, device="cuda:0")
    with pytest.raises(UnsupportedError):
        rdmaxfer.pull_weights("127.0.0.1:1", device="cuda:0")
    with pytest.raises(UnsupportedError, match="CUDA memory"):
        device_view(FakeCudaArray(np.zeros(4)), writable=False)
    with pytest.raises(UnsupportedError):
        _core.DeviceMemory(0, 1024)


@pytest.mark.parametrize("device", ["gpu", "cuda:x", -1, True, 1.5])
def test_bad_device_names(device: object) -> None:
    with pytest.raises(InvalidArgumentError, match="must be 'cuda'"):
        cuda.parse_device(device)


def test_pointer_kind_of_host_memory() -> None:
    arr = np.ones(16)
    assert _core.pointer_kind(int(arr.ctypes.data)) == ("host", -1)


def test_info_reports_gpus_and_preflight(capsys: pytest.CaptureFixture[str]) -> None:
    from rdmaxfer.tools import cli

    assert cli.main(["info", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    gpu = info["gpu"]
    assert gpu["gpudirect"]["tcp"]["method"] == "staging"
    assert "moves bytes with the CPU" in gpu["gpudirect"]["tcp"]["reasons"]["dmabuf"]
    if NO_GPU:
        assert gpu["cuda"].startswith("no CUDA") or "CUDA" in gpu["cuda"]
        assert gpu["gpus"] == []
    assert cli.main(["info"]) == 0
    text = capsys.readouterr().out
    assert "GPU memory on tcp: staging" in text


# -- __cuda_array_interface__ ------------------------------------------------------------


def test_cai_v3_fields(rng: np.random.Generator) -> None:
    arr = rng.standard_normal((3, 5)).astype(np.float32)
    ptr, shape, dtype, readonly, stream = cuda.parse_cuda_array_interface(
        FakeCudaArray(arr, stream=7).cai
    )
    assert (ptr, shape, dtype, readonly, stream) == (arr.ctypes.data, (3, 5), np.float32, False, 7)
    # Contiguous strides spelled out are accepted; so are any strides of size-1 dimensions.
    cuda.parse_cuda_array_interface(FakeCudaArray(arr, strides=(20, 4)).cai)
    one = np.zeros((1, 5), np.int16)
    cuda.parse_cuda_array_interface(FakeCudaArray(one, strides=(999, 2)).cai)
    # Before v3 there is no stream field to honour.
    assert cuda.parse_cuda_array_interface(FakeCudaArray(arr, stream=7, version=2).cai)[4] is None
    assert cuda.parse_cuda_array_interface(FakeCudaArray(arr, readonly=True).cai)[3] is True


def test_cai_non_contiguous_is_refused() -> None:
    arr = np.zeros((4, 6), np.float64)
    with pytest.raises(InvalidArgumentError, match=r"not C-contiguous.*strides are \(8, 32\)"):
        cuda.parse_cuda_array_interface(FakeCudaArray(arr, strides=(8, 32)).cai)


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"stream": 0}, "stream 0 is disallowed"),
        ({"stream": "s"}, "not an int"),
        ({"mask": object()}, "mask"),
        ({"typestr": "|O"}, "object dtype"),
        ({"shape": (-1,)}, "negative dimension"),
        ({"data": (0, False)}, "null data pointer"),
        ({"data": None}, "lacks shape/typestr/data"),
    ],
)
def test_cai_malformed(change: dict[str, Any], needle: str) -> None:
    fake = FakeCudaArray(np.zeros(8, np.uint8))
    fake.cai.update(change)
    with pytest.raises(InvalidArgumentError, match=needle):
        cuda.parse_cuda_array_interface(fake.cai)


# -- DLPack ------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.uint8, np.float16, np.bool_])
def test_dlpack_capsule_parsing(rng: np.random.Generator, dtype: Any) -> None:
    arr = (rng.standard_normal((4, 3, 2)) * 10).astype(dtype)
    view = _dlpack.parse(arr.__dlpack__())
    assert (view.ptr, view.shape, view.dtype, view.device_type, view.device_id) == (
        arr.ctypes.data,
        (4, 3, 2),
        np.dtype(dtype),
        _dlpack.KDL_CPU,
        0,
    )


def test_dlpack_non_contiguous_is_refused() -> None:
    arr = np.zeros((4, 6), np.float32)[:, ::2]
    with pytest.raises(InvalidArgumentError, match="not C-contiguous"):
        _dlpack.parse(arr.__dlpack__())
    with pytest.raises(InvalidArgumentError, match="dltensor"):
        _dlpack.parse(object())


def test_host_dlpack_objects_are_not_device_memory() -> None:
    assert device_view(np.zeros(3), writable=False) is None
    assert device_view(Buffer.wrap(np.zeros(3)), writable=True) is None


# -- the GPU path of the Endpoint API, host memory standing in for the device --------------


@pytest.fixture
def standin() -> Iterator[None]:
    with staging.host_standin():
        yield


def test_device_buffer_interfaces(standin: None, rng: np.random.Generator) -> None:
    buf = Buffer.empty((6, 7), ml_dtypes.bfloat16, device="cuda:0")
    assert buf.device == "cuda:0" and buf.shape == (6, 7) and buf.nbytes == 84
    with pytest.raises(InvalidArgumentError, match="GPU memory"):
        buf.numpy()
    with pytest.raises(TypeError, match="copy_to_host"):
        np.asarray(buf)
    assert not hasattr(buf, "__array_interface__")
    assert buf.__dlpack_device__() == (2, 0)
    # Our own DLPack export parses back to the same memory, dtype and shape.
    view = _dlpack.parse(buf.__dlpack__())
    assert (view.ptr, view.shape, view.dtype, view.device_type, view.device_id) == (
        buf.addr,
        (6, 7),
        buf.dtype,
        2,
        0,
    )
    f32 = Buffer.empty(10, np.float32, device="cuda:0")
    cai = f32.__cuda_array_interface__
    assert cai["version"] == 3 and cai["stream"] is None and cai["typestr"] == "<f4"
    host = rng.standard_normal(10).astype(np.float32)
    cuda.copy_from_host(f32.device_array(), host)
    np.testing.assert_array_equal(f32.copy_to_host(), host)
    wrapped = Buffer.wrap(FakeCudaArray(host))
    assert wrapped.device == "cuda:0" and wrapped.addr == host.ctypes.data


def test_send_device_array_to_plain_recv(
    standin: None, pair: Pair, rng: np.random.Generator
) -> None:
    src = rng.standard_normal((257, 129)).astype(np.float32)
    transfer = pair.a.post_send(FakeCudaArray(src))
    got = pair.b.recv(timeout=30)
    transfer.wait(30)
    assert got.dtype == np.float32 and got.shape == src.shape
    assert _crc(got) == _crc(src)


def test_recv_into_device_out_and_new_device_array(
    standin: None, pair: Pair, rng: np.random.Generator
) -> None:
    src = rng.integers(0, 2**31, (1000, 37), dtype=np.int32)
    out = np.zeros_like(src)
    fake_out = FakeCudaArray(out)
    sent = pair.b.post_send(src)
    assert pair.a.recv(out=fake_out, timeout=30) is fake_out
    sent.wait(30)
    np.testing.assert_array_equal(out, src)

    sent = pair.b.post_send(src)
    got = pair.a.recv(device="cuda:0", timeout=30)
    sent.wait(30)
    assert isinstance(got, Buffer) and got.device == "cuda:0"
    np.testing.assert_array_equal(got.copy_to_host(), src)


def test_recv_into_mismatched_device_out_is_rejected(
    standin: None, pair: Pair, rng: np.random.Generator
) -> None:
    src = rng.standard_normal(100).astype(np.float32)
    out = np.full(100, 7.0, np.float64)
    sent = pair.b.post_send(src)
    with pytest.raises(InvalidArgumentError, match="rejected"):
        pair.a.recv(out=FakeCudaArray(out), timeout=30)
    with pytest.raises(ProtocolError):
        sent.wait(30)
    assert (out == 7.0).all()  # untouched
    with pytest.raises(InvalidArgumentError, match="read-only"):
        pair.a.post_recv(out=FakeCudaArray(out, readonly=True))


def test_one_receive_step_for_host_and_device_memory(
    standin: None, pair: Pair, rng: np.random.Generator
) -> None:
    """Host and GPU destinations go through the same receive step (issue 12): the same
    mismatch is refused with the same words, the GPU one only naming the device array."""
    src = rng.standard_normal(100).astype(np.float32)
    errors = []
    for out in (np.full(100, 7.0), FakeCudaArray(np.full(100, 7.0))):
        sent = pair.b.post_send(src)
        with pytest.raises(InvalidArgumentError) as caught:
            pair.a.recv(out=out, timeout=30)
        with pytest.raises(ProtocolError):
            sent.wait(30)
        errors.append(str(caught.value))
    host, device = errors
    assert "(400 bytes) but out is dtype <f8 shape (100,) (800 bytes)" in host
    assert "or out=None to allocate one" in host
    assert device == host.replace("but out is dtype", "but out is device array dtype")
    sent = pair.b.post_send(src)  # the endpoint still works, and the bytes arrive
    out = np.zeros(100, np.float32)
    pair.a.recv(out=FakeCudaArray(out), timeout=30)
    sent.wait(30)
    assert _crc(out) == _crc(src)


@pytest.mark.parametrize("size", [1, 4095, 5_000_011])
def test_write_and_read_device_memory(
    standin: None, pair: Pair, rng: np.random.Generator, size: int
) -> None:
    remote = np.zeros(size, np.uint8)
    region = pair.server.register(remote, "rw")
    device = Buffer.empty(size, np.uint8, device="cuda:0")
    data = rng.integers(0, 256, size, dtype=np.uint8)
    cuda.copy_from_host(device.device_array(), data)
    pair.a.write(device, region.descriptor(), timeout=30)
    assert _crc(remote) == _crc(data)
    back = Buffer.empty(size, np.uint8, device="cuda:0")
    pair.a.read(back, region.descriptor(), timeout=30)
    np.testing.assert_array_equal(back.copy_to_host(), data)
    # Partial ranges: offset into the local device array and into the remote region.
    if size > 10:
        part = Buffer.empty(size, np.uint8, device="cuda:0")
        pair.a.read(
            part, region.descriptor(), offset=3, remote_offset=5, nbytes=size - 8, timeout=30
        )
        np.testing.assert_array_equal(part.copy_to_host()[3 : size - 5], data[5 : size - 3])
    with pytest.raises(InvalidArgumentError, match="past the end"):
        pair.a.post_write(device, region.descriptor(), offset=1, nbytes=size)


def test_copy_failure_surfaces_from_the_endpoint_api(pair: Pair, rng: np.random.Generator) -> None:
    with staging.host_standin(lambda _dev: _core.HostCopier(fail_at=0)):
        remote = np.zeros(1 << 16, np.uint8)
        region = pair.server.register(remote, "rw")
        src = rng.integers(0, 256, remote.size, dtype=np.uint8)
        with pytest.raises(TransportError, match="injected failure of copy #0"):
            pair.a.write(FakeCudaArray(src), region.descriptor(), timeout=30)
        assert not remote.any()
        pair.client.close()  # closes the stager inside the stand-in


def test_hung_copy_times_out_through_the_endpoint_api(pair: Pair, rng: np.random.Generator) -> None:
    with staging.host_standin(lambda _dev: _core.HostCopier(hang_at=0)):
        remote = np.zeros(1 << 16, np.uint8)
        region = pair.server.register(remote, "rw")
        src = rng.integers(0, 256, remote.size, dtype=np.uint8)
        start = time.monotonic()
        with pytest.raises(TransferTimeoutError):
            pair.a.write(FakeCudaArray(src), region.descriptor(), timeout=0.5)
        pair.client.close()
        assert time.monotonic() - start < 0.5 + MARGIN_S + 5.0


def test_weights_from_gpu_tensors_into_gpu(standin: None, rng: np.random.Generator) -> None:
    tensors = {
        "w": rng.standard_normal((64, 33)).astype(np.float32),
        "b": rng.standard_normal(33).astype(np.float16),
        "i": rng.integers(-5, 5, (7, 3), dtype=np.int64),
    }
    published = {k: FakeCudaArray(v) for k, v in tensors.items() if k != "i"}
    published["i"] = tensors["i"]  # host and GPU tensors can be mixed
    with rdmaxfer.WeightServer(published, transport="tcp") as server:
        server.start()
        got = rdmaxfer.pull_weights(f"127.0.0.1:{server.port}", transport="tcp", device="cuda:0")
        assert set(got) == set(tensors)
        for name, ref in tensors.items():
            assert isinstance(got[name], Buffer) and got[name].device == "cuda:0"
            host = got[name].copy_to_host()
            assert host.dtype == ref.dtype and host.shape == ref.shape
            np.testing.assert_array_equal(host.view(np.uint8), ref.view(np.uint8))
        # Trainer -> inference sync: update the GPU tensor in place, refresh, pull again.
        tensors["w"][:] = rng.standard_normal((64, 33)).astype(np.float32)
        assert server.refresh() == 2  # a new version: a snapshot of the published arrays
        again = rdmaxfer.pull_weights(f"127.0.0.1:{server.port}", transport="tcp", names=["w"])
        assert again.version == 2
        np.testing.assert_array_equal(again["w"], tensors["w"])


class _NoCaiForThisDtype:
    """Like a PyTorch bfloat16 CPU tensor: ``__cuda_array_interface__`` raises TypeError."""

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        raise TypeError("dtype not supported by the interface")

    def __dlpack_device__(self) -> tuple[int, int]:
        return (_dlpack.KDL_CPU, 0)

    def __dlpack__(self, stream: Any = None) -> Any:
        return np.zeros(2).__dlpack__()


def test_inexpressible_cai_falls_through_to_dlpack() -> None:
    assert device_view(_NoCaiForThisDtype(), writable=False) is None
