"""Child programs for the Ctrl-C tests (tests/test_interrupt.py, tests/rdma/test_rdma_interrupt.py).

    python _wait_child.py serve HOST           prints "PORT <port>", then serves for ever: each
                                               peer gets the descriptor of a 1 MiB "rw" region
                                               as a message; nothing is ever received
    python _wait_child.py serve-weights HOST   prints "PORT <port>", publishes 4 MiB of weights
    python _wait_child.py receive HOST         prints "PORT <port>", accepts one peer, posts
                                               the receive of a message and prints
                                               "RECEIVING" once its bytes are asked for (CTS
                                               sent); with "receive-stop" it then SIGSTOPs
                                               itself (the sender stalls)
    python _wait_child.py KIND ADDRESS         prints "WAITING", then blocks in a wait of KIND
                                               until interrupted; on KeyboardInterrupt it prints
                                               "RAISED <time.monotonic()>" and re-raises it

The transport comes from RDMAXFER_TRANSPORT (and RDMAXFER_RDMA_DEVICE on rdma). Every wait has
a 60 s timeout, far beyond the test's bound.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import numpy as np

import rdmaxfer

WAIT_S = 60.0
KINDS = (
    "accept-recv",
    "accept-send",
    "accept-engine",
    "connect-refused",
    "handshake",
    "send",
    "recv",
    "read",
    "write",
    "pull",
)


def say(text: str) -> None:
    print(text, flush=True)


def serve(host: str) -> None:
    engine = rdmaxfer.Engine()
    port = engine.listen(host, 0)
    region = engine.register(np.zeros(1 << 20, np.uint8), access="rw")
    packed = np.frombuffer(region.descriptor().pack(), np.uint8)
    say(f"PORT {port}")
    peers = []
    while True:
        try:
            peer = engine.accept(timeout=WAIT_S)
        except rdmaxfer.TransferTimeoutError:
            continue
        peer.send(packed, timeout=WAIT_S)
        peers.append(peer)


def serve_weights(host: str) -> None:
    rng = np.random.default_rng(7)
    tensors = {f"w{i}": rng.standard_normal(1 << 18).astype(np.float32) for i in range(4)}
    server = rdmaxfer.serve_weights(tensors, host=host, port=0)
    say(f"PORT {server.port}")
    while True:
        time.sleep(1)


def receive(host: str, stop: bool) -> None:
    engine = rdmaxfer.Engine()
    say(f"PORT {engine.listen(host, 0)}")
    ep = engine.accept(timeout=WAIT_S)
    transfer = ep.post_recv()
    while transfer.nbytes < 0:  # set once the buffer is placed and the CTS went out
        transfer.done()
        time.sleep(0.001)
    say("RECEIVING")
    if stop:  # at once: a receiver still running for a moment could take the whole message
        os.kill(os.getpid(), signal.SIGSTOP)
    transfer.wait(timeout=WAIT_S)


def wait_in(kind: str, address: str) -> None:
    x = np.arange(1 << 18, dtype=np.float32)  # 1 MiB: a rendezvous message
    engine = rdmaxfer.default_engine()  # opened first: the signal must find the wait itself
    if kind == "accept-recv":
        say("WAITING")
        rdmaxfer.recv(listen=":0", timeout=WAIT_S)
    elif kind == "accept-send":
        say("WAITING")
        rdmaxfer.send(x, listen=":0", timeout=WAIT_S)
    elif kind == "accept-engine":
        engine.listen("127.0.0.1", 0)
        say("WAITING")
        engine.accept(timeout=WAIT_S)
    elif kind in ("connect-refused", "handshake"):
        say("WAITING")
        engine.connect(address, timeout=WAIT_S)
    elif kind == "pull":
        pull = rdmaxfer.pull_weights  # imported before the wait (rdmaxfer loads it on first use)
        say("WAITING")
        while True:
            pull(address, engine=engine, timeout=WAIT_S)
    else:
        ep = engine.connect(address, timeout=WAIT_S)
        remote = ep.recv(timeout=WAIT_S).tobytes()
        local = np.ones(1 << 20, np.uint8)
        say("WAITING")
        if kind == "send":
            ep.send(x, timeout=WAIT_S)  # the peer never receives: no CTS comes
        elif kind == "recv":
            ep.recv(timeout=WAIT_S)  # the peer never sends
        elif kind == "read":
            while True:  # the test stops the peer: one of these READs never completes
                ep.read(local, remote, timeout=WAIT_S)
        elif kind == "write":
            while True:
                ep.write(local, remote, timeout=WAIT_S)
    raise SystemExit(f"the {kind} wait returned")


def main() -> None:
    kind, arg = sys.argv[1], sys.argv[2]
    if kind == "serve":
        serve(arg)
    elif kind == "serve-weights":
        serve_weights(arg)
    elif kind in ("receive", "receive-stop"):
        receive(arg, stop=kind == "receive-stop")
    else:
        try:
            wait_in(kind, arg)
        except KeyboardInterrupt:
            say(f"RAISED {time.monotonic()!r}")
            raise


if __name__ == "__main__":
    main()
