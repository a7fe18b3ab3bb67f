"""Code that the ranks of tests/test_distributed.py run, each in its own process (spawned:
this module must not import pytest or conftest).

A rank is ``target(ctx)`` where ``ctx`` is a :class:`RankCtx`; what it returns (or raises,
with the seconds it took) is put on the results queue as a :class:`RankResult`.
"""

from __future__ import annotations

import datetime
import hashlib
import os
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

import ml_dtypes
import numpy as np


@dataclass
class RankCtx:
    rank: int
    world: int
    store: dict[str, Any]  # {"kind": "tcp", "port": P} or {"kind": "file", "path": F}
    args: dict[str, Any] = field(default_factory=dict)
    events: Any = None  # a multiprocessing Queue to tell the test about progress

    def make_store(self) -> Any:
        import torch.distributed as dist

        timeout = datetime.timedelta(seconds=30)
        if self.store["kind"] == "tcp":
            return dist.TCPStore(
                "127.0.0.1", self.store["port"], self.world, False, timeout=timeout
            )
        return dist.FileStore(self.store["path"], self.world)

    def group(self, **kwargs: Any) -> Any:
        import rdmaxfer.distributed as rd

        kwargs.setdefault("timeout", 30)
        kwargs.setdefault("transport", "tcp")
        return rd.init(self.make_store(), self.rank, self.world, **kwargs)

    def tell(self, what: str) -> None:
        if self.events is not None:
            self.events.put((self.rank, what, time.monotonic()))


@dataclass
class RankResult:
    rank: int
    ok: bool
    value: Any = None
    error_type: str = ""
    error: str = ""
    elapsed_s: float = 0.0


def rank_main(target: Any, ctx: RankCtx, results: Any) -> None:
    start = time.monotonic()
    try:
        value = target(ctx)
        results.put(RankResult(ctx.rank, True, value, elapsed_s=time.monotonic() - start))
    except BaseException as exc:
        results.put(
            RankResult(
                ctx.rank,
                False,
                error_type=type(exc).__name__,
                error=f"{exc}\n{traceback.format_exc()}",
                elapsed_s=time.monotonic() - start,
            )
        )


# -- data -----------------------------------------------------------------------------------------
def random_bytes(seed: int, nbytes: int) -> np.ndarray:
    return np.frombuffer(np.random.default_rng(seed).bytes(nbytes), dtype=np.uint8).copy()


def ints_as_float32(seed: int, n: int) -> np.ndarray:
    """Whole numbers as float32: sums of them are exact."""
    return np.random.default_rng(seed).integers(-1000, 1000, n).astype(np.float32)


def sha(arr: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(arr).reshape(-1).view(np.uint8)).hexdigest()


def weights(seed: int) -> dict[str, np.ndarray]:
    """A dict of several dtypes and sizes: tiny tensors (packed together into one piece), a
    0-d and an empty one, and big ones that span several pieces."""

    def raw(n: int, dtype: Any, shape: tuple[int, ...]) -> np.ndarray:
        dt = np.dtype(dtype)
        return random_bytes(seed + n, int(np.prod(shape)) * dt.itemsize).view(dt).reshape(shape)

    return {
        "embed.weight": raw(1, np.float32, (1000, 384)),
        "embed.bias": raw(2, np.float32, (384,)),
        "ln.weight": raw(3, ml_dtypes.bfloat16, (384,)),
        "ln.bias": raw(4, np.float16, (384,)),
        "step": raw(5, np.int64, ()),
        "empty": raw(6, np.float64, (0, 4)),
        "mask": (raw(7, np.uint8, (77,)) & 1).astype(np.bool_),
        "fp8": raw(8, ml_dtypes.float8_e4m3fn, (33, 7)),
        "layer.0.w": raw(9, ml_dtypes.bfloat16, (1536, 384)),
        "layer.0.ids": raw(10, np.int32, (5, 3, 2)),
        "tail": raw(11, np.complex64, (999,)),
    }


def fingerprint(d: dict[str, np.ndarray]) -> list[tuple[str, str, tuple[int, ...], str]]:
    return [(k, str(v.dtype), tuple(v.shape), sha(v)) for k, v in d.items()]


# -- rank programs ------------------------------------------------------------------------------
def broadcast_array(ctx: RankCtx) -> dict[str, Any]:
    a = ctx.args
    with ctx.group() as group:
        ranks = a.get("ranks")
        if ranks is not None and ctx.rank not in ranks:
            group.barrier()
            return {"skipped": True}
        data = random_bytes(a["seed"], a["nbytes"]).view(a.get("dtype", "uint8"))
        got = group.broadcast(
            data if ctx.rank == a["src"] else None,
            src=a["src"],
            ranks=ranks,
            chunk_bytes=a["chunk"],
        )
        group.barrier()
        return {"sha": sha(got), "dtype": str(got.dtype), "shape": got.shape, "skipped": False}


