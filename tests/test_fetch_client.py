"""rdmaxfer.fetch's HTTP client: the adaptive connection count (the ramp's rule on simulated
servers, then a server with a per-connection cap, which gets more connections, and a total
cap, under which the download keeps the few it started with), the adaptive range size,
redirects, https with HTTP/2, cancellation of the asyncio form, the file writes (O_DIRECT
for whole blocks)."""

from __future__ import annotations

import asyncio
import errno
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from _nginx import Nginx, nginx_binary
from _range_server import RangeServer, servers
from rdmaxfer import FetchError
from rdmaxfer.tools.connection_ramp import (
    MAX_ADAPTIVE_CONNECTIONS,
    MAX_RANGE,
    RANGE_S,
    SETTLE_S,
    START_CONNECTIONS,
    WINDOW_S,
    ConnectionRamp,
    RangeSizer,
)
from rdmaxfer.tools.fetch import STATE_SUFFIX, afetch, fetch, fetch_weights
from rdmaxfer.tools.ranges import _FileSink, _Staged, open_direct

MiB = 1 << 20


def simulate(
    per_connection: float, total: float, limit: int = MAX_ADAPTIVE_CONNECTIONS
) -> list[int]:
    """The counts a ramp chooses against a server whose rate is min(n * per_connection,
    total) bytes/s, sampled every 10 ms for 5 s."""
    ramp = ConnectionRamp(START_CONNECTIONS, limit)
    received, t, dt = 0.0, 0.0, 0.01
    while t < 5.0:
        received += min(ramp.target * per_connection, total) * dt
        t += dt
        ramp.sample(t, int(received))
    return [s.connections for s in ramp.steps]


def test_ramp_grows_while_each_connection_is_capped() -> None:
    # 50 MB/s per connection, 2 Gbit/s in all: 4 -> 8 (1.25x: kept, not doubled again)
    assert simulate(50e6, 250e6) == [4, 8]
    # 1 MB/s per connection, no total limit: doubles up to the limit
    assert simulate(1e6, 1e12) == [4, 8, 16, 32]
    assert simulate(1e6, 1e12, limit=12) == [4, 8, 12]


def test_ramp_undoes_a_doubling_that_gained_nothing() -> None:
    # a total cap (the client's CPU, a link, --rate) reached with 4 connections: 8 are tried,
    # then it goes back to 4
    assert simulate(1e9, 1e9) == [4, 8, 4]


def test_ramp_fixed_and_timing() -> None:
    fixed = ConnectionRamp(6, 6, adaptive=False)
    assert fixed.sample(100.0, 1 << 40) == 6 and len(fixed.steps) == 1
    ramp = ConnectionRamp(START_CONNECTIONS, 64)
    assert ramp.sample(SETTLE_S / 2, 10) == START_CONNECTIONS  # still settling
    ramp.sample(SETTLE_S, 1000)  # the window starts here
    assert ramp.sample(SETTLE_S + WINDOW_S * 0.9, 2000) == START_CONNECTIONS
    assert ramp.sample(SETTLE_S + WINDOW_S * 1.5, 3000) == 2 * START_CONNECTIONS
    assert ramp.steps[0].rate == pytest.approx(2000 / (WINDOW_S * 1.5))


@pytest.fixture
def pyserver() -> Iterator[type[RangeServer]]:
    yield from servers()


# -- real servers ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def www(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("www-adaptive")
    rng = np.random.default_rng(21)
    (root / "capped.bin").write_bytes(rng.integers(0, 256, 4 * MiB, dtype=np.uint8).tobytes())
    (root / "free.bin").write_bytes(rng.integers(0, 256, 6 * MiB + 5, dtype=np.uint8).tobytes())
    (root / "big.bin").write_bytes(rng.integers(0, 256, 64 * MiB, dtype=np.uint8).tobytes())
    save_file(
        {"w": rng.standard_normal((512, 300)).astype(np.float32)}, str(root / "m.safetensors")
    )
    return root


