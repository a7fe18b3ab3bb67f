"""The cases of tests/test_ray.py, run as a Ray driver script: ``python tests/_ray_cases.py
[CASE...]`` starts one local cluster (``ray.init(num_cpus=2)``), runs the cases in turn and
prints one JSON line per case: ``{"case": name, "ok": bool, "error": text, "seconds": s}``.

A script rather than the test module itself: its actor classes travel to the workers by value,
as a driver script's do.

The cluster's workers run at niceness 0 (``RAY_worker_niceness``, unless set): Ray starts them
at 15, and on a machine shared with other busy processes they then get so little CPU that a
first transfer (engine, connection, READs) was seen to take 20-470 s at load 35 (3-9 s at
niceness 0), past Ray's fixed 60 s RDT fetch timeout, which fails the destination's task.
"""

from __future__ import annotations

import faulthandler
import gc
import json
import os
import signal
import sys
import threading
import time
import traceback
import warnings
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np
import ray
import torch

import rdmaxfer.ray as rr

rr.register()  # before the classes below name the transport

KiB, MiB = 1 << 10, 1 << 20
CASE_STACKS_AFTER_S = 90  # a case still running then has the driver's stacks printed (stderr)


def _crc(t: Any) -> int:
    return zlib.crc32(t.contiguous().view(torch.uint8).reshape(-1).cpu().numpy())


def _random(seed: int, nbytes: int, dtype: Any) -> Any:
    """``nbytes`` of random bits, as ``dtype`` (reproducible from ``seed``)."""
    g = torch.Generator().manual_seed(seed)
    raw = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=g)
    return raw.view(dtype)


def _tensors(seed: int, sizes: list[int], device: str) -> list[Any]:
    """Random tensors of ``sizes`` bytes and several dtypes on ``device``, plus (with more
    than one) a view with a storage offset, sharing the first tensor's storage."""
    dtypes = [torch.float32, torch.bfloat16, torch.int64, torch.uint8, torch.uint8]
    out = [_random(seed + i, n, dtypes[i]).to(device) for i, n in enumerate(sizes)]
    if len(out) > 1:
        out.append(out[0].view(torch.uint8)[64:])
    return out


@ray.remote
class Source:
    """Makes random tensors and returns them over RDMAXFER; keeps them to answer checksums."""

    def __init__(self) -> None:
        self.made: dict[int, list[Any]] = {}

    @ray.method(tensor_transport="rdmaxfer")
    def make(self, seed: int, sizes: list[int]) -> list[Any]:
        self.made[seed] = _tensors(seed, sizes, "cpu")
        return self.made[seed]

    @ray.method(tensor_transport="rdmaxfer")
    def make_cuda(self, seed: int, sizes: list[int]) -> list[Any]:
        """As :meth:`make`, in the GPU memory of the actor's GPU."""
        self.made[seed] = _tensors(seed, sizes, "cuda")
        return self.made[seed]

    @ray.method(tensor_transport="rdmaxfer")
    def one(self, seed: int, nbytes: int) -> Any:
        t = _random(seed, nbytes, torch.uint8)
        self.made[seed] = [t]
        return t

    def crcs(self, seed: int) -> list[int]:
        return [_crc(t) for t in self.made[seed]]

    def pin(self, seed: int) -> None:
        """register_memory on the tensor of ``seed``: its storage stays registered."""
        rr.register_memory(self.made[seed][0])

    def unpin(self, seed: int) -> None:
        rr.deregister_memory(self.made[seed][0])

    def registered(self) -> int:
        from rdmaxfer.ray import transport

        return 0 if transport._process is None else len(transport._process.storages)

    def objects(self) -> int:
        from rdmaxfer.ray import transport

        return 0 if transport._process is None else len(transport._process.objects)

    def pid(self) -> int:
        return os.getpid()


# enable_tensor_transport: Ray's transfer thread, which runs the receive step (without it the
# step runs among the actor's tasks); max_concurrency=2: inflight() answers while a task waits
# for its tensors
@ray.remote(enable_tensor_transport=True, max_concurrency=2)
class Destination:
    def crcs(self, tensors: Any) -> list[int]:
        items = tensors if isinstance(tensors, list) else [tensors]
        return [_crc(t) for t in items]

    def described(self, tensors: list[Any]) -> list[tuple[str, int]]:
        """Each received tensor's kind of device and CRC-32."""
        return [(t.device.type, _crc(t)) for t in tensors]

    def where(self, t: Any) -> tuple[int, int]:
        """The received tensor's address and CRC-32."""
        return t.data_ptr(), _crc(t)

    def inflight(self) -> int:
        from ray.experimental.rdt.util import get_tensor_transport_manager

        return len(get_tensor_transport_manager("RDMAXFER")._inflight)

    def pid(self) -> int:
        return os.getpid()