def broadcast_weights(ctx: RankCtx) -> dict[str, Any]:
    a = ctx.args
    with ctx.group() as group:
        w = weights(a["seed"])
        if ctx.rank == a["src"]:
            obj: Any = w
        elif ctx.rank in a.get("in_place", ()):
            obj = {k: np.zeros_like(v) for k, v in w.items()}
        else:
            obj = None
        got = group.broadcast(obj, src=a["src"], chunk_bytes=a["chunk"])
        in_place = obj is not None and all(got[k] is obj[k] for k in obj)
        group.barrier()
        aligned = all(v.ctypes.data % 64 == 0 for v in got.values() if v.nbytes)
        return {
            "fp": fingerprint(got),
            "order": list(got),
            "in_place": in_place,
            "aligned": aligned,
        }


def all_pairs(ctx: RankCtx) -> list[tuple[int, int, str]]:
    """Every ordered pair (i, j) exchanges one array; returns (src, dst, sha) received here."""
    seen = []
    with ctx.group() as group:
        for i in range(ctx.world):
            for j in range(ctx.world):
                if i == j:
                    continue
                nbytes = 1000 + 70_001 * (i * ctx.world + j)  # eager and rendezvous sizes
                if ctx.rank == i:
                    group.send(random_bytes(100 * i + j, nbytes), j)
                elif ctx.rank == j:
                    out = np.empty(nbytes, np.uint8) if (i + j) % 2 else None
                    got = group.recv(i, out)
                    assert out is None or got is out or np.shares_memory(got, out)
                    seen.append((i, j, sha(got)))
        group.barrier()
    return seen


def mismatched_recv(ctx: RankCtx) -> str:
    """Rank 1 receives with an out of the wrong shape: it gets InvalidArgumentError, rank 0 a
    ProtocolError; the connection stays usable for the next message."""
    import rdmaxfer

    with ctx.group() as group:
        if ctx.rank == 0:
            try:
                group.send(np.arange(100_000, dtype=np.float32), 1)
            except rdmaxfer.ProtocolError as exc:
                first = f"ProtocolError: {exc}"
            else:
                first = "no error"
            group.send(np.arange(10, dtype=np.int16), 1)
            return first
        try:
            group.recv(0, np.empty(99_999, np.float32))
        except rdmaxfer.InvalidArgumentError as exc:
            first = f"InvalidArgumentError: {exc}"
        else:
            first = "no error"
        second = group.recv(0)
        assert second.tolist() == list(range(10)) and second.dtype == np.int16
        return first


def default_group(ctx: RankCtx) -> dict[str, Any]:
    """torch.distributed.init_process_group('gloo') first, then rd.init() with no store."""
    import torch
    import torch.distributed as dist

    import rdmaxfer.distributed as rd

    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{ctx.store['port']}",
        rank=ctx.rank,
        world_size=ctx.world,
        timeout=datetime.timedelta(seconds=30),
    )
    try:
        with rd.init(transport="tcp", timeout=30) as group:
            data = ints_as_float32(ctx.args["seed"], 750_000)
            got = group.broadcast(data if ctx.rank == 0 else None, src=0)
            group.barrier()
            # And gloo still works beside it, on the same bytes.
            t = torch.from_numpy(got.copy())
            dist.all_reduce(t)
            return {
                "rank": group.rank,
                "world": group.world_size,
                "sha": sha(got),
                "sum_sha": sha(t.numpy()),
            }
    finally:
        dist.destroy_process_group()


def failing_rank(ctx: RankCtx) -> tuple[str, float]:
    """Ranks 0 and 1 broadcast; rank ``victim`` misbehaves as ``mode`` says:

    * ``"exit"``: it dies (os._exit) right after init, before any connection;
    * ``"kill"``/``"stop"``: it takes part, tells the test, stops receiving, and the test
      SIGKILLs / SIGSTOPs it.

    Returns (what ranks 0 and 1 caught, seconds from the start of the broadcast).
    """
    a = ctx.args
    group = ctx.group(timeout=a["timeout"])
    if ctx.rank == a["victim"]:
        if a["mode"] == "exit":
            os._exit(0)
        ctx.tell("victim ready")
        time.sleep(600)  # the test kills or stops it: it never posts a receive
        os._exit(1)
    data = random_bytes(1, a["nbytes"])
    ctx.tell("broadcast")
    start = time.monotonic()
    try:
        group.broadcast(data if ctx.rank == 0 else None, src=0, chunk_bytes=1 << 20)
        # The source may finish (rank 1 took every piece): the next collective reports it.
        group.barrier()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}", time.monotonic() - start
    finally:
        group.close()
    return "no error", time.monotonic() - start


# -- GPU memory (issue 16 item 5) ---------------------------------------------------------------
class DlpackOnly:
    """A CUDA array exported by DLPack alone (kDLCUDA), as a library other than CuPy/torch
    would hand it over."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._inner.__dlpack_device__()  # type: ignore[no-any-return]

    def __dlpack__(self, **kwargs: Any) -> Any:
        return self._inner.__dlpack__(**kwargs)


def to_device(arr: np.ndarray) -> Any:
    from rdmaxfer import Buffer, cuda

    buf = Buffer.empty(arr.shape, arr.dtype, device="cuda:0")
    cuda.copy_from_host(buf.device_array(), np.ascontiguousarray(arr))
    return buf


def host_of(x: Any) -> np.ndarray:
    """A received array's bytes in host memory (a device Buffer, a CuPy array or an ndarray)."""
    if hasattr(x, "copy_to_host"):
        return np.asarray(x.copy_to_host())
    if hasattr(x, "get"):
        return np.asarray(x.get())
    return np.asarray(x)