@pytest.fixture(scope="module")
def nginx(www: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Nginx]:
    if nginx_binary() is None:
        pytest.skip("nginx is not installed (apt-get install -y nginx); CI installs it")
    extra = (
        f"        location /capped/ {{ alias {www}/; limit_rate 100k; }}\n"
        "        location = /hop1 { return 302 /hop2; }\n"
        "        location = /hop2 { return 301 /free.bin; }\n"
        "        location = /weights { return 307 /m.safetensors; }\n"
    )
    with Nginx(www, tmp_path_factory.mktemp("nginx-adaptive"), extra) as server:
        yield server


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_capped_connections_get_more(pyserver: type[RangeServer]) -> None:
    # 512 KB/s per connection: the total grows with every doubling
    data = np.random.default_rng(22).integers(0, 256, 4 * MiB, dtype=np.uint8).tobytes()
    srv = pyserver(data, cap=512_000)
    result = fetch(srv.url, chunk_size=128 << 10, sha256=hashlib.sha256(data).hexdigest())
    counts = [s["connections"] for s in result.connection_steps]
    assert counts[0] == START_CONNECTIONS and result.connections >= 2 * START_CONNECTIONS, counts
    assert srv.most_open >= 2 * START_CONNECTIONS
    assert result.bytes_fetched == result.size == len(data)


def test_total_cap_keeps_few_connections(pyserver: type[RangeServer]) -> None:
    # a total cap (--rate) that 4 connections reach: the ramp stops after one doubling
    data = np.random.default_rng(23).integers(0, 256, 3 * MiB, dtype=np.uint8).tobytes()
    srv = pyserver(data)
    result = fetch(srv.url, chunk_size=64 << 10, rate="2M")
    assert result.array is not None and result.array.tobytes() == data
    counts = [s["connections"] for s in result.connection_steps]
    # it starts at START_CONNECTIONS and tries at most one doubling: the cap is the total, so
    # a doubling gains nothing (on a loaded machine the download may end before it is tried)
    assert counts[0] == START_CONNECTIONS, counts
    assert max(counts) <= 2 * START_CONNECTIONS, counts


def test_redirects_are_followed(nginx: Nginx, www: Path, tmp_path: Path) -> None:
    want = sha(www / "free.bin")
    result = fetch(f"{nginx.url}/hop1", tmp_path / "r.bin", connections=3, chunk_size=MiB)
    assert sha(tmp_path / "r.bin") == want and result.chunks == 7 and result.ranged
    result = fetch(f"{nginx.url}/hop1", sha256=want)
    assert result.sha256 == want
    ref = load_file(str(www / "m.safetensors"))
    got = fetch_weights(f"{nginx.url}/weights")
    assert np.array_equal(got["w"], ref["w"]) and got["w"].dtype == np.float32


def test_cancelled_afetch_stops(nginx: Nginx) -> None:
    async def main() -> float:
        task = asyncio.ensure_future(afetch(f"{nginx.url}/capped/capped.bin", connections=1))
        await asyncio.sleep(0.3)
        t0 = time.perf_counter()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return time.perf_counter() - t0

    assert asyncio.run(main()) < 20  # stopped long before the 40 s the capped file takes


@pytest.fixture(scope="module")
def tls_nginx(www: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Nginx]:
    if nginx_binary() is None or shutil.which("openssl") is None:
        pytest.skip("nginx and openssl are needed (apt-get install -y nginx openssl)")
    work = tmp_path_factory.mktemp("nginx-tls")
    cert, key = work / "cert.pem", work / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-days", "2", "-subj", "/CN=127.0.0.1", "-addext",
         "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    with Nginx(www, work, tls=(cert, key)) as server:
        yield server


