"""The benchmark pages' tables and plots, made from the JSON in ``bench/results/``.

An mkdocs hook (``hooks:`` in mkdocs.yml): at every build a line ``<!-- bench-table NAME -->``
in a page becomes the Markdown table ``TABLES[NAME]`` makes from the current results, and the
plots of ``PLOTS`` are drawn with matplotlib into the site as ``benchmarks/NAME.png``, so the
pages always show what the files hold. Each result file is written by the bench script named
in its table's caption (``--json``).

    python bench/results_docs.py          # prints every table (a check without mkdocs)
"""

from __future__ import annotations

import io
import json
import re
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
MARKER = re.compile(r"^<!-- bench-table ([a-z0-9-]+) -->$", re.MULTILINE)


def _load(name: str) -> Any:
    path = RESULTS / name
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return json.loads(path.read_text())


def size_text(nbytes: int) -> str:
    """``65536`` -> ``64 KiB``; sizes that are no power-of-1024 multiple stay in bytes."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift} {unit}"
    return f"{nbytes} B"


def _table(header: list[str], rows: list[list[str]], right_from: int = 0) -> str:
    """A Markdown table; columns from ``right_from`` on are right-aligned (numbers)."""
    align = ["---" if i < right_from else "---:" for i in range(len(header))]
    lines = [header, align, *rows]
    return "\n".join("| " + " | ".join(cells) + " |" for cells in lines) + "\n"


def _x(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b else "n/a"


def _bandwidth_table(name: str, ours: str, columns: dict[str, str], digits: str) -> str:
    """Rows of ``sizes``: GB/s of ours and of each reference (``columns``: key -> heading),
    then ours against each reference."""
    rows = []
    for r in _load(name)["sizes"]:
        keys = [ours, *columns]
        rows.append(
            [
                size_text(r["bytes"]),
                *(f"{r[k]:{digits}}" for k in keys),
                *(_x(r[ours], r[k]) for k in columns),
            ]
        )
    head = ["bytes", *(f"{h} GB/s" for h in ("rdmaxfer", *columns.values()))]
    return _table(head + [f"vs {h}" for h in columns.values()], rows)


def tcp_vs_peers() -> str:
    refs = {"iperf3_GB_per_s": "iperf3", "python_GB_per_s": "Python"}
    rtt = _load("tcp-vs-iperf3-python.json")["rtt_us"]
    return _bandwidth_table("tcp-vs-iperf3-python.json", "rdmaxfer_GB_per_s", refs, ".2f") + (
        f"\n8-byte round trip (median): rdmaxfer WRITE {rtt['rdmaxfer_cpp_loop']:.1f} µs in the "
        f"C++ loop, {rtt['rdmaxfer_python_api']:.1f} µs through the Python API; plain Python "
        f"ping-pong {rtt['python']:.1f} µs.\n"
    )


def shm_vs_memcpy() -> str:
    refs = {"memcpy_GB_per_s": "memcpy", "tcp_GB_per_s": "TCP loopback"}
    return _bandwidth_table("shm-vs-memcpy.json", "shm_GB_per_s", refs, ".3g")


def _small_ops(transport: str) -> str:
    rows = []
    for cpus, placement in (("0-1", "two CPUs (0,1)"), ("0-0", "one CPU (0,0)")):
        d = _load(f"small-ops-{transport}-cpus-{cpus}.json")
        after = d["rounds"]["after"]
        for i, size in enumerate(d["sizes"]):
            api, cpp, ref = (
                statistics.median(r[key][i] for r in after)
                for key in ("api_us", "cpp_us", "ref_us")
            )
            what = "ping-pong" if size <= 8 else after[0]["ref"].split(" (")[0]
            rows.append(
                [
                    placement,
                    "8 B (round trip)" if size <= 8 else size_text(size),
                    f"{api:.1f}",
                    f"{cpp:.1f}",
                    f"{ref:.1f} ({what})",
                    f"{ref / api:.2f}x",
                ]
            )
    head = ["placement", "bytes", "Python API µs", "C++ loop µs", "reference µs", "speed vs ref"]
    return _table(head, rows, right_from=1)


def rdma_vs_perftest() -> str:
    d = _load("rdma-vs-perftest-rxe.json")
    rows = [
        [
            r["metric"],
            size_text(r["bytes"]),
            r["poll"],
            r["loop"],
            f"{r['rdmaxfer']:.3f}",
            f"{r['perftest']:.3f}",
            f"{r['ratio']:.2f}",
            f"{r['ratio_min']:.2f}-{r['ratio_max']:.2f}",
        ]
        for r in d["rows"]
    ]
    head = ["figure", "bytes", "poll", "loop", "rdmaxfer", "perftest", "ratio", "per round"]
    return _table(head, rows, right_from=4)


def rails() -> str:
    """``bench/rails_bench.sh``: one line per round and rail count, ``rdmaxfer bench`` rows."""
    gbps: dict[int, dict[int, list[float]]] = {}  # bytes -> rails -> Gb/s per round
    for line in _load("rails-rxe.jsonl"):
        for row in line["results"]:
            per = gbps.setdefault(row["bytes"], {}).setdefault(line["rails"], [])
            per.append(row["bw_avg_GB_per_s"] * 8)
    rows = []
    for size, by_rails in sorted(gbps.items()):
        one, two = by_rails[1], by_rails[2]
        ratios = [b / a for a, b in zip(one, two, strict=True)]
        rows.append(
            [
                size_text(size),
                " / ".join(f"{v:.3f}" for v in one),
                " / ".join(f"{v:.3f}" for v in two),
                " / ".join(f"{v:.2f}x" for v in ratios),
                f"{statistics.mean(ratios):.2f}x",
            ]
        )
    head = ["WRITE size", "1 rail Gb/s (rounds)", "2 rails Gb/s (rounds)", "ratio", "mean ratio"]
    return _table(head, rows, right_from=1)


def _sync_medians(d: dict[str, Any]) -> tuple[float, float, int, str]:
    """Median seconds of one full pull and of 4 sharded ones, rounds, per-round ratio range."""
    if "one_s" not in d:  # medians only
        return d["median_one_s"], d["median_four_s"], d["rounds"], ""
    ratios = [b / a for a, b in zip(d["one_s"], d["four_s"], strict=True)]
    spread = f" (rounds {min(ratios):.2f}-{max(ratios):.2f})"
    return statistics.median(d["one_s"]), statistics.median(d["four_s"]), len(ratios), spread


def weight_sync() -> str:
    rows = []
    for name, where in (("tcp", "TCP loopback"), ("rdma", "verbs, rxe0 → rxe1 (soft-RoCE)")):
        one, four, rounds, spread = _sync_medians(_load(f"weight-sync-{name}.json"))
        rows.append(
            [where, str(rounds), f"{one * 1e3:.0f}", f"{four * 1e3:.0f}", _x(four, one) + spread]
        )
    head = ["transport", "rounds", "1 consumer, whole, ms", "4 sharded, slowest, ms", "ratio"]
    return _table(head, rows, right_from=1)


def batch_tcp() -> str:
    runs = _load("batch-vs-contiguous-tcp.json")["runs"]
    rows = [
        [
            r["case"],
            f"{r['entries']:,}",
            size_text(r["entry_bytes"]),
            f"{r['batch_GB_per_s']:.3f}",
            f"{r['contiguous_GB_per_s']:.3f}",
            f"{r['batch_GB_per_s'] / r['contiguous_GB_per_s']:.2f}",
        ]
        for r in runs
    ]
    head = ["case", "entries", "entry", "batch GB/s", "contiguous GB/s", "ratio"]
    return _table(head, rows, right_from=1)


_BATCH_SCALE_HEAD = (
    "transport|op|entries|requests|batch GB/s|contiguous GB/s|ratio (range)|us per entry|"
    "ib_write_bw GB/s (batch vs it)|load"
).split("|")
_REGISTER_SCALE_HEAD = (
    "transport|N|views register|views deregister|arrays register|arrays deregister|"
    "core register|core deregister|batch, per entry (registered)|registrations per batch|load"
).split("|")


def _load_text(row: dict[str, Any]) -> str:
    return f"{row['load']:.1f}" if "load" in row else "n/a"


def batch_scale() -> str:
    """``bench/scale_bench.py``: one row per transport, op and N (the rdma file from the rxe
    guest, with ib_write_bw at the same entry size)."""
    rows = []
    for transport in ("tcp", "shm", "rdma"):
        path = RESULTS / f"batch-scale-{transport}.json"
        if not path.exists():
            continue
        for r in _load(path.name)["rows"]:
            low, high = r["ratio_range"]
            perftest = r.get("ratio_vs_ib_write_bw")
            rows.append(
                [
                    transport,
                    r["op"],
                    f"{r['entries']:,}",
                    f"{r['requests']:,}",
                    f"{r['batch_GBps']:.3f}",
                    f"{r['contiguous_GBps']:.3f}",
                    f"{r['ratio']:.2f} ({low:.2f}-{high:.2f})",
                    f"{r['us_per_entry']:.2f}",
                    f"{r['ib_write_bw_GBps']:.4f} ({perftest:.2f}x)" if perftest else "",
                    _load_text(r),
                ]
            )
    return _table(_BATCH_SCALE_HEAD, rows, right_from=2)


def register_scale() -> str:
    """``bench/register_scale.py``: microseconds per region, one row per transport and N, then
    the largest N's figures over the smallest N's."""
    rows = []
    for transport in ("tcp", "shm", "rdma"):
        d = _load(f"register-scale-{transport}.json")
        for r in d["rows"]:
            batch = r["batch"]
            rows.append(
                [
                    transport,
                    f"{r['regions']:,}",
                    *(
                        f"{r[case][f'{way}_us']:.1f}"
                        for case in ("views", "arrays", "views_core")
                        for way in ("register", "deregister")
                    ),
                    f"{batch['implicit_fresh']['register_us']:.2f} "
                    f"({batch['registered']['register_us']:.2f})",
                    str(batch["registrations"]),
                    _load_text(r),
                ]
            )
        flat = d["flat"]
        rows.append(
            [
                transport,
                "flat (largest N / smallest)",
                *(
                    f"{flat[f'{case}_{way}']:.2f}x"
                    for case in ("views", "arrays")
                    for way in ("register", "deregister")
                ),
                "",
                "",
                f"{flat['batch_implicit_fresh']:.2f}x",
                "",
                "",
            ]
        )
    return _table(_REGISTER_SCALE_HEAD, rows, right_from=1)


def batch_rxe() -> str:
    rows = []
    for r in _load("batch-vs-ib-write-bw-rxe.jsonl"):
        ratios = [b / p for b, p in zip(r["batch_gbps"], r["ib_write_bw_gbps"], strict=True)]
        host = r.get("host") or f"load {r['host_load']:.1f}"
        rows.append(
            [
                host,
                str(r["rounds"]),
                f"{statistics.median(r['batch_gbps']):.3f}",
                f"{statistics.median(r['ib_write_bw_gbps']):.3f}",
                f"{r['ratio']:.2f}",
                f"{min(ratios):.2f}-{max(ratios):.2f}",
                f"{statistics.median(ratios):.2f}",
            ]
        )
    head = [
        "host",
        "rounds",
        "batch Gb/s",
        "ib_write_bw Gb/s",
        "ratio of medians",
        "per round",
        "median round",
    ]
    return _table(head, rows, right_from=1)


def batch_where_time() -> str:
    recs = _load("batch-where-time-rxe.jsonl")
    rows = []
    for mode in ("event", "busy"):
        for n in sorted({r["entries"] for r in recs}):
            mine = [r for r in recs if r["mode"] == mode and r["entries"] == n]

            def med(key: str, mine: list[dict[str, Any]] = mine) -> float:
                return statistics.median(float(r[key]) for r in mine)

            rows.append(
                [
                    mode,
                    f"{n:,}",
                    f"{med('wall_ms'):.0f}",
                    f"{med('gbps'):.3f}",
                    f"{med('user_ms'):.0f}",
                    f"{med('sys_ms'):.0f}",
                    f"{med('voluntary_switches'):.0f}",
                ]
            )
    head = ["poll", "entries", "wall ms", "Gb/s", "user CPU ms", "system CPU ms", "vol. switches"]
    return _table(head, rows, right_from=1)


def gpu_staging() -> str:
    d = _load("gpu-staging-h200.json")
    keys = ("d2h", "h2d", "wire", "staged_write", "staged_read")
    rows = [
        [size_text(r["bytes"]), *(f"{r[k + '_GB_per_s']:.1f}" for k in keys)] for r in d["sizes"]
    ]
    head = [
        "bytes",
        "pinned D2H GB/s",
        "pinned H2D GB/s",
        "TCP wire GB/s",
        "staged write GB/s",
        "staged read GB/s",
    ]
    return _table(head, rows) + f"\n{d['gpu']}, driver {d['driver']}, TCP loopback.\n"


def broadcast() -> str:
    """``bench/broadcast_bench.py --json``: one run, or a list of runs."""
    d = _load("broadcast-vs-gloo.json")
    rows = []
    for run in d if isinstance(d, list) else [d]:
        gb = run["args"]["size"] / 1e9
        ours, gloo = (run["summary"][k]["median_s"] for k in ("rdmaxfer", "gloo"))
        rows.append(
            [
                f"{run['args']['ranks']} ranks, median of {run['args']['iters']}",
                f"{ours:.3f}",
                f"{gb / ours:.2f}",
                f"{gloo:.3f}",
                f"{gb / gloo:.2f}",
                _x(gloo, ours),
            ]
        )
    head = ["run", "rdmaxfer ring s", "GB/s", "gloo broadcast s", "GB/s", "gloo time / ours"]
    return _table(head, rows, right_from=1)


def fetch() -> str:
    """``bench/fetch_bench.py --json``: one row per scenario and tool (the best round)."""
    rows = _load("fetch-vs-curl-wget-aria2c.json")["rows"]

    def ratio(row: dict[str, Any], key: str) -> str:
        return f"{row[key]:.2f}x" if key in row else ""

    table = [
        [
            r["scenario"],
            r["tool"],
            f"{r['GB_per_s']:.3f}",
            f"{r['cpu_s_per_GB']:.2f}",
            ratio(r, "x_best_reference") or ratio(r, "x_fetch_out"),
            ratio(r, "x_curl"),
            ratio(r, "x_aria2c"),
            " -> ".join(str(n) for n in r.get("connection_steps", [])),
            f"{r['range_size'] >> 20} MiB" if r.get("range_size") else "",
            ", ".join(f"{x:.3f}" for x in r.get("rounds_GB_per_s", [])),
            f"{r['load_avg_1min']:.1f}",
        ]
        for r in rows
    ]
    head = ["scenario", "tool", "GB/s", "CPU s/GB", "vs best other", "vs curl", "vs aria2c",
            "connections", "largest range", "rounds GB/s", "load"]  # fmt: skip
    return _table(head, table, right_from=2)


def _figure(row: dict[str, Any]) -> str:
    """A WRITE's figure with both processes' CPU: 8 B as latency, larger sizes as GB/s; then
    CPU % of the initiator + the target, and their CPU time per operation."""
    value = f"{row['lat_us']:.1f} µs" if row["bytes"] <= 8 else f"{row['GB_per_s']:.2f} GB/s"
    mine, theirs = row["initiator_cpu_pct"], row["target_cpu_pct"]
    per_op = (mine + theirs) / 100 * row["lat_us"]
    cpu = f"{per_op:.0f} µs" if per_op < 10_000 else f"{per_op / 1000:.0f} ms"
    return f"{value} ({mine:.0f}+{theirs:.0f} %, {cpu} CPU)"


def _speed(ours: dict[str, Any], theirs: dict[str, Any]) -> str:
    return _x(theirs["lat_us"], ours["lat_us"])  # latency ratio = speed ratio at one size


def _loads(rounds: list[dict[str, Any]]) -> str:
    ones = sorted(float(run["load"].split()[0]) for r in rounds for run in r.values())
    return f"{ones[0]:.1f}-{ones[-1]:.1f}"


def vs_mooncake(cpus: int) -> str:
    """rdmaxfer's poll modes, the release before, and Mooncake TE over TCP (and iperf3)."""
    d = _load(f"small-vs-mooncake-tcp-{cpus}cpu.json")
    summary = d["summary"]
    sides = [s for s in ("rdmaxfer before", "rdmaxfer adaptive", "rdmaxfer busy",
                         "rdmaxfer event", "mooncake") if s in summary]  # fmt: skip
    names = {"rdmaxfer before": f"release {d.get('before_label') or 'before'}",
             "mooncake": "Mooncake TE"}  # fmt: skip
    head = ["bytes", *(names.get(s, s.removeprefix("rdmaxfer ")) for s in sides)]
    pairs = [("rdmaxfer adaptive", "mooncake"), ("rdmaxfer busy", "mooncake"),
             ("rdmaxfer adaptive", "rdmaxfer before")]  # fmt: skip
    pairs = [(a, b) for a, b in pairs if a in summary and b in summary]
    head += [f"{a.removeprefix('rdmaxfer ')} vs {names[b]}" for a, b in pairs]
    iperf3 = d.get("iperf3", {})
    if iperf3:
        head += ["iperf3", "adaptive vs iperf3"]
    rows = []
    for i, size in enumerate(d["sizes"]):
        row = [size_text(size), *(_figure(summary[s][i]) for s in sides)]
        row += [_speed(summary[a][i], summary[b][i]) for a, b in pairs]
        if iperf3:
            rate = iperf3.get(str(size))
            mine = summary["rdmaxfer adaptive"][i]["GB_per_s"]
            row += [f"{rate:.2f} GB/s", _x(mine, rate)] if rate else ["", ""]
        rows.append(row)
    note = (
        f"\n{d['cpus']} CPU(s), load average (1 min) {_loads(d['rounds'])} during the runs; "
        f"medians of {len(d['rounds'])} alternating rounds; in brackets CPU % of initiator + "
        "target over the timed operations, and their CPU time per operation.\n"
    )
    return _table(head, rows, right_from=1) + note


