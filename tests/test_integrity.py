"""End-to-end checksums, and registration limits that must fail cleanly."""

from __future__ import annotations

import gc
import mmap
import resource
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from _common import Pair
from rdmaxfer import (
    ChecksumError,
    InvalidArgumentError,
    RegistrationError,
    _core,
)
from rdmaxfer.memory import meta as _meta


@pytest.mark.parametrize("nbytes", [1, 4095, 16384, 1 << 20])
def test_checksum_roundtrip(pair: Pair, rng: np.random.Generator, nbytes: int) -> None:
    data = rng.integers(0, 256, nbytes, dtype=np.uint8)
    sending = pair.a.post_send(data, checksum=True)
    got = pair.b.recv(timeout=30)
    sending.wait(30)
    assert got.tobytes() == data.tobytes()


@pytest.mark.parametrize("nbytes", [100, 1 << 20])
def test_corrupted_message_raises(pair: Pair, rng: np.random.Generator, nbytes: int) -> None:
    """The sender's checksum does not match the bytes (as if they were corrupted on the wire)."""
    data = rng.integers(0, 256, nbytes, dtype=np.uint8)
    wrong = _meta.payload_checksum(data) ^ 0x1
    meta = _meta.encode(data.dtype, data.shape, wrong)
    region = pair.client.register(data, access="none")
    request = pair.a.core.post_send(region.core, 0, nbytes, meta)
    with pytest.raises(ChecksumError, match=r"sender computed .*corrupted"):
        pair.b.recv(timeout=30)
    assert request.wait(30)
    # The endpoint carries on.
    again = rng.standard_normal(10)
    sending = pair.a.post_send(again, checksum=True)
    np.testing.assert_array_equal(pair.b.recv(timeout=30), again)
    sending.wait(30)


def test_region_too_large_is_a_registration_error(pair: Pair) -> None:
    with pytest.raises(RegistrationError, match=r"mmap of .* bytes for a pinned buffer"):
        pair.server.alloc_pinned(1 << 60)


def test_registering_unmapped_memory_is_refused(pair: Pair) -> None:
    m = mmap.mmap(-1, 4 * mmap.PAGESIZE)
    addr = np.frombuffer(m, dtype=np.uint8).ctypes.data
    m.close()  # the pages are gone: the address now names freed memory
    with pytest.raises(RegistrationError, match=r"not mapped"):
        pair.server.core.register(addr, 4 * mmap.PAGESIZE, _core.ACCESS_REMOTE_WRITE)


def test_double_deregistration_is_a_clear_error(pair: Pair) -> None:
    region = pair.server.core.register(np.zeros(8).ctypes.data, 64, 0)
    pair.server.core.deregister(region, 5.0)
    with pytest.raises(InvalidArgumentError, match="already deregistered"):
        pair.server.core.deregister(region, 5.0)


def test_buffer_dropped_while_in_flight_is_kept_alive(pair: Pair, rng: np.random.Generator) -> None:
    dest = np.zeros(4 << 20, dtype=np.uint8)
    remote = pair.server.register(dest, access="w")
    expected = rng.integers(0, 256, dest.size, dtype=np.uint8)
    transfer = pair.a.post_write(expected.copy(), remote.descriptor())  # the only reference
    gc.collect()
    transfer.wait(30)
    assert dest.tobytes() == expected.tobytes()


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv (util-linux)")
def test_memlock_too_low_names_ulimit() -> None:
    """Without CAP_IPC_LOCK (root would bypass the limit) and with a 64 KiB memlock limit,
    pinning 1 MiB fails with a RegistrationError that names `ulimit -l`."""
    code = textwrap.dedent(
        """
        import resource
        resource.setrlimit(resource.RLIMIT_MEMLOCK, (64 * 1024, 64 * 1024))
        from rdmaxfer import Engine, RegistrationError
        with Engine("tcp") as e:
            try:
                e.alloc_pinned(1 << 20)
            except RegistrationError as exc:
                print("RAISED", exc)
        """
    )
    out = subprocess.run(
        ["setpriv", "--inh-caps=-ipc_lock", "--bounding-set=-ipc_lock", sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "RAISED" in out.stdout
    assert "ulimit -l" in out.stdout and "64 KiB" in out.stdout
    assert resource.getrlimit(resource.RLIMIT_MEMLOCK)  # the parent is untouched
