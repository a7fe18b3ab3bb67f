"""The one table of bench/efa_check.sh: every check of the ofi transport on an EFA machine with
its figure, its target and PASS, FAIL or SKIP, read from what the earlier steps wrote into the
results folder:

- ``ofi-cases.xml`` (tests/rdma/ofi_cases.py over the provider, JUnit): the connection names
  its provider and domains; one-sided WRITE and READ bit-exact at 8 B, 64 KiB and 4 MiB; a
  batch of WRITEs whose notification comes after every byte; SEND/RECV; the MiniLM file served
  and pulled bit-exact (the main job);
- ``ofi_bench.json`` (bench/ofi_bench.py): WRITE bandwidth per size against fabtests'
  ``fi_rma_bw -o write`` over the same provider, target >= 0.9x (SKIP where fabtests is not
  installed), and the 8-byte round trip beside ``fi_pingpong``'s.

A missing file makes its rows FAIL ("not run"). Exit status 0 only when no row failed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from check_table import Row, load_json, print_table, test_rows

#: ofi WRITE bandwidth against fi_rma_bw over the same provider, per size.
RMA_TARGET = 0.9

#: Table rows drawn from the ofi cases: (label, test module, test name prefix or "" for all).
TEST_ROWS = (
    ("the connection names its provider and domains", "ofi_cases", "test_the_connection"),
    ("WRITE and READ bit-exact, 8 B to 4 MiB", "ofi_cases", "test_write_and_read"),
    ("a batch notifies after every byte", "ofi_cases", "test_a_batch_notifies"),
    ("SEND/RECV", "ofi_cases", "test_send_and_recv"),
    ("MiniLM served and pulled bit-exact", "ofi_cases", "test_minilm"),
)


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


def bench_rows(bench: Any) -> list[Row]:
    if not bench:
        return [("ofi WRITE bandwidth vs fi_rma_bw", "not run", "", "FAIL")]
    rows: list[Row] = []
    for r in bench["sizes"]:
        ofi, ref = r["ofi_GB_per_s"], r.get("fi_rma_bw_GB_per_s")
        label = f"WRITE {_size(r['bytes'])} over {bench['provider']}"
        target = f">= {RMA_TARGET}x fi_rma_bw"
        if not ref:
            why = "fabtests not installed" if not bench.get("fi_rma_bw") else "fi_rma_bw failed"
            rows.append((label, f"{ofi:.2f} GB/s ({why})", target, "SKIP"))
            continue
        ratio = ofi / ref
        verdict = "PASS" if ratio >= RMA_TARGET else "FAIL"
        rows.append((label, f"{ofi:.2f} GB/s = {ratio:.2f}x ({ref:.2f})", target, verdict))
    rtt = bench["rtt_us"]
    ref_rtt = rtt.get("fi_pingpong")
    against = f", fi_pingpong {ref_rtt:.1f} us" if ref_rtt else ", no fi_pingpong"
    rows.append(("8-byte WRITE round trip", f"{rtt['ofi']:.1f} us{against}", "reference", "PASS"))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("results", type=Path, help="the folder efa_check.sh wrote into")
    args = parser.parse_args()
    rows = test_rows(args.results / "ofi-cases.xml", TEST_ROWS) + bench_rows(
        load_json(args.results / "ofi_bench.json")
    )
    return print_table(rows)


if __name__ == "__main__":
    sys.exit(main())