def write_before_after() -> str:
    """The regression guard: public-API TCP WRITEs of this build against the release before."""
    d = _load("write-before-after-tcp.json")
    before, after = d["rounds"]["before"], d["rounds"]["after"]
    rows = []
    for i, size in enumerate(d["sizes"]):

        def med(runs: list[dict[str, Any]], key: str, i: int = i) -> float:
            return statistics.median(r[key][i] for r in runs)

        def cpu(runs: list[dict[str, Any]]) -> str:
            return f"{med(runs, 'initiator_cpu_pct'):.0f}+{med(runs, 'target_cpu_pct'):.0f}"

        speed = statistics.median(
            b["lat_us"][i] / a["lat_us"][i] for b, a in zip(before, after, strict=True)
        )
        rows.append(
            [
                size_text(size),
                f"{med(before, 'lat_us'):.1f}",
                f"{med(after, 'lat_us'):.1f}",
                f"{med(before, 'GB_per_s'):.2f}",
                f"{med(after, 'GB_per_s'):.2f}",
                f"{speed:.2f}x",
                cpu(before),
                cpu(after),
            ]
        )
    head = ["bytes", "release µs", "this build µs", "release GB/s", "this build GB/s",
            "speed vs release", "CPU % release", "CPU % this build"]  # fmt: skip
    loads = sorted(float(r["load"].split()[0]) for r in before + after)
    note = (
        f"\nRelease: {d['before']}; load average (1 min) {loads[0]:.1f}-{loads[-1]:.1f}; "
        f"medians of {len(after)} alternating rounds; CPU % = initiator + target.\n"
    )
    return _table(head, rows, right_from=1) + note


