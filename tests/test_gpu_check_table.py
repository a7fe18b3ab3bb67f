"""bench/gpu_check_table.py's rows for load_weights into GPU memory (bench/load_gpu_bench.py's
JSON): PASS at >= 0.8x the disk with the bytes intact, FAIL below or with a bad byte, SKIP
for GPUDirect Storage where libcufile does not load, FAIL when the step did not run."""

from __future__ import annotations

from typing import Any

from _common import bench_module

table = bench_module("gpu_check_table")


def result(gds: bool) -> dict[str, Any]:
    rates = {"disk": 5.0, "bounce": 4.5, "read_then_copy": 2.0, **({"gds": 3.0} if gds else {})}
    loads = [m for m in rates if m != "disk"]
    return {
        "file_bytes": 1 << 30,
        "cache": "cold",
        "gds": "available" if gds else "no GPUDirect Storage: libcufile.so.0 not found",
        "engines": {"bounce": "io_uring", **({"gds": "cufile"} if gds else {})},
        "GB_per_s": rates,
        "vs_disk": {m: rates[m] / rates["disk"] for m in loads},
        "vs_read_then_copy": {m: rates[m] / rates["read_then_copy"] for m in loads},
        "bit_exact": dict.fromkeys(loads, True),
    }


def test_rows_against_the_disk() -> None:
    rows = table.load_rows(result(gds=True))
    assert [r[3] for r in rows] == ["FAIL", "PASS", "PASS"]  # GDS at 0.6x, bounce at 0.9x
    assert rows[0][0] == "load_weights 1 GiB -> cuda:0, GPUDirect Storage (cufile)"
    assert rows[0][1] == "3.00 GB/s = 0.60x disk (5.00), 1.50x read-then-copy"
    assert rows[1][1] == "4.50 GB/s = 0.90x disk (5.00), 2.25x read-then-copy"
    assert rows[2][0].startswith("read-then-copy 1 GiB -> cuda:0 (torch.load style, cold")


def test_gds_absent_is_skipped_and_a_bad_byte_fails() -> None:
    r = result(gds=False)
    r["bit_exact"]["bounce"] = False
    rows = table.load_rows(r)
    assert rows[0][1:] == ("no GPUDirect Storage: libcufile.so.0 not found", "", "SKIP")
    assert rows[1][3] == "FAIL"
    assert table.load_rows(None) == [("load_weights -> cuda:0 vs disk", "not run", "", "FAIL")]
