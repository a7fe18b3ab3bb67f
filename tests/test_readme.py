"""What the README and the docs show is what runs: the README's test command is the one CI
runs (with pip quiet there), each of its Python programs is (a part of) an example that
tests/test_examples.py runs, and every ``rdmaxfer`` command line in the README and the docs
parses with the CLI's own parser (a command, option or choice that does not exist fails)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from rdmaxfer.tools.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").rglob("*.md"))
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.DOTALL | re.MULTILINE)


def _blocks(path: Path, *languages: str) -> list[str]:
    return [body for lang, body in FENCE.findall(path.read_text()) if lang in languages]


def _sh_commands(path: Path) -> list[str]:
    """Each ``rdmaxfer ...`` command of the file's shell blocks, comments cut off."""
    lines = []
    for block in _blocks(path, "sh", "console", ""):
        for line in block.splitlines():
            line = line.split(" # ")[0].strip()
            if line.startswith("rdmaxfer "):
                lines.append(line)
    return lines


def test_readme_test_command_is_the_one_ci_runs() -> None:
    setup = [b.strip() for b in _blocks(README, "sh") if b.startswith("python3 -m venv")]
    assert len(setup) == 2, setup  # the demo, then the tests
    # CI runs it with pip's -q (quiet), nothing else changed
    ci = [line.replace(" -q ", " ") for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert setup[1] in ci
    assert setup[0].endswith("&& rdmaxfer demo")


def _stripped(text: str) -> str:
    return "\n".join(line.strip() for line in text.strip().splitlines())


def test_readme_programs_are_parts_of_examples() -> None:
    examples = {p.name: _stripped(p.read_text()) for p in (ROOT / "examples").glob("*.py")}
    programs = _blocks(README, "python")
    assert programs, "the README shows no Python"
    for program in programs:
        found = [name for name, text in examples.items() if _stripped(program) in text]
        assert found, f"no file of examples/ holds the README program:\n{program}"


@pytest.mark.parametrize("path", [README, *DOCS], ids=lambda p: p.name)
def test_cli_lines_parse(path: Path) -> None:
    parser = build_parser()
    for line in _sh_commands(path):
        argv = shlex.split(line)[1:]
        try:
            parser.parse_args(argv)
        except SystemExit as exc:
            if exc.code == 0:  # --help, --version
                continue
            pytest.fail(f"{path.name}: `{line}` does not parse (exit {exc.code})")


def test_the_docs_show_cli_lines() -> None:
    assert sum(len(_sh_commands(p)) for p in DOCS) >= 10
