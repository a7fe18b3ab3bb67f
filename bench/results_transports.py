"""The benchmark tables of the transports (bench/results_docs.py): each against its reference
(iperf3, memcpy, perftest, Mooncake, fi_pingpong, Python ssl), batches, rails and scaling."""

from __future__ import annotations

import re
import statistics
from typing import Any

from results_format import (
    RESULTS,
    bandwidth_table,
    load_result,
    load_text,
    md_table,
    size_text,
    times,
)


def tcp_vs_peers() -> str:
    refs = {"iperf3_GB_per_s": "iperf3", "python_GB_per_s": "Python"}
    rtt = load_result("tcp-vs-iperf3-python.json")["rtt_us"]
    return bandwidth_table("tcp-vs-iperf3-python.json", "rdmaxfer_GB_per_s", refs, ".2f") + (
        f"\n8-byte round trip (median): rdmaxfer WRITE {rtt['rdmaxfer_cpp_loop']:.1f} µs in the "
        f"C++ loop, {rtt['rdmaxfer_python_api']:.1f} µs through the Python API; plain Python "
        f"ping-pong {rtt['python']:.1f} µs.\n"
    )


def shm_vs_memcpy() -> str:
    refs = {"memcpy_GB_per_s": "memcpy", "tcp_GB_per_s": "TCP loopback"}
    return bandwidth_table("shm-vs-memcpy.json", "shm_GB_per_s", refs, ".3g")


def small_ops(transport: str) -> str:
    rows = []
    for cpus, placement in (("0-1", "two CPUs (0,1)"), ("0-0", "one CPU (0,0)")):
        d = load_result(f"small-ops-{transport}-cpus-{cpus}.json")
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
    return md_table(head, rows, right_from=1)


def _figure(row: dict[str, Any]) -> str:
    """A WRITE's figure with both processes' CPU: 8 B as latency, larger sizes as GB/s; then
    CPU % of the initiator + the target, and their CPU time per operation."""
    value = f"{row['lat_us']:.1f} µs" if row["bytes"] <= 8 else f"{row['GB_per_s']:.2f} GB/s"
    mine, theirs = row["initiator_cpu_pct"], row["target_cpu_pct"]
    per_op = (mine + theirs) / 100 * row["lat_us"]
    cpu = f"{per_op:.0f} µs" if per_op < 10_000 else f"{per_op / 1000:.0f} ms"
    return f"{value} ({mine:.0f}+{theirs:.0f} %, {cpu} CPU)"


def _speed(ours: dict[str, Any], theirs: dict[str, Any]) -> str:
    return times(theirs["lat_us"], ours["lat_us"])  # latency ratio = speed ratio at one size


def _loads(rounds: list[dict[str, Any]]) -> str:
    ones = sorted(float(run["load"].split()[0]) for r in rounds for run in r.values())
    return f"{ones[0]:.1f}-{ones[-1]:.1f}"


def vs_mooncake(cpus: int) -> str:
    """rdmaxfer's poll modes, the release before, and Mooncake TE over TCP (and iperf3)."""
    d = load_result(f"small-vs-mooncake-tcp-{cpus}cpu.json")
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
            row += [f"{rate:.2f} GB/s", times(mine, rate)] if rate else ["", ""]
        rows.append(row)
    note = (
        f"\n{d['cpus']} CPU(s), load average (1 min) {_loads(d['rounds'])} during the runs; "
        f"medians of {len(d['rounds'])} alternating rounds; in brackets CPU % of initiator + "
        "target over the timed operations, and their CPU time per operation.\n"
    )
    return md_table(head, rows, right_from=1) + note


def write_before_after() -> str:
    """The regression guard: public-API TCP WRITEs of this build against the release before."""
    d = load_result("write-before-after-tcp.json")
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
    return md_table(head, rows, right_from=1) + note


def rdma_vs_perftest() -> str:
    d = load_result("rdma-vs-perftest-rxe.json")
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
    return md_table(head, rows, right_from=4)


def rails() -> str:
    """``bench/rails_bench.sh``: one line per round and rail count, ``rdmaxfer bench`` rows."""
    gbps: dict[int, dict[int, list[float]]] = {}  # bytes -> rails -> Gb/s per round
    for line in load_result("rails-rxe.jsonl"):
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
    return md_table(head, rows, right_from=1)


