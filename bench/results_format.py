"""What the benchmark tables share (bench/results_docs.py): the result files of
``bench/results/`` and their Markdown formatting."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def load_result(name: str) -> Any:
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


def md_table(header: list[str], rows: list[list[str]], right_from: int = 0) -> str:
    """A Markdown table; columns from ``right_from`` on are right-aligned (numbers)."""
    align = ["---" if i < right_from else "---:" for i in range(len(header))]
    lines = [header, align, *rows]
    return "\n".join("| " + " | ".join(cells) + " |" for cells in lines) + "\n"


def times(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b else "n/a"


def bandwidth_table(name: str, ours: str, columns: dict[str, str], digits: str) -> str:
    """Rows of ``sizes``: GB/s of ours and of each reference (``columns``: key -> heading),
    then ours against each reference."""
    rows = []
    for r in load_result(name)["sizes"]:
        keys = [ours, *columns]
        rows.append(
            [
                size_text(r["bytes"]),
                *(f"{r[k]:{digits}}" for k in keys),
                *(times(r[ours], r[k]) for k in columns),
            ]
        )
    head = ["bytes", *(f"{h} GB/s" for h in ("rdmaxfer", *columns.values()))]
    return md_table(head + [f"vs {h}" for h in columns.values()], rows)


def load_text(row: dict[str, Any]) -> str:
    return f"{row['load']:.1f}" if "load" in row else "n/a"
