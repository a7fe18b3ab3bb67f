"""Two processes of one host moving GPU memory through CUDA IPC on the shm transport (run by
bench/gpu_check.sh).

This process and a spawned peer each allocate device memory and register it on an shm engine;
this process WRITEs its buffer into the peer's (the peer opens this process's allocation once
by cuIpcOpenMemHandle and copies GPU to GPU) and READs it back. Rows: the same GPU, the same GPU
with this process's buffers not registered (each transfer exports their allocations on the
fly, from the engine's export cache after the first), and GPU 0 to GPU 1 when there are two or
more. The reference, measured in the same run, is the pinned
device-to-host copy of the same size (cuMemcpyDtoHAsync into cuMemHostAlloc'd memory): any
path that staged through host memory would run at or below it, so the rate over it shows
that the bytes stayed on the GPUs. GB/s = 1e9 bytes/s.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
import zlib
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from gpu_bench import best_time, parse_size  # this folder (run as bench/gpu_ipc_bench.py)
from rdmaxfer import Buffer, Engine, _core
from rdmaxfer.memory import cuda

#: Targets: the IPC rate over the pinned D2H rate of the same size (see the module doc).
SAME_GPU_TARGET = 5.0
CROSS_GPU_TARGET = 1.0


def _crc(buf: Buffer) -> int:
    return zlib.crc32(np.ascontiguousarray(buf.copy_to_host()).view(np.uint8))


def peer(conn: Connection, port: int, size: int, gpu: int) -> None:
    """The other process: a registered device buffer of ``size`` bytes on ``gpu``; answers
    "crc" and "info" until "stop"."""
    with Engine("shm") as engine, engine.connect("127.0.0.1", port, timeout=60) as ep:
        buf = Buffer.empty(size, np.uint8, device=f"cuda:{gpu}")
        region = engine.register(buf, "rw")
        conn.send(region.descriptor().pack())
        while True:
            if not conn.poll(600):
                return
            cmd = conn.recv()
            if cmd == "stop":
                return
            conn.send(_crc(buf) if cmd == "crc" else ep.info)


def run_row(
    size: int, src_gpu: int, dst_gpu: int, iters: int, registered: bool = True
) -> dict[str, Any]:
    """One row: WRITE and READ of ``size`` bytes between GPU ``src_gpu`` here and GPU
    ``dst_gpu`` in the peer process; this process's buffers registered or not."""
    rng = np.random.default_rng(size + dst_gpu)
    src = Buffer.empty(size, np.uint8, device=f"cuda:{src_gpu}")
    host = rng.integers(0, 256, size, dtype=np.uint8)
    cuda.copy_from_host(src.device_array(), host)
    pinned = _core.PinnedHostMemory(src_gpu, size)
    view = src.device_array()
    d2h = best_time(lambda: _core.cuda_copy_to_host(src_gpu, pinned.ptr, view.ptr, size), iters)
    ctx = mp.get_context("spawn")
    with Engine("shm") as engine:
        port = engine.listen("127.0.0.1", 0)
        conn, child = ctx.Pipe()
        proc = ctx.Process(target=peer, args=(child, port, size, dst_gpu), daemon=True)
        proc.start()
        try:
            ep = engine.accept(timeout=60)
            if not conn.poll(120):
                raise TimeoutError("the peer process sent no descriptor within 120 s")
            descriptor = conn.recv()
            if registered:
                engine.register(src, "rw")
            write = best_time(lambda: ep.write(src, descriptor, timeout=600), iters)
            conn.send("crc")
            ok = conn.recv() == zlib.crc32(host)
            back = Buffer.empty(size, np.uint8, device=f"cuda:{src_gpu}")
            if registered:
                engine.register(back, "rw")
            read = best_time(lambda: ep.read(back, descriptor, timeout=600), iters)
            ok = ok and _crc(back) == zlib.crc32(host)
            ipc_bytes = int(ep.info["cuda_ipc_bytes"])
            conn.send("stop")
            ep.close()
        finally:
            proc.join(60)
            if proc.is_alive():
                proc.kill()
    gbs = lambda t: size / t / 1e9  # noqa: E731
    target = SAME_GPU_TARGET if src_gpu == dst_gpu else CROSS_GPU_TARGET
    ratio = min(gbs(write), gbs(read)) / gbs(d2h)
    return {
        "bytes": size,
        "src_gpu": src_gpu,
        "dst_gpu": dst_gpu,
        "registered": registered,
        "d2h_GB_per_s": gbs(d2h),
        "write_GB_per_s": gbs(write),
        "read_GB_per_s": gbs(read),
        "ratio_to_d2h": ratio,
        "target": target,
        "by_cuda_ipc": ipc_bytes == 2 * iters * size,
        "checksums_ok": ok,
        "pass": ok and ipc_bytes == 2 * iters * size and ratio >= target,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", default="1G", help="bytes per transfer (K/M/G suffixes)")
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    if not cuda.available():
        print(f"gpu_ipc_bench: {cuda.unavailable_reason()}", file=sys.stderr)
        return 2
    size = parse_size(args.size)
    gpus = len(cuda.status()["gpus"])
    pairs = [(0, 0, True), (0, 0, False)] + ([(0, 1, True)] if gpus >= 2 else [])
    rows = []
    head = f"{'bytes':>12} {'GPUs':>5} {'reg':>4} {'D2H':>8} {'write':>8} {'read':>8}"
    print(f"{head} {'x D2H':>6} ok")
    for src_gpu, dst_gpu, registered in pairs:
        row = run_row(size, src_gpu, dst_gpu, args.iters, registered)
        rows.append(row)
        print(
            f"{size:>12} {src_gpu}->{dst_gpu:<2} {'yes' if registered else 'no':>4} "
            f"{row['d2h_GB_per_s']:8.2f} "
            f"{row['write_GB_per_s']:8.2f} {row['read_GB_per_s']:8.2f} "
            f"{row['ratio_to_d2h']:6.1f} {row['checksums_ok'] and row['by_cuda_ipc']}",
            flush=True,
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"gpus": gpus, "rows": rows}, f, indent=2)
    return 0 if all(r["checksums_ok"] and r["by_cuda_ipc"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
