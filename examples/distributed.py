"""Ranks of a torch.distributed job: rdmaxfer finds the other ranks through the job's own
store, then broadcasts a dict of arrays down a pipelined ring and sends point to point.

Both ranks on this machine:  python examples/distributed.py
On two machines (the same RDMAXFER_SECRET set on both; rank 0's host runs the store):
    python examples/distributed.py --rank 0 --host NODE_A   # on node A
    python examples/distributed.py --rank 1 --host NODE_A   # on node B
"""

import argparse

import numpy as np
import torch.distributed as dist

import rdmaxfer.distributed as rd
from _two_sides import run_both


def weights() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(5)
    return {f"layer{i}.weight": rng.standard_normal((512, 512), dtype=np.float32) for i in range(4)}


def rank(r: int, host: str, port: int) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://{host}:{port}", rank=r, world_size=2)
    group = rd.init(transport="auto", timeout=60)  # or: rd.init(store, rank, world_size)
    try:
        got = group.broadcast(weights() if group.rank == 0 else None, src=0)  # array or dict
        assert all(np.array_equal(got[name], w) for name, w in weights().items())
        if group.rank == 0:
            group.send(np.arange(1000, dtype=np.int64), dst=1)
        else:
            y = group.recv(src=0)
            print(f"rank 1: broadcast of {len(got)} tensors exact, received sum {int(y.sum())}")
        group.barrier()
    finally:
        group.close()
        dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description="rdmaxfer.distributed with a gloo group")
    parser.add_argument("--rank", type=int, choices=[0, 1], help="this rank (default: both)")
    parser.add_argument("--host", default="127.0.0.1", help="rank 0's address (the store)")
    parser.add_argument("--port", type=int, default=29500, help="the store's port")
    args = parser.parse_args()
    if args.rank is not None:
        rank(args.rank, args.host, args.port)
    else:  # both ranks on this machine
        run_both(rank1, rank0, args.host, args.port)


def rank0(host: str, port: int) -> None:
    rank(0, host, port)


def rank1(host: str, port: int) -> None:
    rank(1, host, port)


if __name__ == "__main__":
    main()
