"""rdmaxfer's ofi transport over a libfabric provider (default tcp;ofi_rxm on loopback) against
rdmaxfer's own TCP transport and against libfabric's own tools, in one run.

For each size: one-sided WRITE bandwidth (done when the peer has placed the bytes; GB/s = 1e9
bytes/s, from the median latency of ``--iters`` WRITEs), ofi and tcp in alternating rounds, and
fabtests' ``fi_rma_bw -o write`` over the same provider where it is installed (its MB/sec
column, 1e6 bytes/s). Then the 8-byte WRITE round trip (median, C++ timing loop) of both, and
``fi_pingpong -e rdm -S 8`` (libfabric-bin; its "usec/xfer") where installed. Both engines live
in this process, each on ``--iface``'s domain, bootstrapped over 127.0.0.1. tcp;ofi_rxm is
libfabric's test vehicle, not the product's TCP path: there the figures show what the transport
adds on top of a provider, no target. On EFA (``--provider efa --iface <domain>``, run by
bench/efa_check.sh) the target is >= 0.9x ``fi_rma_bw``. The load average is recorded.

    python bench/ofi_bench.py [--provider P] [--iface D] [--sizes 64K,1M,16M] [--iters 20]
                              [--rounds 3] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

from rdmaxfer.tools import bench

RESULTS = Path(__file__).resolve().parent / "results"
#: The default: libfabric's tcp provider on loopback only.
TCP_PROVIDER = "tcp;ofi_rxm"
#: The out-of-band port of fi_pingpong.
PORT = 47631


def write_GB_per_s(transport: str, sizes: list[int], iters: int) -> list[float]:
    rows = bench.run_bench(transport=transport, op="write", sizes=sizes, iters=iters, warmup=2)
    return [r.bytes / (r.lat_us_p50 * 1e-6) / 1e9 for r in rows]


def round_trip_us(transport: str, iters: int) -> float:
    [r] = bench.run_bench(
        transport=transport, op="write", sizes=[8], iters=iters, warmup=100, loop="cpp"
    )
    return r.lat_us_p50


def reference_provider(provider: str) -> str:
    """The provider name libfabric's tools take: the core provider ("tcp", "verbs", "efa"); with
    ``-e rdm`` they layer ofi_rxm over it where it needs one."""
    return provider.split(";")[0]


def run_pair(
    tool: list[str], server_args: list[str], client_args: list[str], env: dict[str, str]
) -> str | None:
    """``tool`` as a server and as a client of it on 127.0.0.1; the client's output, or None
    when the tool is not installed or failed."""
    if shutil.which(tool[0]) is None:
        return None
    timeout = 120
    server = subprocess.Popen([*tool, *server_args], env=env, stdout=subprocess.DEVNULL)
    try:
        time.sleep(0.5)  # the server's listening socket; a bench, not a test
        out = subprocess.run(
            [*tool, *client_args, "127.0.0.1"], env=env, capture_output=True, text=True,
            timeout=timeout,
        )  # fmt: skip
    finally:
        try:
            server.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            server.kill()
    return out.stdout if out.returncode == 0 else None


def column(output: str | None, name: str) -> float | None:
    """The value under the header ``name`` in the first row after fabtests' header line
    ("bytes iters total time MB/sec usec/xfer Mxfers/sec")."""
    lines = (output or "").splitlines()
    for i, line in enumerate(lines):
        head = line.split()
        if name in head and i + 1 < len(lines):
            row = lines[i + 1].split()
            if len(row) == len(head):
                try:
                    return float(row[head.index(name)])
                except ValueError:
                    return None
    return None


def fi_pingpong(provider: str, iters: int, env: dict[str, str]) -> float | None:
    """fi_pingpong -e rdm -S 8 between two processes (its own out-of-band socket on PORT):
    its usec/xfer."""
    tool = ["fi_pingpong", "-p", reference_provider(provider), "-e", "rdm", "-S", "8"]
    tool += ["-I", str(iters)]
    return column(run_pair(tool, ["-B", str(PORT)], ["-P", str(PORT)], env), "usec/xfer")


def fi_rma_bw(provider: str, size: int, iters: int, env: dict[str, str]) -> float | None:
    """fabtests' fi_rma_bw -o write of ``size`` bytes between two processes: GB/s."""
    tool = ["fi_rma_bw", "-p", reference_provider(provider), "-e", "rdm", "-o", "write"]
    tool += ["-S", str(size), "-I", str(iters), "-E"]  # addresses exchanged out of band
    mb_per_s = column(run_pair(tool, [], [], env), "MB/sec")
    return mb_per_s / 1e3 if mb_per_s is not None else None


