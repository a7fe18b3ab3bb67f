"""The benchmark pages' tables come from bench/results/: every table renders from the files
there, every table marker of the docs names a table, and every table is shown somewhere."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from _common import bench_module

ROOT = Path(__file__).resolve().parents[1]

docs = bench_module("results_docs")


@pytest.mark.parametrize("name", sorted(docs.TABLES))
def test_table_renders_from_the_results(name: str) -> None:
    table = docs.TABLES[name]()
    lines = [line for line in table.splitlines() if line.startswith("|")]
    assert len(lines) >= 3, table  # a header, its alignment row and at least one row
    assert len({line.count("|") for line in lines}) == 1, table  # every row has every column


def test_markers_and_tables_match() -> None:
    pages = "\n".join(p.read_text() for p in (ROOT / "docs").rglob("*.md"))
    used = set(docs.MARKER.findall(pages))
    assert used == set(docs.TABLES)
    assert "<!-- bench-table" not in docs.render(pages)


def test_unknown_marker_is_an_error_naming_the_tables() -> None:
    with pytest.raises(KeyError, match=r"no bench table 'nope'.*tcp-vs-peers"):
        docs.render("<!-- bench-table nope -->\n")


def test_sizes_read_as_people_write_them() -> None:
    assert [docs.size_text(n) for n in (8, 65536, 1 << 20, 3 << 30, 1000)] == [
        "8 B",
        "64 KiB",
        "1 MiB",
        "3 GiB",
        "1000 B",
    ]


def test_results_are_named_by_what_they_measure() -> None:
    names = [p.name for p in (ROOT / "bench" / "results").iterdir()]
    assert names and not [n for n in names if re.search(r"issue|\.txt$", n)], names


@pytest.mark.parametrize("name", sorted(docs.PLOTS))
def test_plot_is_a_png_the_docs_show(name: str) -> None:
    assert docs.PLOTS[name]().startswith(b"\x89PNG\r\n\x1a\n")
    pages = "\n".join(p.read_text() for p in (ROOT / "docs" / "benchmarks").glob("*.md"))
    assert f"]({name}.png)" in pages
