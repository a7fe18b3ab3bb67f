"""rdmaxfer TCP against iperf3 (single stream) and plain Python sockets, in one run.

For each size: rdmaxfer one-sided WRITE (done when the peer has placed the bytes), plain
Python ``sendall`` + ``recv_into`` of the same bytes into a preallocated buffer followed by a
1-byte acknowledgement (the same completion rule), and ``iperf3 -n SIZE`` (one stream, when
iperf3 is installed). Then an 8-byte round trip: rdmaxfer 8-byte WRITE (timed from Python, and
in the C++ timing loop like perftest) vs a plain Python ping-pong.
GB/s = 1e9 bytes/s; the median of ``--iters`` runs.

    python bench/tcp_vs_peers.py [--sizes 64K,1M,16M,256M,1G] [--iters 5] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import shutil
import socket
import statistics
import subprocess
import time
from multiprocessing.connection import Connection
from pathlib import Path

import numpy as np

from rdmaxfer.tools import bench

#: Where the results go by default, named by what they measure (the docs' tables read them).
RESULTS = Path(__file__).resolve().parent / "results"


def _python_peer(conn: Connection, size: int) -> None:
    srv = socket.create_server(("127.0.0.1", 0))
    conn.send(srv.getsockname()[1])
    c, _ = srv.accept()
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = bytearray(max(size, 8))
    view = memoryview(buf)
    while True:
        want = conn.recv()
        if want is None:
            return
        if isinstance(want, tuple):  # ("echo", n): n 8-byte ping-pongs, no pipe in between
            for _ in range(want[1]):
                got = 0
                while got < 8:
                    n = c.recv_into(view[got:8])
                    if n == 0:
                        return
                    got += n
                c.sendall(view[:8])
            continue
        got = 0
        while got < want:
            n = c.recv_into(view[got:want])
            if n == 0:
                return
            got += n
        c.sendall(view[:1] if want > 8 else view[:want])


def python_sockets(sizes: list[int], iters: int, rtt_iters: int) -> tuple[list[float], float]:
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    peer = ctx.Process(target=_python_peer, args=(child, max(sizes)), daemon=True)
    peer.start()
    port = parent.recv()
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    src = np.random.default_rng(0).integers(0, 256, max(sizes), dtype=np.uint8)
    ack = bytearray(8)
    rates = []
    for size in sizes:
        times = []
        for _ in range(iters + 1):
            parent.send(size)
            t0 = time.perf_counter()
            s.sendall(memoryview(src)[:size])
            s.recv_into(ack, 1)
            times.append(time.perf_counter() - t0)
        rates.append(size / statistics.median(times[1:]) / 1e9)
    eight = memoryview(bytearray(8))
    times = []
    parent.send(("echo", rtt_iters + 100))
    for i in range(rtt_iters + 100):
        t0 = time.perf_counter()
        s.sendall(eight)
        got = 0
        while got < 8:
            got += s.recv_into(eight[got:])
        if i >= 100:
            times.append(time.perf_counter() - t0)
    parent.send(None)
    s.close()
    peer.join(timeout=10)
    return rates, statistics.median(times) * 1e6


def iperf3(sizes: list[int], iters: int) -> list[float | None]:
    if shutil.which("iperf3") is None:
        return [None for _ in sizes]
    rates: list[float | None] = []
    for size in sizes:
        runs = []
        for _ in range(iters):
            port = 5201 + (size.bit_length() % 50)
            server = subprocess.Popen(
                ["iperf3", "-s", "-1", "-p", str(port)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            time.sleep(0.3)
            try:
                out = subprocess.run(
                    ["iperf3", "-c", "127.0.0.1", "-p", str(port), "-n", str(size), "-J"],
                    capture_output=True,
                    text=True,
                    timeout=120,
                )
                result = json.loads(out.stdout)
                runs.append(result["end"]["sum_received"]["bits_per_second"] / 8e9)
            finally:
                server.wait(timeout=10)
        rates.append(statistics.median(runs))
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="64K,1M,16M,256M,1G")
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--rtt-iters", type=int, default=5000)
    parser.add_argument(
        "--json",
        default=str(RESULTS / "tcp-vs-iperf3-python.json"),
        help="write the results here (default: %(default)s; '': nowhere)",
    )
    args = parser.parse_args()
    sizes = bench.parse_sizes(args.sizes)

    ours = bench.run_bench(transport="tcp", op="write", sizes=sizes, iters=args.iters, warmup=1)
    ours_rtt = bench.run_bench(
        transport="tcp", op="write", sizes=[8], iters=args.rtt_iters, warmup=100
    )[0]
    ours_rtt_cpp = bench.run_bench(
        transport="tcp", op="write", sizes=[8], iters=args.rtt_iters, warmup=100, loop="cpp"
    )[0]
    py_rates, py_rtt = python_sockets(sizes, args.iters, args.rtt_iters)
    ip_rates = iperf3(sizes, args.iters)

    rows = []
    print(
        f"{'bytes':>12} {'rdmaxfer':>10} {'iperf3':>10} {'python':>10} "
        f"{'vs iperf3':>10} {'vs python':>10}   (GB/s, median of {args.iters})"
    )
    for size, r, ip, py in zip(sizes, ours, ip_rates, py_rates, strict=True):
        mine = size / (r.lat_us_p50 * 1e-6) / 1e9
        rows.append(
            {"bytes": size, "rdmaxfer_GB_per_s": mine, "iperf3_GB_per_s": ip, "python_GB_per_s": py}
        )
        ip_text = f"{ip:10.3f}" if ip is not None else f"{'n/a':>10}"
        ratio_ip = f"{mine / ip:9.2f}x" if ip else f"{'n/a':>10}"
        print(f"{size:>12} {mine:10.3f} {ip_text} {py:10.3f} {ratio_ip} {mine / py:9.2f}x")
    print(
        f"8-byte round trip (median): rdmaxfer WRITE {ours_rtt.lat_us_p50:.1f} us through the "
        f"Python API, {ours_rtt_cpp.lat_us_p50:.1f} us in the C++ loop; plain Python ping-pong "
        f"{py_rtt:.1f} us"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "sizes": rows,
                    "rtt_us": {
                        "rdmaxfer_python_api": ours_rtt.lat_us_p50,
                        "rdmaxfer_cpp_loop": ours_rtt_cpp.lat_us_p50,
                        "python": py_rtt,
                    },
                },
                f,
                indent=2,
            )


if __name__ == "__main__":
    main()