def default_json(provider: str) -> str:
    if provider == TCP_PROVIDER:
        return str(RESULTS / "ofi-vs-tcp-fi-pingpong.json")
    slug = re.sub(r"[^a-z0-9]+", "-", provider.lower()).strip("-")
    return str(RESULTS / f"ofi-{slug}-vs-fi-rma-bw.json")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--provider", default=TCP_PROVIDER, help="default: %(default)s")
    parser.add_argument("--iface", default="lo", help="the domain (NIC, or interface for tcp)")
    parser.add_argument("--sizes", default="64K,1M,16M")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--rtt-iters", type=int, default=1000)
    parser.add_argument("--ref-iters", type=int, default=200, help="fi_rma_bw -I per size")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--json", default=None,
        help="write the results here (default: bench/results/ofi-vs-tcp-fi-pingpong.json for "
        "tcp;ofi_rxm, ofi-<provider>-vs-fi-rma-bw.json otherwise; '': nowhere)",
    )  # fmt: skip
    args = parser.parse_args()
    os.environ.update({"RDMAXFER_OFI_PROVIDER": args.provider, "RDMAXFER_OFI_IFACE": args.iface})
    if reference_provider(args.provider) == "tcp":
        os.environ["FI_TCP_IFACE"] = args.iface
    tool_env = dict(os.environ)
    sizes = bench.parse_sizes(args.sizes)
    runs: dict[str, list[list[float]]] = {"ofi": [], "tcp": []}
    refs: list[list[float | None]] = []
    rtts: dict[str, list[float]] = {"ofi": [], "tcp": [], "fi_pingpong": []}
    loads = []
    for _ in range(args.rounds):
        loads.append(os.getloadavg()[0])
        for transport in ("ofi", "tcp"):
            runs[transport].append(write_GB_per_s(transport, sizes, args.iters))
            rtts[transport].append(round_trip_us(transport, args.rtt_iters))
        refs.append([fi_rma_bw(args.provider, size, args.ref_iters, tool_env) for size in sizes])
        ref = fi_pingpong(args.provider, args.rtt_iters, tool_env)
        if ref is not None:
            rtts["fi_pingpong"].append(ref)
    rows = []
    for i, size in enumerate(sizes):
        ofi = statistics.median(run[i] for run in runs["ofi"])
        tcp = statistics.median(run[i] for run in runs["tcp"])
        measured = [bw for r in refs if (bw := r[i]) is not None]
        ref_bw = statistics.median(measured) if measured else None
        rows.append(
            {"bytes": size, "ofi_GB_per_s": ofi, "tcp_GB_per_s": tcp, "fi_rma_bw_GB_per_s": ref_bw}
        )
        line = f"{size:>10} B  ofi {ofi:7.3f} GB/s  tcp {tcp:7.3f} GB/s  ofi/tcp {ofi / tcp:.2f}x"
        if ref_bw:
            line += f"  fi_rma_bw {ref_bw:7.3f} GB/s  ofi/fi_rma_bw {ofi / ref_bw:.2f}x"
        print(line)
    rtt = {k: statistics.median(v) if v else None for k, v in rtts.items()}
    print(f"8-byte round trip (median us): {rtt}")
    result: dict[str, Any] = {
        "provider": f"{args.provider} on {args.iface}",
        "rounds": args.rounds,
        "iters": args.iters,
        "sizes": rows,
        "rtt_us": rtt,
        "fi_rma_bw": shutil.which("fi_rma_bw") is not None,
        "loadavg_1min": loads,
    }
    out = default_json(args.provider) if args.json is None else args.json
    if out:
        Path(out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