@ray.remote
class PlainDestination:
    """An actor without enable_tensor_transport=True (no transfer thread)."""

    def pid(self) -> int:
        return os.getpid()


SIZES = [1 * KiB, 1 * MiB + 3 * 8, 64 * MiB, 256 * MiB]


def new_tensor(nbytes: int) -> None:
    """One tensor of ``nbytes`` random bytes into a new tensor of the destination."""
    src, dst = Source.remote(), Destination.remote()
    ref = src.one.remote(nbytes, nbytes)
    got = ray.get(dst.crcs.remote(ref), timeout=300)
    assert got == ray.get(src.crcs.remote(nbytes)) != [zlib.crc32(b"")]
    del ref


def case_a_freed_receive_lends_its_memory_to_the_next() -> None:
    """The destination's receive cache: the host memory of an object whose tensors were freed
    (the task that took it returned) receives a later object, bit-exact."""
    src, dst = Source.remote(), Destination.remote()
    seen = []
    for seed in (21, 22, 23):
        ptr, crc = ray.get(dst.where.remote(src.one.remote(seed, 8 * MiB)), timeout=300)
        assert [crc] == ray.get(src.crcs.remote(seed))
        seen.append(ptr)
    assert len(set(seen)) < len(seen), f"no receive reused freed memory: {seen}"


def case_several_dtypes_and_a_view_with_an_offset_in_one_object() -> None:
    src, dst = Source.remote(), Destination.remote()
    sizes = [4 * KiB, 1 * MiB, 8 * 3 * KiB, 0, 5]
    got = ray.get(dst.crcs.remote(src.make.remote(7, sizes)), timeout=300)
    assert got == ray.get(src.crcs.remote(7))
    assert len(got) == len(sizes) + 1