def rails_throttled() -> str:
    """``bench/rails_throttle_bench.py``: two rails, one throttled, against the fast one alone."""
    d = load_result("rails-throttled-rxe.json")
    by: dict[tuple[float | None, str], list[dict[str, Any]]] = {}
    for row in d["rows"]:
        by.setdefault((row.get("fast_link_mbit"), row["throttle"]), []).append(row)
    rows = []
    for (fast_mbit, throttle), runs in by.items():
        ratios = [r["ratio"] for r in runs]
        last = runs[-1]["rails"]
        rows.append(
            [
                "as it is (CPU-bound)" if fast_mbit is None else f"capped, {fast_mbit:.0f} Mbit/s",
                throttle,
                " / ".join(f"{r['fast_rail_alone_GB_per_s'] * 1e3:.1f}" for r in runs),
                " / ".join(f"{r['two_rails_GB_per_s'] * 1e3:.1f}" for r in runs),
                " / ".join(f"{x:.2f}x" for x in ratios),
                f"{statistics.median(ratios):.2f}x",
                ", ".join(
                    f"{name} {v['rate_MB_per_s']:.1f} MB/s {v['share_pct']} %"
                    for name, v in sorted(last.items())
                ),
            ]
        )
    head = [
        "rxe0's link",
        "rxe2 throttled to",
        "rxe0 alone MB/s (rounds)",
        "both rails MB/s (rounds)",
        "ratio",
        "median",
        "last round: rate, share",
    ]
    return md_table(head, rows, right_from=2)


def batch_tcp() -> str:
    runs = load_result("batch-vs-contiguous-tcp.json")["runs"]
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
    return md_table(head, rows, right_from=1)


_BATCH_SCALE_HEAD = (
    "transport|op|entries|requests|batch GB/s|contiguous GB/s|ratio (range)|us per entry|"
    "ib_write_bw GB/s (batch vs it)|load"
).split("|")


_REGISTER_SCALE_HEAD = (
    "transport|N|views register|views deregister|arrays register|arrays deregister|"
    "core register|core deregister|batch, per entry (registered)|registrations per batch|load"
).split("|")


def batch_scale() -> str:
    """``bench/scale_bench.py``: one row per transport, op and N (the rdma file from the rxe
    guest, with ib_write_bw at the same entry size)."""
    rows = []
    for transport in ("tcp", "shm", "rdma"):
        path = RESULTS / f"batch-scale-{transport}.json"
        if not path.exists():
            continue
        for r in load_result(path.name)["rows"]:
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
                    load_text(r),
                ]
            )
    return md_table(_BATCH_SCALE_HEAD, rows, right_from=2)


def register_scale() -> str:
    """``bench/register_scale.py``: microseconds per region, one row per transport and N, then
    the largest N's figures over the smallest N's."""
    rows = []
    for transport in ("tcp", "shm", "rdma"):
        d = load_result(f"register-scale-{transport}.json")
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
                    load_text(r),
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
        if "flat_alternating" in d:
            alt = d["flat_alternating"]
            rows.append(
                [
                    transport,
                    "flat, the two N alternating",
                    f"{alt['views_register']:.2f}x",
                    f"{alt['views_deregister']:.2f}x",
                    *[""] * 7,
                ]
            )
    return md_table(_REGISTER_SCALE_HEAD, rows, right_from=1)


def batch_rxe() -> str:
    rows = []
    for r in load_result("batch-vs-ib-write-bw-rxe.jsonl"):
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
    return md_table(head, rows, right_from=1)


def batch_where_time() -> str:
    recs = load_result("batch-where-time-rxe.jsonl")
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
    return md_table(head, rows, right_from=1)


def ofi_host() -> str:
    d = load_result("ofi-vs-tcp-fi-pingpong.json")
    rows = [
        [
            size_text(r["bytes"]),
            f"{r['ofi_GB_per_s']:.3f}",
            f"{r['tcp_GB_per_s']:.3f}",
            times(r["ofi_GB_per_s"], r["tcp_GB_per_s"]),
        ]
        for r in d["sizes"]
    ]
    rtt = d["rtt_us"]
    loads = ", ".join(f"{x:.1f}" for x in d["loadavg_1min"])
    ping = rtt["fi_pingpong"]
    ref = f"; `fi_pingpong -p tcp -e rdm -S 8` {ping:.1f} µs/xfer" if ping else ""
    return md_table(["bytes", "ofi GB/s", "tcp GB/s", "ofi vs tcp"], rows, 1) + (
        f"\n8-byte WRITE round trip (median, C++ loop): ofi {rtt['ofi']:.1f} µs, tcp "
        f"{rtt['tcp']:.1f} µs{ref}. {d['provider']}, {d['rounds']} alternating rounds "
        f"(`bench/ofi_bench.py`), load average {loads}.\n"
    )


def _tcp_settings(text: str) -> str:
    """ "8 streams, 8 I/O threads" from an engine's description."""
    streams = re.search(r"(\d+) streams per connection", text)
    io = re.search(r"(\d+) I/O threads", text)
    n_streams, n_io = (m.group(1) if m else "?" for m in (streams, io))
    return f"{n_streams} streams, {n_io} I/O threads"


