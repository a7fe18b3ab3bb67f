"""rdmaxfer TCP with TLS 1.3 against plain rdmaxfer TCP and a plain Python ``ssl`` socket pair,
in one run, rounds alternating.

Each round measures, in turn: rdmaxfer one-sided WRITE of SIZE bytes over TCP with TLS
(``tls=True``, the shared secret as the pre-shared key, AES-128-GCM), the same without TLS,
plain TCP again with the streams and I/O threads the TLS engine chose (with TLS the defaults
spread streams over more threads: see ``TcpOptions``), and Python's ``ssl`` module (TLS 1.3,
AES-GCM; ``sendall`` of SIZE bytes, the peer ``recv_into`` a preallocated buffer then a
1-byte acknowledgement: the same completion rule as a WRITE). Then ``openssl speed -evp
aes-128-gcm`` on one core, the bound on what one stream can encrypt. GB/s = 1e9 bytes/s; the
median over rounds. The load average and each engine's settings are recorded.

    python bench/tls_bench.py [--size 1G] [--rounds 3] [--streams N] [--io-threads N] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import re
import socket
import ssl
import statistics
import subprocess
import tempfile
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np

from rdmaxfer import Engine
from rdmaxfer.tools import bench

#: Where the results go by default, named by what they measure (the docs' table reads them).
RESULTS = Path(__file__).resolve().parent / "results"
#: The shared secret of the rdmaxfer engines (the TLS pre-shared key).
SECRET = "tls-bench-" + "0" * 22
#: TLS 1.3 ciphersuites of the Python pair (OpenSSL's configuration; Python has no setter).
_OPENSSL_CONF = """openssl_conf = conf
[conf]
ssl_conf = ssl
[ssl]
system_default = tls
[tls]
MinProtocol = TLSv1.3
Ciphersuites = TLS_AES_128_GCM_SHA256
"""


#: Seconds any one wait of the bench may take (a peer's reply, a WRITE, a socket operation).
WAIT_S = 120.0


def _recv(conn: Connection, what: str) -> Any:
    """The next object from the peer process, within WAIT_S seconds."""
    if not conn.poll(WAIT_S):
        raise TimeoutError(f"no {what} from the peer process within {WAIT_S:.0f} s")
    return conn.recv()


def _rdmaxfer_peer(conn: Connection, size: int, streams: int, io_threads: int, tls: bool) -> None:
    with Engine("tcp", io_threads=io_threads, streams=streams, secret=SECRET, tls=tls) as eng:
        port = eng.listen("127.0.0.1", 0)
        buf = np.empty(size, np.uint8)
        buf[::4096] = 1  # fault the pages in before timing
        region = eng.register(buf, access="rw")
        conn.send((port, region.descriptor().pack()))
        with eng.accept(timeout=60):
            _recv(conn, "'done'")


def rdmaxfer_write(size: int, streams: int, io_threads: int, tls: bool) -> tuple[float, str]:
    """GB/s of one rdmaxfer TCP WRITE of ``size`` bytes (the median of 3 after a warm-up),
    TLS on or off, with ``streams`` and ``io_threads`` on both sides (0: the engine's
    default); and the engine's own description of its settings."""
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    peer = ctx.Process(
        target=_rdmaxfer_peer, args=(child, size, streams, io_threads, tls), daemon=True
    )
    peer.start()
    port, descriptor = _recv(parent, "port and descriptor")
    src = np.random.default_rng(0).integers(0, 256, size, dtype=np.uint8)
    times = []
    with Engine("tcp", io_threads=io_threads, streams=streams, secret=SECRET, tls=tls) as eng:
        eng.register(src, access="none", local_write=False)
        settings = eng.describe()
        with eng.connect(f"127.0.0.1:{port}", timeout=30) as ep:
            for _ in range(4):  # the first is a warm-up
                t0 = time.perf_counter()
                ep.write(src, descriptor, nbytes=size, timeout=WAIT_S)
                times.append(time.perf_counter() - t0)
        parent.send("done")
    peer.join(timeout=30)
    return size / statistics.median(times[1:]) / 1e9, settings


def resolved(settings: str) -> tuple[int, int]:
    """(streams, I/O threads) from an engine's description ("tcp: 8 I/O threads, 8 streams
    per connection, ...")."""
    io = re.search(r"(\d+) I/O threads", settings)
    streams = re.search(r"(\d+) streams per connection", settings)
    assert io and streams, settings
    return int(streams.group(1)), int(io.group(1))


