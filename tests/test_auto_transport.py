"""transport="auto" picks the transport of each connection (issue 14, item 2): shm for a peer
on this host, the network transport otherwise, and it says why a same-host peer did not get shm
(another user, CMA refused, no shm listener). One engine holds shm and TCP connections at once.
The failure suites (peer death, kill loop) run on "auto" too, through the ``transport`` fixture.
"""

from __future__ import annotations

import ctypes
import json
import os
import platform
import subprocess
import sys
import textwrap
import zlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from _common import write_halves
from rdmaxfer import Endpoint, Engine, UnsupportedError, _core

SHM_WHY = _core.available_transports().get("shm", "unknown")
needs_shm = pytest.mark.skipif(SHM_WHY != "", reason=f"shm unavailable here: {SHM_WHY}")


@pytest.fixture(autouse=True)
def no_forced_transport(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RDMAXFER_TRANSPORT", raising=False)


@pytest.fixture
def auto_server() -> Iterator[tuple[Engine, int]]:
    with Engine("auto") as server:
        yield server, server.listen("127.0.0.1", 0)


def exchange(sender: Endpoint, receiver: Endpoint, owner: Engine, rng: np.random.Generator) -> None:
    """A random two-sided message, then a one-sided WRITE and READ of a region of ``owner``
    (the receiver's engine), each checked byte for byte."""
    data = rng.integers(0, 256, 3 << 20, dtype=np.uint8)
    sending = sender.post_send(data)
    assert receiver.recv(timeout=30).tobytes() == data.tobytes()
    sending.wait(30)
    target = np.zeros(1 << 20, np.uint8)
    region = owner.register(target)
    src = rng.integers(0, 256, 1 << 20, dtype=np.uint8)
    sender.write(src, region.descriptor(), timeout=30)
    assert target.tobytes() == src.tobytes()
    back = np.zeros_like(src)
    sender.read(back, region.descriptor(), timeout=30)
    assert back.tobytes() == src.tobytes()
    region.deregister()


@needs_shm
def test_auto_picks_shm_for_a_peer_on_this_host(
    auto_server: tuple[Engine, int], rng: np.random.Generator
) -> None:
    server, port = auto_server
    with Engine("auto") as client:
        a = client.connect("127.0.0.1", port, timeout=10)
        b = server.accept(timeout=10)
        assert a.info["transport"] == b.info["transport"] == "shm"
        assert "shm_not_used" not in a.info
        assert a.describe().startswith("shm to ")
        exchange(a, b, server, rng)
        exchange(b, a, client, rng)
        assert client.links() == {"shm": 1}
        assert client.stats()["send.bytes"] == 3 << 20  # shm connections count in the engine's
        assert "auto: shm for peers on this host" in client.describe()


def test_forced_tcp_stays_tcp_and_auto_says_why_a_tcp_listener_got_no_shm(
    rng: np.random.Generator, caplog: pytest.LogCaptureFixture
) -> None:
    with Engine("tcp") as server, Engine("tcp") as forced, Engine("auto") as auto:
        port = server.listen("127.0.0.1", 0)
        a = forced.connect("127.0.0.1", port, timeout=10)
        b = server.accept(timeout=10)
        assert a.info["transport"] == b.info["transport"] == "tcp"
        assert "shm_not_used" not in a.info and forced.shm_off is None
        exchange(a, b, server, rng)
        with caplog.at_level("INFO", logger="rdmaxfer"):
            c = auto.connect("127.0.0.1", port, timeout=10)
        d = server.accept(timeout=10)
        assert c.info["transport"] == "tcp"
        if SHM_WHY == "":
            assert "takes no shm connections on port" in str(c.info["shm_not_used"])
            assert "shm not used: the peer takes no shm connections" in c.describe()
            assert any("is on this host but shm is not used" in r.message for r in caplog.records)
        exchange(c, d, server, rng)
        assert auto.stats().get("errors.connect", 0) == 0  # the shm probe is not an error


@needs_shm
def test_rdmaxfer_transport_tcp_forces_tcp_under_auto(
    monkeypatch: pytest.MonkeyPatch, auto_server: tuple[Engine, int]
) -> None:
    server, port = auto_server
    monkeypatch.setenv("RDMAXFER_TRANSPORT", "tcp")
    with Engine("auto") as client:
        assert client.shm_off is None
        a = client.connect("127.0.0.1", port, timeout=10)
        assert server.accept(timeout=10).info["transport"] == a.info["transport"] == "tcp"


@needs_shm
def test_one_engine_holds_a_shm_and_a_tcp_connection_at_once(
    auto_server: tuple[Engine, int], rng: np.random.Generator
) -> None:
    server, port = auto_server
    with Engine("auto") as near, Engine("tcp") as far:
        a = near.connect("127.0.0.1", port, timeout=10)
        b = server.accept(timeout=10)
        c = far.connect("127.0.0.1", port, timeout=10)
        d = server.accept(timeout=10)
        assert (b.info["transport"], d.info["transport"]) == ("shm", "tcp")
        assert server.links() == {"shm": 1, "tcp": 1}
        write_halves(server, a, c, rng, 30)  # one registration serves both at once
        exchange(b, a, near, rng)
        exchange(d, c, far, rng)


@needs_shm
def test_forced_shm_names_why_a_peer_on_another_host_cannot_be_reached() -> None:
    with Engine("shm") as client, pytest.raises(UnsupportedError, match="not an address of this"):
        client.connect("192.0.2.1", 5555, timeout=5)


# -- a same-host peer that may not use shm ----------------------------------------------------

#: The peer: makes an automatic engine (shm usable), then loses CMA or its user, connects to
#: the listener and reports which transport it got, why, and what it received.
PEER = textwrap.dedent(
    """
    import ctypes, json, os, sys, zlib
    from rdmaxfer import Engine
    port, how = int(sys.argv[1]), sys.argv[2]
    with Engine("auto") as engine:
        if how == "seccomp":
            sys.path.insert(0, sys.argv[3])
            from test_auto_transport import refuse_cma
            refuse_cma()
        elif how == "user":
            os.setgid(65534)
            os.setuid(65534)
        ep = engine.connect("127.0.0.1", port, timeout=30)
        got = ep.recv(timeout=30)
        print(json.dumps({"transport": ep.info["transport"], "why": ep.info.get("shm_not_used"),
                          "crc": zlib.crc32(got.tobytes())}))
        ep.close()
    """
)


def refuse_cma() -> None:
    """Makes the kernel refuse process_vm_readv/writev to this process from now on (seccomp,
    EPERM), as a container profile without the permission does. x86-64 only."""
    libc = ctypes.CDLL(None, use_errno=True)

    class Filter(ctypes.Structure):
        _fields_ = [
            ("code", ctypes.c_uint16),
            ("jt", ctypes.c_uint8),
            ("jf", ctypes.c_uint8),
            ("k", ctypes.c_uint32),
        ]

    class Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(Filter))]

    ld, jeq, ret = 0x20, 0x15, 0x06
    audit_arch_x86_64, process_vm_readv, process_vm_writev = 0xC000003E, 310, 311
    allow, eperm = 0x7FFF0000, 0x00050000 | 1
    code = (Filter * 7)(
        Filter(ld, 0, 0, 4),  # the architecture
        Filter(jeq, 0, 3, audit_arch_x86_64),
        Filter(ld, 0, 0, 0),  # the system call number
        Filter(jeq, 2, 0, process_vm_readv),
        Filter(jeq, 1, 0, process_vm_writev),
        Filter(ret, 0, 0, allow),
        Filter(ret, 0, 0, eperm),
    )
    program = Program(7, code)
    pr_set_no_new_privs, pr_set_seccomp, seccomp_mode_filter = 38, 22, 2
    if libc.prctl(pr_set_no_new_privs, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    if libc.prctl(pr_set_seccomp, seccomp_mode_filter, ctypes.byref(program), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP)")


def run_limited_peer(how: str, rng: np.random.Generator) -> dict[str, object]:
    with Engine("auto") as server:
        port = server.listen("127.0.0.1", 0)
        peer = subprocess.Popen(
            [sys.executable, "-c", PEER, str(port), how, str(Path(__file__).parent)],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            ep = server.accept(timeout=60)
            assert ep.info["transport"] == "tcp"
            data = rng.integers(0, 256, 2 << 20, dtype=np.uint8)
            ep.send(data, timeout=30)  # the peer receives it
            out, _ = peer.communicate(timeout=60)
        finally:
            peer.kill()
            peer.wait(timeout=30)
        assert peer.returncode == 0
        report: dict[str, object] = json.loads(out)
        assert report["crc"] == zlib.crc32(data.tobytes())
        assert server.links() == {"tcp": 1}
        return report


@needs_shm
@pytest.mark.skipif(platform.machine() != "x86_64", reason="the seccomp filter is x86-64's")
def test_auto_falls_back_to_tcp_with_the_reason_when_cma_is_refused(
    rng: np.random.Generator,
) -> None:
    report = run_limited_peer("seccomp", rng)
    assert report["transport"] == "tcp"
    assert "process_vm_readv of the peer (CMA)" in str(report["why"])
    assert "Operation not permitted" in str(report["why"])


@needs_shm
@pytest.mark.skipif(os.geteuid() != 0, reason="changing to another user needs root")
def test_auto_falls_back_to_tcp_with_the_reason_for_another_user(
    rng: np.random.Generator,
) -> None:
    report = run_limited_peer("user", rng)
    assert report["transport"] == "tcp"
    assert "the peer runs as another user (uid 0 vs 65534)" in str(report["why"])


# -- the same-host check itself, against /proc ------------------------------------------------


def proc_identity() -> dict[str, str | int]:
    return {
        "boot_id": Path("/proc/sys/kernel/random/boot_id").read_text().strip(),
        "netns": os.readlink("/proc/self/ns/net"),
        "uid": os.geteuid(),
        "pid": os.getpid(),
    }


@needs_shm
def test_the_same_host_check_reads_what_proc_says() -> None:
    mine = proc_identity()
    assert _core.host_identity() == mine
    yama = Path("/proc/sys/kernel/yama/ptrace_scope")
    assert _core.yama_ptrace_scope() == (int(yama.read_text()) if yama.exists() else -1)

    def mismatch(**changed: str | int) -> str:
        peer = {**mine, **changed}
        return _core.same_host_mismatch(
            str(peer["boot_id"]), str(peer["netns"]), int(peer["uid"]), int(peer["pid"]),
            os.getpid(),  # the pid SO_PEERCRED reports for the peer
        )  # fmt: skip

    assert mismatch() == ""
    assert "another kernel" in mismatch(boot_id="00000000-0000-0000-0000-000000000000")
    assert "another network namespace (net:[1] vs" in mismatch(netns="net:[1]")
    # A container with its own PID namespace: the pid it announces is not the one seen here.
    assert "another PID namespace (it is pid 7 there" in mismatch(pid=7)
    other = mismatch(uid=int(mine["uid"]) + 1)
    assert "another user" in other and "CAP_SYS_PTRACE" in other
    if _core.yama_ptrace_scope() > 0:
        assert "ptrace_scope" in other