def test_https_speaks_http2(
    tls_nginx: Nginx, www: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert tls_nginx.tls is not None
    url = f"{tls_nginx.url}/free.bin"
    # the server's certificate is not one this machine trusts
    with pytest.raises(FetchError, match="certificate"):
        fetch(url, retries=0)
    monkeypatch.setenv("SSL_CERT_FILE", str(tls_nginx.tls[0]))  # now it is
    result = fetch(url, tmp_path / "tls.bin", connections=2, chunk_size=MiB)
    assert sha(tmp_path / "tls.bin") == sha(www / "free.bin")
    assert result.http_version == "2" and result.chunks == 7


# -- the range size ----------------------------------------------------------------------------
def sized(per_connection: float, chunk: int = MiB, connections: int = 8) -> list[int]:
    """The range sizes a sizer chooses against connections that each receive
    ``per_connection`` bytes/s, sampled every 10 ms for 3 s."""
    sizer = RangeSizer(chunk)
    received, t, dt = 0.0, 0.0, 0.01
    while t < 3.0:
        received += per_connection * connections * dt
        t += dt
        sizer.sample(t, int(received), connections)
    return [size for _, size in sizer.steps]


def test_range_size_follows_the_rate_per_connection() -> None:
    # one chunk first; then what a connection receives in RANGE_S, as a power-of-two multiple
    assert sized(50e6) == [MiB, 16 * MiB]  # 25 MB per RANGE_S: 16 MiB
    assert sized(1e9) == [MiB, MAX_RANGE]  # fast: capped at MAX_RANGE
    assert sized(1e6) == [MiB]  # slow: one chunk
    assert sized(1e9, chunk=128 * MiB) == [128 * MiB]  # never below one chunk
    assert RANGE_S == 0.5


def test_range_size_keeps_within_a_factor_of_two_and_shares_the_end() -> None:
    sizer = RangeSizer(MiB)
    sizer.sample(0.0, 0, 4)
    assert sizer.sample(WINDOW_S, int(4 * 40e6 * WINDOW_S), 4) == 16 * MiB  # 20 MB per RANGE_S
    # 26 MB then 21 MB per RANGE_S: within 16-32 MiB, no change
    assert sizer.sample(2 * WINDOW_S, int(4 * 40e6 * WINDOW_S + 4 * 64e6 * WINDOW_S), 4) == 16 * MiB
    assert len(sizer.steps) == 2
    # near the end: no more than the bytes left over twice the connections, at least one chunk
    assert sizer.take(1 << 30, 4) == 16
    assert sizer.take(40 * MiB, 4) == 5
    assert sizer.take(MiB // 2, 4) == 1
    fixed = RangeSizer(2 * MiB, adaptive=False)
    assert fixed.sample(1.0, 1 << 40, 4) == 2 * MiB and fixed.take(1 << 40, 1) == 1


def test_ranges_grow_with_the_rate(pyserver: type[RangeServer]) -> None:
    # 16 MB/s per connection, 2 connections, 16 chunks of 1.5 MiB: a connection moves 8 MB in
    # RANGE_S, so after the first window a range is 2 or 4 chunks (2 even if the rate
    # measured is 40% of the cap). A host too loaded to run the server at 40% of its cap
    # measures less and rightly keeps one chunk: up to three downloads, and one must grow.
    data = np.random.default_rng(24).integers(0, 256, 24 * MiB, dtype=np.uint8).tobytes()
    for _ in range(3):
        srv = pyserver(data, cap=16e6)
        result = fetch(srv.url, connections=2)
        assert result.array is not None and result.array.tobytes() == data
        chunk = result.chunk_size
        assert chunk == 3 * MiB // 2 and result.chunks == 16
        assert result.range_steps[0]["bytes"] == chunk
        if result.range_size >= 2 * chunk:
            break
    assert result.range_size >= 2 * chunk, result.range_steps
    assert srv.requests < 1 + 16  # the probe and fewer requests than chunks


def test_range_sizes_reported_and_fixed_by_chunk_size(
    nginx: Nginx, www: Path, tmp_path: Path
) -> None:
    out = tmp_path / "ranges.bin"
    data = (www / "big.bin").read_bytes()
    result = fetch(f"{nginx.url}/big.bin", out, sha256=hashlib.sha256(data).hexdigest())
    assert out.read_bytes() == data and result.chunk_size == MiB and result.chunks == 64
    steps = result.range_steps
    assert steps[0]["bytes"] == MiB and result.range_size == max(s["bytes"] for s in steps)
    assert all(s["bytes"] % MiB == 0 for s in steps)
    # a fixed chunk_size fixes the range at one chunk
    fixed = fetch(f"{nginx.url}/big.bin", out, chunk_size=2 * MiB, connections=2)
    assert fixed.range_size == 2 * MiB and len(fixed.range_steps) == 1
    assert out.read_bytes() == data


# -- the file writes ---------------------------------------------------------------------------
@pytest.mark.parametrize("threaded", [False, True], ids=["here", "writer-thread"])
@pytest.mark.parametrize("refused", [False, True], ids=["direct", "refused"])
def test_staged_writes_put_every_byte_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, refused: bool, threaded: bool
) -> None:
    # ranges starting at aligned and unaligned offsets (a retry resumes mid-block), delivered
    # in odd pieces: whole blocks go out with O_DIRECT, partial ones through the page cache;
    # where the file system refuses O_DIRECT, everything goes through the page cache; made
    # here or in a writer thread (two buffers in turn)
    data = np.random.default_rng(25).integers(0, 256, 5 * MiB + 4321, dtype=np.uint8).tobytes()
    path = tmp_path / "staged.bin"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    direct = open_direct(path)
    calls: list[int] = []
    if refused:
        pwrite = _FileSink._pwrite

        def refuse(fd_: int, pos: int, view: memoryview) -> None:
            calls.append(fd_)
            if fd_ == direct:
                raise OSError(errno.EINVAL, "Invalid argument")
            pwrite(fd_, pos, view)

        monkeypatch.setattr(_FileSink, "_pwrite", staticmethod(refuse))
    pool = ThreadPoolExecutor(1) if threaded else None
    try:
        os.ftruncate(fd, len(data))
        sink = _FileSink(fd, direct_fd=direct)
        stage = _Staged(sink, pool)
        ranges = [
            (0, 100_000),
            (100_000, 2 * MiB + 17),
            (2 * MiB + 17, 5 * MiB),
            (5 * MiB, len(data)),
        ]
        for first, end in ranges:
            stage.begin(first)
            pos, step = first, 7000
            while pos < end:
                n = min(step, end - pos)
                stage.write(memoryview(data)[pos : pos + n])
                pos, step = pos + n, (step * 3) % 300_001 + 1  # up to 300 KB, never 0
            stage.flush()
            stage.wait()
            assert stage.written() == end
        assert path.read_bytes() == data
        if refused and direct >= 0:
            assert sink.direct_fd == -1 and calls.count(direct) == 1  # refused once, then not tried
    finally:
        if pool is not None:
            pool.shutdown(wait=True)
        os.close(fd)
        if direct >= 0:
            os.close(direct)


def test_a_failed_write_is_raised(tmp_path: Path) -> None:
    # the writer thread's error (here: a descriptor open for reading only) reaches the caller
    path = tmp_path / "ro.bin"
    path.write_bytes(b"\0" * (2 * MiB))
    fd = os.open(path, os.O_RDONLY)
    with ThreadPoolExecutor(1) as pool:
        stage = _Staged(_FileSink(fd), pool)
        stage.begin(0)
        with pytest.raises(OSError) as err:
            for _ in range(2 * MiB // 16384):
                stage.write(memoryview(b"\1" * 16384))
            stage.flush()
            stage.wait()
        assert err.value.errno == errno.EBADF
    os.close(fd)


def test_resume_inside_long_ranges(pyserver: type[RangeServer], tmp_path: Path) -> None:
    # ranges of several chunks: each chunk is recorded done once written, so a download
    # killed inside a range resumes from its last whole chunk
    data = np.random.default_rng(26).integers(0, 256, 24 * MiB, dtype=np.uint8).tobytes()
    srv = pyserver(data, cap=8e6)
    out, state = tmp_path / "long.bin", tmp_path / ("long.bin" + STATE_SUFFIX)
    cmd = [sys.executable, "-m", "rdmaxfer", "fetch", srv.url, "--out", str(out), "--quiet"]
    proc = subprocess.Popen([*cmd, "--connections", "2"], stderr=subprocess.PIPE, text=True)

    def done() -> list[int]:
        try:
            return list(json.loads(state.read_text())["done"])
        except (OSError, ValueError, KeyError):
            return []

    try:
        deadline = time.monotonic() + 60
        while len(done()) < 4 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    marked = done()
    chunk = json.loads(state.read_text())["chunk_size"]
    assert len(marked) >= 4 and chunk == 3 * MiB // 2
    result = fetch(srv.url, out, connections=2, sha256=hashlib.sha256(data).hexdigest())
    assert result.resumed_chunks == len(marked) and out.read_bytes() == data
    assert result.bytes_fetched == len(data) - len(marked) * chunk


def test_a_busy_writer_spills_through_the_page_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the writer thread is held on its first write (a busy disk): the bytes after it are
    # written here through the page cache instead of waiting, and every byte lands in place
    data = np.random.default_rng(27).integers(0, 256, 4 * MiB + 100, dtype=np.uint8).tobytes()
    path = tmp_path / "spill.bin"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    sink = _FileSink(fd, direct_fd=open_direct(path))
    release = threading.Event()
    staged_write, page_cache_write = sink.write_staged, sink.write
    spilled: list[int] = []

    def held(first: int, view: memoryview) -> None:
        assert release.wait(60)
        staged_write(first, view)

    def counted(first: int, view: memoryview) -> None:
        spilled.append(len(view))
        page_cache_write(first, view)

    monkeypatch.setattr(sink, "write_staged", held)
    monkeypatch.setattr(sink, "write", counted)
    try:
        with ThreadPoolExecutor(1) as pool:
            stage = _Staged(sink, pool)
            stage.begin(0)
            for pos in range(0, len(data), 16384):
                stage.write(memoryview(data)[pos : pos + 16384])
            assert sum(spilled) >= 2 * MiB  # all but the first buffer's worth, at least
            release.set()
            stage.flush()
            stage.wait()
            assert stage.written() == len(data)
        assert path.read_bytes() == data
    finally:
        release.set()
        os.close(fd)
        if sink.direct_fd >= 0:
            os.close(sink.direct_fd)
