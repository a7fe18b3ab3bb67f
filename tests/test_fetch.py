"""rdmaxfer.fetch: parallel HTTP Range downloads against nginx on loopback, a server that
ignores Range and one that drops connections mid-transfer; resume, rate limit, integrity,
safetensors straight into arrays."""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from _nginx import Nginx, nginx_binary
from _range_server import RangeServer, servers
from rdmaxfer import Engine, FetchError, FetchIntegrityError, InvalidArgumentError
from rdmaxfer.tools.fetch import (
    MAX_CHUNKS,
    STATE_SUFFIX,
    TokenBucket,
    choose_chunk_size,
    fetch,
    fetch_weights,
    parse_rate,
    server_sha256,
)

MiB = 1 << 20
WAIT_S = 60


def random_bytes(seed: int, n: int) -> bytes:
    data = np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)
    data[0] = 0xA5  # never all zeros
    return data.tobytes()


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# -- fixtures: files, nginx, Python servers --------------------------------------------------
@pytest.fixture(scope="module")
def www(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("www")
    (root / "small.bin").write_bytes(random_bytes(1, 5 * MiB + 123))
    (root / "big.bin").write_bytes(random_bytes(2, 16 * MiB + 7))
    (root / "digest-ok.bin").write_bytes(random_bytes(3, 2 * MiB + 1))
    (root / "digest-bad.bin").write_bytes(random_bytes(3, 2 * MiB + 1))
    (root / "empty.bin").write_bytes(b"")
    rng = np.random.default_rng(4)
    save_file(
        {
            "emb": rng.standard_normal((300, 64)).astype(np.float32),
            "half": rng.standard_normal((7, 5, 3)).astype(np.float16),
            "ids": rng.integers(-(2**40), 2**40, 999, dtype=np.int64),
            "bytes": rng.integers(1, 255, 13, dtype=np.uint8),
            "big": rng.standard_normal((1024, 1100)).astype(np.float32),
        },
        str(root / "model.safetensors"),
    )
    return root


@pytest.fixture(scope="module")
def nginx(www: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Nginx]:
    if nginx_binary() is None:
        pytest.skip("nginx is not installed (apt-get install -y nginx); CI installs it")
    ok = sha((www / "digest-ok.bin").read_bytes())
    extra = (
        f"        location = /digest-ok.bin {{ add_header X-Checksum-Sha256 {ok}; }}\n"
        f"        location = /digest-bad.bin {{ add_header X-Checksum-Sha256 {'0' * 64}; }}\n"
    )
    with Nginx(www, tmp_path_factory.mktemp("nginx"), extra) as server:
        yield server


@pytest.fixture
def pyserver() -> Iterator[type[RangeServer]]:
    yield from servers()


# -- pure functions --------------------------------------------------------------------------
def test_chunk_size_from_file_size() -> None:
    assert choose_chunk_size(5 * MiB, 8) == MiB  # few chunks for small files
    assert choose_chunk_size(1 << 30, 8) == 16 * MiB  # 64 chunks for 1 GiB over 8 connections
    size = 100 * 10**9
    chunk = choose_chunk_size(size, 8)
    assert chunk == 64 * MiB and -(-size // chunk) == 1491  # many for 100 GB
    huge = 10 * 10**12
    assert -(-huge // choose_chunk_size(huge, 8)) <= MAX_CHUNKS  # capped
    assert choose_chunk_size(1000, 8) % 65536 == 0


def test_parse_rate() -> None:
    assert parse_rate("1G") == 1 << 30
    assert parse_rate("1.5M") == 1.5 * MiB
    assert parse_rate("500MiB/s") == 500 * MiB
    assert parse_rate(1000) == 1000.0
    assert parse_rate(None) is None
    for bad in ("fast", "0", "-1M", 0):
        with pytest.raises(InvalidArgumentError, match="rate"):
            parse_rate(bad)


def test_token_bucket_debt() -> None:
    bucket = TokenBucket(1000.0, burst=1000.0)
    assert bucket.take(1000) == 0.0  # the burst is free
    wait = bucket.take(500)  # 500 bytes of debt at 1000 bytes/s
    assert 0.45 <= wait <= 0.5


def test_server_sha256_headers() -> None:
    digest = hashlib.sha256(b"abc").digest()
    import base64

    b64 = base64.b64encode(digest).decode()
    assert server_sha256({"X-Checksum-Sha256": digest.hex().upper()}) == digest.hex()
    assert server_sha256({"Repr-Digest": f"sha-512=:AAAA:, sha-256=:{b64}:"}) == digest.hex()
    assert server_sha256({"Digest": f"SHA-256={b64}"}) == digest.hex()
    assert server_sha256({"Digest": "md5=AAAA"}) is None
    assert server_sha256({}) is None


def test_bad_arguments() -> None:
    url = "http://127.0.0.1:1/x"
    with pytest.raises(InvalidArgumentError, match="connections=0"):
        fetch(url, connections=0)
    with pytest.raises(InvalidArgumentError, match="64 hex digits"):
        fetch(url, sha256="xyz")
    with pytest.raises(InvalidArgumentError, match="rate"):
        fetch(url, rate="fast")
    with pytest.raises(InvalidArgumentError, match="timeout"):
        fetch(url, timeout=0)


# -- nginx -----------------------------------------------------------------------------------
def test_memory_parallel_ranges(nginx: Nginx, www: Path) -> None:
    data = (www / "big.bin").read_bytes()
    result = fetch(f"{nginx.url}/big.bin", connections=4, chunk_size=MiB)
    assert result.array is not None and result.array.tobytes() == data
    assert result.size == len(data) and result.bytes_fetched == len(data)
    assert result.chunks == 17 and result.connections == 4 and result.ranged


def test_file_with_sha256(nginx: Nginx, www: Path, tmp_path: Path) -> None:
    data = (www / "small.bin").read_bytes()
    out = tmp_path / "small.bin"
    result = fetch(f"{nginx.url}/small.bin", out, connections=3, sha256=sha(data).upper())
    assert out.read_bytes() == data
    assert result.sha256 == sha(data) and result.chunks == 6 and result.path == out
    assert not (tmp_path / ("small.bin" + STATE_SUFFIX)).exists()


def test_wrong_sha256_raises(nginx: Nginx, tmp_path: Path) -> None:
    with pytest.raises(FetchIntegrityError, match="you gave " + "1" * 64):
        fetch(f"{nginx.url}/small.bin", tmp_path / "x", sha256="1" * 64)
    assert not (tmp_path / ("x" + STATE_SUFFIX)).exists()


def test_server_announced_digest(nginx: Nginx, www: Path) -> None:
    data = (www / "digest-ok.bin").read_bytes()
    result = fetch(f"{nginx.url}/digest-ok.bin")
    assert result.sha256 == sha(data)
    with pytest.raises(FetchIntegrityError, match="the server announced 0000"):
        fetch(f"{nginx.url}/digest-bad.bin")


def test_empty_file_and_404(nginx: Nginx, tmp_path: Path) -> None:
    result = fetch(f"{nginx.url}/empty.bin", tmp_path / "e")
    assert result.size == 0 and (tmp_path / "e").read_bytes() == b""
    with pytest.raises(FetchError, match="HTTP 404"):
        fetch(f"{nginx.url}/missing.bin", retries=0)


def test_into_pinned_engine_memory(nginx: Nginx, www: Path) -> None:
    data = (www / "small.bin").read_bytes()
    with Engine("tcp") as engine:
        result = fetch(f"{nginx.url}/small.bin", engine=engine)
        assert result.array is not None and result.array.tobytes() == data
        assert engine.registered_count() >= 1
    out = np.zeros(len(data) + 10, np.uint8)
    fetch(f"{nginx.url}/small.bin", into=out)
    assert out[: len(data)].tobytes() == data and not out[len(data) :].any()
    with pytest.raises(InvalidArgumentError, match="at least"):
        fetch(f"{nginx.url}/small.bin", into=np.empty(10, np.uint8))


def test_rate_limit_bounds_the_rate(nginx: Nginx, www: Path) -> None:
    size = (www / "small.bin").stat().st_size  # 5 MiB
    rate = 2 * MiB
    t0 = time.perf_counter()
    fetch(f"{nginx.url}/small.bin", connections=4, chunk_size=MiB, rate=rate)
    elapsed = time.perf_counter() - t0
    # a quarter second of burst is free: the rest cannot arrive faster than the limit
    assert size / elapsed <= rate * 1.5, f"{size / elapsed:.0f} B/s with a {rate} B/s limit"
    assert elapsed >= (size - rate / 4) / rate * 0.8


def test_safetensors_into_arrays(nginx: Nginx, www: Path) -> None:
    ref = load_file(str(www / "model.safetensors"))
    got = fetch_weights(f"{nginx.url}/model.safetensors", connections=4, chunk_size=MiB)
    assert set(got) == set(ref)
    for name, arr in ref.items():
        assert got[name].dtype == arr.dtype and got[name].shape == arr.shape, name
        assert np.array_equal(got[name], arr), name


def test_safetensors_rejects_other_files(nginx: Nginx) -> None:
    with pytest.raises(FetchError, match="header length"):
        fetch_weights(f"{nginx.url}/small.bin")


def _state_done(state: Path) -> int:
    try:
        return len(json.loads(state.read_text())["done"])
    except (OSError, ValueError, KeyError):
        return 0


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGINT], ids=["kill", "ctrl-c"])
def test_resume_after_kill(nginx: Nginx, www: Path, tmp_path: Path, how: signal.Signals) -> None:
    data = (www / "big.bin").read_bytes()
    out = tmp_path / "big.bin"
    state = tmp_path / ("big.bin" + STATE_SUFFIX)
    url = f"{nginx.url}/big.bin"
    cmd = [sys.executable, "-m", "rdmaxfer", "fetch", url, "--out", str(out), "--quiet"]
    cmd += ["--rate", "2M", "--connections", "2", "--chunk-size", "1M"]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + WAIT_S
        while _state_done(state) < 3 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert proc.poll() is None, (
            f"the fetch ended early: {proc.stderr.read() if proc.stderr else ''}"
        )
        proc.send_signal(how)
    finally:
        code = proc.wait(timeout=WAIT_S)
    assert code == (130 if how == signal.SIGINT else -signal.SIGKILL)
    done = _state_done(state)
    assert 3 <= done < 17
    assert out.stat().st_size == len(data)  # preallocated
    result = fetch(url, out, connections=4, chunk_size=MiB, sha256=sha(data))
    assert result.resumed_chunks == done and result.chunks == 17
    assert result.bytes_fetched <= len(data) - done * MiB + MiB
    assert out.read_bytes() == data and not state.exists()


def test_resume_ignored_when_file_changed(nginx: Nginx, www: Path, tmp_path: Path) -> None:
    data = (www / "small.bin").read_bytes()
    out = tmp_path / "small.bin"
    out.write_bytes(b"\x01" * len(data))
    state = tmp_path / ("small.bin" + STATE_SUFFIX)
    record = {"v": 1, "url": "x", "size": len(data), "chunk_size": MiB, "nchunks": 6}
    state.write_text(json.dumps({**record, "etag": '"old"', "last_modified": None, "done": [0, 1]}))
    result = fetch(f"{nginx.url}/small.bin", out, chunk_size=MiB)
    assert result.resumed_chunks == 0 and result.bytes_fetched == len(data)
    assert out.read_bytes() == data


def test_cli_fetch(nginx: Nginx, www: Path, tmp_path: Path) -> None:
    data = (www / "small.bin").read_bytes()
    out = tmp_path / "cli.bin"
    proc = subprocess.run(
        [sys.executable, "-m", "rdmaxfer", "fetch", f"{nginx.url}/small.bin", "--out", str(out),
         "--connections", "2", "--sha256", sha(data), "--json"],
        capture_output=True, text=True, timeout=WAIT_S,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert info["size"] == len(data) and info["sha256"] == sha(data) and info["ranged"] is True
    assert info["range_steps"][0]["bytes"] == info["chunk_size"] == MiB
    assert info["range_size"] == max(step["bytes"] for step in info["range_steps"])
    assert out.read_bytes() == data
    proc = subprocess.run(
        [sys.executable, "-m", "rdmaxfer", "fetch", f"{nginx.url}/model.safetensors", "--quiet"],
        capture_output=True, text=True, timeout=WAIT_S,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "5 tensors" in proc.stdout
    proc = subprocess.run(
        [sys.executable, "-m", "rdmaxfer", "fetch", f"{nginx.url}/nope", "--retries", "0"],
        capture_output=True, text=True, timeout=WAIT_S,
    )  # fmt: skip
    assert proc.returncode == 2 and "HTTP 404" in proc.stderr


# -- Python servers: no Range, dropped connections --------------------------------------------
def test_server_ignoring_range_falls_back(pyserver: type[RangeServer], tmp_path: Path) -> None:
    data = random_bytes(5, 3 * MiB + 5)
    srv = pyserver(data, ignore_range=True)
    with pytest.warns(RuntimeWarning, match="ignores HTTP Range"):
        result = fetch(srv.url, connections=8)
    assert result.array is not None and result.array.tobytes() == data and not result.ranged
    with pytest.warns(RuntimeWarning, match="ignores HTTP Range"):
        result = fetch(srv.url, tmp_path / "f", sha256=sha(data))
    assert (tmp_path / "f").read_bytes() == data and result.sha256 == sha(data)


def test_server_ignoring_range_sends_the_body_once(
    pyserver: type[RangeServer], tmp_path: Path
) -> None:
    # The size probe's 200 answer is the download: one request, the body sent once.
    data = random_bytes(9, 4 * MiB + 3)
    for out in (None, tmp_path / "once.bin"):
        srv = pyserver(data, ignore_range=True)
        with pytest.warns(RuntimeWarning, match="ignores HTTP Range") as caught:
            result = fetch(srv.url, out, sha256=sha(data))
        assert result.sha256 == sha(data) and result.bytes_fetched == len(data)
        assert (srv.requests, srv.bytes_sent) == (1, len(data))
        assert len(caught) == 1 and caught[0].filename == __file__  # the caller's line


def test_cli_prints_the_range_warning_once(pyserver: type[RangeServer]) -> None:
    data = random_bytes(10, MiB)
    srv = pyserver(data, ignore_range=True)
    proc = subprocess.run(
        [sys.executable, "-m", "rdmaxfer", "fetch", srv.url, "--quiet", "--sha256", sha(data)],
        capture_output=True, text=True, timeout=WAIT_S,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("ignores HTTP Range") == 1, proc.stderr
    assert (srv.requests, srv.bytes_sent) == (1, len(data))


def test_no_range_and_no_length(pyserver: type[RangeServer]) -> None:
    data = random_bytes(8, MiB + 17)
    srv = pyserver(data, ignore_range=True, no_length=True)
    with pytest.warns(RuntimeWarning, match="ignores HTTP Range"):
        result = fetch(srv.url, sha256=sha(data))
    assert result.array is not None and result.array.tobytes() == data
    assert result.size == len(data) and result.sha256 == sha(data)


def test_safetensors_from_server_ignoring_range(pyserver: type[RangeServer], www: Path) -> None:
    srv = pyserver((www / "model.safetensors").read_bytes(), ignore_range=True)
    with pytest.warns(RuntimeWarning, match="ignores HTTP Range"):
        got = fetch_weights(srv.url)
    ref = load_file(str(www / "model.safetensors"))
    assert all(np.array_equal(got[k], v) and got[k].dtype == v.dtype for k, v in ref.items())


def test_dropped_connections_are_retried(pyserver: type[RangeServer], tmp_path: Path) -> None:
    data = random_bytes(6, 4 * MiB + 3)
    srv = pyserver(data, drops=3)
    result = fetch(srv.url, tmp_path / "d", connections=2, chunk_size=MiB, sha256=sha(data))
    assert (tmp_path / "d").read_bytes() == data
    assert srv.drops_done == 3 and result.retries >= 3
    # resumed from where each range stopped: little more than the file was transferred
    assert result.bytes_fetched == len(data)


def test_retries_are_bounded(pyserver: type[RangeServer]) -> None:
    srv = pyserver(random_bytes(7, 2 * MiB), drops=100)
    t0 = time.perf_counter()
    with pytest.raises(FetchError, match="failed 3 times"):
        fetch(srv.url, connections=1, retries=2)
    assert time.perf_counter() - t0 < WAIT_S