def load() -> str:
    """``bench/load_bench.py --json``: medians from a cold page cache, one row per method."""
    r = _load("load-vs-fio-safetensors.json")
    names = {
        "rdmaxfer": f"rdmaxfer load_weights ({r['io']}, {r['engine']})",
        "fio": "fio --direct=1 --bs=1M --iodepth=16 --ioengine=io_uring",
        "safetensors": "safetensors.numpy.load_file (mmap + copy)",
    }
    best = {m: r["file_bytes"] / min(s) / 1e9 for m, s in r["seconds"].items()}
    rows = [
        [names[m], f"{gbps:.2f}", f"{best[m]:.2f}", _x(r["GB_per_s"]["rdmaxfer"], gbps)]
        for m, gbps in r["GB_per_s"].items()
    ]
    head = [f"{size_text(r['file_bytes'])} file, {r['rounds']} rounds", "median GB/s", "best GB/s"]
    load = (
        f" (load average {r['load_average']:.1f} on {r['cpus']} CPUs)"
        if "load_average" in r
        else ""
    )
    spread = ""
    if "per_round" in r:
        loads = sorted(r["round_loads"])
        ratios = "; ".join(
            f"against {ref} {statistics.median(x):.2f}x (rounds {min(x):.2f}-{max(x):.2f}x)"
            for ref, x in r["per_round"].items()
        )
        spread = (
            f" rdmaxfer's ratio within each round, median and range: {ratios}; load average "
            f"{loads[0]:.1f}-{loads[-1]:.1f} over the rounds, on {r['cpus']} CPUs."
        )
        load = ""
    return (
        _table([*head, "rdmaxfer vs"], rows, right_from=1)
        + f"\nMeasured on {r['machine']}{load}.{spread}\n"
    )


