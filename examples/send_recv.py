"""Two-sided messages with the module-level API: ``rdmaxfer.send`` and ``rdmaxfer.recv``.

Both sides on this machine:  python examples/send_recv.py
On two machines (the same RDMAXFER_SECRET set on both):
    python examples/send_recv.py --role receiver --bind 0.0.0.0 --host NODE_A   # on node B
    python examples/send_recv.py --role sender --bind 0.0.0.0 --host NODE_B     # on node A
"""

import argparse

import numpy as np

import rdmaxfer as rdma
from _two_sides import run_both


def receiver(bind: str, sender_host: str, port: int) -> None:
    # The receiver listens, the sender connects: a new array of the sender's dtype and shape.
    arr = rdma.recv(listen=f"{bind}:{port}")
    # Into an existing array, from a sender that listens: a dtype or shape mismatch raises
    # before any byte is written.
    out = np.empty((1024, 1024), np.float32)
    rdma.recv(out=out, from_=f"{sender_host}:{port + 1}")
    assert np.array_equal(out.ravel(), arr)
    print(f"received {arr.nbytes} bytes of {arr.dtype}, then {out.shape} into out=")


def sender(bind: str, receiver_host: str, port: int) -> None:
    x = np.arange(1 << 20, dtype=np.float32)
    rdma.send(x, to=f"{receiver_host}:{port}")  # connects (retried until the receiver listens)
    rdma.send(x.reshape(1024, 1024), listen=f"{bind}:{port + 1}")  # waits for the receiver


def main() -> None:
    parser = argparse.ArgumentParser(description="rdmaxfer.send / rdmaxfer.recv, both sides")
    parser.add_argument("--role", choices=["both", "sender", "receiver"], default="both")
    parser.add_argument("--host", default="127.0.0.1", help="the other side's address")
    parser.add_argument("--bind", default="127.0.0.1", help="the address this side listens on")
    parser.add_argument("--port", type=int, default=5555, help="this port and the next")
    args = parser.parse_args()
    if args.role == "receiver":
        receiver(args.bind, args.host, args.port)
    elif args.role == "sender":
        sender(args.bind, args.host, args.port)
    else:  # both on this machine
        run_both(receiver, sender, args.bind, args.host, args.port)


if __name__ == "__main__":
    main()
