"""Helpers shared by the verbs-transport tests (engines on the rxe devices of the test VM)."""

from __future__ import annotations

import functools
import os
import resource
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import pytest

from _common import wait_for as wait_for
from rdmaxfer import Endpoint, Engine, _core

SKIP_REASON = "no RDMA device (run inside tests/rxe/run-in-vm.sh)"
#: Every bounded wait in these tests (TCG emulation is slow, but never this slow).
WAIT_S = 60.0

RW = _core.ACCESS_REMOTE_READ | _core.ACCESS_REMOTE_WRITE


def rdma_reason() -> str:
    return _core.available_transports().get("rdma", "unknown transport")


def devices() -> list[str]:
    return os.environ.get("RDMAXFER_RXE_DEVICES", "rxe0 rxe1").split()


def rails(index: int) -> list[str]:
    """The rails of side `index` (0: client, 1: server): with ``run-in-vm.sh --rails 2``
    (``RDMAXFER_RXE_RAIL_DEVICES="rxe0,rxe2 rxe1,rxe3"``) two devices each, else
    ``[devices()[index]]``."""
    sides = os.environ.get("RDMAXFER_RXE_RAIL_DEVICES", "").split()
    return sides[index].split(",") if len(sides) == 2 else [devices()[index]]


def addrs() -> list[str]:
    return os.environ.get("RDMAXFER_RXE_ADDRS", "10.77.0.1 10.77.0.2").split()


def make_engine(index: int, **kwargs: object) -> _core.Engine:
    """An rdma engine on side `index`'s rails (0: rxe0 [+rxe2], 1: rxe1 [+rxe3]); GID from
    RDMAXFER_GID_INDEX/auto."""
    return _core.Engine("rdma", rdma_devices=rails(index), **kwargs)  # type: ignore[arg-type]


@dataclass
class RdmaPair:
    server: _core.Engine  # on rxe1, listening on 10.77.0.2
    client: _core.Engine  # on rxe0
    a: _core.Endpoint  # the client's (connected) endpoint
    b: _core.Endpoint  # the server's (accepted) endpoint
    port: int

    def reconnect(self, streams: int = 0) -> tuple[_core.Endpoint, _core.Endpoint]:
        a = self.client.connect(addrs()[1], self.port, streams, WAIT_S)
        b = self.server.accept(WAIT_S)
        return a, b


def connect_pair(streams: int = 0, **kwargs: object) -> RdmaPair:
    server = make_engine(1, **kwargs)
    client = make_engine(0, **kwargs)
    port = server.listen(addrs()[1], 0)
    a = client.connect(addrs()[1], port, streams, WAIT_S)
    b = server.accept(WAIT_S)
    return RdmaPair(server, client, a, b, port)


@contextmanager
def api_pair(secret: str = "rxe-tests") -> Iterator[tuple[Engine, Engine, Endpoint, Endpoint]]:
    """Python-API engines on rxe1 (server, listening on 10.77.0.2) and rxe0 (client), and the
    client's and the server's endpoint of one connection; everything closed on exit."""
    with (
        Engine("rdma", rdma_devices=rails(1), secret=secret) as server,
        Engine("rdma", rdma_devices=rails(0), secret=secret) as client,
    ):
        port = server.listen(addrs()[1], 0)
        ep = client.connect(addrs()[1], port, timeout=WAIT_S)
        peer = server.accept(timeout=WAIT_S)
        yield server, client, ep, peer


def random_bytes(rng: np.random.Generator, n: int) -> np.ndarray:
    """n random bytes, never all zeros."""
    data = rng.integers(0, 256, size=n, dtype=np.uint8)
    if n and not data.any():
        data[0] = 1
    return data


def region_array(region: _core.Region) -> np.ndarray:
    return np.frombuffer(region, dtype=np.uint8)  # type: ignore[call-overload]


def wait_ok(request: _core.Request, timeout: float = WAIT_S) -> None:
    assert request.wait(timeout), f"{request.op} did not finish within {timeout} s"
    request.check()