def serve_cold() -> str:
    """``bench/serve_cold_bench.py --json``: server start + first pull, cold vs warm cache."""
    r = _load("serve-cold-vs-warm.json")
    rows = [
        [f"{cache} page cache", f"{statistics.median(r['seconds'][cache]):.3f}", f"{gbps:.3f}"]
        for cache, gbps in r["GB_per_s"].items()
    ]
    head = [f"{r['file']} ({r['file_bytes'] / 1e6:.1f} MB), median of {r['rounds']}", "s", "GB/s"]
    return _table(head, rows, right_from=1) + (f"\nCold against warm: {r['cold_vs_warm']:.2f}x.\n")


TABLES: dict[str, Callable[[], str]] = {
    "tcp-vs-peers": tcp_vs_peers,
    "shm-vs-memcpy": shm_vs_memcpy,
    "small-ops-tcp": lambda: _small_ops("tcp"),
    "small-ops-shm": lambda: _small_ops("shm"),
    "vs-mooncake-2cpu": lambda: vs_mooncake(2),
    "vs-mooncake-1cpu": lambda: vs_mooncake(1),
    "write-before-after-tcp": write_before_after,
    "rdma-vs-perftest": rdma_vs_perftest,
    "rails": rails,
    "weight-sync": weight_sync,
    "batch-tcp": batch_tcp,
    "batch-scale": batch_scale,
    "register-scale": register_scale,
    "batch-rxe": batch_rxe,
    "batch-where-time": batch_where_time,
    "gpu-staging": gpu_staging,
    "broadcast": broadcast,
    "fetch": fetch,
    "load": load,
    "serve-cold": serve_cold,
}


