"""Fork safety, as one process does it: run as a script by tests/test_fork.py (TCP) and
tests/rdma/test_rdma_fork.py (verbs, in the rxe guest).

Usage: _fork_scenario.py tcp | _fork_scenario.py ofi |
       _fork_scenario.py rdma SERVER_DEVICE CLIENT_DEVICE HOST

The process connects two engines, registers a buffer that is not page-aligned and transfers,
then forks. The child checks that every inherited object refuses use with a clear error, closes
them (which must change nothing), transfers with engines of its own, and exits normally
(sys.exit: atexit and garbage collection of the inherited objects). The parent then checks its
connection is untouched (no GOODBYE, no shutdown, no QP change) and still moves bytes. Prints
one JSON line per side; exits 0 when every check held. run_fork_scenario() runs it and checks
both reports.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from typing import Any

import numpy as np

import rdmaxfer
from rdmaxfer import Engine
from rdmaxfer.errors import EndpointClosedError


def make_engines(args: list[str]) -> tuple[Engine, Engine, str]:
    if args[0] in ("tcp", "ofi"):
        return Engine(args[0]), Engine(args[0]), "127.0.0.1"
    server_dev, client_dev, host = args[1:4]
    return Engine("rdma", rdma_device=server_dev), Engine("rdma", rdma_device=client_dev), host


def round_trip(server: Engine, client: Engine, host: str, seed: int) -> None:
    """A WRITE, a READ and a message between two fresh engines, checked byte for byte."""
    port = server.listen(host, 0)
    with client.connect(f"{host}:{port}", timeout=60) as ep, server.accept(timeout=60) as peer:
        rng = np.random.default_rng(seed)
        target = np.zeros(7001, np.uint8)
        region = server.register(target, "rw")
        data = rng.integers(1, 256, 7001, dtype=np.uint8)
        ep.write(data, region.descriptor(), timeout=60)
        assert np.array_equal(target, data), "WRITE"
        back = np.zeros(7001, np.uint8)
        ep.read(back, region.descriptor(), timeout=60)
        assert np.array_equal(back, data), "READ"
        message = rng.standard_normal(999)
        sending = ep.post_send(message)
        assert np.array_equal(peer.recv(timeout=60), message), "SEND/RECV"
        sending.wait(60)


def child(args: list[str], objects: dict[str, Any]) -> None:
    server, client, ep, peer = (objects[k] for k in ("server", "client", "ep", "peer"))
    refused: dict[str, str] = {}
    attempts = {
        "send": lambda: ep.send(np.ones(8), timeout=5),
        "write": lambda: ep.write(np.ones(8), objects["region"], timeout=5),
        "register": lambda: server.register(np.ones(8)),
        "connect": lambda: client.connect("127.0.0.1:1", timeout=5),
        "core_post": lambda: ep.core.post_recv_header(),
    }
    for name, attempt in attempts.items():
        try:
            attempt()
            refused[name] = "not refused"
        except EndpointClosedError as exc:
            refused[name] = str(exc)
    # The bytes around the registered buffer, on its first and last page, are there (with
    # RDMAV_FORK_SAFE the buffer's own whole pages are not: libibverbs keeps them from fork).
    backing = objects["backing"]
    checksum = int(backing[:17].astype(np.uint64).sum() + backing[-100:].astype(np.uint64).sum())
    ep.close()
    peer.close()
    objects["region"].close()
    server.close()
    own_server, own_client, host = make_engines(args)
    with own_server, own_client:
        round_trip(own_server, own_client, host, seed=11)
    print(json.dumps({"side": "child", "refused": refused, "checksum": checksum}), flush=True)
    objects.clear()
    gc.collect()
    sys.exit(0)  # atexit handlers run; `client` is collected at exit without being closed


def main() -> None:
    args = sys.argv[1:]
    server, client, host = make_engines(args)
    port = server.listen(host, 0)
    ep = client.connect(f"{host}:{port}", timeout=60)
    peer = server.accept(timeout=60)
    rng = np.random.default_rng(5)
    backing = rng.integers(1, 256, 4 * 4096, dtype=np.uint8)
    unaligned = backing[17 : 17 + 9000]  # shares its first and last pages with other data
    region = server.register(unaligned, "rw")
    data = rng.integers(1, 256, 9000, dtype=np.uint8)
    ep.write(data, region.descriptor(), timeout=60)
    assert np.array_equal(unaligned, data)
    objects: dict[str, Any] = {
        "server": server,
        "client": client,
        "ep": ep,
        "peer": peer,
        "region": region,
        "backing": backing,
    }
    pid = os.fork()
    if pid == 0:
        try:
            child(args, objects)
        except SystemExit:
            raise
        except BaseException as exc:  # report, then fail the child
            print(json.dumps({"side": "child", "error": repr(exc)}), flush=True)
            sys.exit(3)
    _, status = os.waitpid(pid, 0)
    # The parent's connection is untouched: both ends open and moving bytes.
    untouched = not ep.closed and not peer.closed
    more = rng.integers(1, 256, 9000, dtype=np.uint8)
    ep.write(more, region.descriptor(), timeout=60)
    back = np.zeros(9000, np.uint8)
    ep.read(back, region.descriptor(), timeout=60)
    message = rng.standard_normal(777)
    sending = peer.post_send(message)
    received = ep.recv(timeout=60)
    sending.wait(60)
    result = {
        "side": "parent",
        "child_exit": os.waitstatus_to_exitcode(status),
        "untouched": untouched,
        "write_ok": bool(np.array_equal(unaligned, more) and np.array_equal(back, more)),
        "message_ok": bool(np.array_equal(received, message)),
        "checksum_before_fork": int(
            backing[:17].astype(np.uint64).sum() + backing[-100:].astype(np.uint64).sum()
        ),
    }
    print(json.dumps(result), flush=True)
    server.close()
    client.close()


def run_fork_scenario(args: list[str], fork_safe: bool) -> None:
    """Runs tests/_fork_scenario.py and checks what both sides report."""
    package_root = os.path.dirname(os.path.dirname(rdmaxfer.__file__))
    env = {**os.environ, "PYTHONPATH": package_root}
    env.pop("RDMAV_FORK_SAFE", None)
    if fork_safe:
        env["RDMAV_FORK_SAFE"] = "1"
    done = subprocess.run(
        [sys.executable, __file__, *args], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    reports = {r["side"]: r for r in map(json.loads, done.stdout.strip().splitlines())}
    child, parent = reports["child"], reports["parent"]
    assert parent["child_exit"] == 0, "the child crashed or failed (negative: killed by a signal)"
    assert child["checksum"] == parent["checksum_before_fork"]
    for name, error in child["refused"].items():
        assert "before os.fork()" in error or "before fork()" in error, (name, error)
        assert "create a new Engine" in error, (name, error)
    assert parent["untouched"], "the child closed or changed the parent's connection"
    assert parent["write_ok"] and parent["message_ok"]


if __name__ == "__main__":
    main()