def raise_fd_limit(need: int, what: str) -> None:
    """Raises the soft RLIMIT_NOFILE to `need` (skips when the hard limit is lower)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < need:
        if hard != resource.RLIM_INFINITY and hard < need:
            pytest.skip(f"{what} need {need} file descriptors; hard limit {hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))


def connect_many(
    client: Engine, server: Engine, host: str, port: int, n: int
) -> tuple[list[Endpoint], list[Endpoint]]:
    """`n` connections from `client` to `server` (listening on host:port), made by 8 threads
    while this one accepts: (client endpoints, server endpoints), in no matching order."""
    ours: list[Endpoint] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def connect(count: int) -> None:
        try:
            for _ in range(count):
                ep = client.connect(host, port, timeout=WAIT_S)
                with lock:
                    ours.append(ep)
        except BaseException as e:  # reported by the assert below
            errors.append(e)

    threads = [threading.Thread(target=connect, args=(n // 8,)) for _ in range(8)]
    for t in threads:
        t.start()
    theirs = [server.accept(timeout=WAIT_S) for _ in range(n)]
    for t in threads:
        t.join(WAIT_S)
    assert not errors, errors[:3]
    assert len(ours) == len(theirs) == n
    return ours, theirs


def peers_by_tag(
    rng: np.random.Generator, ours: list[Endpoint], theirs: list[Endpoint]
) -> dict[int, int]:
    """Sends a random tag (no two alike) from each of `theirs`; returns, for each index into
    `theirs`, the index of its peer in `ours`, after checking every tag arrived exactly once."""
    tags = rng.choice(2**62, size=len(theirs), replace=False).astype(np.uint64)
    sends = [ep.post_send(tags[i : i + 1]) for i, ep in enumerate(theirs)]
    peer_of: dict[int, int] = {}
    for j, ep in enumerate(ours):
        got = ep.recv(timeout=WAIT_S)
        peer_of[int(np.where(tags == got.view(np.uint64)[0])[0][0])] = j
    for r in sends:
        r.wait(WAIT_S)
    assert sorted(peer_of) == list(range(len(theirs)))
    assert sorted(peer_of.values()) == list(range(len(ours)))
    return peer_of


def send_and_notify(
    rng: np.random.Generator,
    sender: tuple[_core.Engine, _core.Endpoint],
    receiver: tuple[_core.Engine, _core.Endpoint],
) -> None:
    """A rendezvous message (control SENDs, a grant of a temporary MR, WRITE_WITH_IMM) and an
    eager one from `sender` to `receiver`, then a WRITE with a notification: bytes exact."""
    (src_engine, ep), (dst_engine, peer) = sender, receiver
    for size, meta in ((300_000 + 7, b"rendezvous"), (1000, b"eager")):
        src = src_engine.alloc_pinned(size, 0)
        data = random_bytes(rng, size)
        region_array(src)[:] = data
        send = ep.post_send(src, 0, size, meta, 0, 0)
        header = peer.post_recv_header()
        wait_ok(header)
        msg_id, length, got_meta = header.message()
        assert (length, got_meta) == (size, meta)
        dst = dst_engine.alloc_pinned(size, 0)  # no REMOTE_WRITE: a temporary MR is granted
        wait_ok(peer.post_recv(msg_id, dst, 0, size))
        wait_ok(send)
        assert np.array_equal(region_array(dst), data)
    size = 64 * 1024 + 3
    src = src_engine.alloc_pinned(size, 0)
    dst = dst_engine.alloc_pinned(size, RW)
    data = random_bytes(rng, size)
    region_array(src)[:] = data
    table = np.array([[0, 0, 0, 0, size]], dtype=np.uint64)
    plan = _core.BatchPlan("write", [src], [dst.descriptor()], table)
    wait_ok(_core.post_batch(ep, plan, b"landed", whole=True).request)
    assert _core.pop_notification(dst_engine, WAIT_S) == (peer.peer, b"landed")
    assert np.array_equal(region_array(dst), data)


MIB = 1 << 20

#: The tests of several rails per engine: skipped unless each side has two.
TWO_RAILS = pytest.mark.skipif(
    len(rails(0)) < 2, reason="needs two rails per side: tests/rxe/run-in-vm.sh --rails 2"
)


@contextmanager
def rail_pair(
    client_rails: list[str] | None = None, server_rails: list[str] | None = None
) -> Iterator[tuple[_core.Engine, _core.Engine, _core.Endpoint, _core.Endpoint]]:
    server = _core.Engine("rdma", rdma_devices=server_rails or rails(1))
    client = _core.Engine("rdma", rdma_devices=client_rails or rails(0))
    try:
        port = server.listen(addrs()[1], 0)
        a = client.connect(addrs()[1], port, 0, WAIT_S)
        b = server.accept(WAIT_S)
        yield client, server, a, b
    finally:
        client.close()
        server.close()


def rail_bytes(ep: _core.Endpoint) -> dict[str, int]:
    attrs = ep.attributes()
    return {
        k[5:-6]: int(v) for k, v in attrs.items() if k.startswith("rail_") and k.endswith("_bytes")
    }


def port_active(device: str) -> bool:
    """Whether port 1 of `device` is ACTIVE (sysfs)."""
    try:
        with open(f"/sys/class/infiniband/{device}/ports/1/state") as f:
            return "ACTIVE" in f.read()
    except OSError:
        return False


def run_cmd(*cmd: str) -> None:
    """Runs a command (ip, rdma, tc) in the guest; raises on failure."""
    subprocess.run(cmd, check=True, timeout=60, capture_output=True)


def set_link(netdev: str, state: str) -> None:
    """`ip link set netdev state` for a veth of guest.sh, with the route guest.sh gave it (to the
    other end's address, from its own, in table 100 + its number) made a blackhole while the link
    is down and put back when it is up. Both ends live in this guest, so without the blackhole a
    packet for the other end's address finds it in the `local` table and goes through `lo`: the
    rail would keep delivering with its link down, and after it a peer would see a connection
    come from its own address."""
    n = int(netdev.removeprefix("veth"))
    net = f"10.{77 + n // 2}.0"
    src, dst = (f"{net}.1", f"{net}.2") if n % 2 == 0 else (f"{net}.2", f"{net}.1")
    table = str(100 + n)
    if state == "down":
        run_cmd("ip", "route", "replace", "blackhole", f"{dst}/32", "table", table)
    run_cmd("ip", "link", "set", netdev, state)
    if state == "up":
        run_cmd("ip", "route", "replace", f"{dst}/32", "dev", netdev, "src", src, "table", table)


def device_back(device: str) -> bool:
    """`device` listed, its port ACTIVE and its GID[1] the IPv4-mapped RoCE v2 one (guest.sh)."""
    try:
        with open(f"/sys/class/infiniband/{device}/ports/1/gids/1") as f:
            gid = f.read().strip()
    except OSError:
        return False
    return port_active(device) and gid.startswith("0000:0000:0000:0000:0000:ffff:")


#: How long `rdma link delete` may take once the engine noticed the removal (it checks the
#: device list every 0.5 s; the rest is releasing the QPs, MRs and CQs under emulation).
DELETE_BOUND_S = 30.0


@contextmanager
def deleting(device: str, netdev: str) -> Iterator[subprocess.Popen[bytes]]:
    """Starts `rdma link delete device` and yields it; afterwards waits for it (the engines are
    closed by then, so it ends) and adds `device` back on `netdev`, as guest.sh made it, for the
    later tests."""
    delete = subprocess.Popen(
        ["rdma", "link", "delete", device], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        yield delete
    finally:
        if delete.poll() is None:
            delete.wait(timeout=120)
        if not os.path.exists(f"/sys/class/infiniband/{device}"):
            run_cmd("rdma", "link", "add", device, "type", "rxe", "netdev", netdev)
        wait_for(f"{device} back, ACTIVE with its IPv4 GID", functools.partial(device_back, device))


def deleted_within_bound(delete: subprocess.Popen[bytes], ep: _core.Endpoint) -> None:
    """Asserts that `delete` ends, successfully, within DELETE_BOUND_S."""
    try:
        _, err = delete.communicate(timeout=DELETE_BOUND_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"rdma link delete still blocked after {DELETE_BOUND_S} s: the engine did "
                    f"not let go of the device; {ep.describe()}")  # fmt: skip
    assert delete.returncode == 0, err