def _bandwidth_plot(title: str, sizes: list[int], lines: dict[str, list[float]]) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    for label, values in lines.items():
        ax.plot(sizes, values, marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [size_text(s) for s in sizes])
    ax.set_xlabel("bytes per transfer")
    ax.set_ylabel("GB/s (1e9 bytes per second)")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    out = io.BytesIO()
    fig.savefig(out, format="png", metadata={"Software": None})
    plt.close(fig)
    return out.getvalue()


def tcp_plot() -> bytes:
    rows = _load("tcp-vs-iperf3-python.json")["sizes"]
    return _bandwidth_plot(
        "TCP loopback: one-sided WRITE vs iperf3 and plain Python sockets",
        [r["bytes"] for r in rows],
        {
            "rdmaxfer": [r["rdmaxfer_GB_per_s"] for r in rows],
            "iperf3 (one stream)": [r["iperf3_GB_per_s"] for r in rows],
            "Python sendall/recv_into": [r["python_GB_per_s"] for r in rows],
        },
    )


def shm_plot() -> bytes:
    rows = _load("shm-vs-memcpy.json")["sizes"]
    return _bandwidth_plot(
        "Same host: shm WRITE vs memcpy and TCP loopback",
        [r["bytes"] for r in rows],
        {
            "rdmaxfer shm": [r["shm_GB_per_s"] for r in rows],
            "rdmaxfer TCP loopback": [r["tcp_GB_per_s"] for r in rows],
            "memcpy (numpy.copyto)": [r["memcpy_GB_per_s"] for r in rows],
        },
    )


PLOTS: dict[str, Callable[[], bytes]] = {"tcp": tcp_plot, "shm": shm_plot}


def render(markdown: str) -> str:
    """``markdown`` with every ``<!-- bench-table NAME -->`` line replaced by its table.

    Raises:
        KeyError: a marker names no table (the message lists the names).
    """

    def table(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in TABLES:
            raise KeyError(f"no bench table {name!r}; the tables are {sorted(TABLES)}")
        return TABLES[name]()

    return MARKER.sub(table, markdown)


# mkdocs hooks (https://www.mkdocs.org/user-guide/configuration/#hooks)


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    for name, plot in PLOTS.items():
        files.append(File.generated(config, f"benchmarks/{name}.png", content=plot()))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    return render(markdown)


if __name__ == "__main__":
    for name, make in TABLES.items():
        sys.stdout.write(f"## {name}\n\n{make()}\n")
