"""Failures on the verbs transport: bad keys and bounds, a killed peer, a low memlock limit.
After each, the engine still works."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import rdmaxfer
from rdmaxfer import _core
from rdmaxfer.errors import ConnectionFailedError, RemoteAccessError, WcStatus

from .rdma_helpers import (
    RW,
    WAIT_S,
    RdmaPair,
    addrs,
    connect_pair,
    devices,
    random_bytes,
    region_array,
    send_and_notify,
    wait_ok,
)

pytestmark = pytest.mark.rdma

# Children import rdmaxfer from wherever this process did (an installed package or a staged
# source tree), not from the checkout: a checkout has no compiled _core.
PACKAGE_ROOT = os.path.dirname(os.path.dirname(rdmaxfer.__file__))


def forged(desc: _core.Descriptor, key_xor: int) -> _core.Descriptor:
    packed = bytearray(desc.pack())
    key = int.from_bytes(packed[24:28], "little") ^ key_xor
    packed[24:28] = key.to_bytes(4, "little")
    return _core.Descriptor.unpack(bytes(packed))


def assert_pair_works(pair: RdmaPair, rng: np.random.Generator) -> None:
    a, b = pair.reconnect()
    size = 4096 * 3 + 1
    src = pair.client.alloc_pinned(size, 0)
    dst = pair.server.alloc_pinned(size, RW)
    data = random_bytes(rng, size)
    region_array(src)[:] = data
    wait_ok(a.post_write(src, 0, dst.descriptor(), 0, size))
    np.testing.assert_array_equal(region_array(dst), data)
    a.close()
    b.close()


def test_remote_access_error_then_engine_usable(
    rdma_pair: RdmaPair, rng: np.random.Generator
) -> None:
    src = rdma_pair.client.alloc_pinned(8192, 0)
    dst = rdma_pair.server.alloc_pinned(4096, RW)
    req = rdma_pair.a.post_write(src, 0, forged(dst.descriptor(), 0x5A5A00), 0, 4096)
    assert req.wait(WAIT_S)
    with pytest.raises(
        RemoteAccessError,
        match=r"RDMA WRITE failed: .*\(IBV_WC_REM_ACCESS_ERR, wc_status 10\), vendor_err 0x",
    ) as failure:
        req.check()
    # The cause is kept as attributes too.
    assert failure.value.wc_status == WcStatus(10, "IBV_WC_REM_ACCESS_ERR")
    assert failure.value.wc_status.name == "IBV_WC_REM_ACCESS_ERR"
    assert isinstance(failure.value.vendor_err, int)
    assert f"vendor_err 0x{failure.value.vendor_err:x}" in str(failure.value)
    # The QP went to the error state: the connection is torn down on both sides.
    assert rdma_pair.a.closed
    with pytest.raises(ConnectionFailedError):
        rdma_pair.a.post_write(src, 0, dst.descriptor(), 0, 10)
    deadline = time.monotonic() + 30
    while not rdma_pair.b.closed and time.monotonic() < deadline:
        time.sleep(0.05)
    assert rdma_pair.b.closed, "the responder side did not notice the broken connection"
    assert_pair_works(rdma_pair, rng)


def test_read_with_bad_rkey(rdma_pair: RdmaPair, rng: np.random.Generator) -> None:
    dst = rdma_pair.client.alloc_pinned(4096, 0)
    remote = rdma_pair.server.alloc_pinned(4096, _core.ACCESS_REMOTE_WRITE)  # no REMOTE_READ
    req = rdma_pair.a.post_read(dst, 0, remote.descriptor(), 0, 4096)
    assert req.wait(WAIT_S)
    with pytest.raises(RemoteAccessError, match="RDMA READ failed"):
        req.check()
    assert_pair_works(rdma_pair, rng)


PEER_SCRIPT = textwrap.dedent(
    """
    import sys, time
    from rdmaxfer import _core
    engine = _core.Engine("rdma", rdma_device=sys.argv[1])
    port = engine.listen(sys.argv[2], 0)
    print(port, flush=True)
    ep = engine.accept(60)
    region = engine.alloc_pinned(65536, _core.ACCESS_REMOTE_READ | _core.ACCESS_REMOTE_WRITE)
    print(region.descriptor().pack().hex(), flush=True)
    time.sleep(600)
    """
)


def test_peer_killed_fails_pending_requests(rng: np.random.Generator) -> None:
    env = dict(os.environ, PYTHONPATH=PACKAGE_ROOT)
    child = subprocess.Popen(
        [sys.executable, "-c", PEER_SCRIPT, devices()[1], addrs()[1]],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    client = _core.Engine("rdma", rdma_device=devices()[0])
    try:
        port = int(child.stdout.readline())  # type: ignore[union-attr]
        ep = client.connect(addrs()[1], port, 0, WAIT_S)
        desc = _core.Descriptor.unpack(bytes.fromhex(child.stdout.readline().strip()))  # type: ignore[union-attr]
        src = client.alloc_pinned(65536, 0)
        region_array(src)[:] = random_bytes(rng, 65536)
        wait_ok(ep.post_write(src, 0, desc, 0, 65536))  # the peer is alive and serving
        header = ep.post_recv_header()
        child.send_signal(signal.SIGKILL)
        child.wait(30)
        start = time.monotonic()
        assert header.wait(30), "a pending request outlived the peer by 30 s"
        elapsed = time.monotonic() - start
        with pytest.raises(ConnectionFailedError, match=r"went away|closed"):
            header.check()
        assert elapsed < 30
        with pytest.raises(ConnectionFailedError):
            ep.post_write(src, 0, desc, 0, 100)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
        client.close()


MEMLOCK_SCRIPT = textwrap.dedent(
    """
    import json, resource
    import numpy as np
    from rdmaxfer import _core
    from rdmaxfer.errors import RegistrationError
    status = open("/proc/self/status").read().split("CapEff:")[1]
    cap_eff = int(status.split()[0], 16)
    resource.setrlimit(resource.RLIMIT_MEMLOCK, (64 * 1024, 64 * 1024))
    engine = _core.Engine("rdma", rdma_device="%s")
    arr = np.ones(16 << 20, dtype=np.uint8)
    out = {"ipc_lock": bool(cap_eff & (1 << 14)), "limit": _core.memlock_limit()}
    try:
        engine.register(arr.ctypes.data, arr.nbytes, 0)
        out["error"] = None
    except RegistrationError as exc:
        out["error"] = str(exc)
        out["errno"] = exc.errno
    print(json.dumps(out))
    """
)


@pytest.mark.parametrize("drop_ipc_lock", [True, False])
def test_memlock_too_low(drop_ipc_lock: bool) -> None:
    """Root bypasses RLIMIT_MEMLOCK through CAP_IPC_LOCK, so the child runs without it
    (setpriv drops it from the inheritable and bounding sets)."""
    env = dict(os.environ, PYTHONPATH=PACKAGE_ROOT)
    cmd = [sys.executable, "-c", MEMLOCK_SCRIPT % devices()[0]]
    if drop_ipc_lock:
        cmd = ["setpriv", "--inh-caps=-ipc_lock", "--bounding-set=-ipc_lock", *cmd]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["limit"] == "64 KiB"
    if not drop_ipc_lock:
        if out["ipc_lock"]:  # root with CAP_IPC_LOCK: the limit does not apply
            assert out["error"] is None
        return
    assert out["ipc_lock"] is False
    assert out["error"] is not None, "registration above RLIMIT_MEMLOCK succeeded"
    assert out["errno"] in (errno.ENOMEM, errno.EPERM, errno.EAGAIN), out
    assert f"(errno {out['errno']})" in out["error"], out["error"]
    assert "ulimit -l" in out["error"] and "64 KiB" in out["error"], out["error"]
    assert "ibv_reg_mr" in out["error"]


def test_control_sends_that_come_twice_are_handed_up_once(
    rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every control SEND posted twice with its number (the tests-only knob
    RDMAXFER_RDMA_TEST_CTRL_TWICE=1, as a SEND whose ACK was lost with a failed rail is sent
    again on another): RTS, EAGER, CTS and NOTIFY each reach the protocol once, so a
    rendezvous and an eager message and a notified WRITE each way arrive once and exact, no
    phantom message or notification follows, and each side counts the repeats it dropped."""
    monkeypatch.setenv("RDMAXFER_RDMA_TEST_CTRL_TWICE", "1")
    pair = connect_pair()
    try:
        send_and_notify(rng, (pair.client, pair.a), (pair.server, pair.b))
        send_and_notify(rng, (pair.server, pair.b), (pair.client, pair.a))
        # Per direction: RTS, CTS; EAGER, CTS; NOTIFY, each sent twice. The second copy of the
        # last one may still be on its way when the message it repeats was handed up.
        for ep in (pair.a, pair.b):
            deadline = time.monotonic() + WAIT_S
            while ep.attributes()["ctrl_repeats"] < 5 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert ep.attributes()["ctrl_repeats"] == 5, ep.describe()
            extra = ep.post_recv_header()
            assert not extra.wait(1.0), f"a message came twice: {extra.message()}"
        for engine in (pair.client, pair.server):
            assert _core.pop_notification(engine, 0.5) is None
        assert not pair.a.closed and not pair.b.closed
    finally:
        pair.client.close()
        pair.server.close()
