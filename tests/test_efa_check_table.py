"""bench/efa_check_table.py's rows: the ofi cases from their JUnit file (FAIL when one failed or
none ran), WRITE bandwidth per size against fi_rma_bw (PASS at >= 0.9x, FAIL below, SKIP where
fabtests is not installed), and FAIL for a step that did not run; the exit status follows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from _common import bench_module

table = bench_module("efa_check_table")

JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.rdma.ofi_cases"
 name="test_the_connection_names_the_provider_and_domains"/>
<testcase classname="tests.rdma.ofi_cases" name="test_write_and_read_bit_exact[8]"/>
<testcase classname="tests.rdma.ofi_cases" name="test_write_and_read_bit_exact[65536]">
<failure message="assert"/></testcase>
<testcase classname="tests.rdma.ofi_cases" name="test_a_batch_notifies_after_every_byte"/>
<testcase classname="tests.rdma.ofi_cases" name="test_send_and_recv"/>
<testcase classname="tests.rdma.ofi_cases" name="test_minilm_served_and_pulled_bit_exact">
<skipped message="no provider"/></testcase>
</testsuite></testsuites>"""


def bench(with_fabtests: bool) -> dict[str, Any]:
    ref = 10.0 if with_fabtests else None
    sizes = [(65536, 9.0), (1 << 20, 8.0)]
    return {
        "provider": "efa on rdmap16s27-rdm",
        "fi_rma_bw": with_fabtests,
        "sizes": [
            {"bytes": n, "ofi_GB_per_s": gbps, "tcp_GB_per_s": 1.0, "fi_rma_bw_GB_per_s": ref}
            for n, gbps in sizes
        ],
        "rtt_us": {"ofi": 18.0, "tcp": 30.0, "fi_pingpong": 16.5 if with_fabtests else None},
    }


def test_bandwidth_rows_against_fi_rma_bw() -> None:
    rows = table.bench_rows(bench(with_fabtests=True))
    assert [r[3] for r in rows] == ["PASS", "FAIL", "PASS"]  # 0.9x, 0.8x, the round trip
    assert rows[0] == (
        "WRITE 64 KiB over efa on rdmap16s27-rdm",
        "9.00 GB/s = 0.90x (10.00)",
        ">= 0.9x fi_rma_bw",
        "PASS",
    )
    assert rows[2][1] == "18.0 us, fi_pingpong 16.5 us"


def test_without_fabtests_the_bandwidth_rows_skip_and_a_missing_step_fails() -> None:
    rows = table.bench_rows(bench(with_fabtests=False))
    assert [r[3] for r in rows[:2]] == ["SKIP", "SKIP"]
    assert rows[0][1] == "9.00 GB/s (fabtests not installed)"
    assert table.bench_rows(None) == [("ofi WRITE bandwidth vs fi_rma_bw", "not run", "", "FAIL")]


def test_case_rows_and_the_exit_status(tmp_path: Path, capsys: Any) -> None:
    (tmp_path / "ofi-cases.xml").write_text(JUNIT)
    rows = table.test_rows(tmp_path / "ofi-cases.xml", table.TEST_ROWS)
    assert [r[3] for r in rows] == ["PASS", "FAIL", "PASS", "PASS", "SKIP"]
    assert rows[1][1] == "1 passed, 1 failed, 0 skipped"
    assert table.test_rows(tmp_path / "missing.xml", table.TEST_ROWS)[0][1:] == (
        "not run",
        "passes",
        "FAIL",
    )
    assert table.print_table(rows) == 1
    assert "4 of 5 checks did not fail; 1 failed" in capsys.readouterr().out