def device_of(x: Any) -> str:
    """Where a received array lives: "cpu" or "cuda:N" (``device=`` gives a device Buffer, or a
    CuPy array when CuPy is installed)."""
    device = getattr(x, "device", "cpu")
    if isinstance(device, str):
        return device
    return f"cuda:{device.id}" if hasattr(device, "id") else str(device)


def gpu_exchange(ctx: RankCtx) -> dict[str, Any]:
    """Device memory through send/recv and broadcast, over the four ranks: rank 0 sends a
    device Buffer to rank 1, which receives it on the GPU and sends it back as a DLPack-only
    object into a device ``out`` of rank 0. Then rank 0 broadcasts a device array and a dict
    mixing device and host arrays; rank 1 allocates on the GPU (``device=``), rank 2 fills
    device arrays in place, rank 3 receives into host memory."""
    from rdmaxfer import Buffer

    a = ctx.args
    out: dict[str, Any] = {}
    with ctx.group() as group:
        data = random_bytes(a["seed"], a["nbytes"]).view(np.float32).reshape(-1, 4)
        if ctx.rank == 0:
            group.send(to_device(data), 1)
            back = Buffer.empty(data.shape, data.dtype, device="cuda:0")
            got = group.recv(1, back)
            assert got is back
            out["p2p"] = sha(back.copy_to_host())
        elif ctx.rank == 1:
            got = group.recv(0, device="cuda:0")
            assert device_of(got) == "cuda:0"
            out["p2p"] = sha(host_of(got))
            group.send(DlpackOnly(got), 0)
        device = "cuda:0" if ctx.rank == 1 else None
        if ctx.rank == 0:
            arr: Any = to_device(data)
        elif ctx.rank == 2:
            arr = Buffer.empty(data.shape, data.dtype, device="cuda:0")
        else:
            arr = None
        got = group.broadcast(arr, src=0, chunk_bytes=a["chunk"], device=device)
        assert arr is None or got is arr
        out["array"] = (sha(host_of(got)), device_of(got))
        w = weights(a["seed"])
        if ctx.rank == 0:
            obj: Any = {k: to_device(v) if i % 2 == 0 else v for i, (k, v) in enumerate(w.items())}
        elif ctx.rank == 2:
            obj = {k: Buffer.empty(v.shape, v.dtype, device="cuda:0") for k, v in w.items()}
        else:
            obj = None
        got_w = group.broadcast(obj, src=0, chunk_bytes=a["chunk"], device=device)
        out["weights"] = [
            (k, str(v.dtype), tuple(v.shape), sha(host_of(v))) for k, v in got_w.items()
        ]
        out["weights_devices"] = sorted({device_of(v) for v in got_w.values()})
        group.barrier()
    return out


def framework_exchange(ctx: RankCtx) -> dict[str, Any]:
    """CuPy arrays or torch CUDA tensors (``library``) through send/recv and a dict
    broadcast: rank 0 sends to rank 1, which receives into a tensor of its own (``out=``);
    rank 0 broadcasts, rank 1 fills tensors in place, rank 2 allocates (``device=``)."""
    a = ctx.args
    w = {"a": random_bytes(a["seed"], 4 << 20).view(np.float32), "b": random_bytes(7, 999)}

    if a["library"] == "cupy":
        import cupy

        def put(x: np.ndarray) -> Any:
            return cupy.asarray(x)

        def empty_like(x: np.ndarray) -> Any:
            return cupy.empty(x.shape, x.dtype)
    else:
        import torch

        def put(x: np.ndarray) -> Any:
            return torch.from_numpy(x.copy()).cuda()

        def empty_like(x: np.ndarray) -> Any:
            return torch.from_numpy(np.empty_like(x)).cuda()

    def host(x: Any) -> np.ndarray:
        if hasattr(x, "cpu"):
            return np.asarray(x.cpu().numpy())
        return host_of(x)

    out: dict[str, Any] = {}
    with ctx.group() as group:
        if ctx.rank == 0:
            group.send(put(w["a"]), 1)
        elif ctx.rank == 1:
            into = empty_like(w["a"])
            group.recv(0, into)
            out["p2p"] = sha(host(into))
        if ctx.rank == 0:
            obj: Any = {k: put(v) for k, v in w.items()}
        elif ctx.rank == 1:
            obj = {k: empty_like(v) for k, v in w.items()}
        else:
            obj = None
        got = group.broadcast(obj, src=0, chunk_bytes=1 << 20, device="cuda:0")
        out["weights"] = {k: sha(host(v)) for k, v in got.items()}
        group.barrier()
    return out
