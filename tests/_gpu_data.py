"""Random data in device memory and the CRC-32 the GPU tests compare it by."""

from __future__ import annotations

import zlib
from typing import Any

import numpy as np

from rdmaxfer import Buffer
from rdmaxfer.memory import cuda


def crc(x: Any) -> int:
    """CRC-32 of the bytes of array `x` (any dtype, made contiguous first)."""
    return zlib.crc32(np.ascontiguousarray(x).view(np.uint8))


def device_random(
    rng: np.random.Generator, shape: Any, dtype: Any = np.uint8
) -> tuple[Buffer, np.ndarray]:
    """A device ``Buffer`` of `shape`/`dtype` with random bytes, and the same bytes on the host."""
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    host = rng.integers(0, 256, nbytes, dtype=np.uint8).view(dtype).reshape(shape)
    buf = Buffer.empty(shape, dtype, device="cuda:0")
    cuda.copy_from_host(buf.device_array(), host)
    return buf, host