def _ssl_peer(conn: Connection, size: int, cert: str, key: str) -> None:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.load_cert_chain(cert, key)
    srv = socket.create_server(("127.0.0.1", 0))
    srv.settimeout(WAIT_S)
    conn.send(srv.getsockname()[1])
    raw, _ = srv.accept()
    raw.settimeout(WAIT_S)
    c = ctx.wrap_socket(raw, server_side=True)
    buf = bytearray(size)
    view = memoryview(buf)
    while (want := _recv(conn, "size")) is not None:
        got = 0
        while got < want:
            n = c.recv_into(view[got:want])
            if n == 0:
                return
            got += n
        c.sendall(view[:1])


def python_ssl(size: int, cert: str, key: str) -> tuple[float, str]:
    """GB/s of Python ``ssl`` sendall/recv_into of ``size`` bytes (the median of 3), and the
    negotiated cipher."""
    ctx_mp = mp.get_context("spawn")
    parent, child = ctx_mp.Pipe()
    peer = ctx_mp.Process(target=_ssl_peer, args=(child, size, cert, key), daemon=True)
    peer.start()
    port = _recv(parent, "port")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.load_verify_locations(cert)
    ctx.check_hostname = False
    s = ctx.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=WAIT_S))
    cipher = (s.cipher() or ("?",))[0]
    src = np.random.default_rng(0).integers(0, 256, size, dtype=np.uint8).data
    ack = bytearray(1)
    times = []
    for _ in range(4):  # the first is a warm-up
        parent.send(size)
        t0 = time.perf_counter()
        s.sendall(src)
        s.recv_into(ack, 1)
        times.append(time.perf_counter() - t0)
    parent.send(None)
    s.close()
    peer.join(timeout=30)
    return size / statistics.median(times[1:]) / 1e9, cipher


def openssl_speed() -> float:
    """GB/s of ``openssl speed -evp aes-128-gcm`` on one core at 16 KiB blocks."""
    out = subprocess.run(
        ["openssl", "speed", "-evp", "aes-128-gcm", "-bytes", "16384", "-seconds", "3"],
        capture_output=True, text=True, check=True, timeout=120,
    ).stdout  # fmt: skip
    line = next(x for x in out.splitlines() if x.lower().startswith("aes-128-gcm"))
    kbytes = float(re.findall(r"([\d.]+)k", line)[-1])
    return kbytes * 1e3 / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", default="1G")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--streams", type=int, default=0, help="0: each engine's default")
    parser.add_argument("--io-threads", type=int, default=0, help="0: each engine's default")
    parser.add_argument(
        "--json",
        default=str(RESULTS / "tls-vs-plain-tcp.json"),
        help="write the results here (default: %(default)s; '': nowhere)",
    )
    args = parser.parse_args()
    size = bench.parse_size(args.size)
    load_before = os.getloadavg()
    rounds = []
    with tempfile.TemporaryDirectory() as tmp:
        cert, key, conf = f"{tmp}/cert.pem", f"{tmp}/key.pem", f"{tmp}/openssl.cnf"
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
             "-nodes", "-keyout", key, "-out", cert, "-days", "1", "-subj", "/CN=127.0.0.1"],
            check=True, capture_output=True, timeout=60,
        )  # fmt: skip
        Path(conf).write_text(_OPENSSL_CONF)
        os.environ["OPENSSL_CONF"] = conf  # read by this process's and the peer's libssl
        cipher = ""
        settings = {}
        for i in range(args.rounds):
            row = {}
            row["tls_GB_per_s"], settings["tls"] = rdmaxfer_write(
                size, args.streams, args.io_threads, True
            )
            row["plain_GB_per_s"], settings["plain"] = rdmaxfer_write(
                size, args.streams, args.io_threads, False
            )
            same_streams, same_io = resolved(settings["tls"])
            row["plain_same_settings_GB_per_s"], settings["plain_same_settings"] = rdmaxfer_write(
                size, same_streams, same_io, False
            )
            row["python_ssl_GB_per_s"], cipher = python_ssl(size, cert, key)
            rounds.append(row)
            print(
                f"round {i + 1}: " + ", ".join(f"{k} {v:.3f}" for k, v in row.items()), flush=True
            )
    speed = openssl_speed()
    load_after = os.getloadavg()
    median = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    result = {
        "bytes": size,
        "streams": args.streams,
        "io_threads": args.io_threads,
        "settings": settings,
        "rounds": rounds,
        "median": median,
        "tls_vs_plain": median["tls_GB_per_s"] / median["plain_GB_per_s"],
        "tls_vs_plain_same_settings": (
            median["tls_GB_per_s"] / median["plain_same_settings_GB_per_s"]
        ),
        "tls_vs_python_ssl": median["tls_GB_per_s"] / median["python_ssl_GB_per_s"],
        "python_ssl_cipher": cipher,
        "openssl_speed_aes_128_gcm_GB_per_s_one_core": speed,
        "cpus": os.cpu_count(),
        "load_average_before": list(load_before),
        "load_average_after": list(load_after),
    }
    print(json.dumps(result, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
