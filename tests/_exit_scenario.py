"""A process that ends with every kind of rdmaxfer object still open (tests/test_exit.py).

    python tests/_exit_scenario.py ENDING TRANSPORT[,TRANSPORT...]

On each transport it opens two connected engines, a WeightServer that served one pull and
holds a second client that never asks for anything (its thread waits for that client's
request), a WeightReceiver, a WRITE of 8 MiB in flight, and daemon threads blocked in
``Endpoint.recv``, ``Engine.accept`` and ``Engine.wait_notification`` (an hour's timeout);
prints ``ready N`` (N: the objects kept open) and ends by ENDING:

- ``normal``: the script returns (exit 0);
- ``exit3``: ``sys.exit(3)``;
- ``raise``: an unhandled ``RuntimeError("the user's own error")`` (exit 1);
- ``sigterm``: SIGTERM with no handler installed (the default action: killed, -15);
- ``sigterm-handler``: SIGTERM with a handler that calls ``sys.exit(143)``.

A TRANSPORT is ``tcp``, ``shm`` or ``rdma`` (the rxe test VM's devices, tests/rxe).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Any

import numpy as np

import rdmaxfer
from rdmaxfer.weights import pull_weights, receive_weights, serve_weights

#: The bound of each step of the set-up.
WAIT_S = 60.0
#: A blocked wait's bound: far longer than the set-up takes after it (minutes in the emulated
#: rxe guest) and than any exit may take.
BLOCKED_S = 3600.0


def _blocked(target: Any) -> None:
    """Run ``target(timeout=BLOCKED_S)`` in a daemon thread that stays blocked in it."""
    threading.Thread(target=target, kwargs={"timeout": BLOCKED_S}, daemon=True).start()


def _side(transport: str, index: int) -> tuple[rdmaxfer.Engine, str]:
    """A new engine of side ``index`` (0 connects, 1 listens) and its host. Over rdma the
    sides are the test VM's two soft-RoCE devices and their addresses (tests/rxe), with a
    shared secret (listening beyond loopback without one warns)."""
    if transport != "rdma":
        return rdmaxfer.Engine(transport), "127.0.0.1"
    device = os.environ.get("RDMAXFER_RXE_DEVICES", "rxe0 rxe1").split()[index]
    host = os.environ.get("RDMAXFER_RXE_ADDRS", "10.77.0.1 10.77.0.2").split()[index]
    return rdmaxfer.Engine("rdma", rdma_device=device, secret="exit-scenario"), host


def open_everything(transport: str) -> list[object]:
    """Every object left open at exit (the list keeps them referenced until then)."""
    server, host = _side(transport, 1)
    client, _ = _side(transport, 0)
    port = server.listen(host, 0)
    ep_client = client.connect(host, port, timeout=WAIT_S)
    ep_server = server.accept(timeout=WAIT_S)
    _blocked(ep_server.recv)  # nothing is ever sent
    _blocked(server.wait_notification)  # nothing is ever notified
    idle, _ = _side(transport, 1)
    idle.listen(host, 0)
    _blocked(idle.accept)  # nobody connects

    rng = np.random.default_rng(7)
    tensors = {"w": rng.standard_normal((256, 64)).astype(np.float32)}
    weights = serve_weights(tensors, host=host, engine=_side(transport, 1)[0], timeout=BLOCKED_S)
    address = f"{host}:{weights.port}"
    pulled = pull_weights(address, engine=client, timeout=WAIT_S)
    assert np.array_equal(pulled["w"], tensors["w"])
    silent = client.connect(address, timeout=WAIT_S)  # its server thread waits in recv
    receiver = receive_weights(
        {"w": np.zeros((256, 64), np.float32)}, host, engine=_side(transport, 1)[0]
    )

    target = np.zeros(8 << 20, np.uint8)
    region = server.register(target, access="w")
    source = rng.integers(0, 256, size=target.size, dtype=np.uint8)
    in_flight = ep_client.post_write(source, region.descriptor())
    return [server, client, idle, ep_client, ep_server, weights, silent, receiver, in_flight]


def main() -> None:
    ending = sys.argv[1]
    kept = [kept for transport in sys.argv[2].split(",") for kept in open_everything(transport)]
    print("ready", len(kept), flush=True)
    if ending == "exit3":
        sys.exit(3)
    if ending == "raise":
        raise RuntimeError("the user's own error")
    if ending in ("sigterm", "sigterm-handler"):
        if ending == "sigterm-handler":
            signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(143))
        os.kill(os.getpid(), signal.SIGTERM)
        threading.Event().wait(BLOCKED_S)  # the signal ends the process (or the handler runs)
        raise AssertionError("SIGTERM did not end the process")
    assert ending == "normal", ending


if __name__ == "__main__":
    main()
