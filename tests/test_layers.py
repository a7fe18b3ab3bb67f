"""The Python package falls into layers with no import cycle (issue 12, item 4).

The import graph is read from the source (``ast``): every ``import`` counts, at module level,
inside functions and under ``if TYPE_CHECKING:`` alike, since each is a dependency of the
importing module. A module may import its own layer or a lower one, never a higher one, and
no set of modules may import each other in a circle.
"""

from __future__ import annotations

import ast
import textwrap
from collections.abc import Iterable, Sequence
from pathlib import Path

import pytest

PACKAGE_DIR = Path(__file__).resolve().parent.parent / "python" / "rdmaxfer"

#: The floors of ``rdmaxfer``, lowest first; a module belongs to the floor of the longest
#: prefix that names it. See docs/internals.md.
LAYERS: tuple[tuple[str, ...], ...] = (
    (
        "rdmaxfer._core",
        "rdmaxfer.errors",
        "rdmaxfer.options",
        "rdmaxfer._option",
        "rdmaxfer._test_hooks",
        "rdmaxfer._config",
        "rdmaxfer._transports",
        "rdmaxfer._warn",
    ),
    ("rdmaxfer.memory",),
    ("rdmaxfer.gpu",),
    ("rdmaxfer.transport",),
    ("rdmaxfer.metrics",),
    ("rdmaxfer.weights",),
    ("rdmaxfer.distributed", "rdmaxfer.ray"),
    ("rdmaxfer.tools",),
    ("rdmaxfer",),
)


def module_names(package_dir: Path, package: str) -> dict[str, Path]:
    """Every module of the package (``.py`` sources and ``.pyi`` stubs of extensions) by its
    dotted name; a package's ``__init__`` is named by the package."""
    names: dict[str, Path] = {}
    for path in sorted(package_dir.rglob("*.py*")):
        if path.suffix not in (".py", ".pyi"):
            continue
        parts = list(path.relative_to(package_dir).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names.setdefault(".".join([package, *parts]), path)
    return names


def _imported(node: ast.AST, module: str, is_package: bool) -> Iterable[tuple[str, list[str]]]:
    """(base module, names imported from it) for one import statement."""
    if isinstance(node, ast.Import):
        for alias in node.names:
            yield alias.name, []
    elif isinstance(node, ast.ImportFrom):
        if node.level:
            parts = module.split(".")
            keep = len(parts) - node.level + (1 if is_package else 0)
            base = ".".join(parts[:keep] + ([node.module] if node.module else []))
        else:
            base = node.module or ""
        yield base, [alias.name for alias in node.names]


def import_graph(package_dir: Path, package: str) -> dict[str, set[str]]:
    """module -> the modules of the same package it imports (anywhere in its source)."""
    modules = module_names(package_dir, package)
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        is_package = path.stem == "__init__"
        for node in ast.walk(tree):
            for base, names in _imported(node, name, is_package):
                targets = [f"{base}.{n}" for n in names if f"{base}.{n}" in modules]
                if len(targets) < len(names) or not names:
                    targets.append(base)  # names defined in ``base`` itself
                graph[name].update(t for t in targets if t in modules and t != name)
    return graph


def layer_of(module: str, layers: Sequence[Sequence[str]]) -> int:
    best, best_len = -1, -1
    for index, prefixes in enumerate(layers):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best_len:
                best, best_len = index, len(prefix)
    if best < 0:
        raise AssertionError(f"{module} belongs to no layer: add it to LAYERS")
    return best


def upward_imports(graph: dict[str, set[str]], layers: Sequence[Sequence[str]]) -> list[str]:
    """``"a -> b"`` for every import of a higher layer."""
    return sorted(
        f"{src} -> {dst}"
        for src, targets in graph.items()
        for dst in targets
        if layer_of(dst, layers) > layer_of(src, layers)
    )


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), and modules that
    import themselves; each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph.get(node, ())):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def test_the_package_has_no_import_cycle() -> None:
    graph = import_graph(PACKAGE_DIR, "rdmaxfer")
    assert len(graph) > 30, sorted(graph)  # the whole package was read
    assert cycles(graph) == []


def test_no_module_imports_a_higher_layer() -> None:
    graph = import_graph(PACKAGE_DIR, "rdmaxfer")
    assert upward_imports(graph, LAYERS) == []


