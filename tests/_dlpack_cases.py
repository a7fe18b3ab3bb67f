"""DLPack producers' tensors through an endpoint pair, shared by the TCP tests (tests/
test_dlpack.py) and the verbs tests in the rxe guest (tests/rdma/test_rdma_dlpack.py)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import torch

from rdmaxfer import Endpoint, Engine

#: torch dtype -> the ml_dtypes type a DLPack view of it has (same bits).
TORCH_TO_ML = {
    torch.bfloat16: ml_dtypes.bfloat16,
    torch.float8_e4m3fn: ml_dtypes.float8_e4m3fn,
    torch.float8_e5m2: ml_dtypes.float8_e5m2,
    torch.float8_e4m3fnuz: ml_dtypes.float8_e4m3fnuz,
    torch.float8_e5m2fnuz: ml_dtypes.float8_e5m2fnuz,
    torch.float8_e8m0fnu: ml_dtypes.float8_e8m0fnu,
}
WAIT_S = 60.0


def random_tensor(seed: int, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """Random bits (never all zero) reinterpreted as ``dtype``: every bit pattern travels."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    n = int(np.prod(shape)) * itemsize
    raw = np.random.default_rng(seed).integers(1, 256, size=n, dtype=np.uint8)
    return torch.from_numpy(raw).view(dtype).reshape(shape)


def tensor_bytes(t: torch.Tensor) -> bytes:
    return bytes(t.contiguous().view(torch.uint8).numpy().tobytes())


def send_recv_both_ways(a: Endpoint, b: Endpoint, dtype: torch.dtype, seed: int) -> None:
    """A torch tensor sent arrives as the matching ml_dtypes array, bits unchanged; received
    into a torch tensor (``out=``) it fills the tensor."""
    src = random_tensor(seed, (33, 7), dtype)
    got = b.post_recv()
    a.send(src, timeout=WAIT_S)
    arr = got.wait(WAIT_S)
    assert arr.dtype == np.dtype(TORCH_TO_ML[dtype]) and arr.shape == (33, 7)
    assert arr.tobytes() == tensor_bytes(src)
    out = torch.empty((33, 7), dtype=dtype)
    into = a.post_recv(out)
    b.send(arr, timeout=WAIT_S)
    view = into.wait(WAIT_S)
    assert tensor_bytes(out) == tensor_bytes(src)
    assert view.ctypes.data == out.data_ptr()  # received in place, no copy


def one_sided(server: Engine, a: Endpoint, dtype: torch.dtype, seed: int) -> None:
    """A registered torch tensor is the target of WRITE and the source of READ."""
    target = torch.zeros((16, 9), dtype=dtype)
    region = server.register(target, access="rw")
    try:
        src = random_tensor(seed, (16, 9), dtype)
        a.write(src, region.descriptor(), timeout=WAIT_S)
        assert tensor_bytes(target) == tensor_bytes(src)
        back = torch.empty((16, 9), dtype=dtype)
        a.read(back, region.descriptor(), timeout=WAIT_S)
        assert tensor_bytes(back) == tensor_bytes(src)
    finally:
        region.close()
