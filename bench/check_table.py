"""What the one-command hardware checks (bench/gpu_check.sh, bench/efa_check.sh) share: a row
of their table, rows drawn from a pytest run's JUnit file, and the table itself."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

Row = tuple[str, str, str, str]  # check, measured, target, verdict (PASS, FAIL or SKIP)


def load_json(path: Path) -> Any:
    """The JSON in ``path``, or None when a step did not write it."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def test_rows(junit: Path, wanted: tuple[tuple[str, str, str], ...]) -> list[Row]:
    """One row per ``(label, test module, test name prefix)`` of ``wanted`` ("" matches all):
    how many of those tests passed, failed and skipped in the JUnit file ``junit``; FAIL when
    one failed or none ran, SKIP when all skipped."""
    try:
        cases = list(ET.parse(junit).getroot().iter("testcase"))
    except (OSError, ET.ParseError):
        return [(label, "not run", "passes", "FAIL") for label, _, _ in wanted]
    rows: list[Row] = []
    for label, module, prefix in wanted:
        chosen = [
            c
            for c in cases
            if module in ("", c.get("classname", "").rsplit(".", 1)[-1])
            and c.get("name", "").startswith(prefix)
        ]
        failed = sum(
            1 for c in chosen if c.find("failure") is not None or c.find("error") is not None
        )
        skipped = sum(1 for c in chosen if c.find("skipped") is not None)
        passed = len(chosen) - failed - skipped
        verdict = "FAIL" if failed or not chosen else ("SKIP" if passed == 0 else "PASS")
        rows.append(
            (label, f"{passed} passed, {failed} failed, {skipped} skipped", "passes", verdict)
        )
    return rows


def print_table(rows: list[Row]) -> int:
    """Prints ``rows`` as one table and a count; returns the exit status (1: a row failed)."""
    widths = [
        max(len(r[i]) for r in [*rows, ("check", "measured", "target", "result")]) for i in range(4)
    ]
    line = "  ".join(f"{{:<{w}}}" for w in widths)
    print(line.format("check", "measured", "target", "result"))
    print(line.format(*("-" * w for w in widths)))
    for r in rows:
        print(line.format(*r))
    failed = sum(1 for r in rows if r[3] == "FAIL")
    print(f"\n{len(rows) - failed} of {len(rows)} checks did not fail; {failed} failed")
    return 1 if failed else 0