def case_into_target_buffers_set_for_the_ref() -> None:
    """The owner (here the driver) fetches into its own buffers: the tensors returned are
    those buffers, filled bit-exact."""
    from ray.experimental import set_target_for_ref

    src = Source.remote()
    ref = src.make.remote(11, [64 * MiB, 4 * KiB])
    buffers = [
        torch.empty(64 * MiB // 4, dtype=torch.float32),
        torch.empty(4 * KiB // 2, dtype=torch.bfloat16),
        torch.empty(64 * MiB - 64, dtype=torch.uint8),
    ]
    set_target_for_ref(ref, buffers)
    got = ray.get(ref, timeout=300)
    assert [t.data_ptr() for t in got] == [b.data_ptr() for b in buffers], "not into the buffers"
    assert [_crc(t) for t in got] == ray.get(src.crcs.remote(11))


def case_registrations_are_released_when_ray_frees_the_object() -> None:
    src, dst = Source.remote(), Destination.remote()
    ref = src.one.remote(3, 1 * MiB)
    ray.get(dst.crcs.remote(ref))
    assert ray.get(src.registered.remote()) == 1
    del ref
    deadline = time.monotonic() + 60
    while ray.get(src.registered.remote()) != 0:  # Ray frees the object in the background
        assert time.monotonic() < deadline, "the registration outlived the object"
        time.sleep(0.1)


def case_a_pinned_storage_outlives_its_objects() -> None:
    """register_memory keeps a storage registered after the objects made of it are freed
    (each object counts too); deregister_memory then releases it."""
    src, dst = Source.remote(), Destination.remote()
    ref = src.one.remote(4, 1 * MiB)
    ray.get(src.pin.remote(4))
    first = ray.get(dst.crcs.remote(ref))
    assert first == ray.get(src.crcs.remote(4))
    del ref
    deadline = time.monotonic() + 60
    while ray.get(src.registered.remote()) != 1 or ray.get(src.objects.remote()):
        assert time.monotonic() < deadline, "the object was never freed"
        time.sleep(0.1)
    ray.get(src.unpin.remote(4))
    assert ray.get(src.registered.remote()) == 0


def case_source_death_mid_transfer_raises_rays_transport_error() -> None:
    """Over TCP (a stopped source serves no READ): the destination's READs are in flight when
    the source dies; the dependent task raises RayDirectTransportError, and the destination's
    engine then moves the next object from a new source."""
    tcp = {"env_vars": {"RDMAXFER_TRANSPORT": "tcp"}}
    src = Source.options(runtime_env=tcp).remote()
    dst = Destination.options(runtime_env=tcp).remote()
    ray.get(dst.crcs.remote(src.one.remote(1, 4 * KiB)))  # connected, endpoint cached
    ref = src.one.remote(2, 64 * MiB)
    ray.wait([ref], timeout=120)
    pid = ray.get(src.pid.remote())
    os.kill(pid, signal.SIGSTOP)
    try:
        out = dst.crcs.remote(ref)
        deadline = time.monotonic() + 120
        while ray.get(dst.inflight.remote()) == 0:
            assert time.monotonic() < deadline, "the READs never started"
            time.sleep(0.05)
    finally:
        os.kill(pid, signal.SIGKILL)
    try:
        ray.get(out, timeout=120)
    except ray.exceptions.RayDirectTransportError as exc:
        assert "RDMAXFER transfer" in str(exc), exc
    else:
        raise AssertionError("the transfer from the dead source did not fail")
    src2 = Source.options(runtime_env=tcp).remote()
    got = ray.get(dst.crcs.remote(src2.one.remote(5, 8 * MiB)), timeout=120)
    assert got == ray.get(src2.crcs.remote(5))


@ray.remote(max_concurrency=2)
class Puller:
    """An inference actor with live weights; ``hold()`` makes its next sync stall until
    ``release()``."""

    def __init__(self, address: str, rank: int, rows: int, gc_freeze: bool = True) -> None:
        self.live = {"w": torch.zeros((rows // 2, 8), dtype=torch.float32)}
        part = np.s_[rank * rows // 2 : (rank + 1) * rows // 2]
        self.weights = rr.LiveWeights(
            address, self.live, shard={"w": part}, timeout=20, gc_freeze=gc_freeze
        )
        self.rank = rank
        self.gate = threading.Event()
        self.gate.set()

    def sync_weights(self, version: int) -> int:
        if not self.gate.wait(timeout=120):
            raise TimeoutError("never released")
        return self.weights.pull(version)

    def hold(self) -> None:
        self.gate.clear()

    def release(self) -> None:
        self.gate.set()

    def values(self) -> list[float]:
        return sorted(set(self.live["w"].reshape(-1).tolist()))

    def frozen(self) -> int:
        """Objects in the garbage collector's permanent generation (``gc.freeze``)."""
        return gc.get_freeze_count()


@ray.remote
class Publisher:
    def __init__(self, rows: int) -> None:
        self.w = np.ones((rows, 8), np.float32)
        self.server = rr.publish({"w": self.w}, timeout=5)

    def address(self) -> str:
        return rr.address_of(self.server)

    def step(self) -> int:
        self.w += 1
        return self.server.refresh()


def case_weight_sync_skips_a_stalled_actor_and_reports_a_dead_one() -> None:
    rows = 1024
    trainer = Publisher.remote(rows)
    address = ray.get(trainer.address.remote())
    actors = {
        "a": Puller.remote(address, 0, rows),
        "b": Puller.remote(address, 1, rows, gc_freeze=False),
    }
    ray.get([a.values.remote() for a in actors.values()], timeout=300)  # both up
    # LiveWeights froze what actor a's process held (torch, Ray: tens of thousands of
    # objects); b asked it not to.
    assert ray.get(actors["a"].frozen.remote()) > 10_000
    assert ray.get(actors["b"].frozen.remote()) == 0
    sync = rr.WeightSync(deadline=10)
    first = sync.sync(actors, 1)
    assert first.pulled == {"a": 1, "b": 1} and not first.stalled
    ray.get(actors["b"].hold.remote())
    assert ray.get(trainer.step.remote()) == 2
    second = sync.sync(actors, 2)
    assert second.pulled == {"a": 2} and second.stalled == ["b"]
    assert ray.get(trainer.step.remote()) == 3  # b holds no version: nothing waits for it
    third = sync.sync(actors, 3)  # b's call of version 2 still runs: not called again
    assert third.pulled == {"a": 3} and third.stalled == ["b"]
    assert ray.get(actors["a"].values.remote()) == [3.0]
    ray.get(actors["b"].release.remote())
    ray.kill(actors["a"], no_restart=True)
    deadline = time.monotonic() + 60
    while True:  # b's late call ends (it pulled version 2 or 3); from then on it is called
        fourth = sync.sync(actors, 3)
        if fourth.pulled.get("b") == 3:
            break
        assert time.monotonic() < deadline, fourth
    assert "Actor" in fourth.dead["a"], fourth  # RayActorError or a subclass
    assert ray.get(actors["b"].values.remote()) == [3.0]
    joined = {"c": Puller.remote(address, 0, rows), "b": actors["b"]}  # a third one joins
    ray.get(joined["c"].values.remote(), timeout=300)
    assert ray.get(trainer.step.remote()) == 4
    assert sync.sync(joined, 4).pulled == {"b": 4, "c": 4}


def case_a_destination_without_a_transfer_thread_is_warned_about_once() -> None:
    """Ray runs the receive step among the tasks of an actor created without
    enable_tensor_transport=True, where it can wait behind the task that needs the tensors
    until Ray's fetch timeout: the driver is told once per such actor, before any transfer."""
    from ray.experimental.rdt.util import get_tensor_transport_manager

    manager = get_tensor_transport_manager("RDMAXFER")
    plain, enabled = PlainDestination.remote(), Destination.remote()
    ray.get([plain.pid.remote(), enabled.pid.remote()], timeout=300)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for dst in (plain, plain, enabled):
            manager.get_communicator_metadata(None, dst, "RDMAXFER")
    messages = [str(w.message) for w in seen if w.category is UserWarning]
    assert len(messages) == 1, messages
    assert plain._actor_id.hex() in messages[0], messages
    assert "enable_tensor_transport=True" in messages[0], messages


ON_GPU = {"num_gpus": 0.5}  # two actors share one GPU


def case_cuda_tensors_between_two_actors_on_one_gpu() -> None:
    """GPU tensors (several dtypes, an empty one, a view with an offset; 64 MiB and 256 MiB)
    from one actor's GPU memory into new GPU tensors of another actor, bit-exact."""
    src, dst = Source.options(**ON_GPU).remote(), Destination.options(**ON_GPU).remote()
    for seed, sizes in ((31, [64 * MiB, 4 * KiB, 8 * 3 * KiB, 0, 5]), (36, [256 * MiB])):
        got = ray.get(dst.described.remote(src.make_cuda.remote(seed, sizes)), timeout=300)
        assert [crc for _, crc in got] == ray.get(src.crcs.remote(seed))
        assert {kind for kind, _ in got} == {"cuda"}, got
        assert len(got) == len(sizes) + (len(sizes) > 1)


def case_cuda_into_target_buffers_set_for_the_ref() -> None:
    """The driver fetches an actor's GPU tensors into its own GPU buffers."""
    from ray.experimental import set_target_for_ref

    src = Source.options(**ON_GPU).remote()
    ref = src.make_cuda.remote(41, [64 * MiB, 4 * KiB])
    buffers = [
        torch.empty(64 * MiB // 4, dtype=torch.float32, device="cuda"),
        torch.empty(4 * KiB // 2, dtype=torch.bfloat16, device="cuda"),
        torch.empty(64 * MiB - 64, dtype=torch.uint8, device="cuda"),
    ]
    set_target_for_ref(ref, buffers)
    got = ray.get(ref, timeout=300)
    assert [t.data_ptr() for t in got] == [b.data_ptr() for b in buffers], "not into the buffers"
    assert [_crc(t) for t in got] == ray.get(src.crcs.remote(41))


def cases() -> dict[str, Callable[[], None]]:
    """Every case by name (the sizes of the bit-exact case each a case of its own)."""
    found: dict[str, Callable[[], None]] = {}
    for nbytes in SIZES:
        found[f"new_tensor_{nbytes}"] = lambda n=nbytes: new_tensor(n)
    for name, fn in sorted(globals().items()):
        if name.startswith("case_"):
            found[name[len("case_") :]] = fn
    return found


def main(argv: list[str]) -> int:
    chosen = cases()
    gpus = torch.cuda.device_count()
    names = argv or [n for n in chosen if gpus or not n.startswith("cuda_")]
    os.environ.setdefault("RAY_worker_niceness", "0")  # inherited by the cluster ray.init starts
    ray.init(num_cpus=2, num_gpus=gpus, include_dashboard=False, log_to_driver=False)
    try:
        for name in names:
            started = time.monotonic()
            print(f"case {name}: started", file=sys.stderr, flush=True)
            faulthandler.dump_traceback_later(CASE_STACKS_AFTER_S, exit=False)
            error = ""
            try:
                chosen[name]()
            except Exception:
                error = traceback.format_exc()[-3000:]
            faulthandler.cancel_dump_traceback_later()
            seconds = round(time.monotonic() - started, 2)
            line = {"case": name, "ok": not error, "error": error, "seconds": seconds}
            print(json.dumps(line), flush=True)
    finally:
        ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
