"""rdmaxfer bench: queue depth, duration mode, the rdma set-up from the environment, the
reference run (iperf3) with ratios, and the plot."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rdmaxfer.errors import InvalidArgumentError
from rdmaxfer.tools import bench

needs_iperf3 = pytest.mark.skipif(shutil.which("iperf3") is None, reason="iperf3 not installed")


@pytest.mark.parametrize("op", bench.OPS)
def test_queue_depth(op: str) -> None:
    rows = bench.run_bench(transport="tcp", op=op, sizes=[3, 70000], iters=12, warmup=2, qd=4)
    assert [r.bytes for r in rows] == [3, 70000]
    for r in rows:
        assert r.iters == 12 and r.qd == 4 and r.seconds > 0
        assert r.bw_peak_GB_per_s >= r.bw_avg_GB_per_s > 0
        assert r.lat_us_min <= r.lat_us_p50 <= r.lat_us_p99
        # 12 operations of r.bytes in r.seconds
        assert r.bw_avg_GB_per_s == pytest.approx(r.bytes * 12 / r.seconds / 1e9)


def test_duration_mode() -> None:
    rows = bench.run_bench(transport="tcp", op="write", sizes=[4096], duration=0.3, qd=2)
    (r,) = rows
    assert r.seconds >= 0.3 and r.iters > 8
    assert r.msg_rate_mpps == pytest.approx(r.iters / r.seconds / 1e6)


def test_bad_arguments() -> None:
    with pytest.raises(InvalidArgumentError, match="qd=0"):
        bench.run_bench(sizes=[8], qd=0)
    with pytest.raises(InvalidArgumentError, match="duration=-1"):
        bench.run_bench(sizes=[8], duration=-1)


def test_rdma_setup_from_the_rxe_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RDMAXFER_RXE_DEVICES", "rxe0 rxe1")
    monkeypatch.setenv("RDMAXFER_RXE_ADDRS", "10.77.0.1 10.77.0.2")
    assert bench.RdmaSetup.resolve() == bench.RdmaSetup("rxe0", "rxe1", "10.77.0.2")
    # one device talking to itself: the bootstrap stays on loopback
    assert bench.RdmaSetup.resolve("rxe0", "rxe0") == bench.RdmaSetup("rxe0", "rxe0", "127.0.0.1")
    monkeypatch.delenv("RDMAXFER_RXE_DEVICES")
    monkeypatch.delenv("RDMAXFER_RXE_ADDRS")
    assert bench.RdmaSetup.resolve() == bench.RdmaSetup(None, None, "127.0.0.1")
    assert bench.RdmaSetup.resolve("mlx5_0", "mlx5_1", "192.0.2.2").bind == "192.0.2.2"


def test_rdma_setup_with_two_rails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RDMAXFER_RXE_DEVICES", "rxe0 rxe1")
    monkeypatch.setenv("RDMAXFER_RXE_ADDRS", "10.77.0.1 10.77.0.2")
    monkeypatch.setenv("RDMAXFER_RXE_RAIL_DEVICES", "rxe0,rxe2 rxe1,rxe3")
    assert bench.RdmaSetup.resolve(rails=2) == bench.RdmaSetup(
        "rxe0,rxe2", "rxe1,rxe3", "10.77.0.2"
    )
    assert bench.RdmaSetup.resolve(rails=1) == bench.RdmaSetup("rxe0", "rxe1", "10.77.0.2")
    monkeypatch.delenv("RDMAXFER_RXE_RAIL_DEVICES")
    with pytest.raises(InvalidArgumentError, match=r"--rails 2: RDMAXFER_RXE_RAIL_DEVICES"):
        bench.RdmaSetup.resolve(rails=2)


def test_reference_fields_and_table() -> None:
    (r,) = bench.run_bench(transport="tcp", op="write", sizes=[65536], iters=3)
    assert "ref_tool" not in r.as_dict()
    r.attach_reference({"tool": "iperf3", "bw_GB_per_s": r.bw_avg_GB_per_s / 2, "lat_us": None})
    d = r.as_dict()
    assert d["ref_tool"] == "iperf3" and d["bw_ratio"] == pytest.approx(2.0)
    assert d["lat_ratio"] is None
    table = bench.format_reference_table([r])
    assert "iperf3" in table and "2.00" in table


@needs_iperf3
def test_iperf3_reference() -> None:
    from rdmaxfer.tools.bench_reference import iperf3_reference

    ref = iperf3_reference([4096, 1 << 20], iters=4)
    for size in (4096, 1 << 20):
        assert ref[size]["error"] is None, ref[size]
        assert ref[size]["tool"] == "iperf3" and ref[size]["bw_GB_per_s"] > 0


def test_plot(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from rdmaxfer.tools.bench_plot import plot_results

    rows = [r.as_dict() for r in bench.run_bench(sizes=[64, 4096, 65536], iters=3)]
    for i, row in enumerate(rows):
        row.update(ref_tool="iperf3", ref_bw_GB_per_s=0.1 * (i + 1), ref_lat_us=None)
    out = tmp_path / "bench.png"
    plot_results(rows, out, title="test")
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000


@needs_iperf3
def test_cli_reference_and_plot(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    png = tmp_path / "b.png"
    cmd = [sys.executable, "-m", "rdmaxfer", "bench", "--transport", "tcp", "--size", "4K,256K"]
    cmd += ["--duration", "0.2", "--qd", "2", "--reference", "--plot", str(png)]
    out = subprocess.run([*cmd, "--json"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in out.stdout.splitlines()]  # JSON Lines
    assert [r["bytes"] for r in rows] == [4096, 262144]
    for r in rows:
        assert r["qd"] == 2 and r["ref_tool"] == "iperf3" and r["ref_bw_GB_per_s"] > 0
        assert r["bw_ratio"] == pytest.approx(r["bw_avg_GB_per_s"] / r["ref_bw_GB_per_s"])
    assert png.read_bytes()[:4] == b"\x89PNG"
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "#bytes" in out.stdout and "BW ratio" in out.stdout and "iperf3" in out.stdout


def test_stats_count_each_size_and_print_after_the_table() -> None:
    rows = bench.run_bench(op="send", sizes=[100, 70000], iters=3, warmup=2, stats=True)
    for r in rows:
        assert r.stats is not None
        assert (r.stats["send.ops"], r.stats["send.bytes"]) == (5, 5 * r.bytes)
        assert r.stats["errors.send"] == 0
        assert r.as_dict()["stats"] == r.stats
    assert "stats" not in bench.run_bench(sizes=[64], iters=1)[0].as_dict()
    out = subprocess.run(
        [sys.executable, "-m", "rdmaxfer", "bench", "--size", "4K", "--iters", "2", "--stats"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    table = out.split("# counters of this side's endpoint per size", 1)[1].splitlines()
    assert table[1].split() == ["#counter", "4096"]
    assert ["write.bytes", str(4 * 4096)] in [line.split() for line in table]