def test_every_module_sits_in_a_subpackage_of_a_layer() -> None:
    """Only the floor (errors, options and its _option, _test_hooks, _config, _warn, _transports,
    the _core stub) and the package's own entry points stay at the top; everything else lives
    in a layer's subpackage."""
    top = {m for m in module_names(PACKAGE_DIR, "rdmaxfer") if m.count(".") == 1}
    floor = {"rdmaxfer._config", "rdmaxfer._core", "rdmaxfer._warn", "rdmaxfer.errors"}
    floor |= {
        "rdmaxfer.options",
        "rdmaxfer._option",
        "rdmaxfer._test_hooks",
        "rdmaxfer._transports",
    }
    layers = {prefix for prefixes in LAYERS[1:-1] for prefix in prefixes}
    assert top == floor | layers | {"rdmaxfer.__main__"}


#: No source file is longer than this many lines.
MAX_LINES = 600
#: The sources the line limit covers: folders of the repository and the file patterns in them.
LINE_LIMITED: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("python/rdmaxfer", ("*.py",)),
    ("csrc", ("*.cc", "*.h")),
    ("tests", ("*.py",)),
)


def long_files(root: Path, limited: Iterable[tuple[str, tuple[str, ...]]]) -> dict[str, int]:
    """The files over MAX_LINES lines under ``root``'s folders of ``limited`` that match their
    patterns, by path relative to ``root``, with their line counts. Code under a
    ``third_party`` folder is not the project's and is left out."""
    long: dict[str, int] = {}
    for folder, patterns in limited:
        for pattern in patterns:
            for path in (root / folder).rglob(pattern):
                relative = path.relative_to(root)
                if "third_party" in relative.parts:
                    continue
                n = len(path.read_text(encoding="utf-8").splitlines())
                if n > MAX_LINES:
                    long[relative.as_posix()] = n
    return long


def test_no_source_file_is_over_600_lines() -> None:
    repo = PACKAGE_DIR.parent.parent
    missing = [folder for folder, _ in LINE_LIMITED if not (repo / folder).is_dir()]
    assert missing == [], "a folder the line limit covers moved: update LINE_LIMITED"
    assert long_files(repo, LINE_LIMITED) == {}


def test_the_line_limit_finds_a_planted_long_file(tmp_path: Path) -> None:
    """The check above can fail: a C++ source, a header and a test one line over the limit are
    found; files at the limit, other kinds of file and third_party code are not."""
    sizes = {
        "csrc/transport/long.cc": MAX_LINES + 1,
        "csrc/core/long.h": MAX_LINES + 1,
        "tests/rdma/test_long.py": MAX_LINES + 1,
        "csrc/core/at_limit.cc": MAX_LINES,
        "csrc/notes.txt": MAX_LINES + 1,
        "csrc/third_party/vendored.h": MAX_LINES + 1,
        "python/rdmaxfer/short.py": 3,
    }
    for rel, n in sizes.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x\n" * n, encoding="utf-8")
    assert long_files(tmp_path, LINE_LIMITED) == {
        "csrc/transport/long.cc": MAX_LINES + 1,
        "csrc/core/long.h": MAX_LINES + 1,
        "tests/rdma/test_long.py": MAX_LINES + 1,
    }


def _plant(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / "pkg" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text), encoding="utf-8")
    return root / "pkg"


def test_the_checker_finds_a_planted_cycle_and_an_upward_import(tmp_path: Path) -> None:
    """The checks above can fail: on a tiny package whose low layer imports its high layer
    (inside a function, and under TYPE_CHECKING), and whose two modules import each other."""
    pkg = _plant(
        tmp_path,
        {
            "__init__.py": "",
            "low/__init__.py": "",
            "low/a.py": """
                from typing import TYPE_CHECKING
                if TYPE_CHECKING:
                    from ..high import b
                def f():
                    from ..high.b import g
                    return g
            """,
            "high/__init__.py": "",
            "high/b.py": "from ..low import a\ndef g(): return a\n",
            "high/c.py": "from . import b\nimport pkg.high.d\n",
            "high/d.py": "from pkg.high.c import x\n",
        },
    )
    graph = import_graph(pkg, "pkg")
    assert graph["pkg.low.a"] == {"pkg.high.b"}
    assert graph["pkg.high.b"] == {"pkg.low.a"}
    assert graph["pkg.high.c"] == {"pkg.high.b", "pkg.high.d"}
    layers = (("pkg.low",), ("pkg.high",), ("pkg",))
    assert upward_imports(graph, layers) == ["pkg.low.a -> pkg.high.b"]
    assert cycles(graph) == [["pkg.high.b", "pkg.low.a"], ["pkg.high.c", "pkg.high.d"]]


def test_a_module_outside_every_layer_is_reported() -> None:
    with pytest.raises(AssertionError, match=r"pkg\.other belongs to no layer"):
        layer_of("pkg.other", (("pkg.low",),))