def tls_vs_plain() -> str:
    r = load_result("tls-vs-plain-tcp.json")
    m = r["median"]
    settings = r.get("settings", {})

    def label(what: str, key: str) -> str:
        return f"{what} ({_tcp_settings(settings[key])})" if key in settings else what

    kinds = [
        (label("rdmaxfer TCP, TLS 1.3 (AES-128-GCM)", "tls"), "tls_GB_per_s"),
        (label("rdmaxfer TCP, plain", "plain"), "plain_GB_per_s"),
        (
            label("rdmaxfer TCP, plain at TLS's settings", "plain_same_settings"),
            "plain_same_settings_GB_per_s",
        ),
        (f"Python ssl, sendall/recv_into ({r['python_ssl_cipher']})", "python_ssl_GB_per_s"),
    ]
    rows = [
        [what, f"{m[key]:.2f}", f"{m[key] / m['plain_GB_per_s']:.2f}x"]
        for what, key in kinds
        if key in m
    ]
    streams = f"{r['streams']} streams" if r["streams"] else "each engine's default settings"
    head = [f"{size_text(r['bytes'])} WRITE, {streams}, median of "
            f"{len(r['rounds'])} alternating rounds", "GB/s", "vs plain"]  # fmt: skip
    load = (r["load_average_before"][0], r["load_average_after"][0])
    return md_table(head, rows, right_from=1) + (
        f"\nTLS against Python ssl: {r['tls_vs_python_ssl']:.2f}x. One core's AES-128-GCM "
        f"(`openssl speed -evp aes-128-gcm`, 16 KiB blocks): "
        f"{r['openssl_speed_aes_128_gcm_GB_per_s_one_core']:.2f} GB/s, the bound for one "
        f"stream's encryption; {r['cpus']} CPUs shared by both ends, load average "
        f"{load[0]:.1f} at the start and {load[1]:.1f} at the end (`bench/tls_bench.py`).\n"
    )


def ofi_rails() -> str:
    d = load_result("ofi-rails-rxe.json")
    rows = [
        [
            size_text(r["bytes"]),
            f"{r['ofi_1_rails_Gbit_per_s']:.3f}",
            f"{r['ofi_2_rails_Gbit_per_s']:.3f}",
            f"{r['ofi_two_vs_one']:.2f}x",
            f"{r['rdma_1_rails_Gbit_per_s']:.3f}",
            f"{r['rdma_2_rails_Gbit_per_s']:.3f}",
            f"{r['rdma_two_vs_one']:.2f}x",
        ]
        for r in d["sizes"]
    ]
    head = ["bytes", "ofi 1 rail Gb/s", "ofi 2 rails Gb/s", "ofi 2 vs 1",
            "rdma 1 rail Gb/s", "rdma 2 rails Gb/s", "rdma 2 vs 1"]  # fmt: skip
    loads = ", ".join(f"{x:.1f}" for x in d["loadavg_1min"])
    return md_table(head, rows, 1) + (
        f"\nWRITEs, {d['depth']} in flight, medians of {d['rounds']} rounds "
        f"(`bench/ofi_rails_bench.py`), load average {loads}.\n"
    )


def ofi_guest() -> str:
    d = load_result("ofi-vs-verbs-rxe.json")
    rows = [
        [
            size_text(r["bytes"]),
            f"{r['ofi_Gbit_per_s']:.3f}",
            f"{r['rdma_Gbit_per_s']:.3f}",
            f"{r['ib_write_bw_Gbit_per_s']:.3f}",
            times(r["ofi_Gbit_per_s"], r["rdma_Gbit_per_s"]),
            times(r["ofi_Gbit_per_s"], r["ib_write_bw_Gbit_per_s"]),
        ]
        for r in d["sizes"]
    ]
    head = ["bytes", "ofi Gb/s", "rdma Gb/s", "ib_write_bw Gb/s", "ofi vs rdma",
            "ofi vs ib_write_bw"]  # fmt: skip
    rtt = d["rtt"]
    ping = rtt["fi_pingpong_usec_per_xfer"]
    ref = f'; `fi_pingpong -p "verbs;ofi_rxm"` {ping:.0f} µs/xfer' if ping else ""
    loads = ", ".join(f"{x:.1f}" for x in d["loadavg_1min"])
    return md_table(head, rows, 1) + (
        f"\nWRITEs, {d['depth']} in flight for all three, medians of {d['rounds']} rounds "
        f"(`bench/ofi_guest_bench.py`), load average {loads}. 8-byte WRITE round trip (median): "
        f"ofi {rtt['ofi_write_us']:.0f} µs, rdma {rtt['rdma_write_us']:.0f} µs{ref}.\n"
    )
