"""GPU bench for a lent GPU machine (run by bench/gpu_check.sh): pinned copy ceiling vs the
staging pipeline, and a loopback TCP transfer of a large GPU array into another GPU array.

For each size: D2H and H2D between device memory and cuMemHostAlloc'd memory (the PCIe
ceiling), host->host WRITE over loopback TCP (the wire ceiling), and the staged WRITE
(device -> bounce -> wire) and READ (wire -> bounce -> device). "eff" is the staged rate over
min(copy ceiling, wire ceiling): how well the pipeline hides the copies behind the wire.
GB/s = 1e9 bytes/s.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import zlib
from typing import Any

import numpy as np

import rdmaxfer
from rdmaxfer import Buffer, _core
from rdmaxfer.memory import cuda


def parse_size(text: str) -> int:
    """ "16M" -> bytes (K/M/G: powers of 1024)."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper()
    return int(float(text[:-1]) * units[text[-1]]) if text[-1] in units else int(text)


def best_time(fn: Any, iters: int) -> float:
    """The fastest of ``iters`` calls of ``fn``, in seconds."""
    best = float("inf")
    for _ in range(iters):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def _fill(buf: Buffer, rng: np.random.Generator) -> np.ndarray:
    host = rng.integers(0, 256, buf.nbytes, dtype=np.uint8)
    cuda.copy_from_host(buf.device_array(), host)
    return host


def bench_size(
    size: int, pair: tuple[Any, ...], rng: np.random.Generator, iters: int, chunk: int, slots: int
) -> dict[str, Any]:
    server, client, a, _b = pair
    dev = Buffer.empty(size, np.uint8, device="cuda:0")
    host_ref = _fill(dev, rng)
    pinned = _core.PinnedHostMemory(0, size)
    view = dev.device_array()
    d2h = best_time(lambda: _core.cuda_copy_to_host(0, pinned.ptr, view.ptr, size), iters)
    h2d = best_time(lambda: _core.cuda_copy_to_device(0, view.ptr, pinned.ptr, size), iters)

    remote = np.zeros(size, np.uint8)
    region = server.register(remote, "rw")
    src_host = rng.integers(0, 256, size, dtype=np.uint8)
    wire = best_time(lambda: a.write(src_host, region.descriptor(), timeout=600), iters)

    stager = client.stager(0)

    def staged(op: str) -> None:
        post = stager.post_write if op == "write" else stager.post_read
        req = post(a.core, view.ptr, size, region.descriptor(), 0, chunk, slots, 600.0)
        if not req.wait(600):
            raise TimeoutError(op)
        req.check()

    cuda.copy_from_host(view, host_ref)
    w = best_time(lambda: staged("write"), iters)
    ok_w = zlib.crc32(remote) == zlib.crc32(host_ref)
    remote[:] = rng.integers(0, 256, size, dtype=np.uint8)
    r = best_time(lambda: staged("read"), iters)
    ok_r = zlib.crc32(dev.copy_to_host()) == zlib.crc32(remote)
    region.close()
    gbs = lambda t: size / t / 1e9  # noqa: E731
    ceil_w = min(gbs(d2h), gbs(wire))
    ceil_r = min(gbs(h2d), gbs(wire))
    return {
        "bytes": size,
        "d2h_GB_per_s": gbs(d2h),
        "h2d_GB_per_s": gbs(h2d),
        "wire_GB_per_s": gbs(wire),
        "staged_write_GB_per_s": gbs(w),
        "staged_read_GB_per_s": gbs(r),
        "write_eff": gbs(w) / ceil_w,
        "read_eff": gbs(r) / ceil_r,
        "checksums_ok": ok_w and ok_r,
    }


def big_transfer(pair: tuple[Any, ...], size: int, rng: np.random.Generator) -> dict[str, Any]:
    _server, _client, a, b = pair
    src = Buffer.empty(size, np.uint8, device="cuda:0")
    ref = _fill(src, rng)
    dst = Buffer.empty(size, np.uint8, device="cuda:0")
    start = time.perf_counter()
    sent = a.post_send(src)
    b.recv(out=dst, timeout=600)
    sent.wait(600)
    seconds = time.perf_counter() - start
    ok = zlib.crc32(dst.copy_to_host()) == zlib.crc32(ref)
    return {"bytes": size, "seconds": seconds, "GB_per_s": size / seconds / 1e9, "checksum_ok": ok}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="16M,64M,256M,1G,4G")
    parser.add_argument("--big", default="4G", help="size of the GPU->GPU loopback send")
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--chunk", default="8M")
    parser.add_argument("--slots", type=int, default=3)
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    if not cuda.available():
        print(f"gpu_bench: {cuda.unavailable_reason()}", file=sys.stderr)
        return 2
    gpu = cuda.status()["gpus"][0]
    print(f"# {gpu['name']} ({gpu['pci_bus_id']}), driver {cuda.status()['driver_version']}")
    rng = np.random.default_rng(1)
    results: dict[str, Any] = {"gpu": gpu["name"], "sizes": [], "big": None}

    def save() -> None:
        """Written after every row: a run cut short by its timeout keeps what it measured."""
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=2)

    with rdmaxfer.Engine("tcp") as server, rdmaxfer.Engine("tcp") as client:
        port = server.listen("127.0.0.1", 0)
        a = client.connect("127.0.0.1", port, timeout=30)
        b = server.accept(timeout=30)
        pair = (server, client, a, b)
        print(
            f"{'bytes':>12} {'D2H':>7} {'H2D':>7} {'wire':>7} {'stW':>7} {'stR':>7} "
            f"{'effW':>5} {'effR':>5} ok"
        )
        for text in args.sizes.split(","):
            size = parse_size(text)
            iters = args.iters if size < (1 << 30) else 2
            row = bench_size(size, pair, rng, iters, parse_size(args.chunk), args.slots)
            results["sizes"].append(row)
            save()
            print(
                f"{size:>12} {row['d2h_GB_per_s']:7.2f} {row['h2d_GB_per_s']:7.2f} "
                f"{row['wire_GB_per_s']:7.2f} "
                f"{row['staged_write_GB_per_s']:7.2f} {row['staged_read_GB_per_s']:7.2f} "
                f"{row['write_eff']:5.0%} {row['read_eff']:5.0%} {row['checksums_ok']}",
                flush=True,
            )
        if args.big:
            big = big_transfer(pair, parse_size(args.big), rng)
            results["big"] = big
            save()
            print(
                f"GPU->GPU loopback TCP send/recv of {big['bytes']} bytes: {big['seconds']:.2f} s, "
                f"{big['GB_per_s']:.2f} GB/s, checksum {'ok' if big['checksum_ok'] else 'MISMATCH'}"
            )
    bad = not all(r["checksums_ok"] for r in results["sizes"])
    bad = bad or (results["big"] is not None and not results["big"]["checksum_ok"])
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
