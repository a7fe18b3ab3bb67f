"""Run by tests/test_async_gpu.py in a process of its own, over the stand-in CUDA driver with
RDMAXFER_CUDA_STANDIN_DELAY_US set (read once, at cuInit): every device copy takes that long.

Asyncio GPU transfers run beside a ticker task that wakes every 5 ms. The transfers meet
what blocks: a producer whose last write is still queued on its stream (the consumer must
``cuStreamSynchronize`` before it reads or writes the memory, as with torch or CuPy), staged
copies, and a checksummed message copied to host and back. Prints one JSON line: the largest
gap between ticks, the tick count, the seconds one blocking device copy took (the reference
measured in the same run) and whether every byte arrived.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import os
import time
from typing import Any

import numpy as np

from rdmaxfer import Buffer, Endpoint, Engine, cuda

_LIB = ctypes.CDLL(os.environ["RDMAXFER_CUDA_LIBRARY"])  # the copy rdmaxfer loaded already
_LEGACY_STREAM = ctypes.c_void_p(1)  # CU_STREAM_LEGACY


class PendingProducer:
    """Device memory exported by DLPack only (kDLCUDA), whose last write, a copy of
    ``host``, is still queued on the legacy default stream when it is handed over."""

    def __init__(self, host: np.ndarray) -> None:
        self.buffer = Buffer.empty(host.shape, host.dtype, device="cuda:0")
        self._source = host  # read by the queued copy: alive as long as this object
        rc = _LIB.cuMemcpyHtoDAsync_v2(
            ctypes.c_ulonglong(self.buffer.addr),
            ctypes.c_void_p(host.ctypes.data),
            ctypes.c_size_t(host.nbytes),
            _LEGACY_STREAM,
        )
        assert rc == 0, f"cuMemcpyHtoDAsync_v2 returned {rc}"

    def __dlpack_device__(self) -> tuple[int, int]:
        return self.buffer.__dlpack_device__()

    def __dlpack__(self, **kwargs: Any) -> Any:
        return self.buffer.__dlpack__(**kwargs)


async def transfers(a: Endpoint, b: Endpoint, data: np.ndarray) -> dict[str, Any]:
    """The transfers: from and into producers with pending writes, then a checksummed
    message between device Buffers. Returns what the caller checks once the ticker stopped."""
    src = PendingProducer(data)
    dst = PendingProducer(np.zeros_like(data))  # its pending write must land first
    await asyncio.gather(a.asend(src, timeout=60), b.arecv(dst, timeout=60))
    checked = Buffer.empty(data.shape, data.dtype, device="cuda:0")
    _, got = await asyncio.gather(
        a.asend(src.buffer, checksum=True, timeout=60),
        b.arecv(out=checked, timeout=60),
    )
    assert got is checked
    return {"dlpack": dst.buffer, "checksummed": checked}


async def ticking(a: Endpoint, b: Endpoint, data: np.ndarray) -> dict[str, Any]:
    ticks: list[float] = []
    running = True

    async def ticker() -> None:
        while running:
            ticks.append(time.monotonic())
            await asyncio.sleep(0.005)

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0.05)
    start = time.monotonic()
    try:
        landed = await transfers(a, b, data)
    finally:
        elapsed = time.monotonic() - start
        running = False
        await task
    during = [t for t in ticks if start - 0.01 <= t <= start + elapsed + 0.01]
    return {
        "elapsed_s": elapsed,
        "ticks_during": len(during),
        "max_gap_s": float(np.diff(during).max()),
        "landed": landed,
    }


def main() -> dict[str, Any]:
    probe = Buffer.empty(16, np.uint8, device="cuda:0")
    began = time.monotonic()
    cuda.copy_from_host(probe.device_array(), np.arange(16, dtype=np.uint8))
    copy_s = time.monotonic() - began
    data = np.random.default_rng(16).integers(0, 256, 256 << 10, dtype=np.uint8)
    with Engine("tcp") as server, Engine("tcp") as client:
        port = server.listen("127.0.0.1", 0)
        a = client.connect("127.0.0.1", port, timeout=30)
        b = server.accept(timeout=30)
        out = asyncio.run(ticking(a, b, data))
    landed = out.pop("landed")
    for name, buffer in landed.items():
        out[f"{name}_exact"] = buffer.copy_to_host().tobytes() == data.tobytes()
    out["blocking_copy_s"] = copy_s
    return out


if __name__ == "__main__":
    print(json.dumps(main()), flush=True)
